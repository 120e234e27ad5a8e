"""NVIDIA DeepLearningExamples BERT HDF5 shards, read in chunks and written with h5py.

Layout (PyTorch/LanguageModeling/BERT ``create_pretraining_data.py``; one shard = one file)::

    input_ids            [N, S] int32   zero-padded to max_seq_length
    input_mask           [N, S] int8    1 for real tokens, then 0
    segment_ids          [N, S] int8
    masked_lm_positions  [N, P] int32   zero-padded to max_predictions_per_seq
    masked_lm_ids        [N, P] int32   zero-padded
    next_sentence_labels [N]    int8    1 = random next

There are no ``masked_lm_weights``: position 0 is always ``[CLS]`` and never masked, so a
zero position marks padding (NVIDIA's reader takes the predictions before the first zero
position). Reading gives the same unpadded omnibert records as the TFRecord reader.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from omnibert.errors import UserError
from omnibert.formats.padded import RecordError, pad_records, unpad_batch

__all__ = ["HDF5_DATASETS", "HDF5FormatError", "read_hdf5", "write_hdf5"]

HDF5_DATASETS = {  # name -> (dtype as NVIDIA writes it, width: "S", "P" or None for [N])
    "input_ids": ("i4", "S"),
    "input_mask": ("i1", "S"),
    "segment_ids": ("i1", "S"),
    "masked_lm_positions": ("i4", "P"),
    "masked_lm_ids": ("i4", "P"),
    "next_sentence_labels": ("i1", None),
}


class HDF5FormatError(UserError):
    """An HDF5 shard is unreadable or does not hold NVIDIA BERT pretraining data."""


def write_hdf5(
    path: str | os.PathLike[str],
    records: Iterable[dict[str, Any]],
    max_seq_length: int,
    max_predictions_per_seq: int,
    *,
    block_rows: int = 4096,
    compression: str | None = "gzip",
) -> int:
    """Write omnibert records as an NVIDIA BERT HDF5 shard (streamed in blocks, atomically).

    Datasets are resizable and chunked by ``min(block_rows, 1024)`` rows, gzip-compressed like
    NVIDIA's shards. Returns the number of records written.
    """
    final = Path(path)
    tmp = final.with_name(final.name + ".partial")
    widths = {"S": max_seq_length, "P": max_predictions_per_seq}
    chunk = max(1, min(block_rows, 1024))
    written = 0
    it = iter(records)
    try:
        with h5py.File(tmp, "w") as f:
            sets = {}
            for name, (dtype, w) in HDF5_DATASETS.items():
                shape: tuple[int, ...] = (0, widths[w]) if w else (0,)
                sets[name] = f.create_dataset(
                    name,
                    shape=shape,
                    maxshape=(None, *shape[1:]),
                    chunks=(chunk, *shape[1:]),
                    dtype=dtype,
                    compression=compression,
                )
            while block := list(islice(it, block_rows)):
                padded = _pad(path, block, written, max_seq_length, max_predictions_per_seq)
                for name, ds in sets.items():
                    ds.resize(written + len(block), axis=0)
                    ds[written:] = padded[name].astype(ds.dtype)
                written += len(block)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return written


def _pad(
    path: str | os.PathLike[str], block: list[dict[str, Any]], start: int, seq: int, preds: int
) -> dict[str, Any]:
    try:
        padded = pad_records(block, seq, preds)
    except RecordError as err:
        raise HDF5FormatError(
            f"{path}: cannot write record {start + err.index}: {err.problem}; fix the record "
            "or raise max_seq_length / max_predictions_per_seq."
        ) from err
    zero = (padded["masked_lm_positions"] == 0) & (padded["masked_lm_weights"] != 0)
    if zero.any():
        index = start + int(np.flatnonzero(zero.any(axis=1))[0])
        raise HDF5FormatError(
            f"{path}: cannot write record {index}: it masks position 0, which the NVIDIA HDF5 "
            "layout reserves for padding; position 0 must be [CLS] and never masked."
        )
    return padded


def _check_layout(
    path: str | os.PathLike[str], f: h5py.File, seq: int | None, preds: int | None
) -> tuple[int, int, int]:
    """Validate datasets and shapes; return (rows, max_seq_length, max_predictions_per_seq)."""
    missing = [name for name in HDF5_DATASETS if name not in f]
    if missing:
        raise HDF5FormatError(
            f"{path}: no dataset {', '.join(missing)} (found {sorted(f.keys())}); this is not an "
            "NVIDIA BERT pretraining shard, re-create it with its create_pretraining_data.py."
        )
    rows = f["input_ids"].shape[0]
    found = {"S": f["input_ids"].shape[1:], "P": f["masked_lm_positions"].shape[1:]}
    declared = {"S": seq, "P": preds}
    arg = {"S": "max_seq_length", "P": "max_predictions_per_seq"}
    for name, (_, w) in HDF5_DATASETS.items():
        shape = f[name].shape
        if shape[0] != rows or (w is None and shape[1:] not in ((), (1,))):
            raise HDF5FormatError(
                f"{path}: dataset {name!r} has shape {shape} but input_ids has {rows} rows; "
                "the shard is inconsistent, re-create it."
            )
        if w is None:
            continue
        if len(shape) != 2 or shape[1:] != found[w]:
            raise HDF5FormatError(
                f"{path}: dataset {name!r} has shape {shape}, inconsistent with input_ids "
                f"{f['input_ids'].shape} / masked_lm_positions "
                f"{f['masked_lm_positions'].shape}; re-create the shard."
            )
        want = declared[w]
        if want is not None and shape[1] != want:
            raise HDF5FormatError(
                f"{path}: dataset {name!r} is padded to {shape[1]} but {arg[w]} is {want}; "
                f"set {arg[w]}={shape[1]} or use shards made for {want}."
            )
    return rows, int(found["S"][0]), int(found["P"][0])


def read_hdf5(
    path: str | os.PathLike[str],
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    chunk_rows: int = 8192,
) -> Iterator[dict[str, Any]]:
    """Stream the unpadded omnibert records of an NVIDIA BERT HDF5 shard.

    Reads ``chunk_rows`` rows of every dataset at a time, so a large shard never loads at
    once. Predictions are the slots with a nonzero ``masked_lm_positions``. Raises
    :class:`HDF5FormatError` (naming the file and row) on unreadable or foreign data.
    """
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise HDF5FormatError(
            f"{path}: cannot be opened as HDF5 ({err}); the file is missing, truncated or not "
            "HDF5, re-create or re-copy it."
        ) from err
    with f:
        rows, _, _ = _check_layout(path, f, max_seq_length, max_predictions_per_seq)
        for start in range(0, rows, chunk_rows):
            stop = min(start + chunk_rows, rows)
            try:
                arrays = {name: f[name][start:stop].astype(np.int64) for name in HDF5_DATASETS}
            except OSError as err:
                raise HDF5FormatError(
                    f"{path}: rows {start}..{stop - 1} cannot be read ({err}); the file is "
                    "corrupt or truncated, re-create or re-copy it."
                ) from err
            positions = arrays["masked_lm_positions"]
            try:
                records = unpad_batch(
                    arrays["input_ids"],
                    arrays["input_mask"],
                    arrays["segment_ids"],
                    positions,
                    arrays["masked_lm_ids"],
                    positions != 0,
                    arrays["next_sentence_labels"],
                )
            except RecordError as err:
                raise HDF5FormatError(
                    f"{path}: row {start + err.index}: {err.problem}; re-create the shard."
                ) from err
            yield from records
