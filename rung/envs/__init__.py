"""Environments for multi-turn episodes: the built-ins `retry` and `python`, any class written to
TRL's environment contract by import path, their params and checks, and the tool-capable chat template.

TRL 1.16's contract (trl/trainer/grpo_trainer.py; GRPOTrainer(environment_factory=...)):

- `environment_factory` is a zero-argument callable (or a dict name -> callable, a row's `environment` column
  picking one); one instance per rollout, pooled and reused across batches (`_generate_and_score_completions`).
- `reset(**row)` is required (checked in `__init__` on an instance: a function named reset on its class). It
  gets the dataset row's columns as keywords (all of them; without `environment` in the dict case) before
  generation, and a returned string is appended to the last user message (None: nothing).
- Every public function of the class but `reset` and `get_reward` is a tool, found on the class by
  `inspect.getmembers(type(instance), inspect.isfunction)` (so properties and attributes are not tools, but a
  public staticmethod is); its schema comes from its type hints and Google-style docstring
  (transformers' get_json_schema). A tool that raises gives the model `{'error': ...}` and counts as a
  tool failure (`tools/failure_frequency`).
- `get_reward()` (optional, sync or async) is called once per finished rollout and appended as one more
  reward function, weight 1, named after the class; None means unscored (NaN). Reward functions also get
  `environments=` (the rollouts' instances).
- The loop (`_tool_call_loop`) continues a rollout only while its last assistant message has tool calls,
  up to `GRPOConfig.max_tool_calling_iterations`; tool results are appended by token concatenation (hence a
  prefix-preserving template) and masked out of the loss (`tool_mask`).

The gap: an environment never sees a plain answer, so feedback after one (`retry`) cannot run in TRL's loop,
and an environment cannot grade the final answer (rung.envs.FinalAnswer grades it as a reward function).
TRL's way in for such loops is `rollout_func` (returns prompt_ids, completion_ids, logprobs and an
`env_mask` that becomes the tool mask). rung's episode loop (rung.envs.loop: one loop for difficulty, RL
rollouts and eval) extends the contract by one hook:

    reply(self, message: str) -> str | None

called after each assistant turn without tool calls with its text; a string is the next user turn, None
ends the episode (no `reply`: the episode ends at the first plain answer, as in TRL). rung never takes it for a
tool; TRL's own loop would, but an environment that replies needs rung's loop anyway. Its first name, `_reply`,
still works. Everything else is TRL's contract, so a class written for TRL runs in both loops.
"""

from rung.envs.episode import Episode, FinalAnswer
from rung.envs.python import Python, PythonSettings
from rung.envs.retry import Retry, RetrySettings
from rung.envs.spec import BUILTINS, Environment, EnvironmentParams, check

__all__ = [
    "BUILTINS",
    "Environment",
    "EnvironmentParams",
    "Episode",
    "FinalAnswer",
    "Python",
    "PythonSettings",
    "Retry",
    "RetrySettings",
    "check",
]
