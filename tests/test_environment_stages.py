"""Episodes in the stages (issue #47): evaluation runs the experiment's environment through rung's episode loop,
grades each episode's final answer as single-turn completions are graded, keeps the whole episode in the record,
and summarizes the episodes (success within t turns, first answer, tool calls) in the set's metrics."""

from __future__ import annotations

import json

import pytest
import torch

from rung.config import EvalParams, FormatParams
from rung.envs import check
from rung.eval import evaluate
from rung.eval.results import EvalResult
from rung.report import keys
from tests.test_episodes import generator, tok, trained  # noqa: F401 - the fixtures: the tiny model that calls python

FMT = FormatParams()
ROWS = [  # curated rows: the trained model calls python(print(17 * 23)), then answers 391
    {"id": f"r{i}", "source": "s", "task": "basic_arithmetic", "prompt": "What is 17 * 23?", "answer": answer}
    for i, answer in enumerate(["391", "390"])
]
for row in ROWS:
    row["meta"] = {"difficulty": {}}
PARAMS = EvalParams.model_validate(
    {"sampling": {"temperature": 0.0, "max_new_tokens": 64}, "samples": {"n": 2, "max_new_tokens": 64}}
)


@pytest.fixture(scope="module")
def python_eval(generator):  # noqa: F811
    env = check({"name": "python", "max_turns": 3}, generator.tok)
    return evaluate.evaluate(generator, ROWS, FMT, PARAMS, seed=0, environment=env)


def test_evaluation_runs_episodes_and_grades_their_final_answers(python_eval):
    greedy, sampled, result = python_eval
    right, wrong = (r["samples"][0] for r in greedy)
    assert right["episode"]["tool_calls"] == 1 and right["episode"]["turns"][0]["tool_results"] == ["391\n"]
    assert (
        right["correct"]
        and right["extracted"] == "391"
        and right["completion"] == right["episode"]["turns"][-1]["text"]
    )
    assert not wrong["correct"]
    assert right["tokens"] == right["episode"]["tokens"] > 0
    assert [len(r["samples"]) for r in sampled] == [2, 2] and all("episode" in s for r in sampled for s in r["samples"])
    json.dumps(greedy)  # records are written as JSON lines


def test_an_eval_set_summarizes_its_episodes(python_eval):
    result = python_eval[2]
    assert result.accuracy == 0.5
    episodes = result.episodes
    assert set(episodes["success_within"]) == {"1", "2", "3"}
    assert episodes["success_within"]["1"] == 0.0 and episodes["success_within"]["2"] == 0.5
    assert episodes["tool_calls_per_episode"] == 1.0 and episodes["tool_error_rate"] == 0.0
    logged = keys.eval_metrics(EvalResult.model_validate({"sets": {"test": result.dump()}}))
    assert logged["test/episodes/success_within_2"] == 0.5 and logged["test/episodes/mean_turns"] > 1


def test_without_an_environment_evaluation_is_single_turn(generator):  # noqa: F811
    greedy, _, result = evaluate.evaluate(generator, ROWS, FMT, PARAMS.model_copy(update={"samples": None}), seed=0)
    assert "episode" not in greedy[0]["samples"][0] and result.episodes is None


def _arithmetic_rows(n: int) -> list[dict]:
    import reasoning_gym

    return [
        {
            "id": f"a{i}",
            "source": "s",
            "task": "basic_arithmetic",
            "prompt": x["question"],
            "answer": x["answer"],
            "meta": x["metadata"],
        }
        for i, x in enumerate(
            reasoning_gym.create_dataset(
                "basic_arithmetic", size=n, seed=3, min_terms=2, max_terms=3, min_digits=1, max_digits=1
            )
        )
    ]


def test_tool_call_traces_run_the_tool_and_sft_trains_only_the_assistants_tokens(tiny_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from rung.answers.verify import is_correct
    from rung.config import ToolTraces
    from rung.data.traces import from_tool_calls
    from rung.envs import template
    from rung.train.sft import examples

    rows = _arithmetic_rows(4)
    traces = from_tool_calls(rows, ToolTraces(type="tool_calls"), FMT)
    # a row whose printed value is not its answer, as the grader reads values (6 / 3 prints 2.0: the answer 2),
    # is skipped, never trained on
    by_id = {r["id"]: r for r in rows}
    printed = [(t["messages"][1]["content"].strip(), by_id[t["id"]]) for t in traces]
    assert 2 <= len(traces) <= 4 and all(is_correct(value, row) for value, row in printed)
    call, tool, final = traces[0]["messages"]
    first = by_id[traces[0]["id"]]
    assert call["tool_calls"][0]["function"]["arguments"]["code"] == f"print({first['meta']['expression']})"
    assert tool["content"].endswith("\n") and is_correct(tool["content"].strip(), first)  # the sandbox's output
    assert final["content"] == f"Answer: {first['answer']}"

    tools_tok = template.apply(AutoTokenizer.from_pretrained(tiny_model))
    args = SFTConfig(
        output_dir=str(tmp_path),
        max_steps=3,
        learning_rate=1e-2,
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        completion_only_loss=True,
        seed=0,
    )
    trainer = SFTTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny_model),
        args=args,
        train_dataset=examples(traces, FMT, tools_tok),
        processing_class=tools_tok,
    )
    example = trainer.train_dataset[0]
    learned = [i for i, m in zip(example["input_ids"], example["labels"], strict=True) if m != -100]
    text = tools_tok.decode(learned)
    assert "<tool_call>" in text and f"Answer: {first['answer']}" in text  # the assistant's turns are trained
    assert "<tool_response>" not in text and "user" not in text  # the tool's output and the prompt are not
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    trainer.train()
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())
