"""First-fit decreasing (FFD), the textbook baseline, computed on the histogram.

Sequence-level FFD sorts sequences longest first and puts each into the *first-opened* pack
that has room (free space and fewer than `max_sequences_per_pack` sequences), opening a new
pack when none has. With all sequences of one length processed in a row, each pack in
opening order takes as many copies as fit before the next pack is tried, so the same
result is computed per length over groups of identical packs kept in opening order: a
group that takes fewer sequences than it has packs splits into the packs that took them
(first) and the rest. The packs are exactly those of sequence-level FFD.
"""

from __future__ import annotations

import numpy as np

from omnibert.packing.greedy import Group
from omnibert.packing.plan import IntArray


def ffd(histogram: IntArray, max_sequence_length: int, max_sequences_per_pack: int) -> list[Group]:
    """First-fit decreasing; returns ``(count, lengths)`` groups."""
    size = max_sequence_length
    limit = max_sequences_per_pack
    # Open groups in opening order as [count, lengths, free]; full packs move to `done`.
    opened: list[tuple[int, tuple[int, ...], int]] = []
    done: list[Group] = []
    nonzero = np.flatnonzero(histogram)
    shortest = int(nonzero[0]) + 1 if nonzero.size else 1
    for index in nonzero[::-1]:
        length = int(index) + 1
        todo = int(histogram[index])
        updated: list[tuple[int, tuple[int, ...], int]] = []
        for count, lengths, free in opened:
            copies = min(free // length, limit - len(lengths))
            if todo == 0 or copies == 0:
                updated.append((count, lengths, free))
                continue
            full = min(count, todo // copies)
            pieces = [(full, copies)]
            todo -= full * copies
            if full < count and todo:  # one pack takes the last few
                pieces.append((1, todo))
                todo = 0
            taken = 0
            for packs, added in pieces:
                if packs:
                    updated.append((packs, (*lengths, *(length,) * added), free - added * length))
                    taken += packs
            if count > taken:
                updated.append((count - taken, lengths, free))
        copies = min(size // length, limit)
        if todo >= copies:
            updated.append((todo // copies, (length,) * copies, size - copies * length))
        if todo % copies:
            rest = todo % copies
            updated.append((1, (length,) * rest, size - rest * length))
        opened = []
        for count, lengths, free in updated:
            if free < shortest or len(lengths) >= limit:  # can take nothing more
                done.append((count, lengths))
            else:
                opened.append((count, lengths, free))
    done.extend((count, lengths) for count, lengths, _ in opened)
    return done
