"""RL rollouts on vLLM through TRL (`rl.stages.<name>.use_vllm`): what rung checks before a stage
starts, and rung's per-row seeds in colocate mode.

- Preflight, one line each: vllm in rung's own environment, in TRL's range, on CUDA
  (rung.generate.vllm.require_trl_vllm); in colocate mode a GPU memory share that leaves the trainer
  room for its fp32 weights, gradients and AdamW state; in server mode a `trl vllm-serve` (`vllm serve`
  in dev mode) that answers, can take the trainer's weights, and reports the log-probabilities the
  importance-sampling correction needs.
- Seeds: TRL hands vLLM one SamplingParams for the whole batch. In colocate mode rung gives each row
  its own copy seeded by (seed, step, call, vLLM rank, row), as rung's own rollouts seed each
  completion, so a resumed stage draws what an unkilled one would (on the same GPU and vLLM: vLLM is
  not batch-invariant). Server mode sends one request for all prompts (TRL's client), which takes one
  seed: rows there draw from the server's engine stream (`--seed` of the server), not per row.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from safetensors import safe_open

from rung.config import RLStageParams
from rung.errors import InputError, Unavailable
from rung.seeding import derive

TRAINER_BYTES_PER_PARAM = 16
"""fp32 weight, gradient and AdamW's two moments of a trained parameter (rung trains fp32 master weights)."""
FROZEN_BYTES_PER_PARAM = 4
"""fp32 weight of a parameter LoRA leaves frozen (its adapters' own state is comparatively nothing)."""


def parameters(model_dir: Path) -> int:
    """Parameter count of a model directory's safetensors, from their headers (no weights read)."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                n = 1
                for d in f.get_slice(name).get_shape():
                    n *= d
                total += n
    return total


def trainer_bytes(n_params: int, lora: bool) -> int:
    """What the trainer holds whatever the batch: weights, gradients and optimizer state (activations come on top)."""
    return n_params * (FROZEN_BYTES_PER_PARAM if lora else TRAINER_BYTES_PER_PARAM)


def colocate_memory(stage: RLStageParams, n_params: int, gpu_bytes: int, key: str) -> None:
    """InputError, naming `key`.vllm_gpu_memory_utilization, where the share vLLM takes of a GPU of
    `gpu_bytes` leaves the trainer less than its weights, gradients and AdamW state."""
    left = (1 - stage.vllm_gpu_memory_utilization) * gpu_bytes
    need = trainer_bytes(n_params, stage.lora is not None)
    if left < need:
        gib = 2**30
        raise InputError(
            f"{key}.vllm_gpu_memory_utilization: {stage.vllm_gpu_memory_utilization} leaves the trainer "
            f"{left / gib:.1f} GiB of the GPU's {gpu_bytes / gib:.1f} GiB, and its fp32 "
            f"{'weights' if stage.lora else 'weights, gradients and AdamW state'} alone need {need / gib:.1f} GiB "
            f"({n_params / 1e9:.2f}B parameters): lower the share{'' if stage.lora else ', or train LoRA adapters'}"
        )


def _get(url: str, timeout: float) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, None


def server(stage: RLStageParams, key: str, timeout: float = 10.0) -> dict[str, Any]:
    """Server mode: the `trl vllm-serve` at `vllm_server_base_url` answers (Unavailable, exit 75, where it
    does not: a rerun once it is up can succeed), exposes the dev endpoints TRL syncs weights through,
    has a weight-transfer engine, and, with the importance-sampling correction on, returns processed
    log-probabilities (TRL only warns: raw ones bias the correction). Returns the server's vllm_config."""
    base = (stage.vllm_server_base_url or "http://0.0.0.0:8000").rstrip("/")
    where = f"{key}.vllm_server_base_url"
    try:
        status, _ = _get(f"{base}/health", timeout)
    except (urllib.error.URLError, OSError) as e:
        raise Unavailable(
            f"{where}: the vLLM server at {base} does not answer ({getattr(e, 'reason', e)}); start it "
            "(docs/gpu.md, RL on vLLM) and rerun"
        ) from None
    if status != 200:
        raise Unavailable(f"{where}: the vLLM server at {base} is not ready (/health answered {status})")
    status, info = _get(f"{base}/server_info?config_format=json", timeout)
    if status == 404:
        raise InputError(
            f"{where}: the vLLM server at {base} hides the dev endpoints TRL syncs weights through; "
            "start it with `trl vllm-serve`, or `vllm serve` with VLLM_SERVER_DEV_MODE=1"
        )
    if status != 200 or not isinstance(info, dict) or "vllm_config" not in info:
        raise InputError(f"{where}: {base}/server_info answered {status}, not a vLLM server's config")
    config = info["vllm_config"]
    if config.get("weight_transfer_config") is None:
        raise InputError(
            f"{where}: the vLLM server at {base} has no weight-transfer engine, so the trainer cannot send it "
            """its weights; start it with `trl vllm-serve` (or --weight-transfer-config '{"backend": "nccl"}')"""
        )
    model = config.get("model_config") or {}
    mode = model.get("logprobs_mode")
    if stage.vllm_importance_sampling_correction and mode != "processed_logprobs":
        raise InputError(
            f"{where}: the vLLM server at {base} returns {mode} log-probabilities, which bias "
            f"{key}.vllm_importance_sampling_correction; restart it with --logprobs-mode processed_logprobs "
            "(`trl vllm-serve` does)"
        )
    max_len = model.get("max_model_len")
    if isinstance(max_len, int) and max_len <= stage.max_completion_length:
        raise InputError(
            f"{where}: the vLLM server at {base} serves {max_len} tokens, no room for a prompt and "
            f"{key}.max_completion_length {stage.max_completion_length}"
        )
    return config


def preflight(stage: RLStageParams, model_dir: Path | None, key: str) -> None:
    """What a stage with `use_vllm` needs before any compute, in one line each (module docstring)."""
    from rung.generate.vllm import require_trl_vllm

    require_trl_vllm(f"{key}.use_vllm")
    if stage.vllm_mode == "server":
        server(stage, key)
    elif model_dir is not None:
        import torch

        colocate_memory(stage, parameters(model_dir), torch.cuda.mem_get_info()[1], key)


class SeededRows:
    """Wraps a colocated vLLM engine's `generate` so that each prompt row gets its own SamplingParams
    seeded by derive(`seed()`, row): TRL passes one SamplingParams for the batch, whose single seed
    would give identical completions to a group's identical prompts."""

    def __init__(self, generate: Any, seed: Any) -> None:
        self._generate, self._seed = generate, seed

    def __call__(self, prompts: list[Any], sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any:
        if sampling_params is not None and not isinstance(sampling_params, list):
            base = self._seed()
            rows = []
            for i in range(len(prompts)):
                row = sampling_params.clone()
                row.seed = derive(base, "row", str(i))
                rows.append(row)
            sampling_params = rows
        return self._generate(prompts, sampling_params, *args, **kwargs)
