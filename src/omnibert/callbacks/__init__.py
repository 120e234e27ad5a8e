"""Lightning callbacks and plugins omnibert needs that Lightning does not ship.

* :class:`~omnibert.callbacks.throughput.PretrainingThroughput`: samples, real tokens,
  real sequences per second, FLOPs and MFU.
* :class:`~omnibert.callbacks.checkpoint_io.AtomicCheckpointIO`: write-then-rename checkpoints.
* :class:`~omnibert.callbacks.checkpoint.PretrainingCheckpoint`: ``ModelCheckpoint`` that
  also saves the final step.
* :class:`~omnibert.callbacks.batch_progress.CompletedBatchProgress`: checkpoints written in
  ``on_train_batch_end`` by Lightning < 2.5 resume with the next batch.
"""

from omnibert.callbacks.batch_progress import CompletedBatchProgress
from omnibert.callbacks.checkpoint import PretrainingCheckpoint
from omnibert.callbacks.checkpoint_io import AtomicCheckpointIO
from omnibert.callbacks.throughput import PretrainingThroughput

__all__ = [
    "AtomicCheckpointIO",
    "CompletedBatchProgress",
    "PretrainingCheckpoint",
    "PretrainingThroughput",
]
