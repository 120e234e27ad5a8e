"""Non-negative least-squares histogram packing (NNLSHP, Krell et al., arXiv 2107.02027).

1. List every *strategy* that fills a pack exactly: the multisets of at most `depth`
   lengths summing to `max_sequence_length` (22 102 of them for 512 tokens, depth 3).
2. With ``A[l, s]`` = how many sequences of length l+1 strategy s holds and ``h`` the
   histogram, solve ``min ||W (A x - h)||`` over ``x >= 0`` (NNLS). As in the paper, the
   weights ``W`` are 0.09 for lengths up to 8 and 1 elsewhere: short sequences left over
   are the cheapest to place afterwards, so the fit should favour the long ones.
3. Turn x into whole packs and reconcile them with the histogram. Where the packs ask for
   more sequences of a length than exist, the missing ones become *holes*, taken from the
   packs that already have the most holes; sequences the packs do not take are *left
   over*. Two ways to finish, so that every sequence is packed exactly once:

   * ``residual="lpfhp"`` (default): x is rounded down, packs with holes are dissolved
     (their sequences join the left-overs) and the left-overs are packed by LPFHP with up
     to `max_sequences_per_pack` sequences per pack. Packs stay exactly full except those
     LPFHP makes.
   * ``residual="single"``: the paper's handling, kept for comparison: x is rounded to the
     nearest integer, holes stay as padding and each left-over sequence gets a pack of
     its own. It reproduces the paper's published figures.

The least-squares step uses `omnibert.packing.nnls`, the same Lawson–Hanson method as
``scipy.optimize.nnls`` but exploiting the sparse, integer columns.
"""

from __future__ import annotations

import warnings

import numpy as np

from omnibert.packing.greedy import Group, lpfhp
from omnibert.packing.nnls import nnls_sparse
from omnibert.packing.plan import IntArray

SHORT_LENGTH = 8
SHORT_LENGTH_WEIGHT = 0.09
RESIDUAL_MODES = ("lpfhp", "single")


def exact_fill_strategies(max_sequence_length: int, depth: int) -> IntArray:
    """All multisets of at most `depth` lengths summing to `max_sequence_length`.

    Returned as an int64 array of shape ``(strategies, depth)``, each row non-increasing
    and padded with zeros.
    """
    size = max_sequence_length
    prefixes = np.zeros((1, 0), dtype=np.int64)
    remaining = np.array([size], dtype=np.int64)
    found: list[IntArray] = []
    for level in range(depth):
        slots = depth - level
        low = -(-remaining // slots)  # the next part must leave a reachable remainder
        high = remaining if level == 0 else np.minimum(prefixes[:, -1], remaining)
        options = np.maximum(high - low + 1, 0)
        parent = np.repeat(np.arange(remaining.size), options)
        starts = np.cumsum(options) - options
        part = low[parent] + np.arange(parent.size) - starts[parent]
        prefixes = np.concatenate([prefixes[parent], part[:, None]], axis=1)
        remaining = remaining[parent] - part
        complete = remaining == 0
        padded = np.zeros((int(complete.sum()), depth), dtype=np.int64)
        padded[:, : level + 1] = prefixes[complete]
        found.append(padded)
        prefixes, remaining = prefixes[~complete], remaining[~complete]
    return np.concatenate(found) if found else np.zeros((0, depth), dtype=np.int64)


def _holes(
    groups: list[tuple[int, list[int]]], excess: IntArray, size: int
) -> list[tuple[int, list[int]]]:
    """Take `excess[l-1]` sequences of each length l out of the packs (most free space first)."""
    for index in np.flatnonzero(excess)[::-1]:
        length = int(index) + 1
        todo = int(excess[index])
        candidates = [i for i, (_, lengths) in enumerate(groups) if length in lengths]
        while todo:
            best = max(
                (i for i in candidates if length in groups[i][1]),
                key=lambda i: (size - sum(groups[i][1]), -i),
            )
            count, lengths = groups[best]
            taken = min(count, todo)
            reduced = list(lengths)
            reduced.remove(length)
            groups[best] = (taken, reduced)
            if count > taken:
                candidates.append(len(groups))
                groups.append((count - taken, lengths))
            todo -= taken
    return groups


def nnlshp(
    histogram: IntArray,
    max_sequence_length: int,
    max_sequences_per_pack: int,
    *,
    depth: int | None = None,
    residual: str = "lpfhp",
    max_iterations: int = 100_000,
) -> list[Group]:
    """NNLSHP (see the module docstring); returns ``(count, lengths)`` groups."""
    size = max_sequence_length
    depth = min(3, max_sequences_per_pack) if depth is None else depth
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth must be a positive integer, got {depth!r}.")
    if depth > max_sequences_per_pack:
        raise ValueError(
            f"depth={depth} exceeds max_sequences_per_pack={max_sequences_per_pack}; "
            "strategies would hold more sequences than a pack may."
        )
    if residual not in RESIDUAL_MODES:
        raise ValueError(f"residual must be one of {RESIDUAL_MODES}, got {residual!r}.")
    if not histogram.any():
        return []

    strategies = exact_fill_strategies(size, depth)
    rows = np.where(strategies > 0, strategies - 1, size)
    weights = np.ones(size)
    weights[:SHORT_LENGTH] = SHORT_LENGTH_WEIGHT
    solution, iterations = nnls_sparse(rows, weights, histogram.astype(np.float64), max_iterations)
    if iterations >= max_iterations:
        warnings.warn(
            f"NNLSHP stopped after max_iterations={max_iterations} before the least-squares "
            "fit converged; the plan is valid but may pack less tightly.",
            RuntimeWarning,
            stacklevel=3,
        )
    rounded = np.rint(solution) if residual == "single" else np.floor(solution)
    repeats = rounded.astype(np.int64)

    used = np.flatnonzero(repeats)
    groups = [(int(repeats[s]), [int(n) for n in strategies[s] if n]) for s in used]
    demand = np.zeros(size + 1, dtype=np.int64)  # entry `size` counts the padding
    np.add.at(demand, rows[used].ravel(), np.repeat(repeats[used], depth))
    demand = demand[:size]
    groups = _holes(groups, np.maximum(demand - histogram, 0), size)
    leftover = np.maximum(histogram - demand, 0)

    if residual == "single":
        packed = [(c, tuple(lengths)) for c, lengths in groups if lengths]
        singles = [(int(leftover[i]), (int(i) + 1,)) for i in np.flatnonzero(leftover)]
        return packed + singles
    full: list[Group] = []
    for count, lengths in groups:
        if sum(lengths) == size:
            full.append((count, tuple(lengths)))
        else:
            for length in lengths:
                leftover[length - 1] += count
    return full + lpfhp(leftover, size, max_sequences_per_pack)
