"""``data.packing=none|online|offline``: the packing settings and the packed training loader.

One switch for every data module (Arrow shards, TFRecord/HDF5 through their Arrow cache,
generated data) and every accelerator: packing only changes which rows the training sampler
hands to the collator, and the collator writes several sequences per row (batch contract in
``omnibert.data.collate``). Evaluation stays unpacked (K = 1), so its metrics are computed on
exactly the same sequences whatever the training packing.

* ``online``: :class:`~omnibert.data.packed_sampler.PackedBatchSampler` packs windows of
  ``data.pack.buffer_size`` shuffled sequences with ``data.pack.algorithm``.
* ``offline``: the pack index ``omnibert-prepare pack.enabled=true`` wrote under
  ``<train_path>/packs/<name>/`` (:mod:`omnibert.prepare.pack_index`), served by
  :class:`~omnibert.data.packed_sampler.PackIndexBatchSampler`.

The global batch keeps counting *sequences* (``phase.global_batch_size``): with packing the
train app asks :func:`sequences_per_row` and runs about ``global / sequences_per_row`` rows
per step (``tasks.plan.packed_batch_plan``), as Graphcore and Habana scale their batch by the
average packing factor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.packing.plan import WINDOW_ALGORITHMS

__all__ = ["MODES", "PackingSettings", "default_predictions_per_pack"]

MODES = ("none", "online", "offline")
IntArray = npt.NDArray[np.int64]


_Error = Callable[[str], Exception]


@dataclass(frozen=True)
class PackingSettings:
    """Parsed ``data.packing`` and ``data.pack.*`` (see conf/data/pack/default.yaml)."""

    mode: str = "none"
    max_sequences_per_pack: int = 3
    max_predictions_per_pack: int | None = None
    buffer_size: int = 16384
    algorithm: str = "nnlshp"
    index: str | None = None

    @property
    def enabled(self) -> bool:
        return self.mode != "none"

    @property
    def sequences_per_row_max(self) -> int:
        """K of a training row: ``max_sequences_per_pack`` when packing, else 1."""
        return self.max_sequences_per_pack if self.enabled else 1

    @staticmethod
    def parse(mode: Any, pack: Mapping[str, Any] | None, error: _Error) -> PackingSettings:
        """Check the config values; ``error(message)`` builds the exception to raise."""
        if mode not in MODES:
            raise error(
                f"data.packing={mode!r} is not one of {list(MODES)}; set data.packing=none, "
                "online or offline."
            )
        options = dict(pack or {})
        known = {"max_sequences_per_pack", "max_predictions_per_pack", "buffer_size"}
        known |= {"algorithm", "index"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise error(f"data.pack has unknown keys {unknown}; the keys are {sorted(known)}.")
        settings = PackingSettings(mode=str(mode), **options)
        for key, value, low in (
            ("max_sequences_per_pack", settings.max_sequences_per_pack, 1),
            ("buffer_size", settings.buffer_size, 1),
            ("max_predictions_per_pack", settings.max_predictions_per_pack, 1),
        ):
            if value is not None and (not isinstance(value, int) or value < low):
                raise error(f"data.pack.{key}={value!r} must be an integer >= {low}.")
        if settings.algorithm not in WINDOW_ALGORITHMS:
            raise error(
                f"data.pack.algorithm={settings.algorithm!r} is not one of "
                f"{list(WINDOW_ALGORITHMS)}; nnlshp packs best at K=3, bfd is fastest."
            )
        return settings

    def index_name(self) -> str:
        """The offline index directory name under ``<train_path>/packs/``."""
        from omnibert.data.pack_index import default_name

        # offline indexes are built by omnibert-prepare's histogram algorithms, default lpfhp
        if self.index:
            return self.index
        algorithm = "lpfhp" if self.algorithm == "bfd" else self.algorithm
        return default_name(algorithm, self.max_sequences_per_pack)


def default_predictions_per_pack(
    max_predictions_per_seq: int,
    max_seq_length: int,
    max_sequences_per_pack: int,
    masked_lm_prob: float | None,
) -> int:
    """The ``P`` of a packed row when ``data.pack.max_predictions_per_pack`` is null.

    Google's generator masks ``max(1, round(len · prob))`` (capped) positions of a sequence
    of ``len`` tokens, at most ``prob · len + 1``; K sequences sharing S tokens hence hold
    at most ``prob · S + K`` (80 at S=512, K=3 vs 76 unpacked). Unknown ``prob``: K · P.
    The online sampler never exceeds the budget either way (it splits packs that would).
    """
    k, p = max_sequences_per_pack, max_predictions_per_seq
    if masked_lm_prob is None:
        return k * p
    return max(p, min(k * p, math.floor(masked_lm_prob * max_seq_length) + k))


def batch_shapes(b: int, s: int, p: int, k: int) -> dict[str, list[int]]:
    """The static training batch shapes, for logs and plans."""
    return {"input_ids": [b, s], "masked_lm_positions": [b, p], "nsp_labels": [b, k]}


class PackedData:
    """Mixin for the pretraining data modules: packing-aware training sampler and counts.

    The module sets ``self.packing`` (:class:`PackingSettings`) and provides
    ``max_seq_length``, ``max_predictions_per_seq``, ``micro_batch_size``, ``shuffle``,
    ``seed``, ``rank``, ``world_size``, ``num_train_samples``, ``masked_lm_prob`` (or None),
    ``row_lengths()`` (tokens and masked positions of every training row) and, for offline
    packing, ``pack_index()``.
    """

    packing: PackingSettings
    max_seq_length: int
    max_predictions_per_seq: int
    micro_batch_size: int
    eval_micro_batch_size: int
    num_workers: int
    shuffle: bool
    seed: int
    rank: int
    world_size: int
    _pack_cache: dict[str, Any]

    @property
    def num_train_samples(self) -> int:
        raise NotImplementedError

    @property
    def masked_lm_prob(self) -> float | None:
        raise NotImplementedError

    def row_lengths(self) -> tuple[IntArray, IntArray]:
        raise NotImplementedError

    def pack_index(self) -> Any:
        raise NotImplementedError

    def _packed(self) -> dict[str, Any]:
        if not hasattr(self, "_pack_cache"):
            self._pack_cache = {}
        return self._pack_cache

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
            self.masked_lm_prob,
        )

    def train_batch_sampler(self, batch_size: int | None = None, rank: int | None = None) -> Any:
        """This rank's packed training sampler (``batch_size`` packs per micro batch)."""
        from omnibert.data.packed_sampler import PackedBatchSampler, PackIndexBatchSampler

        s = self.packing
        size = batch_size or self.micro_batch_size
        where: dict[str, Any] = {
            "shuffle": self.shuffle,
            "seed": self.seed,
            "num_replicas": self.world_size,
            "rank": self.rank if rank is None else rank,
        }
        if s.mode == "offline":
            return PackIndexBatchSampler(self.pack_index().packs, size, drop_last=True, **where)
        lengths, masks = self.row_lengths()
        return PackedBatchSampler(
            lengths,
            masks,
            size,
            pack_counts=self._packed().setdefault("epoch_packs", {}),
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
        cache = self._packed()
        if "rows" not in cache:
            if s.mode == "offline":
                cache["rows"] = int(self.pack_index().packs.shape[0])
            else:
                cache["rows"] = self.train_batch_sampler(1, 0).packs_in_epoch(0)
        return int(cache["rows"])

    @property
    def sequences_per_row(self) -> float:
        """Average sequences per training row (1.0 unpacked)."""
        return self.num_train_samples / self.num_train_rows

    def batch_facts(self) -> dict[str, Any]:
        """The training batch facts every data module's ``describe()`` reports."""
        b, s = self.micro_batch_size, self.max_seq_length
        p, k = self.predictions_per_pack, self.packing.sequences_per_row_max
        return {
            "packing": self.packing_report(),
            "max_seq_length": s,
            "max_predictions_per_seq": self.max_predictions_per_seq,
            "max_predictions_per_row": p,
            "micro_batch_size": b,
            "eval_micro_batch_size": self.eval_micro_batch_size,
            "train_batches_per_epoch": self.num_train_rows // self.world_size // b,
            "shapes": batch_shapes(b, s, p, k),
            "num_workers": self.num_workers,
            "seed": self.seed,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def packing_report(self) -> dict[str, Any]:
        """Plain facts about the packing, for the plan and logs."""
        s = self.packing
        if not s.enabled:
            return {"mode": "none"}
        lengths = self.row_lengths()[0]
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
