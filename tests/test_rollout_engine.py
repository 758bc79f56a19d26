"""The rollout engine (rung.rl.engine): one check of what rung's decode loop can sample for single-turn rollouts and
episodes alike, one owner of the seeds, and the model the rollouts decode with."""

from __future__ import annotations

import dataclasses
from contextlib import nullcontext

import pytest
import torch
from transformers import AutoModelForCausalLM

from rung.errors import InputError
from rung.rl.engine import GenerationModel, RolloutEngine, check
from rung.seeding import derive
from rung.train.trl_private import RolloutSettings

SETTINGS = RolloutSettings(
    seed=3,
    temperature=1.0,
    top_p=1.0,
    top_k=None,
    min_p=None,
    repetition_penalty=1.0,
    generation_kwargs={},
    max_completion_length=8,
    eos_token_ids=[2],
    num_generations=2,
    use_vllm=False,
    vllm_mode="colocate",
    vllm_tensor_parallel_size=1,
    continuous_batching=False,
    tools=False,
    compute_dtype=None,
)
KEY = "rl.stages.main"
ASKED = {
    "top_k": {"top_k": 5},
    "min_p": {"min_p": 0.1},
    "repetition_penalty": {"repetition_penalty": 1.1},
    "generation_kwargs": {"generation_kwargs": {"typical_p": 0.9}},
    "use_transformers_continuous_batching": {"continuous_batching": True},
    "use_vllm": {"use_vllm": True},
}


def _with(**changes) -> RolloutSettings:
    return dataclasses.replace(SETTINGS, **changes)


@pytest.mark.parametrize("name", sorted(ASKED))
def test_episodes_refuse_what_rungs_loop_cannot_sample_naming_it(name):
    with pytest.raises(
        InputError, match=rf"^{KEY}: episodes are sampled by rung's decode loop, which lacks \['{name}'\]"
    ):
        check(_with(**ASKED[name]), KEY, episodes=True)


@pytest.mark.parametrize("name", sorted(ASKED))
def test_single_turn_rollouts_take_the_generator_the_stage_chose(name):
    assert check(_with(**ASKED[name]), KEY, episodes=False) == ("vllm" if name == "use_vllm" else "trl")
    assert check(SETTINGS, KEY, episodes=False) == check(SETTINGS, KEY, episodes=True) == "rung"


@pytest.mark.parametrize("episodes", [False, True])
def test_temperature_zero_is_refused_on_both_paths(episodes):
    with pytest.raises(InputError, match=rf"^{KEY}\.temperature: 0 "):
        check(_with(temperature=0.0), KEY, episodes=episodes)


def _engine(settings: RolloutSettings, process: int, steps: list[int]) -> RolloutEngine:
    ranks = settings.vllm_tensor_parallel_size if settings.use_vllm else 1
    return RolloutEngine(
        settings,
        check(settings, KEY, episodes=False),
        "rollouts",
        process // ranks,
        lambda: steps[0],
        nullcontext,
        GenerationModel(None),
    )


def test_each_call_of_a_step_has_its_seed_and_tensor_parallel_ranks_share_one():
    steps = [0]
    engine = _engine(SETTINGS, 1, steps)
    first = [engine.seed(), engine.seed()]
    steps[0] = 1
    second = engine.seed()
    assert first == [derive(3, "rollouts", "0", str(c), "1") for c in (0, 1)]
    assert second == derive(3, "rollouts", "1", "0", "1") == engine.last_seed
    tp = _with(use_vllm=True, vllm_tensor_parallel_size=2)
    assert [_engine(tp, p, [0]).seed() for p in range(4)] == [
        derive(3, "rollouts", "0", "0", str(p // 2)) for p in range(4)
    ]


def test_the_generation_model_is_a_low_precision_copy_refreshed_in_place(tiny_model):
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    assert GenerationModel(None)(model) is model
    copy = GenerationModel(torch.bfloat16)
    first = copy(model)
    assert first is not model and first.dtype == torch.bfloat16 and copy.copy is first
    with torch.no_grad():
        next(model.parameters()).add_(1.0)
    assert copy(model) is first  # the same addresses: the compiled path's CUDA graphs stay valid
    torch.testing.assert_close(next(first.parameters()), next(model.parameters()).to(torch.bfloat16))
