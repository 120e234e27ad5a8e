"""`pack_histogram`: run one packing algorithm on a length histogram and check its plan."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from omnibert.packing.ffd import ffd
from omnibert.packing.greedy import Group, lpfhp, spfhp
from omnibert.packing.nnlshp import nnlshp
from omnibert.packing.plan import IntArray, PackPlan, check_limits, validate_histogram

Algorithm = Callable[..., list[Group]]

ALGORITHMS: dict[str, Algorithm] = {
    "spfhp": spfhp,
    "lpfhp": lpfhp,
    "nnlshp": nnlshp,
    "ffd": ffd,
}
"""Name → ``algorithm(histogram, max_sequence_length, max_sequences_per_pack, **options)``."""

OPTIONS: dict[str, frozenset[str]] = {
    "spfhp": frozenset(),
    "lpfhp": frozenset(),
    "nnlshp": frozenset({"depth", "residual", "max_iterations"}),
    "ffd": frozenset(),
}


def pack_histogram(
    counts: Any,
    max_sequence_length: int,
    max_sequences_per_pack: int,
    algorithm: str = "lpfhp",
    **options: Any,
) -> PackPlan:
    """Pack the sequences of a length histogram into packs of `max_sequence_length` tokens.

    `counts[i]` is the number of sequences of length ``i + 1`` (a list or a 1-D array; it
    may be shorter than `max_sequence_length`). No pack holds more than
    `max_sequences_per_pack` sequences or more than `max_sequence_length` tokens, and the
    returned plan packs every sequence exactly once (checked before it is returned).

    `algorithm`: ``"lpfhp"`` (longest-pack-first, the default: milliseconds, and the best
    of the fast ones), ``"spfhp"`` (shortest-pack-first), ``"nnlshp"`` (non-negative least
    squares, tightest, a fraction of a second at depth 3; options ``depth`` = most
    sequences per exact-fill strategy, default ``min(3, max_sequences_per_pack)``;
    ``residual`` = ``"lpfhp"`` (default) or ``"single"`` (the paper's), how the sequences
    the fit leaves over are packed; ``max_iterations`` of the solver) or ``"ffd"``
    (first-fit decreasing, the baseline). Raises ValueError naming the bad argument.
    """
    check_limits(max_sequence_length, max_sequences_per_pack)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {algorithm!r}.")
    unknown = sorted(set(options) - OPTIONS[algorithm])
    if unknown:
        accepted = sorted(OPTIONS[algorithm]) or "none"
        raise TypeError(
            f"algorithm {algorithm!r} got unknown options {unknown}; it takes {accepted}."
        )
    histogram: IntArray = validate_histogram(counts, max_sequence_length)
    start = time.perf_counter()
    groups = ALGORITHMS[algorithm](
        histogram, max_sequence_length, max_sequences_per_pack, **options
    )
    plan = PackPlan.from_groups(
        groups, max_sequence_length, max_sequences_per_pack, algorithm, runtime_s=0.0
    )
    elapsed = time.perf_counter() - start
    try:
        plan.check(histogram)
    except ValueError as error:  # a bug here, not bad input: the input was validated above
        raise RuntimeError(f"{algorithm} produced an invalid pack plan: {error}") from error
    return dataclasses.replace(plan, runtime_s=elapsed)
