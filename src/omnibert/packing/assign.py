"""From a plan to concrete packs: which sequence (by index) goes into which pack.

A plan says "x packs hold lengths (300, 200, 12)"; `assign_packs` fills each such slot with
a sequence of that length. With a `seed`, the sequences of each length are taken in a
random order and the packs are listed in a random order (both from
``numpy.random.default_rng(seed)``: the same seed gives the same packs on every machine
with the same NumPy version); with ``seed=None`` sequences are taken in index order and
packs in plan order.
Inside a pack, sequences are listed longest first.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit

from omnibert.packing.api import pack_histogram
from omnibert.packing.plan import IntArray, PackPlan, check_limits, validate_lengths


@dataclass(frozen=True, eq=False)
class PackAssignment:
    """Packs as flat arrays: pack p holds ``sequence_indices[pack_offsets[p]:pack_offsets[p+1]]``."""

    plan: PackPlan
    pack_offsets: IntArray
    """int64, ``num_packs + 1`` entries, starting at 0."""
    sequence_indices: IntArray
    """int64, every sequence index exactly once."""

    def __len__(self) -> int:
        return int(self.pack_offsets.size - 1)

    def pack(self, index: int) -> IntArray:
        """Indices of the sequences in pack `index`, longest first."""
        return self.sequence_indices[self.pack_offsets[index] : self.pack_offsets[index + 1]]

    def packs(self) -> list[list[int]]:
        """All packs as lists of sequence indices (convenient for small data sets)."""
        bounds = self.pack_offsets.tolist()
        flat = self.sequence_indices.tolist()
        return [flat[a:b] for a, b in itertools.pairwise(bounds)]

    def pack_of_sequence(self) -> IntArray:
        """For each sequence index, the pack holding it."""
        sizes = np.diff(self.pack_offsets)
        owner = np.empty(self.sequence_indices.size, dtype=np.int64)
        owner[self.sequence_indices] = np.repeat(np.arange(sizes.size), sizes)
        return owner

    def check(self, lengths: Any) -> None:
        """Raise ValueError unless each index of `lengths` is in exactly one pack and packs fit."""
        array = validate_lengths(lengths, self.plan.max_sequence_length)
        if self.sequence_indices.size != array.size or (
            array.size and np.any(np.bincount(self.sequence_indices, minlength=array.size) != 1)
        ):
            raise ValueError("packs do not hold every sequence index exactly once.")
        sizes = np.diff(self.pack_offsets)
        if np.any(sizes < 1) or np.any(sizes > self.plan.max_sequences_per_pack):
            raise ValueError("a pack holds no sequence or more than max_sequences_per_pack.")
        tokens = np.add.reduceat(array[self.sequence_indices], self.pack_offsets[:-1])
        if tokens.size and tokens.max() > self.plan.max_sequence_length:
            raise ValueError("a pack holds more than max_sequence_length tokens.")


@njit(cache=True)
def _fill_packs(
    order: np.ndarray,
    lengths: np.ndarray,
    max_sequence_length: int,
    table: np.ndarray,
    sizes: np.ndarray,
    pack_strategy: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Pack p gets strategy ``pack_strategy[p]``; each slot takes the next unused sequence of
    its length, sequences of one length being used in the order they appear in `order`."""
    n = order.shape[0]
    start = np.zeros(max_sequence_length + 2, dtype=np.int64)
    for i in range(n):
        start[lengths[i] + 1] += 1
    for length in range(1, max_sequence_length + 2):
        start[length] += start[length - 1]
    pool = np.empty(n, dtype=np.int64)  # indices grouped by length, each group in `order`
    cursor = start.copy()
    for k in range(n):
        i = order[k]
        pool[cursor[lengths[i]]] = i
        cursor[lengths[i]] += 1
    offsets = np.empty(pack_strategy.shape[0] + 1, dtype=np.int64)
    offsets[0] = 0
    indices = np.empty(n, dtype=np.int64)
    position = 0
    for p in range(pack_strategy.shape[0]):
        strategy = pack_strategy[p]
        for slot in range(sizes[strategy]):
            length = table[strategy, slot]
            indices[position] = pool[start[length]]
            start[length] += 1
            position += 1
        offsets[p + 1] = position
    return offsets, indices


def assign_packs(lengths: Any, plan: PackPlan, *, seed: int | None = 0) -> PackAssignment:
    """Fill `plan`'s packs with the sequences of `lengths` (the plan must pack their histogram)."""
    array = validate_lengths(lengths, plan.max_sequence_length)
    histogram = np.bincount(array, minlength=plan.max_sequence_length + 1)[1:]
    plan.check(histogram)
    widest = max((len(s) for s in plan.strategies), default=0)
    table = np.zeros((len(plan.strategies), widest), dtype=np.int64)
    for row, strategy in enumerate(plan.strategies):
        table[row, : len(strategy)] = strategy
    sizes = np.array([len(s) for s in plan.strategies], dtype=np.int64)
    pack_strategy = np.repeat(np.arange(sizes.size), np.array(plan.counts, dtype=np.int64))
    if seed is None:
        order = np.arange(array.size)
    else:
        rng = np.random.default_rng(seed)
        pack_strategy = pack_strategy[rng.permutation(pack_strategy.size)]
        order = rng.permutation(array.size)
    offsets, indices = _fill_packs(
        order, array, plan.max_sequence_length, table, sizes, pack_strategy
    )
    offsets.setflags(write=False)
    indices.setflags(write=False)
    return PackAssignment(plan=plan, pack_offsets=offsets, sequence_indices=indices)


def pack_lengths(
    lengths: Any,
    max_sequence_length: int,
    max_sequences_per_pack: int,
    algorithm: str = "lpfhp",
    *,
    seed: int | None = 0,
    **options: Any,
) -> PackAssignment:
    """Pack concrete sequences: `pack_histogram` on their histogram, then `assign_packs`.

    `lengths[i]` is the length of sequence i (1..`max_sequence_length`). The result is the
    same for the same inputs and `seed`.
    """
    check_limits(max_sequence_length, max_sequences_per_pack)
    array = validate_lengths(lengths, max_sequence_length)
    histogram = np.bincount(array, minlength=max_sequence_length + 1)[1:]
    plan = pack_histogram(
        histogram, max_sequence_length, max_sequences_per_pack, algorithm, **options
    )
    return assign_packs(array, plan, seed=seed)
