"""A training job's scratch directory: its checkpoints (and the files rung adds to RL ones), which of
them are complete, the fingerprint of the inputs they were written for (a resume from other inputs
starts over), and its removal."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from rung import files

FINGERPRINT = "fingerprint.json"  # the inputs the checkpoints were written for
FINAL = "final"
CURRICULUM_STATE = "curriculum.json"  # beside TRL's files in each RL checkpoint


def generation_state(rank: int) -> str:
    """The file of an RL checkpoint that holds process `rank`'s place in TRL's generation cycle (and the
    batch it is reusing, when num_iterations > 1 puts the checkpoint inside a cycle)."""
    return f"generation-{rank}.pt"


def complete_checkpoints(work_dir: Path, complete: tuple[str, ...] = ("trainer_state.json",)) -> list[Path]:
    """The checkpoints in `work_dir` that hold every file of `complete`, oldest first.

    transformers writes trainer_state.json last, so a checkpoint whose writer was killed is left
    out; one killed while writing trainer_state.json itself leaves a file that does not parse.
    """
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    def done(c: Path) -> bool:
        if not all((c / f).is_file() for f in complete):
            return False
        try:
            json.loads((c / "trainer_state.json").read_text())
        except (OSError, ValueError):
            return False
        return True

    found = [c for c in work_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if done(c)]
    return sorted(found, key=lambda c: int(c.name.rsplit("-", 1)[1]))


def resume_point(
    work_dir: Path, fingerprint: dict[str, Any], complete: tuple[str, ...] = ("trainer_state.json",)
) -> str | None:
    """The last complete checkpoint in `work_dir` (complete_checkpoints) if it was written for the
    same inputs, else None.

    The fingerprint (params, input md5s) is kept beside the checkpoints; when it changed, the old
    checkpoints belong to another experiment and are removed rather than resumed.
    """
    stamp = work_dir / FINGERPRINT
    # Compare through JSON so tuples, paths and key order do not count as changes.
    if stamp.exists() and files.read_json(stamp) == json.loads(files.dumps(fingerprint)):
        done = complete_checkpoints(work_dir, complete)
        return str(done[-1]) if done else None
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    files.write_json(stamp, fingerprint)
    return None


def discard(work_dir: Path) -> None:
    """Remove a finished job's work directory. The fingerprint goes first: a removal cut short by a
    kill then leaves checkpoints that resume_point clears instead of resuming from half of one."""
    (work_dir / FINGERPRINT).unlink(missing_ok=True)
    shutil.rmtree(work_dir)
