"""SFT traces for the `retry` environment (issue #47): wrong-then-right episodes by rejection sampling, their
feedback turn, first-try-right traces beside them, the seeded sampling path they share with `rejection`, the
refusals, and SFT's loss on the right answer only."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from rung import config, files, models, paths
from rung.config import EnvironmentParams, FormatParams, SFTParams
from rung.config.data import RetryTraces
from rung.data import traces
from rung.envs import Retry, RetrySettings
from rung.generate.completion import Completion, Generator
from rung.report import keys
from tests.rows import sums

FMT = FormatParams()
ROWS = sums(4, lambda i: 2)  # 'Calculate i + 2.', answer i + 2
SCRIPT = {  # per row: its samples (row 0: wrong, no answer, right; 1: right only; 2: wrong only; 3: no answer)
    "0": ["Answer: 5", "no idea", "0 + 2 = 2\nAnswer: 2", "Answer: 2"],
    "1": ["Answer: 3", "so it is 3"],
    "2": ["Answer: 9", "it is 7"],
    "3": ["hmm", "well"],
}


def scripted(tiny_model) -> Generator:
    """A sampler whose samples are known, so that the grading is: each prompt's SCRIPT, whatever n."""
    tok = models.load_tokenizer(tiny_model)

    def row_id(prompt_ids: list[int]) -> str:
        return next(r["id"] for r in ROWS if r["prompt"] in tok.decode(prompt_ids))

    return Generator(tok, lambda prompts, sampling, n, seed, desc: [
        [Completion(t, 4, False) for t in SCRIPT[row_id(p)]] for p in prompts
    ])  # fmt: skip


def test_an_episode_is_a_wrong_sample_the_feedback_and_a_right_sample_graded_as_the_environment_grades(tiny_model):
    src = RetryTraces(type="retry", first_try=0.0)
    out, stats = traces.retry_episodes(scripted(tiny_model), ROWS, src, FMT, seed=0, feedback="Let's try again.")
    [episode] = out  # row 0 only: rows 1 and 2 have only right or only wrong samples, row 3 states no answer
    assert episode["id"] == "0" and episode["origin"] == "retry:base"
    assert [m["role"] for m in episode["history"]] == ["assistant", "user"]
    (wrong, feedback), right = (m["content"] for m in episode["history"]), episode["target"]
    assert (wrong, feedback, right) == ("Answer: 5", "Let's try again.", "0 + 2 = 2\nAnswer: 2")
    env = Retry(FMT, max_turns=3)  # the retry environment grades the episode's answers as its traces were picked
    env.reset(**ROWS[0])
    assert env.reply(wrong) == feedback and env.reply(right) is None
    assert env.episode.correct == [False, True] and env.get_reward() == 1.0
    assert stats == {
        "prompts": 4,
        "samples": 16,
        "correct_samples": 4,  # row 0: 2, row 1: 2 (one with the answer line appended)
        "wrong_samples": 3,  # 'no idea', 'hmm' and 'well' state no answer: neither
        "wrong_then_right": 1,
        "first_try_right": 0,
        "kept": 1,
        "prompts_with_trace": 1,
    }


def test_first_try_right_traces_are_a_seeded_share_of_the_solved_prompts(tiny_model):
    gen = scripted(tiny_model)
    every = RetryTraces(type="retry", first_try=1.0)
    out, stats = traces.retry_episodes(gen, ROWS, every, FMT, seed=0, feedback="Again.")
    assert [(t["id"], "history" in t) for t in out] == [("0", True), ("0", False), ("1", False)]
    assert out[2] == {"id": "1", "prompt": ROWS[1]["prompt"], "target": "Answer: 3", "origin": "retry:base:first_try"}
    assert (stats["wrong_then_right"], stats["first_try_right"], stats["prompts_with_trace"]) == (1, 2, 2)

    many = sums(40, lambda i: -i)  # 'Calculate i + -i.': every prompt's answer is 0, each sample right
    right = Generator(gen.tok, lambda prompts, sampling, n, seed, desc: [[Completion("Answer: 0", 2, False)]] * 40)
    half = RetryTraces(type="retry", first_try=0.5)

    def picked(seed: int) -> list[str]:
        return [t["id"] for t in traces.retry_episodes(right, many, half, FMT, seed, "Again.")[0]]

    assert picked(1) == picked(1) and len(picked(1)) == 20  # no wrong sample: first-try-right traces only
    assert picked(1) != picked(2)


def test_retry_traces_sample_through_rejection_s_seeded_path(tiny_model):
    """The real tiny model: the same prompts, samples and seed as `rejection` with the same keys, reproducibly."""
    from rung.config import SampledTraces
    from rung.generate import api

    gen = api.load(tiny_model, "float32", "transformers", "cpu")
    drawn: list = []
    spy = Generator(gen.tok, lambda *a, **kw: drawn.append(gen.generate(*a, **kw)) or drawn[-1])
    keys_ = {"num_samples": 3, "max_prompts": 3, "sampling": {"temperature": 1.0, "max_new_tokens": 6}}
    retry, rejection = RetryTraces(type="retry", **keys_), SampledTraces(type="rejection", **keys_)
    first = traces.retry_episodes(spy, ROWS, retry, FMT, 7, "Again.")
    assert traces.retry_episodes(spy, ROWS, retry, FMT, 7, "Again.") == first
    traces.sampled(spy, ROWS, rejection, FMT, 7)
    traces.retry_episodes(spy, ROWS, retry, FMT, 8, "Again.")
    assert drawn[0] == drawn[1] == drawn[2] != drawn[3]
    assert [len(s) for s in drawn[0]] == [3, 3, 3]


