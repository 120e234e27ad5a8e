"""Read any TFRecord / HDF5 file of pretraining instances by its suffix."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from omnibert.formats import FILE_SUFFIXES
from omnibert.formats.hdf5 import read_hdf5
from omnibert.formats.tfrecord import read_tfrecord

__all__ = ["HDF5_SUFFIXES", "TFRECORD_SUFFIXES", "iter_records"]

TFRECORD_SUFFIXES = FILE_SUFFIXES["tfrecord"]
HDF5_SUFFIXES = FILE_SUFFIXES["hdf5"]


def iter_records(
    path: str | os.PathLike[str],
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Stream unpadded omnibert records from a TFRecord (``.tfrecord``, ``.tfrecords``,
    ``.gz``: gzip-compressed TFRecord) or NVIDIA HDF5 (``.hdf5``, ``.h5``) file."""
    name = str(path).lower()
    if name.endswith(TFRECORD_SUFFIXES):
        return read_tfrecord(
            path, max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq
        )
    if name.endswith(HDF5_SUFFIXES):
        return read_hdf5(
            path, max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq
        )
    raise ValueError(
        f"{path}: unknown pretraining data format; name TFRecord files *.tfrecord, "
        "*.tfrecords or *.gz (gzip) and NVIDIA HDF5 shards *.hdf5 or *.h5."
    )
