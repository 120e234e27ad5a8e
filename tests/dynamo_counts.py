"""A Lightning callback for tests that records ``torch._dynamo``'s counters after every
training batch and at the end of validation (``+callbacks.dynamo={_target_:
dynamo_counts.DynamoCounts}``), and the optimiser's update kernel at the start of training.
What it saw is kept in :data:`SEEN` (the test reads it after the run)."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import Callback

#: one entry per event: {"event": "train"|"validation", "frames", "graphs", "breaks"}
SEEN: list[dict[str, Any]] = []
#: the optimiser's update kernel as the run built it ("impl" of Lamb/AdamW)
OPTIMIZER: dict[str, str] = {}


def _counts(event: str) -> dict[str, Any]:
    from torch._dynamo.utils import counters

    return {
        "event": event,
        "frames": counters["frames"]["total"],
        "graphs": counters["stats"]["unique_graphs"],
        "breaks": sum(counters["graph_break"].values()),
    }


class DynamoCounts(Callback):
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        optimizer = trainer.optimizers[0]
        resolve = getattr(optimizer, "resolve_impl", None)
        OPTIMIZER["impl"] = resolve() if resolve is not None else optimizer.impl

    def on_train_batch_end(self, trainer: Any, *args: Any) -> None:
        SEEN.append(_counts("train"))

    def on_validation_end(self, trainer: Any, pl_module: Any) -> None:
        SEEN.append(_counts("validation"))
