"""RL on vLLM as far as the CPU allows (TRL's vLLM rollouts need CUDA: docs/gpu.md): the stage's keys
reach GRPOConfig, the colocate memory check, the server-mode preflight against a stub answering as
`trl vllm-serve` (vLLM's OpenAI server in dev mode) does, and rung's per-row seeds for colocated vLLM."""

from __future__ import annotations

import copy
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rung import models
from rung.config import RLStageParams
from rung.errors import InputError, Unavailable
from rung.rl import trainers, vllm_rollouts

KEY = "rl.stages.main"


def _stage(**kw) -> RLStageParams:
    return RLStageParams.model_validate({"use_vllm": True, **kw})


def test_vllm_keys_reach_trls_config_with_the_importance_sampling_correction_on(tmp_path):
    stage = _stage(vllm_mode="server", vllm_server_base_url="http://node1:8000", vllm_gpu_memory_utilization=0.5)
    config = trainers.trl_config(stage, [1.0, 0.1], 3, tmp_path)
    assert (config.use_vllm, config.vllm_mode, config.vllm_server_base_url) == (True, "server", "http://node1:8000")
    assert config.vllm_gpu_memory_utilization == 0.5
    assert config.vllm_importance_sampling_correction is True
    assert config.vllm_importance_sampling_mode == "sequence_mask"


def test_colocate_refuses_a_share_that_leaves_the_trainer_less_than_its_state(tiny_model: Path):
    model, _ = models.load(tiny_model)
    n = vllm_rollouts.parameters(tiny_model)
    assert n == sum(p.numel() for p in model.parameters())  # from the headers, no weights read
    gib = 2**30
    one_b = 10**9  # a 1B model: 14.9 GiB of fp32 weights, gradients and AdamW state; 3.7 GiB of fp32 weights
    vllm_rollouts.colocate_memory(_stage(vllm_gpu_memory_utilization=0.3), one_b, 80 * gib, KEY)
    with pytest.raises(InputError, match=r"^rl.stages.main.vllm_gpu_memory_utilization: 0.9 leaves .* 14.9 GiB"):
        vllm_rollouts.colocate_memory(_stage(vllm_gpu_memory_utilization=0.9), one_b, 80 * gib, KEY)
    # LoRA freezes the base: its fp32 weights alone
    vllm_rollouts.colocate_memory(_stage(vllm_gpu_memory_utilization=0.9, lora={"r": 8}), one_b, 80 * gib, KEY)


class _VllmServe(BaseHTTPRequestHandler):
    """Answers the endpoints TRL's VLLMClient reads, as `trl vllm-serve` (vllm serve, dev mode) does."""

    config: dict = {}
    dev_mode = True

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/health":
            self._send(200, None)
        elif path == "/server_info" and self.dev_mode:
            self._send(200, {"vllm_config": self.config})
        elif path == "/v1/models":
            self._send(200, {"data": [{"id": "data/models/sft"}]})
        else:
            self._send(404, {"detail": "Not Found"})

    def _send(self, code: int, body: object) -> None:
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def serve():
    """A stub server on a free port; yields a function that sets its answers and returns its URL."""
    handler = type("Handler", (_VllmServe,), {})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def answer(dev_mode: bool = True, transfer: object = {"backend": "nccl"}, mode="processed_logprobs", max_len=2048):
        handler.dev_mode = dev_mode
        handler.config = {
            "model_config": {"logprobs_mode": mode, "max_model_len": max_len},
            "weight_transfer_config": transfer,
        }
        return f"http://127.0.0.1:{server.server_address[1]}"

    yield answer
    server.shutdown()


def test_server_mode_preflight_against_a_stub_of_trl_vllm_serve(serve):
    url = serve()
    config = vllm_rollouts.server(_stage(vllm_mode="server", vllm_server_base_url=url), KEY)
    assert config["model_config"]["logprobs_mode"] == "processed_logprobs"

    def refused(error, match, **answers):
        stage = _stage(vllm_mode="server", vllm_server_base_url=serve(**answers))
        with pytest.raises(error, match=match):
            vllm_rollouts.server(stage, KEY)

    refused(InputError, r"^rl.stages.main.vllm_server_base_url: .* hides the dev endpoints", dev_mode=False)
    refused(InputError, r"has no weight-transfer engine", transfer=None)
    refused(InputError, r"returns raw_logprobs log-probabilities, which bias", mode="raw_logprobs")
    refused(InputError, r"serves 40 tokens, no room for a prompt", max_len=40)
    # without the correction, raw log-probabilities do no harm
    stage = _stage(
        vllm_mode="server", vllm_server_base_url=serve(mode="raw_logprobs"), vllm_importance_sampling_correction=False
    )
    vllm_rollouts.server(stage, KEY)


def test_a_vllm_server_that_does_not_answer_is_unavailable_not_bad_input():
    stage = _stage(vllm_mode="server", vllm_server_base_url="http://127.0.0.1:9")  # discard port: refused
    with pytest.raises(Unavailable, match=r"^rl.stages.main.vllm_server_base_url: the vLLM server .* does not answer"):
        vllm_rollouts.server(stage, KEY, timeout=2)


@dataclass
class _Sampling:
    """vLLM's SamplingParams as SeededRows uses it: a seed and clone()."""

    temperature: float = 1.0
    seed: int | None = None

    def clone(self) -> _Sampling:
        return copy.deepcopy(self)


def test_colocated_vllm_gets_a_seed_per_row_from_the_calls_seed():
    calls = []
    seed = [11]
    generate = vllm_rollouts.SeededRows(
        lambda prompts, sampling_params, **kw: calls.append(sampling_params), lambda: seed[0]
    )
    group = [{"prompt_token_ids": [1, 2, 3]}] * 4  # a group: the same prompt 4 times
    shared = _Sampling()
    generate(group, sampling_params=shared, use_tqdm=False)
    generate(group, sampling_params=shared)
    seed[0] = 12
    generate(group, sampling_params=shared)
    first, again, other = ([s.seed for s in c] for c in calls)
    assert len(set(first)) == 4  # a group's identical prompts draw from their own streams
    assert first == again  # the same call seed, the same row seeds: a resumed step draws the same
    assert not set(first) & set(other)
    assert shared.seed is None and all(s.temperature == 1.0 for c in calls for s in c)


def test_a_vllm_server_url_with_a_password_is_refused_before_it_reaches_a_record():
    with pytest.raises(ValueError, match=r"vllm_server_base_url: has a password in it"):
        _stage(vllm_mode="server", vllm_server_base_url="http://user:secret@node1:8000")
