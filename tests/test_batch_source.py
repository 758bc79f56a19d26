"""rung.rl.sampling's batch source is a part given values: it draws, scores and refills batches, logs and
checkpoints with no trainer at all, from a `generate` it is handed (here a scripted one)."""

from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from rung.config import DifficultyParams, DynamicSamplingParams, RLStageParams
from rung.rl import curricula
from rung.rl.reward_logs import RewardLog
from rung.rl.rewards import Guarded
from rung.rl.sampling import BatchSource
from rung.train.parts import Generated
from tests.rows import sums

G = 2
ROWS = sums(12, lambda i: i % 3, graded=True)


def _source(metrics: defaultdict[str, list[float]], dynamic: DynamicSamplingParams | None) -> BatchSource:
    stage = RLStageParams.model_validate({"curriculum": {"type": "pools"}})
    curriculum = curricula.build(ROWS, stage.curriculum, buckets=DifficultyParams().buckets, max_steps=4, seed=3)
    funcs = [Guarded(lambda completions, **_: [1.0] * len(completions), "accuracy", G)]
    log = RewardLog(["accuracy"], torch.tensor([1.0]), [r["bucket"] for r in ROWS], metrics)
    return BatchSource(curriculum, [{"id": r["id"]} for r in ROWS], dynamic, G, 1, 0, funcs, log)  # type: ignore[arg-type]


def _scripted(rewards_per_call: list[list[float]], metrics: defaultdict[str, list[float]]):
    """A generation whose rewards are given per call, logging its reward as TRL does; each row's batch entry
    names its call and row."""
    calls: list[list[dict]] = []

    def generate(inputs: list[dict]) -> Generated:
        metrics["reward"].append(-1.0)
        r = torch.tensor(rewards_per_call[len(calls)]).unsqueeze(1)
        calls.append(inputs)
        batch = {
            "advantages": torch.zeros(len(inputs)),
            "row": torch.tensor([len(calls) * 100 + i for i in range(len(inputs))]),
        }
        return Generated(batch, r, torch.zeros(len(inputs)))

    return generate, calls


def _concat(groups: list[tuple[dict, int]]) -> dict:
    return {"row": torch.cat([batch["row"][j * G : (j + 1) * G] for batch, j in groups])}


def test_dynamic_sampling_refills_zero_variance_groups_without_a_trainer():
    metrics: defaultdict[str, list[float]] = defaultdict(list)
    source = _source(metrics, DynamicSamplingParams(max_rounds=2))
    # first call: group 0 all equal (dropped), group 1 varied; the refill: both varied
    generate, calls = _scripted([[1.0, 1.0, 0.0, 1.0], [0.0, 1.0, 1.0, 0.0]], metrics)
    metrics["reward"].append(0.75)  # an earlier step's, kept
    out = source.batch(2 * G, step=0, generate=generate, concat=_concat)
    assert len(calls) == 2 and all(len(c) == 2 * G for c in calls)
    assert out["row"].tolist() == [102, 103, 200, 201]  # the varied group of the first call, then the refill's first
    assert metrics["dynamic_sampling/rounds"] == [1.0]
    assert metrics["dynamic_sampling/zero_std_generated"] == [0.25]
    assert metrics["dynamic_sampling/dropped_share"] == [0.25]
    assert metrics["dynamic_sampling/extra_generations"] == [2.0 * G]
    assert metrics["frac_zero_std_trained"] == [0.0]
    # TRL's entries of both generations replaced by one of the trained rows
    assert metrics["reward"] == [0.75, 0.5] and metrics["reward_generated"] == [0.625]
    assert metrics["curriculum/prompts"] == [2.0, 2.0]


def test_without_dynamic_sampling_the_generated_batch_is_trained_and_the_curriculum_checkpointed(tmp_path):
    metrics: defaultdict[str, list[float]] = defaultdict(list)
    source = _source(metrics, None)
    generate, calls = _scripted([[1.0, 1.0, 0.0, 1.0]], metrics)
    out = source.batch(2 * G, step=0, generate=generate, concat=_concat)
    assert out["row"].tolist() == [100, 101, 102, 103] and len(calls) == 1
    assert metrics["frac_zero_std_trained"] == [0.5]
    assert any(k.startswith("accuracy_by_bucket/") for k in metrics)
    source.save(tmp_path, main=True)
    again = _source(defaultdict(list), None)
    assert again.curriculum.state_dict() != source.curriculum.state_dict()
    again.load(tmp_path)
    assert again.curriculum.state_dict() == source.curriculum.state_dict()


@pytest.mark.parametrize("crashed", [[], [1]])
def test_a_row_a_reward_crashed_on_is_unscored_whole(crashed):
    source = _source(defaultdict(list), None)
    source.reward_funcs[0].crashed = crashed
    rewards = torch.ones(4, 1)
    out = source.scored(rewards, rows=4)
    assert [i for i in range(4) if out[i].isnan().all()] == crashed
