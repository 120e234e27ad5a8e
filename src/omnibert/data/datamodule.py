"""The pretraining DataModule: checked rows → resumable, per-rank, static-shape batches.

One class for every kind of data: the row source (:mod:`omnibert.data.sources`) is chosen
by ``data.source._target_`` and built from the data config's other keys (``train_path``,
``num_train_samples``, ...), so ``data=arrow|tfrecord|hdf5|generated`` differ only in their
source. The module adds what every source shares: the batch shapes, packing
(``data.packing=none|online|offline``, :mod:`omnibert.data.packed`), the resumable per-rank
samplers and the loaders.

Everything that can be wrong with the configuration is found by :meth:`check` before any
compute and reported as one :class:`DataConfigError` sentence naming the key and the fix.

Exact resume under Lightning (verified by tests/unit/test_datamodule.py with 0 and 2 workers and
gradient accumulation, with torchdata and with the fallback loader): Lightning saves
``train_dataloader().state_dict()`` in checkpoints and restores it. Its fetcher does not
prefetch a loader that has a length, and the training loader (torchdata's
``StatefulDataLoader``, or :class:`~omnibert.data.loaders.SamplerStateDataLoader` where
torchdata is missing or Lightning is older than 2.5: :mod:`omnibert.data.loaders`) snapshots the sampler state per dispatched
batch, so a checkpoint taken after batch k resumes at batch k+1, provided the sampler's epoch
ends where Lightning's does (:func:`lightning_epoch_batches`; otherwise worker prefetch runs
past Lightning's epoch end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from torch.utils.data import DataLoader, Dataset

from omnibert.data.collate import PretrainingCollator
from omnibert.data.loaders import build_loader
from omnibert.data.packed import PackingSettings, batch_shapes, default_predictions_per_pack
from omnibert.data.samplers import EvalBatchSampler, ResumableBatchSampler
from omnibert.data.sources import DataConfigError, RowSource, RowSpec

__all__ = [
    "DataConfigError",
    "PretrainingDataModule",
    "build_loader",
    "lightning_epoch_batches",
]


def lightning_epoch_batches(trainer: pl.Trainer | None, batches: int) -> int | None:
    """Training batches per epoch that make the sampler's epoch end exactly where Lightning's
    does: capped by an integer ``limit_train_batches`` and rounded down to whole
    ``accumulate_grad_batches`` groups (every optimiser step sees a full global batch).

    Without the cap, Lightning ends its epoch early while the sampler's epoch goes on: the
    next Lightning epoch would start with the leftover batches, and loader workers would have
    consumed sampler positions past the end that a resumed run would see again.
    """
    if trainer is None:
        return None
    limit, accumulate = trainer.limit_train_batches, int(trainer.accumulate_grad_batches)
    if isinstance(limit, int):  # the app's count; a float is Lightning's default 1.0: all
        batches = min(batches, limit)
    if batches < accumulate:
        raise DataConfigError(
            f"each device gets {batches} micro batches per epoch, fewer than the "
            f"{accumulate} accumulated per optimiser step; lower the global batch size or "
            "use more data."
        )
    return batches // accumulate * accumulate


class PretrainingDataModule(pl.LightningDataModule):
    """Static-shape pretraining batches from any row source (module docstring).

    Args:
        source: the row source's class (or a ``_partial_`` of it), called with
            ``source_options`` (the data config's remaining keys).
        max_seq_length / max_predictions_per_seq: the run's row shape (``phase.*``); checked
            against the data; ``None``: the data's own (evaluating a checkpoint).
        micro_batch_size / eval_micro_batch_size: per device; a run leaves them unset,
            plans its batches from the checked data's facts and gives the final sizes once
            with :meth:`configure_batches`.
        num_workers: loader worker processes per device (0: load in this process).
        seed: the per-epoch shuffle (and generated rows) derive from it.
        shuffle: shuffle the training rows every epoch.
        pin_memory: page-locked host memory for faster host-to-GPU copies.
        packing / pack: ``data.packing`` and ``data.pack.*`` (conf/data/pack/default.yaml).
        evaluate_only: only the eval set is read (``omnibert-eval``); no training loader.

    Rank and world size come from the Trainer in :meth:`setup`; build the Trainer with
    ``use_distributed_sampler=False``.
    """

    def __init__(
        self,
        *,
        source: Callable[..., RowSource],
        max_seq_length: int | None,
        max_predictions_per_seq: int | None,
        micro_batch_size: int | None = None,
        eval_micro_batch_size: int | None = None,
        num_workers: int = 2,
        seed: int = 12345,
        shuffle: bool = True,
        pin_memory: bool = False,
        packing: str = "none",
        pack: dict[str, Any] | None = None,
        evaluate_only: bool = False,
        **source_options: Any,
    ) -> None:
        super().__init__()
        try:
            self.source = source(**source_options)
        except TypeError as err:  # an unknown key of this source
            raise DataConfigError(
                f"the data config does not fit {getattr(source, '__name__', source)} ({err}); "
                "remove the unknown data.* key or pick the data config that has it."
            ) from err
        self._shape = (max_seq_length, max_predictions_per_seq)
        self.evaluate_only = evaluate_only
        self.micro_batch_size: int | None = micro_batch_size
        self.eval_micro_batch_size: int | None = eval_micro_batch_size or micro_batch_size
        self._checked = False
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.pin_memory = pin_memory
        self._packing_config = (packing, dict(pack or {}))
        self.packing = PackingSettings()
        self.rank, self.world_size = 0, 1
        self._pack_cache: dict[str, Any] = {}

    @property
    def format(self) -> str:
        return self.source.format

    @property
    def max_seq_length(self) -> int:
        """Tokens per row: the run's, or the data's when the run left it open."""
        return self._resolved_shape()[0]

    @property
    def max_predictions_per_seq(self) -> int:
        """Masked positions per sequence: the run's, or the data's."""
        return self._resolved_shape()[1]

    def _resolved_shape(self) -> tuple[int, int]:
        seq, preds = self._shape
        if seq is None or preds is None:
            found = self.source.found_shape
            if found is None:
                raise DataConfigError(
                    "the row shape is unknown before the data is checked; call check() first."
                )
            seq, preds = seq or found[0], preds or found[1]
        return seq, preds

    # ------------------------------------------------------------------ validation
    def check(self) -> None:
        """Validate the configuration against the data; raises :class:`DataConfigError`.
        What it reads is kept: the facts a run plans its batches from. Lightning's hooks run
        it when nobody did before."""
        self._check_sizes()
        self.packing = PackingSettings.parse(*self._packing_config, DataConfigError)
        spec = RowSpec(*self._shape, self.seed)
        self.source.check(spec, train=not self.evaluate_only)
        self._checked = True
        if self.evaluate_only:
            return
        if self.packing.mode == "offline":
            self.pack_index()  # refused by sources that have none
        if self.source.num_train_known and self.micro_batch_size is not None:
            self._check_rows()  # TFRecords are counted by their conversion

    def configure_batches(self, micro_batch_size: int, eval_micro_batch_size: int) -> None:
        """The run's micro batch sizes, planned from the checked facts (:meth:`check`)."""
        self.micro_batch_size = micro_batch_size
        self.eval_micro_batch_size = eval_micro_batch_size
        self._check_sizes()
        if not self.evaluate_only and self.source.num_train_known:
            self._check_rows()

    def _check_sizes(self) -> None:
        for key, value, low in (
            ("micro_batch_size", self.micro_batch_size, 1),
            ("eval_micro_batch_size", self.eval_micro_batch_size, 1),
            ("data.num_workers", self.num_workers, 0),
        ):
            if value is not None and value < low:
                raise DataConfigError(f"{key}={value} must be at least {low}; fix {key}.")

    def _batches(self) -> tuple[int, int]:
        if self.micro_batch_size is None or self.eval_micro_batch_size is None:
            raise DataConfigError(
                "the micro batch size is not set; the run configures it (configure_batches)."
            )
        return self.micro_batch_size, self.eval_micro_batch_size

    def _check_rows(self) -> None:
        rows = self.source.num_train_samples
        per_rank = rows // self.world_size
        micro = self._batches()[0]
        if micro > per_rank:
            where = getattr(self.source, "train_path", None)
            origin = f"data.train_path={where} ({rows} rows)" if where else f"{rows} rows"
            raise DataConfigError(
                f"micro_batch_size={micro} is larger than the {per_rank} "
                f"training rows each of {self.world_size} device(s) gets from {origin}; lower "
                "the micro batch size or the number of devices, or use more data."
            )

    # ------------------------------------------------------------------ facts
    @property
    def vocab_size(self) -> int:
        """The data's vocab size (data.vocab_file, metadata.json or data.vocab_size)."""
        return self.source.vocab_size

    @property
    def vocab_file(self) -> str | None:
        return self.source.vocab_file

    @property
    def do_lower_case(self) -> bool | None:
        """Whether the text was lower-cased when prepared (None: the data does not say)."""
        return self.source.do_lower_case

    @property
    def num_train_samples(self) -> int:
        """Training rows (sequences) of all ranks together."""
        return self.source.num_train_samples

    @property
    def num_eval_samples(self) -> int:
        """Rows evaluated per validation run (0 without an eval set)."""
        return self.source.num_eval_samples

    def describe(self) -> dict[str, Any]:
        """Plain facts for the plan and logs."""
        (b, eval_b), s = self._batches(), self.max_seq_length
        p, k = self.predictions_per_pack, self.packing.sequences_per_row_max
        return {
            **self.source.describe(),
            "shuffle": self.shuffle,
            "packing": self.packing_report(),
            "max_seq_length": s,
            "max_predictions_per_seq": self.max_predictions_per_seq,
            "max_predictions_per_row": p,
            "micro_batch_size": b,
            "eval_micro_batch_size": eval_b,
            "train_batches_per_epoch": self.num_train_rows // self.world_size // b,
            "shapes": batch_shapes(b, s, p, k),
            "num_workers": self.num_workers,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    # ------------------------------------------------------------------ packing
    def pack_index(self) -> Any:
        """The offline pack index of the training rows (checked against the data)."""
        if "index" not in self._pack_cache:
            self._pack_cache["index"] = self.source.pack_index(
                self.packing.index_name(), self.packing.max_sequences_per_pack
            )
        return self._pack_cache["index"]

    @property
    def predictions_per_pack(self) -> int:
        """The ``P`` of a training row (``max_predictions_per_seq`` unpacked)."""
        s = self.packing
        if not s.enabled:
            return self.max_predictions_per_seq
        if s.mode == "offline":
            needed = int(self.pack_index().info["max_predictions_per_pack"])
            return max(needed, s.max_predictions_per_pack or 0, self.max_predictions_per_seq)
        if s.max_predictions_per_pack is not None:
            return max(s.max_predictions_per_pack, self.max_predictions_per_seq)
        return default_predictions_per_pack(
            self.max_predictions_per_seq,
            self.max_seq_length,
            s.max_sequences_per_pack,
            self.source.masked_lm_prob,
        )

    def train_batch_sampler(
        self, batch_size: int | None = None, rank: int | None = None, world_size: int | None = None
    ) -> Any:
        """This rank's training sampler (``batch_size`` rows or packs per micro batch;
        ``world_size``: the ranks it shares the data with, before the Trainer has set them)."""
        size = batch_size or self._batches()[0]
        where: dict[str, Any] = {
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_replicas": self.world_size if world_size is None else world_size,
            "rank": self.rank if rank is None else rank,
        }
        s = self.packing
        if not s.enabled:
            return ResumableBatchSampler(self.num_train_samples, size, drop_last=True, **where)
        from omnibert.data.packed_sampler import PackedBatchSampler, PackIndexBatchSampler

        if s.mode == "offline":
            return PackIndexBatchSampler(self.pack_index().packs, size, drop_last=True, **where)
        lengths, masks = self.source.row_lengths()
        return PackedBatchSampler(
            lengths,
            masks,
            size,
            pack_counts=self._pack_cache.setdefault("epoch_packs", {}),
            max_sequence_length=self.max_seq_length,
            max_sequences_per_pack=s.max_sequences_per_pack,
            max_predictions_per_pack=self.predictions_per_pack,
            buffer_size=s.buffer_size,
            algorithm=s.algorithm,
            **where,
        )

    @property
    def num_train_rows(self) -> int:
        """Rows (packs when packed) one pass over the training data makes, all ranks."""
        s = self.packing
        if not s.enabled:
            return self.num_train_samples
        if "rows" not in self._pack_cache:
            if s.mode == "offline":
                self._pack_cache["rows"] = int(self.pack_index().packs.shape[0])
            else:
                self._pack_cache["rows"] = self.train_batch_sampler(1, 0).packs_in_epoch(0)
        return int(self._pack_cache["rows"])

    @property
    def sequences_per_row(self) -> float:
        """Average sequences per training row (1.0 unpacked)."""
        return self.num_train_samples / self.num_train_rows

    def packing_report(self) -> dict[str, Any]:
        """Plain facts about the packing, for the plan and logs."""
        s = self.packing
        if not s.enabled:
            return {"mode": "none"}
        lengths = self.source.row_lengths()[0]
        rows = self.num_train_rows
        report: dict[str, Any] = {
            "mode": s.mode,
            "max_sequences_per_pack": s.max_sequences_per_pack,
            "max_predictions_per_pack": self.predictions_per_pack,
            "rows": rows,
            "sequences_per_row": round(self.sequences_per_row, 4),
            "efficiency": round(float(lengths.sum()) / (rows * self.max_seq_length), 4),
            "efficiency_unpacked": round(
                float(lengths.sum()) / (lengths.size * self.max_seq_length), 4
            ),
        }
        if s.mode == "online":
            report.update(algorithm=s.algorithm, buffer_size=s.buffer_size)
        else:
            report.update(index=str(self.pack_index().path))
        return report

    # ------------------------------------------------------------------ Lightning hooks
    def prepare_data(self) -> None:
        """Convert TFRecord / HDF5 inputs into the Arrow cache (Lightning: once per node)."""
        if not self._checked:
            self.check()
        self.source.materialize()

    def setup(self, stage: str | None = None) -> None:
        trainer = self.trainer
        if trainer is not None:
            self.rank, self.world_size = int(trainer.global_rank), int(trainer.world_size)
        if not self._checked:
            self.check()
        self.source.materialize()
        if not self.evaluate_only:
            self._check_rows()

    def train_dataloader(self) -> DataLoader[Any]:
        """The resumable, per-rank training loader (packed rows when ``data.packing`` is on:
        see :mod:`omnibert.data.packed`)."""
        sampler = self.train_batch_sampler()
        sampler.batches_per_epoch = lightning_epoch_batches(self.trainer, len(sampler))
        collator = PretrainingCollator(
            self.max_seq_length,
            self.max_predictions_per_seq,
            max_sequences_per_pack=self.packing.sequences_per_row_max,
            max_predictions_per_pack=self.predictions_per_pack,
            vocab_size=self._checked_vocab_size(),
        )
        return self._loader(self.source.rows("train"), collator, sampler)

    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        """In-order, full-size (zero-weight padded) evaluation batches of this rank's share."""
        rows = self.num_eval_samples
        if rows == 0:
            return []
        size = self._batches()[1]
        sampler = EvalBatchSampler(rows, size, num_replicas=self.world_size, rank=self.rank)
        collator = PretrainingCollator(
            self.max_seq_length,
            self.max_predictions_per_seq,
            size,
            vocab_size=self._checked_vocab_size(),
        )
        return self._loader(self.source.rows("eval"), collator, sampler)

    def _checked_vocab_size(self) -> int | None:
        """The bound of every token id the collator checks; None where the data does not
        record its vocab (TFRecord / HDF5 without data.vocab_file: ids go unchecked)."""
        try:
            return self.vocab_size
        except DataConfigError:
            return None

    def _loader(self, rows: Dataset[Any], collator: PretrainingCollator, sampler: Any) -> Any:
        return build_loader(
            rows, collator, sampler, num_workers=self.num_workers, seed=self.seed,
            pin_memory=self.pin_memory,
        )  # fmt: skip
