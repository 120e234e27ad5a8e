"""The fine-tuning data module: training features (tensors of equal length) in a loader whose
order the run's seed fixes and whose position checkpoints keep, each batch cut to its longest
row by the run's collate (:class:`omnibert.finetune.batching.TrimPadding`, ``data.padding``).

Like the pretraining data module it shards per rank itself (the trainer config's
``use_distributed_sampler: false`` holds for both), and its loader is pretraining's
(:func:`omnibert.data.loaders.build_loader`: torchdata's ``StatefulDataLoader``, named worker
deaths): Lightning saves the position of the batches handed out, so a run stopped inside an
epoch resumes with the very next batch. The order is the one torch's ``RandomSampler`` (one
process) or ``DistributedSampler`` (several, reshuffled every epoch) gives
(:class:`~omnibert.data.samplers.TorchOrderBatchSampler`), the short last batch kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from omnibert.data.loaders import build_loader
from omnibert.data.samplers import TorchOrderBatchSampler

__all__ = ["DictDataset", "FineTuneDataModule", "batches_taken", "lightning_epoch_cap"]


class DictDataset(torch.utils.data.Dataset):
    """Rows of a dict of equally long tensors (the default collate stacks them)."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.tensors = dict(tensors)
        self.length = int(next(iter(self.tensors.values())).shape[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[index] for k, v in self.tensors.items()}


def batches_taken(limit: int | float, batches: int) -> int:
    """The micro-batches Lightning takes of an epoch of ``batches`` under a
    ``limit_train_batches`` of ``limit`` (an integer count or a fraction, as Lightning counts
    them); what the fine-tuning plan counts its steps from."""
    return min(batches, limit) if isinstance(limit, int) else int(batches * limit)


def lightning_epoch_cap(trainer: pl.Trainer | None, batches: int) -> int | None:
    """The micro-batches Lightning takes of an epoch of ``batches`` under
    ``trainer.limit_train_batches`` (:func:`batches_taken`), None when it takes them all:
    the sampler's epoch must end where Lightning's does, or the next epoch would begin again
    at the start of the cut one (its iterator begins where the last whole epoch ended)."""
    taken = batches_taken(1.0 if trainer is None else trainer.limit_train_batches, batches)
    return taken if 0 < taken < batches else None


class FineTuneDataModule(pl.LightningDataModule):
    """``train_dataloader`` over ``tensors`` in micro batches of ``micro_batch_size``."""

    def __init__(
        self,
        tensors: Mapping[str, Any],
        micro_batch_size: int,
        seed: int,
        num_workers: int = 0,
        collate: Any = None,
    ) -> None:
        super().__init__()
        self.collate = collate
        self.dataset = DictDataset(tensors)
        self.micro_batch_size = micro_batch_size
        self.seed = seed
        self.num_workers = num_workers

    def train_batch_sampler(
        self, world_size: int | None = None, rank: int | None = None
    ) -> TorchOrderBatchSampler:
        """This rank's training sampler (``world_size``/``rank``: before the Trainer sets
        them, e.g. to check a checkpoint's position against it)."""
        trainer = self.trainer
        if world_size is None:
            world_size = trainer.world_size if trainer is not None else 1
        if rank is None:
            rank = trainer.global_rank if trainer is not None else 0
        return TorchOrderBatchSampler(
            len(self.dataset), self.micro_batch_size, seed=self.seed, num_replicas=world_size,
            rank=rank,
        )  # fmt: skip

    def train_dataloader(self) -> DataLoader[Any]:
        sampler = self.train_batch_sampler()
        sampler.batches_per_epoch = lightning_epoch_cap(self.trainer, len(sampler))
        if self.trainer is not None:  # the epoch a checkpoint without a loader state resumes
            sampler.set_epoch(self.trainer.current_epoch)
        return build_loader(
            self.dataset, self.collate, sampler, num_workers=self.num_workers, seed=self.seed
        )
