"""``ModelCheckpoint`` that also saves the final step, so ``last.ckpt`` is always the end.

Lightning's ``ModelCheckpoint`` (2.5) writes ``last.ckpt`` at the end of training only when it
has written nothing else in the run; when ``max_steps`` is not a multiple of
``every_n_train_steps`` the last steps would be lost and phase 2 (``init_from`` phase 1's
``last.ckpt``) would start from an older model. :class:`PretrainingCheckpoint` saves the top-k
step checkpoint and ``last.ckpt`` at the end of training unless that step is already saved.
"""

from __future__ import annotations

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint


class PretrainingCheckpoint(ModelCheckpoint):
    """:class:`ModelCheckpoint` plus a save of the final training step (module docstring)."""

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._should_skip_saving_checkpoint(trainer) or trainer.global_step == 0:
            return
        candidates = self._monitor_candidates(trainer)
        self._save_topk_checkpoint(trainer, candidates)
        self._save_last_checkpoint(trainer, candidates)
