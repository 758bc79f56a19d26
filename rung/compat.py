"""The trainer versions rung is tested with. rung reaches into private methods and state of TRL's
trainers (all of it in rung/train/trl_seam.py and rung/train/trl_private.py, whose tests check it against
the pinned TRL), which may change in any release: outside the tested minor versions it stops with one line
rather than training with hooks that silently no longer apply. This module imports no trainer library, so that
the stages' preflight can run it before they load one (tests/test_startup.py)."""

from __future__ import annotations

import importlib.metadata

from rung.errors import InputError

TESTED = {"trl": "1.16", "transformers": "5.23"}  # minor versions; pyproject.toml pins the same
SEAM = "rung/train/trl_seam.py"


def check(installed: dict[str, str] | None = None) -> None:
    """Raise InputError when an installed trainer library is outside its tested minor version."""
    installed = installed or {name: importlib.metadata.version(name) for name in TESTED}
    for name, minor in TESTED.items():
        version = installed[name]
        if version != minor and not version.startswith(f"{minor}."):
            raise InputError(
                f"{name} {version} is outside the tested {minor}.x: rung overrides private methods of its "
                f"trainers ({SEAM} lists them); install {name}=={minor}.* (pyproject.toml)"
            )
