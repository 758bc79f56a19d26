"""The report with episodes (issue #47): per eval set a table of each checkpoint's episode metrics, paired tests
of each RL checkpoint against its init on the final and on the first answers (exact McNemar), whole episodes of
the first held-out prompts (escaped in HTML, fenced in markdown), and the parent run's headline episode keys."""

from __future__ import annotations

from typing import Any

import pytest
from scipy.stats import binomtest

from rung import files, paths
from rung.envs.trajectory import Trajectory, Turn
from rung.eval import comparisons, episodes
from rung.eval.results import EvalResult
from rung.report import keys, pipeline
from tests.test_episodes import generator, tok, trained  # noqa: F401 - the fixtures: the tiny model that calls python

N = 30
MAX_TURNS = 2
HOSTILE = "<script>alert(1)</script> ```"


def _turn(answer: str, correct: bool, calls: int) -> Turn:
    call = {"name": "python", "arguments": {"code": "1"}}
    return Turn(
        text=f"Answer: {answer}",
        tool_calls=[call] * calls,
        tool_results=["1\n"] * calls,
        tool_errors=0,
        reply=None,
        answer=answer,
        correct=correct,
        tokens=3,
        env_tokens=0,
        truncated=False,
    )


def _episode(first: bool, final: bool, i: int) -> dict[str, Any]:
    """A retry-style episode's record: a first answer after one python call, and a second turn where the first
    was wrong."""
    turns = [_turn("1", first, calls=1)] + ([] if first else [_turn("2", final, calls=0)])
    messages = [{"role": "user", "content": f"What is {i} + 1? {HOSTILE}"}]
    messages += [{"role": "assistant", "content": "", "tool_calls": [{"name": "python", "arguments": {"code": "1"}}]}]
    messages += [{"role": "tool", "name": "python", "content": "1\n"}, {"role": "assistant", "content": "Answer: 1"}]
    last = bool(turns[-1]["correct"])
    return Trajectory(messages=messages, turns=turns, reward=float(last), cut=not last).dump()


def _write(checkpoint: str, first: list[bool], final: list[bool]) -> EvalResult:
    records = [
        {
            "id": f"p{i}",
            "source": "s",
            "answer": "1",
            "samples": [
                {"completion": "Answer: 1", "extracted": "1", "correct": fc, "tokens": 3, "episode": _episode(f, fc, i)}
            ],
        }
        for i, (f, fc) in enumerate(zip(first, final, strict=True))
    ]
    files.write_jsonl(paths.EVAL / paths.checkpoint_slug(checkpoint) / "test.jsonl", records)
    found = episodes.metrics([Trajectory.model_validate(r["samples"][0]["episode"]) for r in records], MAX_TURNS)
    test = {
        "n": N,
        "accuracy": sum(final) / N,
        "accuracy_ci": [0.0, 1.0],
        "accuracy_lenient": sum(final) / N,
        "format_rate": 1.0,
        "mean_tokens": 3.0,
        "truncation_rate": 0.0,
        "accuracy_by_source": {},
        "episodes": found.model_dump(),
    }
    return EvalResult.model_validate({"sets": {"test": test}, "sampling": {"temperature": 0.0}})


# init: first right on 10, final on 14; RL: first right on 20 (12 flips up, 2 down), final right on 24
INIT_FIRST = [True] * 10 + [False] * 20
INIT_FINAL = [True] * 14 + [False] * 16
RL_FIRST = [True] * 8 + [False] * 2 + [True] * 12 + [False] * 8
RL_FINAL = [f or i < 24 for i, f in enumerate(RL_FIRST)]


@pytest.fixture
def reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    evals = {
        "base": _write("base", INIT_FIRST, INIT_FINAL),
        "sft": _write("sft", INIT_FIRST, INIT_FINAL),
        "rl/main": _write("rl/main", RL_FIRST, RL_FINAL),
    }
    compared = comparisons.comparisons(comparisons.pairs({"main": "sft"}), 0.95, 200, 0)
    text = pipeline.run(evals, {"rl/main": [{"step": 1, "reward": 0.5}]}, {}, {"seed": 0}, compared)
    return evals, compared, text, (tmp_path / paths.HTML_REPORT).read_text()


