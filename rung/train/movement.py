"""How far training moves the weights, so that a stage that did not learn says so (rung.report.health).

- Per optimizer step (`UpdateSize`, logged with the step's metrics): the update relative to the
  weights, ‖Δw‖/‖w‖, and the share of weights the step changed, over a fixed seeded sample of each
  trainable tensor (all of a tensor up to SAMPLE elements): a copy of every weight per step would
  cost as much memory as the model, and time.
- At the end of a stage (`since`), exactly: the share of the checkpoint's weights that differ from
  its init, that share within the tensors training touched at all, and ‖w - w_init‖/‖w_init‖.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from transformers import TrainerCallback

from rung.train.trl_private import train_metrics

SAMPLE = 4096
"""Elements tracked per trainable tensor per step (the whole of a smaller tensor): ~0.9M for SmolLM2-135M."""


def _local(p: torch.Tensor) -> torch.Tensor:
    """The part of a parameter this process holds: an FSDP2 DTensor's shard, a ZeRO-3 partition, or all of it."""
    if hasattr(p, "to_local"):
        return p.to_local()
    return getattr(p, "ds_tensor", p.data)


class UpdateSize(TrainerCallback):
    """Logs `update/relative` (‖Δw‖/‖w‖) and `update/changed_share` of each optimizer step, through
    the TRL trainer's per-step metrics (averaged over the steps between two logs)."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.index: list[torch.Tensor | None] | None = None
        self.before: torch.Tensor | None = None

    def _params(self, model: Any) -> list[torch.Tensor]:
        return [_local(p) for p in model.parameters() if p.requires_grad]

    @torch.no_grad()
    def _sample(self, model: Any) -> torch.Tensor:
        """The tracked elements of every trainable tensor, in one fp32 vector on the weights' device."""
        params = self._params(model)
        if self.index is None:
            g = torch.Generator().manual_seed(self.trainer.args.seed)
            self.index = [
                torch.randint(p.numel(), (SAMPLE,), generator=g).to(p.device) if p.numel() > SAMPLE else None
                for p in params
            ]
        flat = [
            p.reshape(-1) if i is None else p.reshape(-1).index_select(0, i)
            for p, i in zip(params, self.index, strict=True)
        ]
        return torch.cat([x.float() for x in flat]) if flat else torch.zeros(0)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        self.before = self._sample(model)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, model: Any = None, **_: Any) -> None:
        before, after = self.before, self._sample(model)
        assert before is not None  # on_pre_optimizer_step sampled it
        norm = float(before.norm())
        metrics = train_metrics(self.trainer)
        metrics["update/relative"].append(float((after - before).norm()) / norm if norm else 0.0)
        metrics["update/changed_share"].append(float(torch.ne(after, before).float().mean()) if len(before) else 0.0)
        self.before = None


def _tensors(model_dir: Path) -> dict[str, Path]:
    """Each tensor name of a safetensors checkpoint (one file or shards) -> its file."""
    out = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        with safe_open(f, "pt") as st:
            out.update(dict.fromkeys(st.keys(), f))
    return out


def _coarser(a: torch.dtype, b: torch.dtype) -> torch.dtype:
    return a if torch.finfo(a).eps >= torch.finfo(b).eps else b


def since(init: Path, final: Path) -> dict[str, float]:
    """How far `final` moved from `init` (both safetensors checkpoints of one architecture, compared
    tensor by tensor in the coarser of their dtypes, so that storing fp32 weights in bf16 is no
    change): `weights_changed_share` of all weights, `weights_changed_share_touched`
    within the tensors of which any element changed (a LoRA or frozen layers leave the rest as they
    were), and `weights_relative_change` ‖w - w_init‖/‖w_init‖. Empty where `init` holds no safetensors."""
    before, after = _tensors(Path(init)), _tensors(Path(final))
    names = sorted(before.keys() & after.keys())
    if not names:
        return {}
    changed = total = touched_total = 0
    delta = norm = 0.0
    for name in names:
        with safe_open(before[name], "pt") as a, safe_open(after[name], "pt") as b:
            x, y = a.get_tensor(name), b.get_tensor(name)
        common = _coarser(x.dtype, y.dtype)
        x, y = x.to(common).float(), y.to(common).float()
        moved = int((x != y).sum())
        changed += moved
        total += x.numel()
        touched_total += x.numel() if moved else 0
        delta += float((y - x).square().sum())
        norm += float(x.square().sum())
    return {
        "weights_changed_share": changed / total,
        "weights_changed_share_touched": changed / touched_total if touched_total else 0.0,
        "weights_relative_change": math.sqrt(delta / norm) if norm else 0.0,
    }
