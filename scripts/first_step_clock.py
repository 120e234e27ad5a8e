"""A Lightning callback that stamps the end of a process's first optimiser step: when, and
what torch's compile caches had served by then (``scripts/bench_compile_restart.py`` adds it
to each run it times: ``+callbacks.first_step._target_=first_step_clock.FirstStepClock``)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

#: torch's counters of the caches that a compile reads (the step's graphs, their autograd)
CACHE_COUNTERS = {
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss"),
}


class FirstStepClock(pl.Callback):
    """At the end of this process's first optimiser step (counted from where it started or
    resumed), writes to ``path`` the wall-clock time (``time.time()``), the step, torch's
    version and its cache counters so far."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = Path(path)
        self.start_step: int | None = None

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.start_step is None:
            self.start_step = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.path.exists() or self.start_step is None or trainer.global_step <= self.start_step:
            return  # stamped already, or inside the first step (accumulation)
        import torch
        from torch._dynamo.utils import counters

        cached = {
            group: {name: int(counters[group][name]) for name in names}
            for group, names in CACHE_COUNTERS.items()
        }
        stamp = {"time": time.time(), "step": trainer.global_step, "torch": torch.__version__,
                 "counters": cached}  # fmt: skip
        self.path.write_text(json.dumps(stamp) + "\n")
