"""A TRL callback that notes a digest of every example its process collates (shards/rank<r>.txt in
the output directory), so a distributed test can show each rank trained on its own shard."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from transformers import TrainerCallback


class RecordExamples(TrainerCallback):
    def __init__(self) -> None:
        self.seen: list[str] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
        loader = getattr(train_dataloader, "base_dataloader", train_dataloader)  # accelerate wraps the torch loader
        inner = loader.collate_fn

        def collate(features: list[dict[str, Any]]) -> Any:
            self.seen += [hashlib.md5(str(f["input_ids"]).encode()).hexdigest() for f in features]
            return inner(features)

        loader.collate_fn = collate

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        shard = Path(args.output_dir) / "shards" / f"rank{args.process_index}.txt"
        shard.parent.mkdir(parents=True, exist_ok=True)
        shard.write_text("\n".join(self.seen) + "\n")