def test_the_stage_writes_them_with_the_experiment_s_feedback_and_counts_them_as_metrics(tiny_model, tmp_path,
                                                                                         monkeypatch):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    env = EnvironmentParams(name="retry", settings={"feedback": "Wrong, once more."})
    assert traces.retry_feedback(env) == "Wrong, once more."
    assert traces.retry_feedback(EnvironmentParams(name="retry")) == RetrySettings().feedback == "Let's try again."
    sft = SFTParams(traces=[{"type": "solutions"}, {"type": "retry", "first_try": 0}])
    stats = traces.run(ROWS, sft, FMT, 0, lambda model: scripted(tiny_model), env)
    written = files.read_jsonl(paths.TRACES)
    assert [t["origin"] for t in written] == ["solutions"] * 4 + ["retry:base"]
    assert written[-1]["history"][1] == {"role": "user", "content": "Wrong, once more."}
    logged = keys.metric_keys(stats, prefix="traces")  # what flows.stage.finish logs to MLflow
    assert logged["traces/1_retry/wrong_then_right"] == 1.0 and logged["traces/total"] == 5.0


@pytest.mark.parametrize(
    ("edits", "refusal"),
    [
        ({}, "error: sft.traces.0: retry traces are episodes of the retry environment; set environment: {name: retry}"),
        ({"environment": {"name": "python"}, "model.chat_template": "tools"}, "error: sft.traces.0: retry traces are"),
        (
            {"environment": {"name": "retry"}, "format.template": "plain"},
            "error: sft.traces.0: retry traces hold turns, which format.template: plain cannot; use chat",
        ),
        ({"environment": {"name": "retry"}}, None),  # the model's own template: the right answer is the completion
    ],
)
def test_validate_refuses_retry_traces_without_the_retry_environment(edits, refusal, default_params, tmp_path,
                                                                     monkeypatch):  # fmt: skip
    from flows.cli import app

    monkeypatch.chdir(tmp_path)
    params = config.with_overrides(default_params, {"sft.traces": [{"type": "retry"}], **edits})
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    res = CliRunner().invoke(app, ["validate", "params.yaml"])
    if refusal is None:
        assert res.exit_code == 0, res.output
    else:
        assert res.exit_code == 2 and res.output.strip().splitlines() == [res.output.strip()], res.output
        assert res.output.strip().startswith(refusal), res.output


def test_sft_trains_the_right_answer_never_the_wrong_one_or_the_feedback(tiny_model, tmp_path, monkeypatch):
    """The SFT stage's own trainer (rung.train.sft) on retry traces, with the model's own chat template."""
    from transformers import AutoTokenizer

    from rung.train import harness, sft
    from rung.train.jobs import SFTJob
    from tests.tiny_model import job

    init, tok = tiny_model, AutoTokenizer.from_pretrained(tiny_model)
    src = RetryTraces(type="retry", first_try=1.0)
    out, _ = traces.retry_episodes(scripted(tiny_model), ROWS, src, FMT, seed=0, feedback="Let's try again.")
    data = tmp_path / "traces.jsonl"
    files.write_jsonl(data, out)
    captured = {}

    def fit(trainer, *args) -> None:  # rung's fit, after keeping the examples TRL tokenized for training
        captured["rows"] = list(trainer.train_dataset)
        fit_as_shipped(trainer, *args)

    fit_as_shipped = harness.fit
    monkeypatch.setattr(harness, "fit", fit)
    params = SFTParams(max_steps=1, per_device_train_batch_size=3, max_length=128)
    result = sft.train(job(SFTJob, init, data, tmp_path / "work", key="sft", params=params, seed=3))
    assert result.metrics["steps"] == 1.0 and result.metrics["examples"] == 3.0
    episode, first_try, _ = captured["rows"]
    learned = tok.decode([i for i, m in zip(episode["input_ids"], episode["labels"], strict=True) if m != -100])
    everything = tok.decode(episode["input_ids"])
    assert "Let's try again." in everything and "Answer: 5" in everything and "Calculate 0 + 2." in everything
    # the right answer is trained; the prompt, the wrong answer and the feedback user turn are its context
    assert learned == "0 + 2 = 2\nAnswer: 2<|im_end|>\n"  # as single-turn SFT on this template
    assert tok.decode([i for i, m in zip(first_try["input_ids"], first_try["labels"], strict=True) if m != -100]) == (
        "0 + 2 = 2\nAnswer: 2<|im_end|>\n"
    )
