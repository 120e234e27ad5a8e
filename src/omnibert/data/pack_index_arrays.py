"""The array side of a pack index (see `omnibert.data.pack_index`): row lengths from the
Arrow offsets, the ``[num_packs, K]`` matrix of row numbers, the mask-budget split, its
statistics and its validation.

Everything here is vectorised NumPy: no Python loop over rows or packs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omnibert.data.packing.budget import Ints, Packs, split_over_budget, to_matrix

__all__ = ["array_problem", "pack_statistics", "row_lengths", "split_over_budget", "to_matrix"]


def row_lengths(dataset: Any) -> tuple[Ints, Ints]:
    """Tokens and masked positions of every row, read from the Arrow list offsets.

    `dataset` is a ``datasets.Dataset`` (row order honours a ``select``/``shuffle`` indices
    mapping) or a ``pyarrow.Table``. No Python loop over rows and no copy of token values.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset if isinstance(dataset, pa.Table) else dataset.data.table
    indices = getattr(dataset, "_indices", None)
    out = []
    for column in ("input_ids", "masked_lm_positions"):
        lengths = pc.fill_null(pc.list_value_length(table.column(column)), 0)
        array = np.asarray(lengths.to_numpy(), dtype=np.int64)
        if indices is not None:
            array = array[np.asarray(indices.column(0).to_numpy(), dtype=np.int64)]
        out.append(array)
    return out[0], out[1]


def pack_statistics(
    packs: Packs, lengths: Ints, masks: Ints, max_sequence_length: int
) -> dict[str, Any]:
    """The statistics ``packing.json`` records, computed from the packs themselves."""
    valid = packs >= 0
    safe = np.where(valid, packs, 0)
    tokens = np.where(valid, lengths[safe], 0).sum(axis=1)
    masked = np.where(valid, masks[safe], 0).sum(axis=1)
    rows, num_packs, real = int(lengths.size), int(packs.shape[0]), int(lengths.sum())
    by_size = np.bincount(valid.sum(axis=1), minlength=packs.shape[1] + 1)
    return {
        "max_predictions_per_pack": int(masked.max(initial=0)),
        "max_tokens_per_pack": int(tokens.max(initial=0)),
        "num_packs": num_packs,
        "sequences_per_pack": rows / num_packs,
        "efficiency": real / (num_packs * max_sequence_length),
        "efficiency_unpacked": real / (rows * max_sequence_length),
        "speedup": rows / num_packs,
        "packs_by_size": {str(k): int(c) for k, c in enumerate(by_size) if k and c},
    }


def array_problem(packs: Any, rows: int, num_packs: Any, width: int) -> str | None:
    """What is wrong with a stored ``packs.npy`` (None when nothing): dtype, shape, row
    numbers in range, -1 only in trailing slots, no empty pack, every row exactly once."""
    if not isinstance(packs, np.ndarray) or packs.dtype not in (np.int32, np.int64):
        return f"dtype {getattr(packs, 'dtype', type(packs).__name__)}, not int32/int64"
    if packs.ndim != 2 or packs.shape != (num_packs, width):
        return f"shape {packs.shape}, not ({num_packs}, {width}) as packing.json says"
    valid = packs >= 0
    if np.any(packs < -1) or np.any(packs >= rows):
        return f"row numbers outside 0..{rows - 1}"
    if packs.shape[0] and (not valid[:, 0].all() or np.any(valid[:, 1:] > valid[:, :-1])):
        return "an empty pack or a -1 before a row number"
    if np.any(np.bincount(packs[valid].astype(np.int64), minlength=rows) != 1):
        return "rows missing or listed twice"
    return None
