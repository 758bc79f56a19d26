"""Difficulty scoring with an environment (issue #47): each train prompt's pass rate is the share of its
`num_generations` episodes, run through rung's one episode loop, whose final answer is right; the outputs and
buckets are those of single-turn scoring."""

from __future__ import annotations

import pytest

from rung import files, paths
from rung.answers.verify import GraderFailed
from rung.config import DifficultyParams, FormatParams
from rung.data import difficulty as diff
from rung.envs import check
from tests.test_episodes import generator, tok, trained  # noqa: F401 - the fixtures: the tiny model that calls python

FMT = FormatParams()
ROWS = [  # the trained model calls python(print(17 * 23)), then answers 391: right for r0, wrong for r1
    {
        "id": f"r{i}",
        "source": "s",
        "task": "basic_arithmetic",
        "prompt": "What is 17 * 23?",
        "answer": answer,
        "meta": {"difficulty": {}},
    }
    for i, answer in enumerate(["391", "390"])
]
PARAMS = DifficultyParams.model_validate(
    {"num_generations": 2, "sampling": {"temperature": 0.0, "max_new_tokens": 64}, "pass_rate_max": 0.5}
)


def test_pass_rates_are_the_share_of_episodes_right_at_their_final_answer(generator, tmp_path, monkeypatch):  # noqa: F811
    env = check({"name": "python", "max_turns": 3}, generator.tok)
    monkeypatch.chdir(tmp_path)
    summary = diff.run(generator, ROWS, FMT, PARAMS, seed=0, environment=env)
    scores = files.read_jsonl(paths.SCORES)
    assert [(s["id"], s["pass_rate"], s["scores"], s["bucket"]) for s in scores] == [
        ("r0", 1.0, [1.0, 1.0], "solved"),
        ("r1", 0.0, [0.0, 0.0], "unsolved"),
    ]
    assert [s["lenient_pass_rate"] for s in scores] == [1.0, 0.0]
    assert [r["id"] for r in files.read_jsonl(paths.FILTERED)] == ["r1"]  # the window [0, 0.5]
    assert summary["prompts"] == 2 and summary["kept"] == 1 and summary["buckets"] == {"solved": 1, "unsolved": 1}
    one = PARAMS.model_copy(update={"num_generations": 1})  # greedy single-turn samples would be identical
    # the same model scored single-turn answers with its tool call (no answer): what the episodes' rates fix
    assert [s["pass_rate"] for s in diff.pass_rates(generator, ROWS, FMT, one, seed=0)] == [0.0, 0.0]


def test_a_grader_failure_inside_an_episode_stops_scoring(generator, monkeypatch):  # noqa: F811
    from rung import sandbox

    env = check({"name": "python", "max_turns": 3}, generator.tok)

    def fails(program, limits):
        raise sandbox.SandboxUnavailable("no bubblewrap")

    monkeypatch.setattr(sandbox, "run", fails)
    with pytest.raises(GraderFailed, match="difficulty row r0"):
        diff.pass_rates(generator, ROWS[:1], FMT, PARAMS, seed=0, environment=env)
