"""The result of a packing algorithm (`PackPlan`) and the checks on its input.

A plan is a histogram of *pack strategies*: each strategy is the tuple of sequence lengths
one pack holds (longest first), and ``counts[i]`` packs use ``strategies[i]``. Every length
histogram in this package is a 1-D integer array in which ``counts[i]`` is the number of
sequences of length ``i + 1``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

Strategy = tuple[int, ...]
"""Lengths of the sequences in one pack, longest first."""

IntArray = npt.NDArray[np.int64]

#: algorithms that pack a window of concrete sequences (online packing; `online.pack_window`)
WINDOW_ALGORITHMS = ("bfd", "lpfhp", "spfhp", "nnlshp", "ffd")


def check_limits(max_sequence_length: int, max_sequences_per_pack: int) -> None:
    """Refuse a non-positive (or non-integer) pack size or per-pack sequence limit."""
    for name, value in (
        ("max_sequence_length", max_sequence_length),
        ("max_sequences_per_pack", max_sequences_per_pack),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}.")


def _as_integer_array(values: Any, name: str) -> IntArray:
    array = np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}.")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind == "f":
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            raise ValueError(f"{name} must hold whole numbers, got {array.dtype} values.")
    elif array.dtype.kind not in "iub":
        raise ValueError(f"{name} must hold integers, got dtype {array.dtype}.")
    return array.astype(np.int64, copy=False)


def validate_histogram(counts: Any, max_sequence_length: int) -> IntArray:
    """`counts` as an int64 array of exactly `max_sequence_length` bins, or a ValueError.

    A histogram shorter than `max_sequence_length` is zero-extended; bins beyond it must be
    empty (they would be sequences longer than a pack).
    """
    histogram = _as_integer_array(counts, "counts")
    if np.any(histogram < 0):
        bad = int(np.flatnonzero(histogram < 0)[0])
        raise ValueError(
            f"counts must be non-negative; counts[{bad}] (length {bad + 1}) is {histogram[bad]}."
        )
    if histogram.size > max_sequence_length and np.any(histogram[max_sequence_length:]):
        longest = int(np.flatnonzero(histogram)[-1]) + 1
        raise ValueError(
            f"counts has sequences of length {longest} > max_sequence_length="
            f"{max_sequence_length}; raise max_sequence_length or truncate those sequences."
        )
    out = np.zeros(max_sequence_length, dtype=np.int64)
    size = min(histogram.size, max_sequence_length)
    out[:size] = histogram[:size]
    return out


def validate_lengths(lengths: Any, max_sequence_length: int) -> IntArray:
    """`lengths` as an int64 array of values in ``1..max_sequence_length``, or a ValueError."""
    array = _as_integer_array(lengths, "lengths")
    if array.size and array.min() < 1:
        bad = int(np.argmin(array))
        raise ValueError(f"lengths must be >= 1; lengths[{bad}] is {array[bad]}.")
    if array.size and array.max() > max_sequence_length:
        bad = int(np.argmax(array))
        raise ValueError(
            f"lengths[{bad}] is {array[bad]} > max_sequence_length={max_sequence_length}; "
            "raise max_sequence_length or truncate that sequence."
        )
    return array


def histogram_of(
    strategies: Iterable[Strategy], counts: Iterable[int], max_sequence_length: int
) -> IntArray:
    """How many sequences of each length packs `counts` × `strategies` hold."""
    histogram = np.zeros(max_sequence_length, dtype=np.int64)
    for strategy, count in zip(strategies, counts, strict=True):
        for length in strategy:
            histogram[length - 1] += count
    return histogram


@dataclass(frozen=True)
class PackPlan:
    """Packs as a histogram of strategies (see the module docstring).

    Strategies are sorted longest first, each appears once, and every count is positive;
    `efficiency`, `speedup` and the totals are derived from them, so they cannot disagree.
    `runtime_s` is the algorithm's wall time and is ignored by ``==``.
    """

    strategies: tuple[Strategy, ...]
    counts: tuple[int, ...]
    max_sequence_length: int
    max_sequences_per_pack: int
    algorithm: str
    runtime_s: float = field(default=0.0, compare=False)

    @classmethod
    def from_groups(
        cls,
        groups: Iterable[tuple[int, Sequence[int]]],
        max_sequence_length: int,
        max_sequences_per_pack: int,
        algorithm: str,
        runtime_s: float = 0.0,
    ) -> PackPlan:
        """Canonical plan from ``(count, lengths)`` pairs in any order, duplicates merged."""
        merged: dict[Strategy, int] = {}
        for count, lengths in groups:
            if count:
                key = tuple(sorted((int(n) for n in lengths), reverse=True))
                merged[key] = merged.get(key, 0) + int(count)
        ordered = sorted(merged.items(), reverse=True)
        return cls(
            strategies=tuple(strategy for strategy, _ in ordered),
            counts=tuple(count for _, count in ordered),
            max_sequence_length=int(max_sequence_length),
            max_sequences_per_pack=int(max_sequences_per_pack),
            algorithm=algorithm,
            runtime_s=runtime_s,
        )

    @property
    def num_packs(self) -> int:
        return sum(self.counts)

    @property
    def num_sequences(self) -> int:
        return sum(len(s) * c for s, c in zip(self.strategies, self.counts, strict=True))

    @property
    def num_tokens(self) -> int:
        return sum(sum(s) * c for s, c in zip(self.strategies, self.counts, strict=True))

    @property
    def efficiency(self) -> float:
        """Real tokens / (packs × max_sequence_length); 1.0 for an empty plan."""
        packs = self.num_packs
        return self.num_tokens / (packs * self.max_sequence_length) if packs else 1.0

    @property
    def speedup(self) -> float:
        """Rows without packing / rows with packing (sequences / packs); 1.0 when empty."""
        packs = self.num_packs
        return self.num_sequences / packs if packs else 1.0

    def histogram(self) -> IntArray:
        """The length histogram the plan packs (``counts[i]``: sequences of length i+1)."""
        return histogram_of(self.strategies, self.counts, self.max_sequence_length)

    def check(self, counts: Any | None = None) -> None:
        """Raise ValueError unless every pack fits and, given `counts`, the plan packs exactly it.

        "Exactly" means every sequence of the histogram is in one pack and no pack holds a
        sequence the histogram lacks.
        """
        if len(self.strategies) != len(self.counts):
            raise ValueError("PackPlan.strategies and PackPlan.counts differ in length.")
        for strategy, count in zip(self.strategies, self.counts, strict=True):
            if count <= 0:
                raise ValueError(f"strategy {strategy} has non-positive count {count}.")
            if not strategy or min(strategy) < 1:
                raise ValueError(f"strategy {strategy} holds no sequence or a length < 1.")
            if sum(strategy) > self.max_sequence_length:
                raise ValueError(
                    f"strategy {strategy} holds {sum(strategy)} tokens > "
                    f"max_sequence_length={self.max_sequence_length}."
                )
            if len(strategy) > self.max_sequences_per_pack:
                raise ValueError(
                    f"strategy {strategy} holds {len(strategy)} sequences > "
                    f"max_sequences_per_pack={self.max_sequences_per_pack}."
                )
        if counts is None:
            return
        expected = validate_histogram(counts, self.max_sequence_length)
        difference = self.histogram() - expected
        if np.any(difference):
            lengths = np.flatnonzero(difference)[:5] + 1
            detail = ", ".join(f"length {n}: {difference[n - 1]:+d}" for n in lengths)
            raise ValueError(f"plan does not pack the histogram exactly ({detail}).")

    def covers(self, counts: Any) -> bool:
        """Whether the plan is valid and packs every sequence of `counts` exactly once."""
        try:
            self.check(counts)
        except ValueError:
            return False
        return True

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready); `from_dict` rebuilds an equal plan."""
        return {
            "algorithm": self.algorithm,
            "max_sequence_length": self.max_sequence_length,
            "max_sequences_per_pack": self.max_sequences_per_pack,
            "strategies": [list(s) for s in self.strategies],
            "counts": list(self.counts),
            "runtime_s": self.runtime_s,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PackPlan:
        return cls(
            strategies=tuple(tuple(int(n) for n in s) for s in data["strategies"]),
            counts=tuple(int(c) for c in data["counts"]),
            max_sequence_length=int(data["max_sequence_length"]),
            max_sequences_per_pack=int(data["max_sequences_per_pack"]),
            algorithm=str(data["algorithm"]),
            runtime_s=float(data.get("runtime_s", 0.0)),
        )
