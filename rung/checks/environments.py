"""The environments of an experiment (params `environment` and `rl.stages.<name>.environment`), checked before
any compute: each loads and keeps TRL's contract (rung.envs.check), episodes speak a chat, and one with tools
meets a chat template that renders tool calls (the model's own, or rung's with `model.chat_template: tools`).
SFT traces that are episodes (`tool_calls`, `retry`) need their environment and a chat template that marks the
assistant's tokens (SFT trains those only)."""

from __future__ import annotations

from pathlib import Path

from rung import files
from rung.config import EnvironmentParams, Params, ToolTraces
from rung.config.data import RetryTraces
from rung.errors import InputError
from rung.models import EMBEDDED

_FIX = (
    "set model.chat_template: tools (rung's ChatML with Qwen2.5 tool calls) or use a model whose own template "
    "renders tool calls (Qwen2.5/3, Llama 3.1+)"
)


def used(params: Params) -> dict[str, EnvironmentParams]:
    """Params key -> environment, for every environment the experiment runs."""
    out = {"environment": params.environment} if params.environment else {}
    out.update(
        {f"rl.stages.{name}.environment": s.environment for name, s in params.rl.stages.items() if s.environment}
    )
    return out


def environments(params: Params) -> None:
    """Every environment the experiment runs, and the SFT traces that are its episodes: see the module docstring."""
    _opt_out_needs_an_environment(params)
    episode_traces(params)
    for key, spec in used(params).items():
        from rung import envs  # transformers and TRL: only for an experiment with episodes (the preflight stays light)

        if params.format.template != "chat":
            raise InputError(f"{key}: episodes are chats; set format.template: chat")
        env = envs.check(spec, None, key)
        if env.tools and params.model.chat_template == "model":
            problem = _template_problem(params.model.source)
            if problem:
                raise InputError(
                    f"{key}: {env.cls.__name__} has tools ({', '.join(env.tools)}) but {problem}; fix: {_FIX}"
                )


def _opt_out_needs_an_environment(params: Params) -> None:
    """`rl.stages.<name>.environment: false` opts a stage out of the experiment's environment (the single-turn
    control): without one there is nothing to opt out of, and no episodes to compare the control in."""
    for name, stage in params.rl.stages.items():
        if stage.environment is False and params.environment is None:
            raise InputError(
                f"rl.stages.{name}.environment: false opts out of the experiment's environment, and it has none "
                "(the stage is single-turn anyway); remove the key or set environment"
            )


_MARKS_FIX = (
    "set model.chat_template: tools (rung's ChatML: byte-identical without tools, with {% generation %} markers)"
)


def episode_traces(params: Params) -> None:
    """`retry` traces are episodes of the experiment's retry environment (its feedback is their user turn), with
    their wrong answer and feedback in a chat prompt; SFT trains a tool episode's assistant turns only (TRL's
    assistant_only_loss), by the chat template's generation markers, which the model's own template must have (or
    TRL a training template for it) unless rung's is set."""
    for i, trace in enumerate(params.sft.traces):
        if not isinstance(trace, RetryTraces):
            continue
        if params.environment is None or params.environment.name != "retry":
            raise InputError(
                f"sft.traces.{i}: retry traces are episodes of the retry environment; set environment: {{name: retry}}"
            )
        if params.format.template == "plain":
            raise InputError(f"sft.traces.{i}: retry traces hold turns, which format.template: plain cannot; use chat")
    episodes = [(i, t) for i, t in enumerate(params.sft.traces) if isinstance(t, ToolTraces)]
    if episodes and params.model.chat_template == "model":
        problem = _marks_problem(params.model.source)
        if problem:
            raise InputError(
                f"sft.traces.{episodes[0][0]}: {episodes[0][1].type} traces train the assistant's "
                f"turns only, but {problem}; fix: {_MARKS_FIX}"
            )


def _marks_problem(source: str) -> str | None:
    """Why SFT's assistant-only loss cannot mask the model's own chat template (TRL swaps in a training template
    only for the families it knows); None when it can, or cannot be told here (a hub id not downloaded)."""
    if source == EMBEDDED:
        return "SmolLM2-135M-Instruct's chat template does not mark them"
    path = Path(source).expanduser()
    if not (files.is_local_path(source) and path.is_dir()):
        return None
    from transformers import AutoTokenizer
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    tok = AutoTokenizer.from_pretrained(path)
    if tok.chat_template is None or has_generation_markers(tok.chat_template):
        return None  # no template at all: the chat_template check says so
    try:
        get_training_chat_template(tok)
    except ValueError:
        return "the model's chat template does not mark them and TRL has no training template for it"
    return None


def _template_problem(source: str) -> str | None:
    """Why the model's own chat template cannot carry tool calls; None when it can, or cannot be told here (a
    hub id not downloaded: the RL stage's trainer checks it)."""
    if source == EMBEDDED:
        return "SmolLM2-135M-Instruct's chat template cannot render a tool call"
    path = Path(source).expanduser()
    if not (files.is_local_path(source) and path.is_dir()):
        return None
    from transformers import AutoTokenizer

    from rung.envs import template

    return template.tool_calling_problem(AutoTokenizer.from_pretrained(path))
