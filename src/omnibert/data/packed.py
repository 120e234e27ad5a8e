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
per step (``run.pretraining.batches.packed_batch_plan``), as Graphcore and Habana scale their batch
by the average packing factor."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.packing.plan import WINDOW_ALGORITHMS

__all__ = ["MODES", "PackingSettings", "batch_shapes", "default_predictions_per_pack"]

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
