"""The environments of an experiment (params `environment` and `rl.stages.<name>.environment`), checked before
any compute: each loads and keeps TRL's contract (rung.envs.check), episodes speak a chat, and one with tools
meets a chat template that renders tool calls (the model's own, or rung's with `model.chat_template: tools`)."""

from __future__ import annotations

from pathlib import Path

from rung import files
from rung.config import EnvironmentParams, Params
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
    """Every environment the experiment runs: see the module docstring."""
    _opt_out_needs_an_environment(params)
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
