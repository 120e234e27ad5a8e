"""A checkpoint of the state the run is in now, written like the periodic ones: what a run
that has to stop in the middle of training (a signal, non-finite gradients) leaves behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl

__all__ = ["save_now"]


def save_now(trainer: pl.Trainer) -> str | None:
    """Save the current step through the run's checkpoint callback: its ``step-*.ckpt`` and
    ``last.ckpt`` (unless it saved this step already); a callback that keeps no
    ``last.ckpt`` of its own (fine-tuning's ``final.ckpt``) gets a ``last.ckpt`` beside.
    Returns the path of ``last.ckpt`` (None: the run has no checkpoint callback). Call it at
    the end of an optimiser step, where the periodic checkpoints are written, so the result
    resumes exactly like them."""
    checkpointing: Any = trainer.checkpoint_callback
    if checkpointing is None:
        return None
    if getattr(checkpointing, "save_last", False):
        if getattr(checkpointing, "_last_global_step_saved", -1) != trainer.global_step:
            candidates = checkpointing._monitor_candidates(trainer)
            checkpointing._save_topk_checkpoint(trainer, candidates)
            checkpointing._save_last_checkpoint(trainer, candidates)
        return checkpointing.last_model_path or None
    dirpath = getattr(checkpointing, "dirpath", None) or trainer.default_root_dir
    path = Path(str(dirpath)) / "last.ckpt"
    trainer.save_checkpoint(path)
    checkpointing.last_model_path = str(path)
    return str(path)
