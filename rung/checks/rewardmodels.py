"""What the learned-reward stages need before they start: pairs or step labels the data can give (every task
graded by a verifier, single-turn samples), a preference file that exists, and a launch that can run here."""

from __future__ import annotations

from pathlib import Path

from rung import compat
from rung.answers.verify import is_known_task
from rung.config import Params, PreferenceFile
from rung.errors import InputError
from rung.train import launch


def _verifiable(params: Params, key: str) -> None:
    """Samples graded by the verifier: every task of the data must have one, and the samples are single-turn."""
    unknown = sorted({s.task for s in params.curate.sources if not is_known_task(s.task)})
    if unknown:
        raise InputError(f"{key}: the verifier grades no task {unknown} of curate.sources; use pairs from a file")
    if params.environment is not None:
        raise InputError(f"{key}: samples are graded single-turn, and the experiment runs episodes (environment)")


def reward_models(params: Params) -> None:
    """Each reward model's pairs can be had and its launch runs here (and the tested trainer versions)."""
    if params.reward_models:
        compat.check()
    for name, rm in params.reward_models.items():
        key = f"reward_models.{name}"
        if isinstance(rm.pairs, PreferenceFile):
            suffix = Path(rm.pairs.path).suffix
            if suffix in (".jsonl", ".ndjson") and not Path(rm.pairs.path).is_file():
                raise InputError(f"{key}.pairs.path: {rm.pairs.path} not found")
        else:
            _verifiable(params, f"{key}.pairs")
        launch.check(rm.launch, f"{key}.launch")


def process_reward_models(params: Params) -> None:
    """Each process reward model's step labels can be had and its launch runs here (and the tested versions)."""
    if params.process_reward_models:
        compat.check()
    for name, prm in params.process_reward_models.items():
        key = f"process_reward_models.{name}"
        _verifiable(params, key)
        launch.check(prm.launch, f"{key}.launch")
