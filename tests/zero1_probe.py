"""Test helper: what each rank's optimiser holds, said by a callback of a real run (the ZeRO-1
run of test_lamb_zero1.py adds it with ``+callbacks.share._target_=zero1_probe.OptimizerShare``)."""

from __future__ import annotations

import sys
from typing import Any

import lightning.pytorch as pl


class OptimizerShare(pl.Callback):
    """At the end of training, one line per rank on stderr: the optimiser's class, and the
    tensors and elements whose state this rank holds, of how many the model trains."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        optimizer: Any = trainer.optimizers[0]
        local = getattr(optimizer, "optim", optimizer)  # ZeRO: this rank's own optimiser
        held = [p for p, state in local.state.items() if state]
        trained = [p for p in pl_module.parameters() if p.requires_grad]
        sys.stderr.write(
            f"OptimizerShare: rank {trainer.global_rank} {type(optimizer).__name__} holds "
            f"{len(held)} of {len(trained)} tensors, {sum(p.numel() for p in held)} of "
            f"{sum(p.numel() for p in trained)} elements\n"
        )
        sys.stderr.flush()