def test_first_answer_mcnemar_is_the_binomial_test_of_the_discordant_first_answers(reported):
    _, compared, _, _ = reported
    test = compared.comparisons["rl-main-vs-sft"].sets["test"]
    first = test.first_answer
    assert first is not None and (first.right_to_wrong, first.wrong_to_right) == (2, 12)
    assert first.mcnemar_p == pytest.approx(binomtest(12, 14, 0.5).pvalue)
    assert first.test == "exact McNemar" and first.verdict == "significant at 0.05 (exact McNemar)"
    assert (first.accuracy_old, first.accuracy_new) == (10 / 30, 20 / 30)
    assert test.mcnemar_p == pytest.approx(binomtest(10, 10, 0.5).pvalue)  # the final answers: greedy_test's
    # the two tests of one pair on one set are one family: Holm over 2 (the smaller p doubled, then step-down)
    assert test.family == first.family == "Holm over 2: final and first answers"
    assert test.p_adjusted == pytest.approx(2 * test.mcnemar_p)
    assert first.p_adjusted == pytest.approx(max(2 * test.mcnemar_p, first.mcnemar_p))


def test_the_report_shows_episode_metrics_first_answer_tests_and_whole_episodes(reported):
    _, _, text, page = reported
    assert "| checkpoint | episodes | success within 1 | success within 2 | first answer |" in text
    assert "| rl/main | 30 | 66.7% | 80.0% | 66.7% | 1.33 | 1.00 | 0.0% | 20.0% |" in text
    assert "First answers (episodes):" in text
    row = next(line for line in text.splitlines() if line.startswith("| rl/main vs sft | test | 30 | 33.3% → 66.7%"))
    assert row.endswith("| 2 | 12 | 0.013 (Holm over 2) | significant at 0.05 (exact McNemar) |")
    # the first 3 held-out prompts of each checkpoint, with roles, tool calls and results; fenced past the text's ```
    assert text.count("### ") == 9 and "### rl/main, prompt p2: right" in text
    assert '→ python({"code": "1"})' in text and "````text\nWhat is 0 + 1? <script>" in text
    assert '<table id="episodes-test">' in page and '<table id="paired-first-answer">' in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<dt>tool</dt><dd><pre>1\n</pre></dd>" in page


def test_the_parent_run_gets_the_headline_episode_keys(reported):
    evals, compared, _, _ = reported
    out = keys.headline_metrics(evals, compared, {"main": "sft"})
    assert out["eval/rl-main/test/episodes/success_within_2"] == pytest.approx(0.8)
    assert out["eval/rl-main/test/episodes/first_answer_accuracy"] == pytest.approx(20 / 30)
    assert set(out) >= {f"eval/{c}/test/episodes/success_within_2" for c in ("base", "sft", "rl-main")}


def test_without_episodes_the_report_has_no_episode_sections(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = _write("base", INIT_FIRST, INIT_FINAL)
    plain = EvalResult.model_validate(
        {"sets": {"test": {**result.sets["test"].dump(), "episodes": None}}, "sampling": {"temperature": 0.0}}
    )
    assert "## Episodes" not in pipeline.markdown({"base": plain})
    assert set(keys.headline_metrics({"base": plain}, comparisons.comparisons([], 0.95, 10, 0), {})) == {
        "eval/base/test/accuracy"
    }


def test_a_real_episode_renders_with_its_tool_call_and_result(generator):  # noqa: F811
    from rung.config import EvalParams, FormatParams
    from rung.envs import check
    from rung.eval import evaluate
    from rung.report import episode_tables

    row = {"id": "r0", "source": "s", "task": "basic_arithmetic", "prompt": "What is 17 * 23?", "answer": "391"}
    params = EvalParams.model_validate({"sampling": {"temperature": 0.0, "max_new_tokens": 64}})
    env = check({"name": "python", "max_turns": 3}, generator.tok)
    greedy, _, _ = evaluate.evaluate(
        generator, [row | {"meta": {"difficulty": {}}}], FormatParams(), params, 0, environment=env
    )
    messages = episode_tables.episode_messages(greedy[0]["samples"][0]["episode"])
    assert [role for role, _ in messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert messages[2][1] == '→ python({"code": "print(17 * 23)"})' and messages[3][1] == "391\n"
    assert "391" in messages[4][1]
