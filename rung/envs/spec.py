"""An environment in params (`EnvironmentParams`) and its check before any compute (`check`): one line per
refusal, naming the key, as `rung validate` prints it."""

from __future__ import annotations

import functools
import importlib
import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError
from transformers import PreTrainedTokenizerBase
from transformers.utils import get_json_schema

from rung import sandbox
from rung.config import FormatParams
from rung.config.envs import EnvironmentParams
from rung.envs.python import Python, PythonSettings
from rung.envs.retry import Retry, RetrySettings
from rung.envs.template import FIX, tool_calling_problem
from rung.errors import InputError

BUILTINS: dict[str, tuple[type, type[BaseModel]]] = {
    "retry": (Retry, RetrySettings),
    "python": (Python, PythonSettings),
}
"""Built-in environments by name: the class and its settings model."""

REPLY = "reply"
"""rung's one hook beyond TRL's contract (rung/envs/__init__.py): the next user turn after a plain answer."""
_OLD_REPLY = "_reply"  # its first name, still read: environments written before the rename keep working
_NOT_TOOLS = ("reset", "get_reward", REPLY)  # TRL's reserved names (grpo_trainer.py, GRPOTrainer.__init__) and rung's


@dataclass(frozen=True)
class Environment:
    """A checked environment: what a stage needs to run its episodes."""

    spec: EnvironmentParams
    cls: type
    settings: BaseModel | dict[str, Any]
    """A built-in's validated settings model, or the keyword arguments of an imported class."""
    tools: tuple[str, ...]
    """The tools TRL will expose: the class's public methods but reset and get_reward."""

    @property
    def builtin(self) -> bool:
        return self.spec.name in BUILTINS

    @property
    def max_tool_calling_iterations(self) -> int:
        """GRPOConfig.max_tool_calling_iterations for max_turns assistant turns."""
        return self.spec.max_turns - 1

    @property
    def scores(self) -> bool:
        """Whether its episodes carry their own reward (rung.envs.trajectory.Trajectory.reward): a built-in
        grades the final answer with the task's verifier, any other class needs a `get_reward()`."""
        return self.builtin or callable(getattr(self.cls, "get_reward", None))

    def factory(self, fmt: FormatParams) -> Callable[[], Any]:
        """A zero-argument factory of instances: TRL's `environment_factory`. Built-ins grade answers in `fmt`."""
        if isinstance(self.settings, BaseModel):  # a built-in's settings
            return functools.partial(self.cls, fmt, self.spec.max_turns, self.settings)
        return functools.partial(self.cls, **self.settings)


def _one_line(error: ValidationError, key: str) -> str:
    first = error.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    return f"{key}.{where}: {first['msg']}" if where else f"{key}: {first['msg']}"


def _load(path: str, key: str) -> type:
    module, _, attr = path.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as e:  # noqa: BLE001 - an import runs the user's module: any error is theirs to see
        raise InputError(f"{key}.name: cannot load {path!r}: {type(e).__name__}: {e}") from None
    if not inspect.isclass(obj):
        raise InputError(f"{key}.name: {path!r} is a {type(obj).__name__}, not a class")
    return obj


def _takes_any_keyword(function: Callable[..., Any]) -> bool:
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in inspect.signature(function).parameters.values())


def _construct(cls: type, settings: dict[str, Any], key: str) -> None:
    """One instance, dropped: a class that cannot start fails here rather than at a stage's first rollout."""
    try:
        cls(**settings)
    except Exception as e:  # noqa: BLE001 - the user's constructor: any error is theirs to see
        why = " ".join(str(e).split())
        raise InputError(f"{key}.settings: {cls.__name__}(**settings) raised {type(e).__name__}: {why}") from None


def replier(env: object) -> Callable[[str], str | None] | None:
    """The environment's `reply` (or, in an environment written before it was named so, `_reply`), None if it has
    neither: then an episode ends at its first plain answer, as in TRL."""
    for name in (REPLY, _OLD_REPLY):
        hook = getattr(env, name, None)
        if callable(hook):
            return hook
    return None


def tool_names(cls: type) -> tuple[str, ...]:
    """The methods TRL exposes as tools, found as TRL finds them: functions on the class (not the instance, so
    no property runs), public, but reset and get_reward; nor rung's `reply` (TRL's own loop would take it for a
    tool, but an environment that replies runs in rung's loop: TRL's never shows it a plain answer)."""
    return tuple(
        name
        for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
        if name not in _NOT_TOOLS and not name.startswith("_")
    )


def check(
    spec: EnvironmentParams | Mapping[str, Any],
    tokenizer: PreTrainedTokenizerBase | None,
    key: str = "environment",
) -> Environment:
    """The environment `spec` names, checked without running an episode; raises InputError in one line naming the
    key for: bad settings (max_turns outside [1, 32] among them), an import path that does not load, a class
    without `reset` or whose `reset` takes no `**kwargs`, a class that raises when constructed with its settings, a
    tool without type hints or docstring, a chat template that cannot render a tool call (with the
    fix; skipped with no tokenizer, e.g. before the model is on this machine), and, for `python`, a sandbox that
    cannot isolate here."""
    if not isinstance(spec, EnvironmentParams):
        try:
            spec = EnvironmentParams.model_validate(dict(spec))
        except ValidationError as e:
            raise InputError(_one_line(e, key)) from None
    if spec.name in BUILTINS:
        cls, settings_model = BUILTINS[spec.name]
        try:
            settings: BaseModel | dict[str, Any] = settings_model.model_validate(spec.settings)
        except ValidationError as e:
            raise InputError(_one_line(e, f"{key}.settings")) from None
    else:
        cls, kwargs = _load(spec.name, key), dict(spec.settings)
        try:
            inspect.signature(cls).bind(**kwargs)
        except TypeError as e:
            raise InputError(f"{key}.settings: {spec.name} does not take them: {e}") from None
        settings = kwargs
    functions = dict(inspect.getmembers(cls, predicate=inspect.isfunction))
    if "reset" not in functions:
        raise InputError(f"{key}.name: {cls.__name__} has no reset() method, which TRL's environment contract needs")
    if not _takes_any_keyword(functions["reset"]):
        raise InputError(
            f"{key}.name: {cls.__name__}.reset takes no **kwargs, and it gets every column of a row as a keyword "
            "(prompt, answer, task, ...); add **row"
        )
    if not isinstance(settings, BaseModel):  # an imported class: constructed once here, as TRL will
        _construct(cls, settings, key)
    tools = tool_names(cls)
    for name in tools:
        try:  # how transformers renders a tool for the chat template; bound, so that `self` is not a parameter
            get_json_schema(types.MethodType(functions[name], object()))
        except Exception as e:  # noqa: BLE001 - TypeHintParsingException, DocstringParsingException, ...
            raise InputError(f"{key}.name: tool {cls.__name__}.{name}: {e}") from None
    if tools and tokenizer is not None and (problem := tool_calling_problem(tokenizer)):
        raise InputError(f"{key}: {cls.__name__} has tools ({', '.join(tools)}) but {problem}; fix: {FIX}")
    if cls is Python:
        try:
            sandbox.check()
        except sandbox.SandboxUnavailable as e:
            raise InputError(f"{key}.name: python runs code in rung.sandbox: {e}") from None
    return Environment(spec, cls, settings, tools)
