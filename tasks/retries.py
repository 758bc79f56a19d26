"""When a Prefect task's failure is worth retrying."""

from __future__ import annotations

from typing import Any

from rung.errors import InputError


def unless_input_error(task: Any, task_run: Any, state: Any) -> bool:  # Prefect's retry_condition_fn signature
    """Retry what may be transient (a hub download, a network file system); never bad input."""
    try:
        state.result()
    except InputError:
        return False
    except Exception:  # noqa: BLE001 - anything else may be transient
        return True
    return False
