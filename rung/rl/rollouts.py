"""The generation parts of an RL stage's trainer (rung.train.trl_seam's `Seam`: its hooks `rollout` and
`token_logps` call them with values), built once from the trainer TRL has set up, whose settings they read:

- the rollout engine (rung.rl.engine.RolloutEngine): rollouts through rung.generate.api instead of batched
  `model.generate`, or the stage's chosen generator (vLLM, seeded per row by rung.rl.vllm_rollouts.SeededRows;
  TRL's for a sampling setting rung's loop lacks), each call's seed its own; the same engine runs a stage's
  episodes (rung.rl.episodes), and its model is the one the held-out curve decodes with;
- the log-probs (rung.rl.logprobs.LogProbs): the prompts' shared prefix encoded once per batch and each prompt once
  per group, completions in chunks of like lengths;
- the KL probe (rung.rl.kl_probe.KLProbe), given a copy of the init: the KL from it, where TRL logs none.
"""

from __future__ import annotations

from typing import Any

from rung.rl.engine import RolloutEngine
from rung.rl.kl_probe import KLProbe
from rung.rl.logprobs import LogProbs
from rung.rl.vllm_rollouts import SeededRows
from rung.train.parts import Generation
from rung.train.trl_seam import Seam


def generation(trainer: Seam, key: str, init: Any | None = None) -> Generation:
    """The trainer's rollout engine and log-probs, and a KL probe holding `init` where given; a setting no
    generator of its rollouts does is refused naming the stage's params `key`."""
    episodes = getattr(trainer, "rollout_func", None) is not None  # rung.rl.episodes: rung's loop as TRL's
    engine = RolloutEngine.of(trainer, "episodes" if episodes else "rollouts", key, episodes)
    if engine.generator == "vllm" and trainer.args.vllm_mode == "colocate":
        # TRL hands colocated vLLM one seed per batch: rung seeds each row from this call's seed
        trainer.wrap_vllm_generate(lambda generate: SeededRows(generate, lambda: engine.last_seed))
    logprobs = LogProbs(trainer.model.config, trainer.accelerator.num_processes, trainer.accelerator.autocast)
    return Generation(engine, logprobs, None if init is None else KLProbe.of(trainer, init))
