from __future__ import annotations

import json
import math

import pytest

from rung.config import (
    AdaptiveCurriculum,
    BanditCurriculum,
    CurriculumPhase,
    DifficultyParams,
    PoolsCurriculum,
    ScheduledCurriculum,
    StagedCurriculum,
    UniformCurriculum,
)
from rung.rl import curricula
from rung.rl.curricula import GroupResult

BUCKETS = DifficultyParams().buckets
# Pass rates of 8 rollouts, so prompts tie (ties are broken by the rng).
RATES = {"hard": (0.125, 0.25), "medium": (0.375, 0.625), "easy": (0.875, 0.875)}


def bucket_of(i: int) -> str:
    return ("hard", "medium", "easy")[i // 10]


def make_rows() -> list[dict]:
    """30 prompts, 10 per bucket, alternating two tasks; some without bucket or pass rate."""
    rows = []
    for i in range(30):
        name = ("hard", "medium", "easy")[i // 10]
        row = {
            "id": f"p{i}",
            "task": ("basic_arithmetic", "chain_sum")[i % 2],
            "source": "rg",
            "pass_rate": RATES[name][i % 2],
            "bucket": name,
        }
        if i % 7 == 0:
            del row["bucket"]
        rows.append(row)
    rows[15]["pass_rate"] = None  # unknown: 0.5, medium
    del rows[15]["bucket"]
    return rows


ROWS = make_rows()
CONFIGS = {
    "uniform": UniformCurriculum(),
    "staged": StagedCurriculum(
        type="staged",
        phases=[CurriculumPhase(buckets=["easy"], until_step=3), CurriculumPhase(buckets=["medium", "hard"])],
    ),
    "scheduled": ScheduledCurriculum(type="scheduled", shape="cosine"),
    "adaptive": AdaptiveCurriculum(type="adaptive"),
    "sec": BanditCurriculum(type="bandit"),
    "ucb": BanditCurriculum(type="bandit", method="ucb", arms="task", signal="learning_progress", window=3),
    "pools": PoolsCurriculum(type="pools", smoothing=0.5),
}


def build(params, seed: int = 1, rows: list[dict] = ROWS, max_steps: int = 10) -> curricula.Scheduler:
    return curricula.build(rows, params, buckets=BUCKETS, max_steps=max_steps, seed=seed)


def result(i: int, step: int) -> GroupResult:
    """Deterministic fake groups: easy prompts all correct, others depending on the step."""
    acc = 1.0 if bucket_of(i) == "easy" else ((i + step) % 4) / 4
    return GroupResult(index=i, accuracy=acc, reward_std=0.5, abs_advantage=acc * (1 - acc))


def run(cur: curricula.Scheduler, steps: range, n: int = 4) -> list:
    """Draws (two per step: a dynamic-sampling refill), updates and metrics of each step."""
    trace = []
    for step in steps:
        idx = cur.draw(n, step)
        refill = cur.draw(2, step)
        cur.update([result(i, step) for i in idx + refill], step)
        trace.append((idx, refill, cur.metrics()))
    return trace


@pytest.mark.parametrize("name", CONFIGS)
def test_draws_valid_distinct_and_seeded(name: str) -> None:
    trace = run(build(CONFIGS[name]), range(6))
    for idx, refill, metrics in trace:
        assert len(idx) == 4 and len(set(idx)) == 4 and len(refill) == 2 and len(set(refill)) == 2
        assert all(0 <= i < len(ROWS) for i in idx + refill)
        assert all(isinstance(v, float) for v in metrics.values())
    assert run(build(CONFIGS[name]), range(6)) == trace
    assert [t[:2] for t in run(build(CONFIGS[name], seed=2), range(6))] != [t[:2] for t in trace]


@pytest.mark.parametrize("name", CONFIGS)
def test_more_draws_than_prompts(name: str) -> None:
    rows = [
        {"id": "a", "task": "t", "source": "s", "pass_rate": 0.5},
        {"id": "b", "task": "t", "source": "s", "pass_rate": 0.9},
    ]
    params = (
        StagedCurriculum(type="staged", phases=[CurriculumPhase(buckets=["medium", "easy"])])
        if name == "staged"
        else CONFIGS[name]
    )
    idx = build(params, rows=rows).draw(3, 0)
    assert len(idx) == 3 and set(idx) == {0, 1}


@pytest.mark.parametrize("name", CONFIGS)
def test_state_dict_resumes_identically(name: str) -> None:
    cur = build(CONFIGS[name])
    run(cur, range(3))
    resumed = build(CONFIGS[name])
    resumed.load_state_dict(json.loads(json.dumps(cur.state_dict())))
    assert resumed.metrics() == cur.metrics()
    assert run(resumed, range(3, 8)) == run(cur, range(3, 8))


def test_state_dict_of_another_curriculum_is_refused() -> None:
    with pytest.raises(ValueError, match="uniform"):
        build(CONFIGS["adaptive"]).load_state_dict(build(CONFIGS["uniform"]).state_dict())


def test_staged_switches_buckets_at_until_step() -> None:
    cur = build(CONFIGS["staged"])
    early = [i for step in range(3) for i in cur.draw(4, step)]
    assert {bucket_of(i) for i in early} == {"easy"}
    assert len(set(early[:10])) == 10  # a pass over the phase's prompts before any repeat
    m = cur.metrics()
    assert (m["phase"], m["prompts"], m["fallback"]) == (0.0, 10.0, 0.0)
    late = [i for step in range(3, 8) for i in cur.draw(4, step)]
    assert {bucket_of(i) for i in late} == {"hard", "medium"}
    assert cur.metrics()["phase"] == 1.0 and cur.metrics()["prompts"] == 20.0


def test_staged_falls_back_to_all_prompts_for_an_empty_phase() -> None:
    cur = build(StagedCurriculum(type="staged", phases=[CurriculumPhase(buckets=["unsolved"])]))
    assert len(set(cur.draw(30, 0))) == 30
    assert cur.metrics()["fallback"] == 1.0 and cur.metrics()["prompts"] == 30.0


@pytest.mark.parametrize(
    ("shape", "middle"), [("linear", 0.7), ("cosine", 0.1 + 0.8 * (1 + math.cos(math.pi / 4)) / 2)]
)
def test_scheduled_target_moves_and_draws_follow_it(shape: str, middle: float) -> None:
    cur = build(ScheduledCurriculum(type="scheduled", start=0.9, end=0.1, shape=shape, width=0.05), max_steps=8)
    targets = []
    for step in (0, 2, 8, 20):
        cur.draw(4, step)
        targets.append(cur.metrics()["target"])
    assert targets == pytest.approx([0.9, middle, 0.1, 0.1])
    assert {bucket_of(i) for step in range(5) for i in cur.draw(4, 0)} == {"easy"}
    assert {bucket_of(i) for step in range(5) for i in cur.draw(4, 8)} == {"hard"}


def test_adaptive_target_follows_reward() -> None:
    params = CONFIGS["adaptive"]
    up, down = build(params), build(params)
    first = up.draw(4, 0)
    assert first[0] == 15 and {bucket_of(i) for i in first} == {"medium"}  # unknown rate 0.5: difficulty 0.5 = target
    assert set(up.draw(4, 0)).isdisjoint(first)  # the previous draw is not re-served
    up.update([GroupResult(i, 1.0, 0.0, 0.0) for i in first], 0)
    down.update([GroupResult(i, 0.0, 0.0, 0.0) for i in first], 0)
    step = params.eta * math.tanh(params.alpha * (1 - params.beta))
    assert up.metrics()["target"] == pytest.approx(0.5 + step) and up.metrics()["reward"] == 1.0
    assert down.metrics()["target"] == pytest.approx(0.5 - step)
    assert {bucket_of(i) for i in up.draw(4, 1)} == {"hard"}
    assert {bucket_of(i) for i in down.draw(4, 1)} == {"easy"}
    for _ in range(5):
        up.update([GroupResult(0, 1.0, 0.0, 0.0)], 1)
    assert up.metrics()["target"] == 1.0


def test_sec_values_follow_td0_and_favour_large_advantage() -> None:
    cur = build(BanditCurriculum(type="bandit", step_size=0.5, temperature=0.05))
    hard, easy = 1, 25
    cur.update(
        [GroupResult(hard, 0.5, 0.5, 0.8), GroupResult(hard, 0.5, 0.5, 0.4), GroupResult(easy, 1.0, 0.0, 0.0)], 0
    )
    assert cur.metrics()["q/hard"] == pytest.approx(0.5 * 0.6) and cur.metrics()["q/easy"] == 0.0
    cur.update([GroupResult(hard, 0.5, 0.5, 0.2)], 1)
    assert cur.metrics()["q/hard"] == pytest.approx(0.5 * 0.2 + 0.5 * 0.3) and cur.metrics()["q/medium"] == 0.0
    drawn = [bucket_of(i) for step in range(2, 7) for i in cur.draw(4, step)]
    assert drawn.count("hard") >= 18
    assert cur.metrics()["pulls/hard"] == drawn.count("hard")


def test_ucb_explores_unpulled_arms_first() -> None:
    cur = build(BanditCurriculum(type="bandit", method="ucb", exploration=0.1))
    assert {bucket_of(i) for i in cur.draw(3, 0)} == {"hard", "medium", "easy"}
    assert {cur.metrics()[f"pulls/{b}"] for b in ("hard", "medium", "easy")} == {1.0}
    cur.update([GroupResult(i, 0.5, 0.5, 0.9 if bucket_of(i) == "medium" else 0.1) for i in cur.last], 0)
    assert cur.metrics()["ucb/medium"] > cur.metrics()["ucb/hard"]
    assert [bucket_of(i) for i in cur.draw(2, 1)] == ["medium", "medium"]


def test_learning_progress_is_the_change_of_accuracy() -> None:
    cur = build(BanditCurriculum(type="bandit", signal="learning_progress", step_size=1.0))
    cur.update([GroupResult(0, 0.25, 0.4, 0.3)], 0)
    assert cur.metrics()["q/hard"] == 0.0
    cur.update([GroupResult(2, 0.75, 0.4, 0.3), GroupResult(4, 0.25, 0.4, 0.3)], 1)
    assert cur.metrics()["q/hard"] == pytest.approx(0.25)


def test_pools_move_and_retire_prompts() -> None:
    cur = build(PoolsCurriculum(type="pools", retire_after=2))
    sizes = {k: v for k, v in cur.metrics().items() if k.startswith("size/")}
    assert sizes == {"size/hard": 10.0, "size/normal": 10.0, "size/easy": 10.0}
    cur.update([GroupResult(3, 1.0, 0.0, 0.0)], 0)
    m = cur.metrics()
    assert (m["size/hard"], m["size/easy"], m["retired"]) == (9.0, 11.0, 0.0)
    cur.update([GroupResult(3, 1.0, 0.0, 0.0)], 1)
    m = cur.metrics()
    assert (m["size/easy"], m["retired"]) == (10.0, 1.0)
    assert m["size/hard"] + m["size/normal"] + m["size/easy"] + m["retired"] == 30
    assert 3 not in {i for step in range(2, 30) for i in cur.draw(4, step)}


def test_pools_keep_drawing_when_every_prompt_is_retired() -> None:
    cur = build(PoolsCurriculum(type="pools", retire_after=1))
    cur.update([GroupResult(i, 1.0, 0.0, 0.0) for i in range(30)], 0)
    idx = cur.draw(4, 1)
    assert len(set(idx)) == 4
    assert cur.metrics()["retired"] == 30.0 and cur.metrics()["exhausted"] == 1.0


def test_bandit_learning_rate_is_read_as_step_size_with_a_warning(caplog) -> None:
    """The bandit's TD step size was called learning_rate (the RL stage's optimizer rate has that name)."""
    with caplog.at_level("WARNING", logger="rung.config"):
        old = BanditCurriculum.model_validate({"type": "bandit", "learning_rate": 0.25})
    assert old.step_size == 0.25
    assert [r.getMessage() for r in caplog.records] == [
        "curriculum.learning_rate: deprecated, renamed step_size; read as step_size (rename it)"
    ]
