"""The environment of multi-turn episodes in params: one `environment` for the experiment, which
difficulty scoring, SFT traces, every RL stage and every evaluation run, so that the held-out number measures
what was trained; an RL stage may set its own (`rl.stages.<name>.environment`, e.g. `retry` before `python`).
The built-ins and the checks that need the model's tokenizer live in rung.envs (`rung validate` runs them)."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from rung.config.base import Section, known_or_import_path

# The most turns an episode may take. Every turn t adds a metric per RL step (`episodes/success_within_<t>`) and per
# eval set, and a column to the report's episode table; 32 is beyond the turns the multi-turn RL recipes train (UFO:
# up to 5 answers; tool-integrated reasoning: a few calls), and a longer agent task wants a token budget, not turns.
MAX_TURNS = 32
# The names of rung.envs.BUILTINS (tests/test_envs.py checks it), here so that params validate without
# importing the environments and the sandbox.
BUILTIN_ENVIRONMENTS = ("retry", "python")


class EnvironmentParams(Section):
    """An episode's environment: a built-in or any class written to TRL's environment contract."""

    name: str
    """`retry` (UFO: a fixed reply to a wrong answer, up to max_turns answers), `python` (a `python(code)` tool
    run in rung.sandbox), or the import path `package.module:Class` of a class written to TRL's environment
    contract (a `reset(**row)`, tools as public methods with type hints and a Google-style docstring, optionally
    `get_reward()`); it need not import rung."""
    max_turns: int = Field(3, ge=1, le=MAX_TURNS)
    """Assistant turns per episode at most (answers for retry; tool calls plus the final answer for python); at
    most 32, as each turn adds a metric per step and eval set (success within t turns).
    TRL's `max_tool_calling_iterations` is max_turns - 1. An episode holds max_turns times a turn's tokens in
    all, the environment's included (max_new_tokens in evaluation and difficulty scoring, max_completion_length
    in RL), below the model's positions."""
    turn_seconds: float = Field(30.0, gt=0, le=3600)
    """Wall seconds the tool calls of one assistant turn may take together: a call that would start later is
    not run and the model reads an error (a running call is not interrupted; the python tool's own limit is
    10 s)."""
    settings: dict[str, Any] = {}
    """The environment's own settings: retry {feedback: "Let's try again.", discount: 1.0}; python
    {max_output: 1000}; or the keyword arguments an imported class is constructed with."""

    @model_validator(mode="before")
    @classmethod
    def _short_form(cls, data: Any) -> Any:
        """`environment: python` is `{name: python}`: a name alone takes the defaults."""
        return {"name": data} if isinstance(data, str) else data

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        return known_or_import_path(name, BUILTIN_ENVIRONMENTS, "a built-in", "module:Class")
