"""rung's episode loop: one implementation of multi-turn episodes for difficulty scoring, RL rollouts and
evaluation (issue #47, item 4).

Each turn, every live episode generates one assistant turn in one batched call to rung's decode loop
(rung.generate.api.generate_ids, stopped at the end-of-turn token); the turn is parsed for tool calls with the
parser TRL uses (rung.envs.template.parse); the tools run (the environment's public methods, called and their
failures reported exactly as TRL's `GRPOTrainer._tool_call_loop` does) or, for a turn without tool calls, the
environment's `reply(text)` gives the next user turn (rung's one hook beyond TRL's contract, rung/envs/__init__.py);
the tool or user turn is appended by token concatenation: the generated ids are kept exactly, the env turn's ids
are rendered as TRL renders tool results (`_get_tool_suffix_ids`'s dummy-conversation difference, which also
checks the template is prefix-preserving). An episode ends at a turn without a tool call that gets no reply,
after `max_turns` assistant turns, at a turn cut by max_new_tokens, or where the next env turn would pass the
completion budget or the model's positions (TRL drops that tool result and ends the rollout the same way). A
tool-call block that does not parse gets an error as its tool result (TRL's loop grades it as the answer).

Seeds: every turn's sampling draws from its own stream (seed, *key, turn) (rung.generate.decode.draws_for),
`key` being the episode's identity that the caller gives (its row and sample): the episodes of a row do not
depend on which other rows share its batch or on how a run was split, so a resumed run reproduces an unkilled
one's episodes.

Output: one `Trajectory` (rung.envs.trajectory) per episode with the token-level fields TRL 1.16's
`rollout_func` returns (`prompt_ids`, `completion_ids`, `env_mask`: 1 model-generated, 0 tool/environment
tokens; TRL turns `env_mask` into its `tool_mask` and trains on the 1s only, grpo_trainer.py `_generate`) and
the episode's story (messages, turns, answers, tool calls and errors, reward): dumped, the eval record.
rung.envs.rollout_func turns a batch of them into what TRL's `rollout_func` returns.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from rung.answers import formats
from rung.config import FormatParams, SamplingParams
from rung.envs.episode import Episode
from rung.envs.spec import Environment, replier, tool_names
from rung.envs.template import FIX, parse, render_ids, tool_calling_problem
from rung.envs.trajectory import Trajectory, Turn
from rung.errors import InputError
from rung.generate.api import Engine, generate_ids, positions
from rung.generate.completion import Generator, stop_ids

Sample = Callable[[list[list[int]], list[tuple[int, ...]], SamplingParams, int], list[tuple[list[int], bool]]]
"""One assistant turn for each context: (context ids, stream keys, sampling, seed) -> (generated ids ending
with the end-of-turn token if one ended them, truncated at max_new_tokens)."""


def sampler(
    source: Generator | PreTrainedModel, eos_ids: Sequence[int] | None = None, engine: Engine = "auto"
) -> Sample:
    """A Sample on rung's decode loop (compiled static-cache `generate` on CUDA) for a transformers Generator
    (rung.generate.api.load) or a model; ended by `eos_ids` (a Generator's default: its stop ids, as its own
    completions end)."""
    if isinstance(source, Generator):
        if source.model is None:
            raise InputError("episodes run on the transformers backend (generation.backend: vllm gives no token ids)")
        model, stop = source.model, list(eos_ids or stop_ids(source.model.generation_config, source.tok))
    elif eos_ids:
        model, stop = source, list(eos_ids)
    else:
        raise ValueError("sampler(model) needs the end-of-turn ids (eos_ids)")

    def sample(
        ids: list[list[int]], keys: list[tuple[int, ...]], sampling: SamplingParams, seed: int
    ) -> list[tuple[list[int], bool]]:
        out = generate_ids(model, ids, sampling, stop, n=1, seed=seed, desc=None, engine=engine, keys=keys)
        return [samples[0] for samples in out]

    return sample


MALFORMED_CALL: dict[str, Any] = {"name": None, "arguments": None}
"""A turn's record of a tool-call block that did not parse: one call, failed."""


@dataclass(frozen=True)
class Limits:
    """What bounds an episode; None: nothing."""

    completion_tokens: int | None = None
    """Tokens after the prompt, the model's and the environment's."""
    context: int | None = None
    """The model's positions (max_position_embeddings): a context stays at least one token below them."""
    turn_seconds: float | None = None
    """Wall seconds for the tool calls of one assistant turn."""


@dataclass
class _Live:
    """An episode in progress."""

    env: Any
    tools: dict[str, Callable[..., Any]]
    trajectory: Trajectory
    episode: Episode | None
    done: bool = False

    @property
    def context(self) -> list[int]:
        return self.trajectory.prompt_ids + self.trajectory.completion_ids


