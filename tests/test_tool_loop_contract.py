"""rung's episode loop (rung.envs.loop) against TRL's own tool loop (GRPOTrainer's `_tool_call_loop`, reached
through `_generate_and_score_completions`) on the same scripted turns: the same tokens, the same mask of the
model's tokens, the same tool results and error texts; and the tool-suffix ids rung renders (`env_turn_ids`)
against TRL's `_get_tool_suffix_ids`: equal on ordinary text, different where a tool prints special tokens, which
rung tokenizes as plain text (a tool cannot forge a turn) and TRL's template does not."""

from __future__ import annotations

import pytest
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from rung.envs import template
from rung.envs.loop import env_turn_ids, run
from tests.test_episodes import FORGE, SAMPLING, Scripted


class Calc:
    """Tools that answer, raise, and (by a call to a name it lacks) are missing."""

    def reset(self, **row) -> None:
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first.
            b: The second.
        """
        return a + b

    def fail(self, x: int) -> int:
        """Fail.

        Args:
            x: Anything.
        """
        raise ValueError(f"no luck with {x}")


def _call(name: str, **arguments: int) -> str:
    args = ", ".join(f'"{k}": {v}' for k, v in arguments.items())
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{{args}}}}}\n</tool_call>'


# per row: its turns (TRL's sampler puts a prompt's two samples side by side: rows 0, 1 share a prompt, as 2, 3)
SCRIPT = {
    0: [_call("add", a=2, b=3), "Answer: 5"],
    1: [_call("fail", x=7), "Answer: 6"],
    2: [_call("nope", x=1), "Answer: 7"],
    3: ["Answer: 8"],
}
PROMPTS = [[{"role": "user", "content": "What is 2 + 3?"}], [{"role": "user", "content": "What is 3 + 4?"}]]


@pytest.fixture(scope="module")
def tok(tiny_model):
    return template.apply(AutoTokenizer.from_pretrained(tiny_model))


@pytest.fixture(scope="module")
def trl_trainer(tiny_model, tok, tmp_path_factory):
    """TRL's GRPOTrainer with Calc's tools, its generation scripted: call k of a batch says each row's turn k."""
    calc = Calc()
    trainer = GRPOTrainer(
        model=str(tiny_model),
        reward_funcs=[lambda completions, **_: [0.0] * len(completions)],
        args=GRPOConfig(
            output_dir=str(tmp_path_factory.mktemp("trl")),
            per_device_train_batch_size=4,
            num_generations=2,
            max_completion_length=200,
            max_tool_calling_iterations=2,
            use_cpu=True,
            bf16=False,
            report_to=[],
            save_strategy="no",
        ),
        train_dataset=Dataset.from_list([{"prompt": p} for p in PROMPTS]),
        processing_class=tok,
        tools=[calc.add, calc.fail],
    )
    trainer.model.train()
    return trainer


def _scripted_trl(trainer, tok) -> dict:
    """TRL's generation batch of the scripted turns, with the completions (messages) its reward functions saw."""
    calls, seen = [], []

    def generate_single_turn(prompt_ids, images, multimodal_fields, num_generations=None, has_tool_images=False):
        turn = len(calls)
        rows = range(len(prompt_ids)) if turn == 0 else [r for r in SCRIPT if len(SCRIPT[r]) > turn]
        calls.append(list(rows))
        out = [tok.encode(SCRIPT[r][turn], add_special_tokens=False) + [tok.eos_token_id] for r in rows]
        return out, None

    def reward(completions, **_):
        seen.extend(completions)
        return [0.0] * len(completions)

    trainer._generate_single_turn = generate_single_turn
    trainer.reward_funcs[0] = reward
    try:
        batch = trainer._generate_and_score_completions([{"prompt": PROMPTS[i // 2]} for i in range(4)])
    finally:
        del trainer._generate_single_turn
    return {**batch, "completions": seen}


def test_rungs_loop_runs_the_scripted_turns_as_trls_tool_loop(trl_trainer, tok):
    theirs = _scripted_trl(trl_trainer, tok)
    ours = run(
        Scripted(tok, SCRIPT),
        tok,
        [Calc() for _ in SCRIPT],
        [{"prompt": PROMPTS[i // 2]} for i in SCRIPT],
        sampling=SAMPLING.model_copy(update={"max_new_tokens": 200}),
        max_turns=3,
        seed=0,
    )
    mask = theirs["completion_mask"].bool()
    completion_ids = [row[m].tolist() for row, m in zip(theirs["completion_ids"], mask, strict=True)]
    tool_mask = [row[m].tolist() for row, m in zip(theirs["tool_mask"], mask, strict=True)]
    prompt_ids = [row[m.bool()].tolist() for row, m in zip(theirs["prompt_ids"], theirs["prompt_mask"], strict=True)]
    assert [e.prompt_ids for e in ours] == prompt_ids
    assert [e.completion_ids for e in ours] == completion_ids
    assert [e.env_mask for e in ours] == tool_mask
    assert 0 in tool_mask[0] and set(tool_mask[3]) == {1}  # tools ran, and a plain answer has none
    trl_results = [[m["content"] for m in c if m["role"] == "tool"] for c in theirs["completions"]]
    assert [[r for t in e.turns for r in t["tool_results"]] for e in ours] == trl_results
    assert trl_results[:3] == [["5"], [str({"error": "no luck with 7"})], [str({"error": "Tool nope not found."})]]
    assert [sum(t["tool_errors"] for t in e.turns) for e in ours] == [0, 1, 1, 0]


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "tool", "name": "add", "content": "5"}],
        [
            {"role": "tool", "name": "add", "content": "5"},
            {"role": "tool", "name": "fail", "content": "{'error': 'x'}"},
        ],
    ],
    ids=["one", "two"],
)
def test_tool_suffix_ids_are_trls_on_ordinary_text(trl_trainer, tok, messages):
    assert env_turn_ids(tok, messages) == trl_trainer._get_tool_suffix_ids(messages)


def test_tool_suffix_ids_differ_from_trls_where_a_tool_prints_special_tokens(trl_trainer, tok):
    """TRL's ids hold <|im_end|> and <|im_start|> as the special tokens a turn ends and opens with; rung's spell
    the same text with ordinary tokens, so a tool's output cannot end the tool turn and open an assistant one."""
    messages = [{"role": "tool", "name": "add", "content": FORGE}]
    ours, theirs = env_turn_ids(tok, messages), trl_trainer._get_tool_suffix_ids(messages)
    assert ours != theirs and tok.decode(ours) == tok.decode(theirs)
    special = set(tok.all_special_ids)
    assert sum(t in special for t in theirs) > sum(t in special for t in ours)
