"""The fine-tuning data module: training features (tensors of equal length) in a DataLoader
whose order the run's seed fixes, each batch cut to its longest row by the run's collate
(:class:`omnibert.finetune.batching.TrimPadding`, ``data.padding``).

Like the pretraining data module it shards per rank itself (the trainer config's
``use_distributed_sampler: false`` holds for both): one process shuffles with a seeded
generator, several take a ``DistributedSampler`` (seeded, reshuffled every epoch).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from omnibert.data.loader_workers import init_worker

__all__ = ["DictDataset", "FineTuneDataModule"]


class DictDataset(torch.utils.data.Dataset):
    """Rows of a dict of equally long tensors (the default collate stacks them)."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self.tensors = dict(tensors)
        self.length = int(next(iter(self.tensors.values())).shape[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> dict[str, Any]:
        return {k: v[index] for k, v in self.tensors.items()}


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

    def train_dataloader(self) -> DataLoader[Any]:
        trainer = self.trainer
        world = trainer.world_size if trainer is not None else 1
        sampler: Any
        if world > 1:
            sampler = DistributedSampler(
                self.dataset,
                num_replicas=world,
                rank=trainer.global_rank if trainer is not None else 0,
                shuffle=True,
                seed=self.seed,
            )
            if trainer is not None:
                sampler.set_epoch(trainer.current_epoch)
        else:
            generator = torch.Generator().manual_seed(self.seed)
            sampler = RandomSampler(self.dataset, generator=generator)
        return DataLoader(
            self.dataset,
            batch_size=self.micro_batch_size,
            sampler=sampler,
            num_workers=self.num_workers,
            collate_fn=self.collate,
            # a signal to the process group stops the run at its step, not a worker under it;
            # a worker that dies is named (omnibert.data.loader_workers)
            worker_init_fn=init_worker("training") if self.num_workers else None,
        )