def _prompt_messages(columns: Mapping[str, Any]) -> list[dict[str, Any]]:
    prompt = columns.get("prompt")
    if not isinstance(prompt, list):
        raise InputError("episodes need conversational prompts (format.template: chat): a row's prompt is its messages")
    return [dict(m) for m in prompt]


def _start(tok: PreTrainedTokenizerBase, env: Any, columns: Mapping[str, Any], key: tuple[int, ...]) -> _Live:
    """reset(**columns), its observation appended to the last user message, and the prompt rendered with the
    environment's tools as TRL renders it (`_tokenize_prompts`)."""
    messages = _prompt_messages(columns)
    observation = env.reset(**columns)
    if observation is not None:
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
    tools = {name: getattr(env, name) for name in tool_names(type(env))}
    prompt_ids = render_ids(tok, messages, tools=list(tools.values()) or None, add_generation_prompt=True)
    episode = getattr(env, "episode", None)
    trajectory = Trajectory(key=key, messages=messages, prompt_ids=prompt_ids)
    return _Live(env, tools, trajectory, episode if isinstance(episode, Episode) else None)


def env_turn_ids(tok: PreTrainedTokenizerBase, messages: list[dict[str, Any]]) -> list[int]:
    """The ids of `messages` (tool results, or a user reply) appended after an assistant turn that ended with
    the end-of-turn token, through the next assistant header, their text tokenized as plain text
    (rung.envs.template.render_ids: a tool's output cannot forge a turn). TRL's `_get_tool_suffix_ids` (a
    trainer method, hence rewritten here; equal to it on ordinary text, tests/test_tool_loop_contract.py)
    generalized to a user reply: the template rendered after a dummy
    exchange with and without them; raises if the template is not prefix-preserving (token concatenation
    would then train on ids the template never renders)."""
    if messages[0]["role"] == "tool":
        call = {"type": "function", "function": {"name": messages[0]["name"], "arguments": {}}}
        assistant: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [call]}
    else:
        assistant = {"role": "assistant", "content": "dummy"}
    dummy = [{"role": "user", "content": "dummy"}, assistant]
    prefix = render_ids(tok, dummy)
    full = render_ids(tok, dummy + messages, add_generation_prompt=True)
    ends = [i for i, t in enumerate(prefix) if t == tok.eos_token_id]
    if ends:  # the generated turn ends at its end-of-turn token: what the template writes after it is the env's
        prefix = prefix[: ends[-1] + 1]
    if full[: len(prefix)] != prefix:
        raise InputError(
            f"the chat template is not prefix-preserving: an episode cannot append turns to it; fix: {FIX}"
        )
    return full[len(prefix) :]


def _call(tools: Mapping[str, Callable[..., Any]], call: Mapping[str, Any]) -> tuple[str, str, bool]:
    """(name, result text, raised): one tool call run as TRL's `_tool_call_loop` runs it."""
    if call.get("type") != "function":
        return call.get("name", "unknown"), str({"error": f"Unsupported tool call type: {call.get('type')}"}), True
    function = call["function"]
    name, arguments = function["name"], function["arguments"]
    try:
        if name not in tools:
            raise ValueError(f"Tool {name} not found.")
        if isinstance(arguments, str):  # the OpenAI form: the arguments object as a JSON string
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise ValueError(f"the arguments must be a JSON object, got {type(arguments).__name__}")
        result = tools[name](**arguments)
        if inspect.isawaitable(result):  # an async tool; TRL gathers them on its own event loop
            result = asyncio.run(_await(result))
    except Exception as e:  # noqa: BLE001 - a tool's exception is the model's to read, as in TRL
        return name, str({"error": str(e)}), True
    return name, str(result), False


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _reward(live: _Live) -> float | None:
    get_reward = getattr(live.env, "get_reward", None)
    if callable(get_reward):
        reward = get_reward()
        return asyncio.run(_await(reward)) if inspect.isawaitable(reward) else reward
    episode = live.episode
    if episode is None or episode.unscored is not None or not episode.correct or episode.correct[-1] is None:
        return None
    return float(episode.correct[-1])


