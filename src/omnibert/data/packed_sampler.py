"""Batch samplers for packed training (``data.packing=online`` and ``offline``).

:class:`PackedBatchSampler` packs on the fly. Data epoch ``e`` is a permutation of all rows
drawn from ``numpy.random.default_rng([seed, e])`` (the same on every rank); it is cut into
windows of ``buffer_size`` sequences (the bounded look-ahead) and each window is packed on
its own (:func:`omnibert.packing.online.pack_window`), its packs shuffled with a seed
derived from ``(seed, e, window)``. The packs of consecutive windows and data epochs form one
deterministic stream; each optimiser micro-step takes the next ``batch_size × num_replicas``
packs of it and rank r keeps the r-th ``batch_size`` of them. So every rank runs the same
number of steps, no sequence appears twice within a data epoch, and nothing is dropped:
the packs at the end of a data epoch simply share a batch with the first ones of the next.

A Lightning epoch is ``batches_per_epoch`` batches of that stream (the train app sets it to
``steps_per_epoch × accumulation``); its default is the number of whole batches the first
data epoch yields. The state is (Lightning epoch, batches handed out in it, stream cursor)
with the cursor = (data epoch, window, pack within the window), so a resume regenerates one
window, never the past. Iterators begin where the previous one began until that one handed
out a whole epoch (as :class:`~omnibert.data.samplers.ResumableBatchSampler`, whose reasons
apply unchanged).

:class:`PackIndexBatchSampler` serves an offline pack index (``omnibert-prepare
pack.enabled=true``): a :class:`ResumableBatchSampler` over the packs that yields each pack
as its list of dataset rows.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.data.samplers import ResumableBatchSampler, _check_rank, check_saved_state
from omnibert.packing.online import pack_window
from omnibert.packing.plan import WINDOW_ALGORITHMS

__all__ = ["PackIndexBatchSampler", "PackedBatchSampler"]

IntArray = npt.NDArray[np.int64]
Cursor = tuple[int, int, int]  # data epoch, window, pack within the window


def _seed(*parts: int) -> int:
    return int(np.random.SeedSequence(list(parts)).generate_state(1, dtype=np.uint64)[0])


class PackedBatchSampler:
    """Yields, per step, this rank's ``batch_size`` packs (lists of dataset rows); see the
    module docstring. ``lengths`` / ``masks``: tokens and masked positions of every row;
    ``pack_counts``: a cache of packs per data epoch to share (independent of batch size and
    rank, so one count serves every sampler over the same rows and packing settings)."""

    def __init__(
        self,
        lengths: Any,
        masks: Any,
        batch_size: int,
        *,
        max_sequence_length: int,
        max_sequences_per_pack: int,
        max_predictions_per_pack: int,
        buffer_size: int = 16384,
        algorithm: str = "nnlshp",
        shuffle: bool = True,
        seed: int = 0,
        num_replicas: int = 1,
        rank: int = 0,
        batches_per_epoch: int | None = None,
        pack_counts: dict[int, int] | None = None,
    ) -> None:
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.masks = np.asarray(masks, dtype=np.int64)
        if self.lengths.ndim != 1 or self.lengths.shape != self.masks.shape:
            raise ValueError("lengths and masks must be 1-D arrays with one entry per row.")
        if batch_size < 1 or buffer_size < 1 or self.lengths.size < 1:
            raise ValueError(
                f"batch_size={batch_size}, buffer_size={buffer_size} and the number of rows "
                f"({self.lengths.size}) must all be positive."
            )
        if algorithm not in WINDOW_ALGORITHMS:
            raise ValueError(f"algorithm must be one of {list(WINDOW_ALGORITHMS)}.")
        _check_rank(num_replicas, rank)
        self.batch_size = batch_size
        self.max_sequence_length = max_sequence_length
        self.max_sequences_per_pack = max_sequences_per_pack
        self.max_predictions_per_pack = max_predictions_per_pack
        self.buffer_size = buffer_size
        self.algorithm = algorithm
        self.shuffle = shuffle
        self.seed = seed
        self.num_replicas = num_replicas
        self.rank = rank
        self.batches_per_epoch = batches_per_epoch
        self.epoch, self._position, self._cursor = 0, 0, (0, 0, 0)
        self._start: tuple[int, int, Cursor] = (0, 0, (0, 0, 0))
        self._order: tuple[int, IntArray] | None = None  # (data epoch, permutation)
        self._window: tuple[int, int, list[list[int]]] | None = None
        # packs per data epoch; a dict shared by samplers of the same data and packing settings
        # (the data module's) so the whole-epoch count is made once, not per sampler
        self._epoch_packs: dict[int, int] = {} if pack_counts is None else pack_counts

    # ------------------------------------------------------------------ the pack stream
    @property
    def num_rows(self) -> int:
        return int(self.lengths.size)

    @property
    def windows_per_epoch(self) -> int:
        return -(-self.num_rows // self.buffer_size)

    def _permutation(self, epoch: int) -> IntArray:
        if self._order is None or self._order[0] != epoch:
            order = (
                np.random.default_rng([self.seed, epoch]).permutation(self.num_rows)
                if self.shuffle
                else np.arange(self.num_rows)
            )
            self._order = (epoch, order)
        return self._order[1]

    def window(self, epoch: int, window: int) -> list[list[int]]:
        """The packs (dataset rows, longest first) of ``window`` of data epoch ``epoch``."""
        if self._window is not None and self._window[:2] == (epoch, window):
            return self._window[2]
        rows = self._permutation(epoch)[window * self.buffer_size : (window + 1) * self.buffer_size]
        seed = _seed(self.seed, epoch, window)
        offsets, members = pack_window(
            self.lengths[rows],
            self.masks[rows],
            self.max_sequence_length,
            self.max_sequences_per_pack,
            self.max_predictions_per_pack,
            self.algorithm,
            seed,
        )
        flat = rows[members].tolist()
        bounds = offsets.tolist()
        packs = [flat[a:b] for a, b in itertools.pairwise(bounds)]
        order = np.random.default_rng(seed).permutation(len(packs)) if self.shuffle else None
        if order is not None:
            packs = [packs[i] for i in order]
        self._window = (epoch, window, packs)
        return packs

    def packs_in_epoch(self, epoch: int = 0) -> int:
        """Packs data epoch ``epoch`` makes (packs every window of it once; cached)."""
        if epoch not in self._epoch_packs:
            self._epoch_packs[epoch] = sum(
                len(self.window(epoch, w)) for w in range(self.windows_per_epoch)
            )
        return self._epoch_packs[epoch]

    @property
    def sequences_per_pack(self) -> float:
        """Average sequences per pack in the first data epoch."""
        return self.num_rows / self.packs_in_epoch(0)

    def _take(self, cursor: Cursor, count: int) -> tuple[list[list[int]], Cursor]:
        """The next ``count`` packs of the stream from ``cursor`` and the cursor after them."""
        epoch, window, index = cursor
        out: list[list[int]] = []
        while len(out) < count:
            packs = self.window(epoch, window)
            taken = packs[index : index + count - len(out)]
            out.extend(taken)
            index += len(taken)
            if index >= len(packs):
                window, index = window + 1, 0
                if window >= self.windows_per_epoch:
                    epoch, window = epoch + 1, 0
        return out, (epoch, window, index)

    # ------------------------------------------------------------------ sampler protocol
    def __len__(self) -> int:
        """Batches per (Lightning) epoch for this rank."""
        if self.batches_per_epoch is not None:
            return self.batches_per_epoch
        return max(1, self.packs_in_epoch(0) // (self.batch_size * self.num_replicas))

    def set_epoch(self, epoch: int) -> None:
        """Continue with Lightning epoch ``epoch`` (a no-op inside the current one). The next
        epoch starts where the last finished one ended; any other epoch is reached by walking
        the stream from its beginning."""
        if epoch < 0:
            raise ValueError(f"epoch={epoch} must be >= 0.")
        if epoch == self._start[0]:
            return
        if epoch == self.epoch + 1 and self._position >= len(self):
            self._start = (epoch, 0, self._cursor)
        else:
            per_epoch = len(self) * self.batch_size * self.num_replicas
            self._start = (epoch, 0, self._take((0, 0, 0), epoch * per_epoch)[1])
        self.epoch, self._position, self._cursor = self._start

    def __iter__(self) -> Iterator[list[list[int]]]:
        epoch, position, cursor = self._start
        if self.epoch == epoch and self._position >= len(self):
            epoch, position, cursor = epoch + 1, 0, self._cursor
        self._start = (epoch, position, cursor)
        self.epoch, self._position, self._cursor = epoch, position, cursor
        step = self.batch_size * self.num_replicas
        mine = slice(self.rank * self.batch_size, (self.rank + 1) * self.batch_size)
        for b in range(position, len(self)):
            packs, cursor = self._take(cursor, step)
            # before the yield: a state taken now points past this batch
            self.epoch, self._position, self._cursor = epoch, b + 1, cursor
            yield packs[mine]

    _CHECKED: tuple[str, ...] = (
        "num_rows", "batch_size", "num_replicas", "seed", "shuffle", "buffer_size",
        "algorithm", "max_sequence_length", "max_sequences_per_pack", "max_predictions_per_pack",
    )  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        state = {key: getattr(self, key) for key in self._CHECKED}
        state.update(epoch=self.epoch, position=self._position, cursor=list(self._cursor))
        state["rank"] = self.rank
        state["batches_per_epoch"] = self.batches_per_epoch
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        same = (
            "data, data.pack settings, micro_batch_size (derived from phase.global_batch_size "
            "when null), accelerator.devices and seed"
        )
        check_saved_state(self, state, self._CHECKED, "packing sampler", same)
        cursor = tuple(int(x) for x in state["cursor"])
        assert len(cursor) == 3
        self.epoch, self._position = int(state["epoch"]), int(state["position"])
        self._cursor = (cursor[0], cursor[1], cursor[2])
        self._start = (self.epoch, self._position, self._cursor)


class PackIndexBatchSampler(ResumableBatchSampler):
    """A :class:`ResumableBatchSampler` over the packs of an offline pack index ``packs``
    (``[num_packs, K]`` dataset rows, ``-1`` = empty slot); yields lists of packs."""

    def __init__(self, packs: npt.NDArray[np.integer[Any]], batch_size: int, **kwargs: Any) -> None:
        super().__init__(int(packs.shape[0]), batch_size, **kwargs)
        self.packs = packs

    def __iter__(self) -> Iterator[list[list[int]]]:  # type: ignore[override]
        for batch in super().__iter__():
            chosen = self.packs[batch]
            yield [[int(i) for i in row if i >= 0] for row in chosen]
