"""rung's episode loop (rung.envs.loop) and the episode metrics (rung.eval.episodes): retry and python episodes
(the real sandbox), token-level concatenation and the environment mask, max_turns and the token budget, seeded
reproducibility on the real generator, and `rollout_func` inside a real TRL GRPOTrainer step.

The loop's control flow runs on a scripted Sample (the turns a test needs, exactly); the generator, seeding and
TRL tests run rung's real generator on the tiny model, trained in a few seconds to call the python tool
(tests.test_envs._memorize)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from rung.config import FormatParams, SamplingParams
from rung.envs import Python, check, template
from rung.envs.loop import EpisodeReward, Trajectory, env_turn_ids, rollout_func, run, sampler
from rung.errors import InputError
from rung.eval.episodes import metrics, record, solved_at
from rung.generate import api
from tests.test_envs import ROW, _memorize

FMT = FormatParams()
CALL = '<tool_call>\n{{"name": "{name}", "arguments": {{"code": {code}}}}}\n</tool_call>'
# kills the sandbox's runner (the kernel drops the signal: it is the namespace's init), reads its environment
HOSTILE = "import os, signal\nos.kill(1, signal.SIGKILL)\nprint(open('/proc/1/environ').read())"


def call(code: str, name: str = "python") -> str:
    return CALL.format(name=name, code=json.dumps(code))


@pytest.fixture(scope="module")
def tok(tiny_model: Path):
    return template.apply(AutoTokenizer.from_pretrained(tiny_model))


class Scripted:
    """A Sample that says script[row][turn] (the episode's key is (row,)) and then the end-of-turn token; a turn
    longer than max_new_tokens is cut there, without it. Records each call's keys."""

    def __init__(self, tok, script: dict[int, list[str]]):
        self.tok, self.script, self.calls = tok, script, []

    def __call__(self, ids, keys, sampling, seed):
        self.calls.append(list(keys))
        out = []
        for key in keys:
            tokens = self.tok.encode(self.script[key[0]][key[-1]], add_special_tokens=False)
            cut = len(tokens) >= sampling.max_new_tokens
            out.append((tokens[: sampling.max_new_tokens] if cut else [*tokens, self.tok.eos_token_id], cut))
        return out


SAMPLING = SamplingParams(temperature=0, max_new_tokens=64)
KW = dict(sampling=SAMPLING, seed=0)


class PythonRetry(Python):
    """The python tool, and retry's feedback on a wrong answer: a tool environment with `_reply`."""

    def _reply(self, message: str) -> str | None:
        return "Let's try again." if self.episode.grade(message) is False else None


def episodes(tok, spec: dict, script: dict[int, list[str]], **kwargs) -> list[Trajectory]:
    env = check(spec, tok)
    generate = Scripted(tok, script)
    return run(
        generate,
        tok,
        [env.factory(FMT)() for _ in script],
        [ROW] * len(script),
        sampling=kwargs.pop("sampling", SAMPLING),
        max_turns=env.spec.max_turns,
        seed=0,
        **kwargs,
    )


def rendered(tok, t: Trajectory, tools) -> list[int]:
    """The episode's messages through the chat template: what token concatenation must equal."""
    return tok.apply_chat_template(t.messages, tools=tools, tokenize=True, return_dict=False)


def assert_concatenation_is_the_template(tok, t: Trajectory, tools=None):
    ids = t.prompt_ids + t.completion_ids
    full = rendered(tok, t, tools)
    # the template closes the last turn with "<|im_end|>\n"; generation stops at <|im_end|>
    assert full[: len(ids)] == ids and tok.decode(full[len(ids) :]) == "\n"
    assert len(t.env_mask) == len(t.completion_ids)


def env_text(tok, t: Trajectory) -> list[str]:
    """The completion's runs of environment tokens (env_mask 0), decoded."""
    runs, run_ids = [], []
    for token, m in zip(t.completion_ids, t.env_mask, strict=True):
        if m == 0:
            run_ids.append(token)
        elif run_ids:
            runs.append(tok.decode(run_ids))
            run_ids = []
    return runs + ([tok.decode(run_ids)] if run_ids else [])


# --- retry -----------------------------------------------------------------------------------------------


def test_retry_feedback_first_answer_discount_and_stop_on_the_right_answer(tok):
    spec = {"name": "retry", "max_turns": 3, "settings": {"discount": 0.5, "feedback": "Try once more."}}
    script = {
        0: ["17 * 23 = 381\nAnswer: 381", "Answer: 391", "never said"],
        1: ["Answer: 391", "never said", "never said"],
        2: ["Answer: 1", "Answer: 2", "Answer: 3"],
    }
    wrong_first, right_first, never = episodes(tok, spec, script)
    assert [len(e.turns) for e in (wrong_first, right_first, never)] == [2, 1, 3]
    assert [t["reply"] for t in wrong_first.turns] == ["Try once more.", None]
    assert [(t["answer"], t["correct"]) for t in wrong_first.turns] == [("381", False), ("391", True)]
    assert wrong_first.reward == 0.5 and right_first.reward == 1.0 and never.reward == 0.0  # discount**(t-1)
    assert [m["role"] for m in wrong_first.messages] == ["user", "assistant", "user", "assistant"]
    assert wrong_first.messages[2]["content"] == "Try once more."
    # the feedback is the environment's: masked out of the loss, rendered exactly as the template renders it
    assert env_text(tok, wrong_first) == ["\n<|im_start|>user\nTry once more.<|im_end|>\n<|im_start|>assistant\n"]
    for e in (wrong_first, right_first, never):
        assert_concatenation_is_the_template(tok, e)
    assert not wrong_first.cut and not right_first.cut and never.cut  # retry would have replied again
    assert record(wrong_first)["first_answer"] == "381" and record(wrong_first)["first_correct"] is False


def test_each_turn_is_one_batched_call_of_the_live_episodes(tok):
    script = {0: ["Answer: 1", "Answer: 391"], 1: ["Answer: 391", "-"], 2: ["Answer: 2", "Answer: 3"]}
    env = check({"name": "retry", "max_turns": 2}, tok)
    generate = Scripted(tok, script)
    run(generate, tok, [env.factory(FMT)() for _ in script], [ROW] * 3, sampling=SAMPLING, max_turns=2, seed=0)
    assert generate.calls == [[(0, 0), (1, 0), (2, 0)], [(0, 1), (2, 1)]]  # keys: (episode, turn)


# --- python ----------------------------------------------------------------------------------------------


def test_python_calls_run_in_the_sandbox_and_their_output_is_masked(tok):
    script = {0: [f"Let me compute.\n{call('print(17 * 23)')}", "Answer: 391"]}
    (e,) = episodes(tok, {"name": "python", "max_turns": 3}, script)
    first, last = e.turns
    assert first["text"] == "Let me compute." and first["tool_calls"] == [
        {"name": "python", "arguments": {"code": "print(17 * 23)"}}
    ]
    assert first["tool_results"] == ["391\n"] and first["tool_errors"] == 0
    assert (last["answer"], last["correct"], e.reward, e.cut) == ("391", True, 1.0, False)
    assert e.messages[2] == {"role": "tool", "name": "python", "content": "391\n"}
    assert env_text(tok, e) == [
        "\n<|im_start|>user\n<tool_response>\n391\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ]
    assert first["env_tokens"] == e.env_mask.count(0) and first["tokens"] + last["tokens"] == sum(e.env_mask)
    tools = [Python(FMT, 3).python]
    assert_concatenation_is_the_template(tok, e, tools)
    assert e.prompt_ids == tok.apply_chat_template(
        [ROW["prompt"][0]], tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )  # the prompt as TRL's _tokenize_prompts renders it, the tool's schema in the system message


def test_a_hostile_or_unknown_call_is_contained_and_the_episode_goes_on(tok):
    script = {0: [call(HOSTILE), call("1", name="shell"), "Answer: 391"]}
    (e,) = episodes(tok, {"name": "python", "max_turns": 4}, script)
    hostile, unknown, answer = e.turns
    assert "PermissionError" in hostile["tool_results"][0] and hostile["tool_errors"] == 1
    assert unknown["tool_results"] == ["{'error': 'Tool shell not found.'}"] and unknown["tool_errors"] == 1
    assert answer["correct"] and e.reward == 1.0 and e.unscored is None and not e.cut


def test_a_malformed_call_is_an_answer(tok):
    (e,) = episodes(tok, {"name": "python", "max_turns": 3}, {0: ['<tool_call>\n{"name": "pyth', "-", "-"]})
    assert len(e.turns) == 1 and e.turns[0]["tool_calls"] == [] and e.reward == 0.0 and not e.cut


def test_max_turns_cuts_an_episode_and_its_last_call_is_not_run(tok):
    (e,) = episodes(tok, {"name": "python", "max_turns": 2}, {0: [call("print(1)"), call("print(2)")]})
    assert [t["tool_results"] for t in e.turns] == [["1\n"], []]  # TRL: max_tool_calling_iterations = 1
    assert e.cut and e.reward == 0.0 and e.turns[-1]["correct"] is False  # no answer: wrong
    assert e.completion_ids[-1] == tok.eos_token_id and e.env_mask[-1] == 1  # it ends with the model's turn
    # an environment that replies to answers but never got one: wrong, not unscored
    (e,) = run(Scripted(tok, {0: [call("print(1)")] * 2}), tok, [PythonRetry(FMT, 2)], [ROW], **KW, max_turns=2)
    assert e.cut and e.reward == 0.0 and e.turns[-1]["correct"] is False


def test_the_token_budget_ends_an_episode_as_trls_rollout_does(tok):
    script = {0: [call("print('x' * 300)"), "Answer: 391"], 1: ["Answer: 39" + "1" * 40, "-"]}
    (long_output, long_turn) = episodes(tok, {"name": "python", "max_turns": 3}, script, max_completion_tokens=40)
    # the tool's output would pass the budget: not appended, the episode ends after the call
    assert len(long_output.turns) == 1 and long_output.truncated and long_output.env_mask.count(0) == 0
    assert len(long_turn.completion_ids) == 40 and long_turn.truncated and long_turn.turns[0]["truncated"]


def test_env_turn_ids_refuse_a_template_that_is_not_prefix_preserving(tok):
    bad = copy.deepcopy(tok)
    bad.chat_template = "{{ messages | length }}" + tok.chat_template  # earlier turns change as messages follow
    with pytest.raises(InputError, match="not prefix-preserving"):
        env_turn_ids(bad, [{"role": "user", "content": "again"}])


# --- the real generator ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tiny_model, tok, tmp_path_factory):
    """The tiny model trained to call python(print(17 * 23)) and then answer 391 (tests.test_envs)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _memorize(tiny_model, tok, tmp_path_factory.mktemp("episodes") / "model")
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def generator(trained):
    return api.load(trained, dtype="float32", device="cpu")


def test_a_python_episode_on_the_real_generator(generator):
    tok = generator.tok
    env = check({"name": "python", "max_turns": 3}, tok)
    (e,) = run(sampler(generator), tok, [env.factory(FMT)()], [ROW], sampling=SAMPLING, max_turns=3, seed=0)
    assert [t["tool_calls"] for t in e.turns] == [[{"name": "python", "arguments": {"code": "print(17 * 23)"}}], []]
    assert e.turns[0]["tool_results"] == ["391\n"] and e.reward == 1.0 and e.turns[1]["answer"] == "391"
    assert env_text(tok, e) == [
        "\n<|im_start|>user\n<tool_response>\n391\n\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ]
    assert_concatenation_is_the_template(tok, e, [Python(FMT, 3).python])


def test_feedback_to_a_wrong_answer_on_the_real_generator(generator):
    tok = generator.tok
    wrong = {**ROW, "answer": "390"}  # the model's memorized 391 is now wrong: the environment replies
    (e,) = run(sampler(generator), tok, [PythonRetry(FMT, 3)], [wrong], sampling=SAMPLING, max_turns=3, seed=0)
    assert len(e.turns) == 3 and e.turns[1]["reply"] == "Let's try again." and e.turns[1]["correct"] is False
    assert e.messages[4] == {"role": "user", "content": "Let's try again."}
    assert env_text(tok, e)[1] == "\n<|im_start|>user\nLet's try again.<|im_end|>\n<|im_start|>assistant\n"
    assert_concatenation_is_the_template(tok, e, [Python(FMT, 3).python])


HOT = SamplingParams(temperature=1.0, max_new_tokens=40)


def _sampled(generator, keys, seed):
    return run(
        sampler(generator),
        generator.tok,
        [PythonRetry(FMT, 3) for _ in keys],
        [{**ROW, "answer": "390"}] * len(keys),  # wrong: most episodes get feedback and go on to turn 3
        sampling=HOT,
        max_turns=3,
        seed=seed,
        keys=keys,
    )


def _story(e: Trajectory):
    return e.completion_ids, e.env_mask, e.messages


def test_episodes_are_seeded_per_row_sample_and_turn(generator):
    keys = [(row, sample) for row in range(4) for sample in range(2)]
    first = _sampled(generator, keys, seed=7)
    whole = {e.key: _story(e) for e in first}
    # a resumed run: the rows in other batches, in another order, with other rows beside them
    split = _sampled(generator, keys[5:][::-1], seed=7) + _sampled(generator, [(9, 0), *keys[:5]], seed=7)
    assert {e.key: _story(e) for e in split if e.key in whole} == whole
    assert sum(len(e.turns) == 3 for e in first) >= 4  # several turns were sampled
    assert len({json.dumps(e.messages) for e in first}) > 1  # and sampling varied them
    assert {e.key: _story(e) for e in _sampled(generator, keys, seed=8)} != whole


# --- TRL's rollout_func ----------------------------------------------------------------------------------


def _one_grpo_step(model: Path, tok, rows: list[dict], rollout, tmp_path: Path, **args):
    """One step of TRL's GRPOTrainer on `rows`, its generation through `rollout`: 2 prompts x 2 samples, fp32."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=[EpisodeReward()],
            args=GRPOConfig(
                **{
                    "output_dir": str(tmp_path),
                    "max_steps": 1,
                    "per_device_train_batch_size": 4,
                    "num_generations": 2,
                    "max_completion_length": 96,
                    "temperature": 0.1,
                    "learning_rate": 1e-5,
                    "use_cpu": True,
                    "bf16": False,  # fp32 compute, as rung's stages on the CPU (rung.train.harness)
                    "report_to": [],
                    "logging_steps": 1,
                    "save_strategy": "no",
                    "seed": 0,
                    **args,
                }
            ),
            train_dataset=Dataset.from_list(rows),
            processing_class=tok,
            rollout_func=rollout,
        )
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    return trainer


def _recording(inner):
    seen = []

    def rollout(prompts, trainer):
        out = inner(prompts, trainer)
        seen.append((prompts, out))
        return out

    return rollout, seen


def test_rollout_func_feeds_a_trl_grpo_step(trained, tmp_path):
    tok = AutoTokenizer.from_pretrained(trained)
    env = check({"name": "python", "max_turns": 3}, tok)
    rows = [ROW, {**ROW, "prompt": [{"role": "user", "content": "What is 17 * 23 ?"}], "answer": "390"}]
    rollout, seen = _recording(rollout_func(env, FMT, rows))
    trainer = _one_grpo_step(trained, tok, rows, rollout, tmp_path)
    ((prompts, out),) = seen
    assert len(prompts) == 4 and set(out) >= {"prompt_ids", "completion_ids", "logprobs", "env_mask"}
    assert out["logprobs"] is None
    for key in ("prompt_ids", "completion_ids", "env_mask", "episode_reward", "episode"):
        assert len(out[key]) == len(prompts)
    assert [len(m) for m in out["env_mask"]] == [len(c) for c in out["completion_ids"]]
    assert all(0 in m for m in out["env_mask"])  # every episode called the tool
    rewards = {json.dumps(p): r for p, r in zip(prompts, out["episode_reward"], strict=True)}
    assert rewards == {json.dumps(ROW["prompt"]): 1.0, json.dumps(rows[1]["prompt"]): 0.0}
    logged = trainer.state.log_history[0]
    # TRL took env_mask as its tool mask: it counts only the model's tokens as the completion's length
    assert logged["completions/mean_length"] == pytest.approx(sum(map(sum, out["env_mask"])) / 4)
    assert logged["completions/mean_length"] < sum(map(len, out["completion_ids"])) / 4
    assert logged["rewards/episode/mean"] == pytest.approx(0.5)


def test_an_rl_step_draws_the_episodes_evaluation_draws_with_its_seed(trained, generator, tmp_path):
    """One implementation: the episodes of an RL step (rung's loop as TRL's rollout_func, on the RL stage's own
    dataset rows) are, token for token, those evaluation draws (per_row, on the curated rows) with that call's
    seed, (prompt, sample) for (row, sample)."""
    from rung.config import SamplingParams
    from rung.envs.loop import per_row
    from rung.rl.trainers import prompts as rl_rows
    from rung.seeding import derive

    curated = [
        {"id": f"r{i}", "source": "s", "task": "basic_arithmetic", "prompt": "What is 17 * 23?", "answer": answer}
        for i, answer in enumerate(["391", "390"])
    ]
    curated[1]["prompt"] = "What is 17 * 23 ?"
    for row in curated:
        row["meta"] = {"difficulty": {}}
    dataset = rl_rows(curated, FMT).to_list()
    env = check({"name": "python", "max_turns": 3}, generator.tok)
    rollout, seen = _recording(rollout_func(env, FMT, dataset))
    _one_grpo_step(trained, generator.tok, dataset, rollout, tmp_path, temperature=1.0, top_p=1.0)
    ((prompts, out),) = seen
    order = [curated[[r["prompt"] for r in dataset].index(p)] for p in prompts[::2]]  # TRL's prompt order
    seed = derive(0, "episodes", "0", "0", "0")  # the step's first generation call, process 0
    sampling = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=96)
    evaluated = [e for row in per_row(generator, env, order, FMT, sampling, n=2, seed=seed) for e in row]
    assert [e.completion_ids for e in evaluated] == out["completion_ids"]
    assert [e.prompt_ids for e in evaluated] == out["prompt_ids"]
    assert len({json.dumps(c) for c in out["completion_ids"]}) > 1  # sampled, not one greedy episode