class _Turns:
    """Appends one generated turn to an episode and runs the environment on it."""

    def __init__(self, tok: PreTrainedTokenizerBase, max_turns: int, limits: Limits) -> None:
        self.tok, self.max_turns, self.limits = tok, max_turns, limits
        self._replies: dict[str, list[int]] = {}  # a reply's ids: retry's feedback is the same every time

    def budget(self, t: Trajectory) -> int | None:
        """Completion tokens the episode may hold: the token budget, and a context one token short of the
        model's positions at most (TRL drops a tool result that reaches them)."""
        context = self.limits.context
        budgets = [self.limits.completion_tokens, None if context is None else context - 1 - len(t.prompt_ids)]
        return min((b for b in budgets if b is not None), default=None)

    def step(self, live: _Live, ids: list[int], truncated: bool) -> None:
        t, env, episode = live.trajectory, live.env, live.episode
        budget = self.budget(t)
        if budget is not None and len(t.completion_ids) + len(ids) > budget:
            ids, truncated = ids[: max(0, budget - len(t.completion_ids))], True
        context = live.context
        t.completion_ids += ids
        t.env_mask += [1] * len(ids)
        malformed = None
        if live.tools:
            message, malformed = parse(self.tok, ids, context, tools=list(live.tools.values()))
            malformed = None if truncated else malformed  # a block cut by the token limit is the limit's doing
        else:  # no tools to call: the turn is its text (TRL decodes a tool-less completion the same way)
            message = {"role": "assistant", "content": self.tok.decode(ids, skip_special_tokens=True)}
        t.messages.append(message)
        graded, counted = (len(episode.answers), episode.tool_errors) if episode else (0, 0)
        calls = list(message.get("tool_calls") or []) if live.tools else []
        turn = Turn(
            text=message.get("content") or "",
            tool_calls=[dict(c.get("function", c)) for c in calls] or ([MALFORMED_CALL] if malformed else []),
            tool_results=[],
            tool_errors=0,
            reply=None,
            answer=None,
            correct=None,
            tokens=len(ids),
            env_tokens=0,
            truncated=truncated,
        )
        t.turns.append(turn)
        last = len(t.turns) == self.max_turns
        env_messages: list[dict[str, Any]] = []
        if malformed:  # TRL would grade it as the answer; a model learning to call tools needs to be told
            turn["tool_errors"] += 1
            if not (last or truncated):
                error = str({"error": f"Malformed tool call, not run: {malformed}"})
                turn["tool_results"].append(error)
                env_messages.append({"role": "tool", "name": "unknown", "content": error})
        elif calls:
            if not (last or truncated):  # TRL runs no calls past max_tool_calling_iterations
                env_messages += self._run(live, calls, turn)
        elif (reply := replier(env)) is not None:
            turn["reply"] = reply(turn["text"])
            if turn["reply"] is not None:
                env_messages.append({"role": "user", "content": turn["reply"]})
        if episode is not None:
            turn["tool_errors"] += episode.tool_errors - counted
            if len(episode.answers) > graded:  # `reply` graded it
                turn["answer"], turn["correct"] = episode.answers[-1], episode.correct[-1]
        if env_messages and not (last or truncated):
            suffix = self._suffix(env_messages)
            if budget is None or len(t.completion_ids) + len(suffix) <= budget:
                t.messages += env_messages
                t.completion_ids += suffix
                t.env_mask += [0] * len(suffix)
                turn["env_tokens"] = len(suffix)
                return
            t.truncated = True  # the env turn does not fit: the episode ends here, as TRL's rollout does
        t.cut = last and (bool(turn["tool_calls"]) or turn["reply"] is not None or self._retry_wrong(env, turn))
        t.truncated = t.truncated or truncated
        self._end(live, turn, shown=not turn["tool_calls"] and replier(env) is not None)

    def _run(self, live: _Live, calls: list[dict[str, Any]], turn: Turn) -> list[dict[str, Any]]:
        """The turn's calls, one after another, as TRL runs them, until the turn's tool time is spent: a call
        that starts after it is not run (one that is running is not interrupted: the python tool's sandbox
        bounds its own)."""
        start, seconds, messages = time.monotonic(), self.limits.turn_seconds, []
        for call in calls:
            if seconds is not None and time.monotonic() - start >= seconds:
                name = call.get("function", {}).get("name", "unknown")
                result = str({"error": f"Tool call not run: the turn used its {seconds:g} s of tool time"})
                raised = True
            else:
                name, result, raised = _call(live.tools, call)
            turn["tool_results"].append(result)
            turn["tool_errors"] += raised
            messages.append({"role": "tool", "name": name, "content": result})
        return messages

    @staticmethod
    def _retry_wrong(env: Any, turn: Turn) -> bool:
        # an environment that replies stops replying at its own max_turns (retry): a wrong last answer was cut
        return replier(env) is not None and turn["correct"] is False

    def _suffix(self, messages: list[dict[str, Any]]) -> list[int]:
        if messages[0]["role"] == "tool":
            return env_turn_ids(self.tok, messages)
        text = messages[0]["content"]
        if text not in self._replies:
            self._replies[text] = env_turn_ids(self.tok, messages)
        return self._replies[text]

    @staticmethod
    def _end(live: _Live, turn: Turn, shown: bool) -> None:
        """The episode is over: its last turn, where `reply` was not `shown` it (no `reply`: TRL's contract, the
        python tool; or a tool call cut at max_turns), is graded as its final answer, as rung.envs.FinalAnswer
        grades it in TRL's loop (a turn without an answer: wrong)."""
        episode = live.episode
        if episode is not None and not shown:
            turn["correct"] = episode.grade(turn["text"])
            turn["answer"] = episode.answers[-1]
        t = live.trajectory
        t.reward, t.unscored, t.environment = _reward(live), episode.unscored if episode else None, live.env
        live.done = True


