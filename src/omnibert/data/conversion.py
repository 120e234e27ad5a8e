"""Convert MLPerf TFRecord / NVIDIA HDF5 files (read by :mod:`omnibert.formats`) to an Arrow
dataset of omnibert's unpadded rows with a ``metadata.json`` (training's converted source
caches them: :mod:`omnibert.data.converted`)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omnibert.formats.hdf5 import HDF5FormatError
from omnibert.formats.records import iter_records
from omnibert.formats.tfrecord import TFRecordError

if TYPE_CHECKING:
    import datasets

__all__ = ["arrow_features", "convert_to_arrow"]


def arrow_features(
    vocab_size: int | None = None, max_seq_length: int | None = None
) -> datasets.Features:
    """The Arrow schema of omnibert's unpadded pretraining instances (that of
    ``omnibert-prepare``); without a vocab size ids are int32, without a sequence length
    positions are int32 too (neither is recorded in TFRecord / HDF5 files)."""
    from omnibert.data.schema import features

    return features(vocab_size or (1 << 31), max_seq_length or (1 << 31))


def _generate(
    paths: Sequence[str], max_seq_length: int | None, max_predictions_per_seq: int | None
) -> Iterator[dict[str, Any]]:
    for path in paths:
        yield from iter_records(
            path, max_seq_length=max_seq_length, max_predictions_per_seq=max_predictions_per_seq
        )


def convert_to_arrow(
    paths: Sequence[str | os.PathLike[str]],
    output_dir: str | os.PathLike[str],
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    num_proc: int | None = None,
    num_shards: int | None = None,
    vocab_size: int | None = None,
) -> datasets.Dataset:
    """Convert TFRecord / HDF5 files to an omnibert Arrow dataset saved at ``output_dir``.

    Files are read in order (split over ``num_proc`` worker processes when given). Pass the
    max lengths to check every file against them; otherwise each file is only checked for
    consistency with itself. The dataset is built in a scratch cache next to ``output_dir``,
    saved with ``save_to_disk`` and reloaded from there, with a ``metadata.json`` like
    ``omnibert-prepare``'s (source files, counts, sequence-length histogram). Returns the
    saved dataset.
    """
    import datasets

    files = [str(p) for p in paths]
    if not files:
        raise ValueError("convert_to_arrow: no input files given; pass TFRecord or HDF5 paths.")
    for p in files:
        if not Path(p).is_file():
            raise FileNotFoundError(f"{p}: no such file; check the input paths.")
        iter_records(p)  # fails fast on an unknown suffix (the generator itself is lazy)
    out = Path(output_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{out.name}.cache-", dir=out.parent)
    try:
        ds = datasets.Dataset.from_generator(
            _generate,
            features=arrow_features(vocab_size, max_seq_length),
            gen_kwargs={
                "paths": files,
                "max_seq_length": max_seq_length,
                "max_predictions_per_seq": max_predictions_per_seq,
            },
            cache_dir=scratch,
            num_proc=num_proc if num_proc and num_proc > 1 and len(files) > 1 else None,
        )
        ds.save_to_disk(str(out), num_shards=num_shards)
        del ds
        _write_metadata(out, files, max_seq_length, max_predictions_per_seq, vocab_size)
    except datasets.exceptions.DatasetGenerationError as err:
        cause = err.__cause__
        if isinstance(cause, (TFRecordError, HDF5FormatError)):  # keep our one-sentence error
            raise type(cause)(str(cause)) from err
        raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return datasets.load_from_disk(str(out))


def _write_metadata(
    out: Path,
    files: Sequence[str],
    max_seq_length: int | None,
    max_predictions_per_seq: int | None,
    vocab_size: int | None,
) -> None:
    import datasets

    from omnibert.data.schema import FORMAT_NAME, FORMAT_VERSION, METADATA_FILE, RowStats
    from omnibert.paths import write_json_atomic
    from omnibert.tokenization.vocab import sha256_file

    dataset = datasets.load_from_disk(str(out))
    lengths = dataset.data.column("input_ids").combine_chunks().value_lengths()
    longest = int(max(lengths.to_numpy(zero_copy_only=False), default=0))
    stats = RowStats.from_dataset(dataset, max_seq_length or longest)
    histogram = stats.histogram
    write_json_atomic(
        out / METADATA_FILE,
        {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "converted_from": [{"path": f, "sha256": sha256_file(f)} for f in files],
            "settings": {
                "max_seq_length": max_seq_length,
                "max_predictions_per_seq": max_predictions_per_seq,
            },
            "vocab": {"size": vocab_size},
            "counts": {
                "instances": stats.rows,
                "tokens": int(sum(n * count for n, count in enumerate(histogram.tolist()))),
                "masked": stats.masked,
                "random_next": stats.random_next,
            },
            "sequence_length_histogram": histogram.tolist(),
        },
    )
