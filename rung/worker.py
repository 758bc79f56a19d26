"""One training job on one process: `python -m rung.worker job.json` (started by rung.launch on
every rank, or called in-process). The spec holds everything the job reads, as JSON."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch.distributed as dist

from rung import io, rl, sft
from rung.config import FormatParams, RLStageParams, SFTParams
from rung.launch import RESULT


def run(spec: dict[str, Any]) -> None:
    """Train as `spec` says; the main process writes the result JSON into the work directory."""
    work_dir, fmt = Path(spec["work_dir"]), FormatParams.model_validate(spec["format"])
    common = dict(seed=spec["seed"], work_dir=work_dir, dtype=spec["dtype"], resume=spec.get("resume"))
    if spec["kind"] == "sft":
        result: dict[str, Any] = {"metrics": sft.train(Path(spec["init"]), io.read_jsonl(spec["data"]), fmt, SFTParams.model_validate(spec["params"]), **common)}
    else:
        stage = RLStageParams.model_validate(spec["params"])
        summary, curves = rl.train(Path(spec["init"]), io.read_jsonl(spec["data"]), fmt, stage, spec["buckets"], **common)
        result = {"metrics": summary, "curves": curves}
    if not dist.is_initialized() or dist.get_rank() == 0:
        io.write_json(work_dir / RESULT, result)


if __name__ == "__main__":
    run(io.read_json(sys.argv[1]))