def run(
    generate: Sample,
    tok: PreTrainedTokenizerBase,
    envs: Sequence[Any],
    rows: Sequence[Mapping[str, Any]],
    *,
    sampling: SamplingParams,
    max_turns: int,
    seed: int,
    keys: Sequence[tuple[int, ...]] | None = None,
    max_completion_tokens: int | None = None,
    max_context: int | None = None,
    turn_seconds: float | None = None,
) -> list[Trajectory]:
    """Run one episode per (environment instance, row): `envs[i]` is reset with `rows[i]`'s columns (its
    `prompt` the conversation) and answers it for at most `max_turns` assistant turns of at most
    `sampling.max_new_tokens` each, `max_completion_tokens` in all (None: no total budget), a context of fewer
    than `max_context` tokens (the model's positions; None: no bound), the tool calls of a turn
    `turn_seconds` of wall time (None: no bound). `keys[i]` is
    episode i's identity for its sampling streams (e.g. (row index, sample)); default (i,). Episodes with equal
    keys, seed and sampling are identical whatever else shares their batch."""
    if len(envs) != len(rows):
        raise ValueError(f"{len(envs)} environments for {len(rows)} rows")
    if max_turns < 1:
        raise ValueError(f"max_turns must be >= 1, got {max_turns}")
    keys = [tuple(k) for k in keys] if keys is not None else [(i,) for i in range(len(rows))]
    if len(set(keys)) != len(keys):
        raise ValueError("two episodes share a key: they would sample the same streams")
    if any(tool_names(type(env)) for env in envs) and (problem := tool_calling_problem(tok)):
        raise InputError(f"the environment has tools but {problem}; fix: {FIX}")
    live = [_start(tok, env, row, key) for env, row, key in zip(envs, rows, keys, strict=True)]
    turns = _Turns(tok, max_turns, Limits(max_completion_tokens, max_context, turn_seconds))
    for turn in range(max_turns):
        now = [e for e in live if not e.done]
        if not now:
            break
        out = generate([e.context for e in now], [(*e.trajectory.key, turn) for e in now], sampling, seed)
        for e, (ids, truncated) in zip(now, out, strict=True):
            turns.step(e, ids, truncated)
    return [e.trajectory for e in live]


# --- TRL's rollout_func --------------------------------------------------------------------------------------


def per_row(
    gen: Generator,
    environment: Environment,
    rows: Sequence[Mapping[str, Any]],
    fmt: FormatParams,
    sampling: SamplingParams,
    n: int,
    seed: int,
) -> list[list[Trajectory]]:
    """`n` episodes of `environment` per row, as difficulty scoring and evaluation run them: each row's prompt put
    to the model as single-turn rollouts put it (rung.answers.formats.prompt), episode (i, j) on the sampling
    streams of row i's sample j, so a row's episodes do not depend on what else is evaluated with it. Each holds
    the budget an RL stage gives it (`budget`, `sampling.max_new_tokens` per turn) and the model's positions. Here,
    below rung.data and rung.eval, so that difficulty scoring and evaluation share it (tests/test_layers.py)."""
    factory = environment.factory(fmt)
    columns = [{**row, "prompt": formats.prompt(row["prompt"], fmt)} for row in rows]
    keys = [(i, j) for i in range(len(rows)) for j in range(n)]
    trajectories = run(
        sampler(gen),
        gen.tok,
        [factory() for _ in keys],
        [columns[i] for i, _ in keys],
        sampling=sampling,
        max_turns=environment.spec.max_turns,
        seed=seed,
        keys=keys,
        max_completion_tokens=budget(sampling.max_new_tokens, environment.spec.max_turns),
        max_context=positions(gen.model) if gen.model is not None else None,
        turn_seconds=environment.spec.turn_seconds,
    )
    return [trajectories[i * n : (i + 1) * n] for i in range(len(rows))]


def budget(turn_tokens: int, max_turns: int) -> int:
    """Tokens an episode's completion may hold in every stage: each turn's own budget, the environment's turns
    in between (RL: GRPOConfig.max_completion_length, rung.rl.trainers)."""
    return turn_tokens * max_turns
