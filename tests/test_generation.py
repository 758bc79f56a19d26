from __future__ import annotations

import pytest

from rung import models
from rung.config import DifficultyParams, EvalParams, FormatParams, SamplingParams
from rung.difficulty import keep, pass_rates, summarize
from rung.evaluate import evaluate
from rung.generation import generate, render

FMT = FormatParams()
ROWS = [
    {"id": str(i), "source": "s", "task": "basic_arithmetic", "prompt": f"Calculate {i} + 1.", "answer": str(i + 1), "meta": {}}
    for i in range(5)
]


@pytest.fixture(scope="module")
def loaded(tiny_model):
    return models.load(tiny_model)


def test_sampling_is_seeded_and_in_input_order(loaded):
    model, tok = loaded
    prompts = render(tok, [[{"role": "user", "content": r["prompt"] * (1 + i % 3)}] for i, r in enumerate(ROWS)])
    sampling = SamplingParams(temperature=1.0, max_new_tokens=6, batch_size=4)
    a = generate(model, tok, prompts, sampling, n=3, seed=1)
    b = generate(model, tok, prompts, sampling, n=3, seed=1)
    c = generate(model, tok, prompts, sampling, n=3, seed=2)
    assert [len(x) for x in a] == [3] * 5
    assert a == b and a != c
    assert all(0 < s.tokens <= 6 and s.truncated == (s.tokens == 6) for x in a for s in x)
    # each prompt's samples do not depend on the batch it shares with others
    solo = generate(model, tok, prompts[:1], SamplingParams(temperature=0, max_new_tokens=6), n=1)
    batched = generate(model, tok, prompts, SamplingParams(temperature=0, max_new_tokens=6), n=1)
    assert solo[0][0].text == batched[0][0].text


def test_greedy_with_several_samples_is_refused(loaded):
    model, tok = loaded
    with pytest.raises(ValueError, match="temperature"):
        generate(model, tok, ["x"], SamplingParams(temperature=0), n=2)


def test_difficulty_and_eval_records(loaded):
    model, tok = loaded
    params = DifficultyParams(num_generations=2, sampling=SamplingParams(max_new_tokens=4))
    scores = pass_rates(model, tok, ROWS, FMT, params, seed=0)
    assert [s["id"] for s in scores] == [r["id"] for r in ROWS] and all(len(s["scores"]) == 2 for s in scores)
    stats = summarize(scores, kept=len(keep(scores, params)))
    assert stats["prompts"] == 5 and stats["kept"] == 5 and 0 <= stats["zero_variance_fraction"] <= 1
    params = EvalParams(sampling=SamplingParams(temperature=0, max_new_tokens=4), samples=dict(n=3, max_new_tokens=4, max_prompts=2))
    greedy, sampled, metrics = evaluate(model, tok, ROWS, FMT, params, seed=0)
    assert len(greedy) == 5 and metrics["n"] == 5 and metrics["truncation_rate"] == 1.0
    assert len(sampled) == 2 and all(len(r["samples"]) == 3 for r in sampled)
    assert set(metrics["pass_at_k"]) == {"1", "2", "3"} and metrics["accuracy_by_difficulty"] == {"unknown": metrics["accuracy"]}


def test_keep_window():
    scores = [{"id": "a", "pass_rate": 0.0}, {"id": "b", "pass_rate": 0.5}, {"id": "c", "pass_rate": 1.0}]
    assert keep(scores, DifficultyParams(pass_rate_min=0.1, pass_rate_max=0.6)) == {"b"}
