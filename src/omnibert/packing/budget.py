"""Packs as a ``[num_packs, K]`` matrix of sequence indices (-1 = empty slot) and the
masked-position budget of a packed row.

The histogram algorithms plan tokens and sequence counts only; a packed batch also has a
static number ``P`` of masked-position slots per row, so packs over that budget are split.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

Packs = npt.NDArray[np.integer[Any]]
Ints = npt.NDArray[np.int64]


def to_matrix(offsets: Ints, flat: Ints, width: int, dtype: Any) -> Packs:
    """Packs given as ``flat[offsets[p]:offsets[p+1]]`` → ``[num_packs, width]``, -1 padded."""
    sizes = np.diff(offsets)
    packs = np.full((sizes.size, width), -1, dtype=dtype)
    rows = np.repeat(np.arange(sizes.size), sizes)
    slots = np.arange(flat.size) - np.repeat(offsets[:-1], sizes)
    packs[rows, slots] = flat
    return packs


def split_over_budget(packs: Packs, masks: Ints, budget: int) -> Packs:
    """Split every pack whose rows hold more than `budget` masked positions in total.

    The pack keeps its longest sequences while they fit; the shorter rest move, by next fit
    in slot order, into new packs placed right after it. Packs within the budget are kept
    as they are. Every single row must hold at most `budget` masked positions.
    """
    width = packs.shape[1]
    valid = packs >= 0
    count = np.where(valid, masks[np.where(valid, packs, 0)], 0)
    group = np.zeros(packs.shape, dtype=np.int64)
    total = np.zeros(packs.shape[0], dtype=np.int64)
    current = np.zeros(packs.shape[0], dtype=np.int64)
    for slot in range(width):  # K vectorised steps of next fit over all packs at once
        overflow = valid[:, slot] & (total + count[:, slot] > budget)
        current += overflow
        total = np.where(overflow, 0, total) + count[:, slot]
        group[:, slot] = current
    if not current.any():
        return packs
    # valid slots in row-major order are sorted by (pack, group); a new pack starts wherever
    # that pair changes, and keeps the slot order (longest first)
    pack_of, slot_of = np.nonzero(valid)
    key = pack_of * width + group[pack_of, slot_of]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    offsets = np.r_[starts, key.size].astype(np.int64)
    return to_matrix(offsets, packs[pack_of, slot_of].astype(np.int64), width, packs.dtype)


def from_matrix(packs: Packs) -> tuple[Ints, Ints]:
    """``[num_packs, K]`` (-1 padded) → ``(pack_offsets, members)``, slot order kept."""
    valid = packs >= 0
    offsets = np.zeros(packs.shape[0] + 1, dtype=np.int64)
    np.cumsum(valid.sum(axis=1), out=offsets[1:])
    return offsets, packs[valid].astype(np.int64)