# --- metrics ----------------------------------------------------------------------------------------------


def test_episode_metrics(tok):
    spec = {"name": "retry", "max_turns": 3}
    script = {
        0: ["Answer: 391", "-", "-"],  # right at turn 1
        1: ["Answer: 1", "Answer: 391", "-"],  # right at turn 2
        2: ["Answer: 1", "Answer: 2", "Answer: 3"],  # never: cut at max_turns
        3: ["no answer at all", "Answer: 2", "Answer: 391"],  # right at turn 3
    }
    records = [record(e) for e in episodes(tok, spec, script)]
    assert [solved_at(r) for r in records] == [1, 2, None, 3]
    m = metrics(records, max_turns=3)
    assert m.success_within == {"1": 0.25, "2": 0.5, "3": 0.75}
    assert m.first_answer_accuracy == 0.25 and m.mean_turns == (1 + 2 + 3 + 3) / 4
    assert m.cut_at_max_turns == 0.25 and m.tool_calls_per_episode == 0 and m.tool_error_rate is None
    assert m.episodes == m.graded == 4 and m.unscored == 0
    assert set(m.flat()) == {
        "episodes",
        "graded",
        "success_within_1",
        "success_within_2",
        "success_within_3",
        "first_answer_accuracy",
        "mean_turns",
        "tool_calls_per_episode",
        "tool_error_rate",
        "cut_at_max_turns",
        "truncated",
        "unscored",
    }
    json.dumps(records)  # eval records carry them as JSON


def test_tool_metrics_and_unscored_episodes(tok, monkeypatch):
    script = {
        0: [call("print(17 * 23)"), "Answer: 391"],  # a call, then right at turn 2
        1: [call("1 / 0"), call("print(1)"), "Answer: 7"],  # an error, then wrong
    }
    records = [record(e) for e in episodes(tok, {"name": "python", "max_turns": 3}, script)]
    m = metrics(records, max_turns=3)
    assert m.tool_calls_per_episode == 1.5 and m.tool_error_rate == pytest.approx(1 / 3)
    assert m.success_within == {"1": 0.0, "2": 0.5, "3": 0.5} and m.first_answer_accuracy == 0.5
    from rung import sandbox

    def fails(program, limits):
        raise sandbox.SandboxUnavailable("no bubblewrap")

    monkeypatch.setattr(sandbox, "run", fails)
    (unscored,) = [record(e) for e in episodes(tok, {"name": "python", "max_turns": 3}, {0: script[0]})]
    assert unscored["unscored"] and unscored["reward"] is None and unscored["correct"] is None
    m = metrics([*records, unscored], max_turns=3)
    assert m.graded == 2 and m.unscored == 1 and m.success_within["3"] == 0.5  # left out, not counted wrong
