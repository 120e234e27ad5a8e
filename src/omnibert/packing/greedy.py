"""Histogram greedy packers: SPFHP and LPFHP (Krell et al., arXiv 2107.02027).

Both work on the length histogram, never on single sequences: packs with identical contents
form one *group* ``(count, lengths)``, so the work depends on the number of distinct pack
contents, not on the number of sequences. Lengths are taken longest first and the
sequences of one length go, a group at a time, into an open pack group that still has room
(free space and fewer than `max_sequences_per_pack` sequences); when none has, they open
new packs.

* SPFHP, *shortest pack first*: the group with the most free space (worst fit), one
  sequence into each of its packs; new packs start with one sequence.
* LPFHP, *longest pack first*: the group with the least free space that fits (best fit),
  as many copies into each of its packs as fit (``free // length``, within the sequence
  limit); new packs also start with as many copies as fit. Filling packs with repeats of
  one length leaves fewer, larger gaps for the shorter sequences still to come.

Ties between groups with the same free space go to the most recently touched group, so
results are deterministic. Both reproduce the paper's published plans on its Wikipedia
histogram (efficiency and speed-up to every published digit).
"""

from __future__ import annotations

import numpy as np

from omnibert.packing.plan import IntArray

Group = tuple[int, tuple[int, ...]]
"""``(number of packs, lengths in each of them)``."""


def greedy_histogram(
    histogram: IntArray,
    max_sequence_length: int,
    max_sequences_per_pack: int,
    *,
    best_fit: bool,
    distribute: bool,
) -> list[Group]:
    """Pack `histogram` greedily: LPFHP with both flags set, SPFHP with neither."""
    size = max_sequence_length
    limit = max_sequences_per_pack
    # open_by_free[r]: groups with r free tokens and fewer than `limit` sequences (a stack).
    open_by_free: list[list[Group]] = [[] for _ in range(size + 1)]
    nonempty = 0  # bit r set <=> open_by_free[r] is not empty
    done: list[Group] = []

    def place(count: int, lengths: tuple[int, ...], free: int) -> None:
        nonlocal nonempty
        if free == 0 or len(lengths) >= limit:
            done.append((count, lengths))
        else:
            open_by_free[free].append((count, lengths))
            nonempty |= 1 << free

    for index in np.flatnonzero(histogram)[::-1]:
        length = int(index) + 1
        todo = int(histogram[index])
        while todo:
            candidates = nonempty >> length
            if candidates:
                if best_fit:  # lowest set bit at or above `length`
                    free = length + (candidates & -candidates).bit_length() - 1
                else:  # highest set bit
                    free = nonempty.bit_length() - 1
                stack = open_by_free[free]
                available, lengths = stack.pop()
                if not stack:
                    nonempty &= ~(1 << free)
                copies = 1
                if distribute:
                    copies = min(free // length, limit - len(lengths), todo)
                used = min(available, todo // copies)
                if available > used:
                    place(available - used, lengths, free)
                place(used, (*lengths, *(length,) * copies), free - copies * length)
                todo -= used * copies
            else:
                copies = min(size // length, limit, todo) if distribute else 1
                used = todo // copies
                place(used, (length,) * copies, size - copies * length)
                todo -= used * copies

    for stack in open_by_free:
        done.extend(stack)
    return done


def spfhp(
    histogram: IntArray, max_sequence_length: int, max_sequences_per_pack: int
) -> list[Group]:
    """Shortest-pack-first histogram packing: worst fit, one sequence per pack per step."""
    return greedy_histogram(
        histogram, max_sequence_length, max_sequences_per_pack, best_fit=False, distribute=False
    )


def lpfhp(
    histogram: IntArray, max_sequence_length: int, max_sequences_per_pack: int
) -> list[Group]:
    """Longest-pack-first histogram packing: best fit, as many copies per pack as fit."""
    return greedy_histogram(
        histogram, max_sequence_length, max_sequences_per_pack, best_fit=True, distribute=True
    )
