"""The trainer versions rung is tested with. rung overrides private methods of TRL's trainers
(in the modules OVERRIDDEN_IN names), which may change in any release: outside the tested minor versions it stops with
one line naming them rather than training with hooks that silently no longer apply."""

from __future__ import annotations

import importlib.metadata

from rung.errors import InputError

TESTED = {"trl": "1.16", "transformers": "5.23"}  # minor versions; pyproject.toml pins the same
# Private methods rung overrides, with the leading parameters they rely on (the
# rest pass through; tests/test_compat.py checks them on both trainers).
OVERRIDDEN = {
    "_calculate_rewards": ["self", "inputs", "prompts", "completions", "completion_ids_list"],
    "_generate_and_score_completions": ["self", "inputs"],
    "_save_checkpoint": ["self", "model", "trial"],
    "_load_optimizer_and_scheduler": ["self", "checkpoint"],
    "_generate_single_turn": ["self", "prompt_ids", "images", "multimodal_fields"],
    "_get_per_token_logps_and_entropies": [
        "self",
        "model",
        "input_ids",
        "attention_mask",
        "logits_to_keep",
        "batch_size",
        "compute_entropy",
        "compute_aux_loss",
    ],
}

# The one module that overrides each (tests/test_layers.py checks that no other does).
OVERRIDDEN_IN = {
    "_calculate_rewards": "rung/rl/sampling.py",
    "_generate_and_score_completions": "rung/rl/sampling.py",
    "_save_checkpoint": "rung/rl/sampling.py",
    "_load_optimizer_and_scheduler": "rung/rl/sampling.py",
    "_generate_single_turn": "rung/rl/rollouts.py",
    "_get_per_token_logps_and_entropies": "rung/rl/rollouts.py",
}


def check(installed: dict[str, str] | None = None) -> None:
    """Raise InputError when an installed trainer library is outside its tested minor version."""
    installed = installed or {name: importlib.metadata.version(name) for name in TESTED}
    for name, minor in TESTED.items():
        version = installed[name]
        if version != minor and not version.startswith(f"{minor}."):
            methods = ", ".join(f"GRPOTrainer.{m}" for m in OVERRIDDEN)
            raise InputError(
                f"{name} {version} is outside the tested {minor}.x: rung overrides {methods}; "
                f"install {name}=={minor}.* (pyproject.toml)"
            )
