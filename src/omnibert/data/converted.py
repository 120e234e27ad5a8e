"""MLPerf/Google TFRecords and NVIDIA HDF5 shards as a row source, through an Arrow cache.

``data=tfrecord`` / ``data=hdf5`` read the same records as ``omnibert-prepare`` output: their
files are converted once (:mod:`omnibert.data.conversion`, imported only when a
conversion runs) into an Arrow cache under ``cache_dir``, one directory per set of inputs,
keyed by the files' paths, sizes and mtimes and the row spec. A conversion is built under a
temporary name and renamed, and one process per cache entry converts while the others wait
on a file lock, so a concurrent or interrupted conversion never leaves a half-written cache.
Afterwards the rows are served exactly like ``data=arrow``: the same random access, sampler,
batches and exact resume.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from omnibert.data.sources import (
    ArrowSource,
    DataConfigError,
    RowSource,
    RowSpec,
    Split,
    check_widths,
    compare_splits,
    read_metadata,
)
from omnibert.formats import FILE_SUFFIXES
from omnibert.paths import user_cache_dir

__all__ = ["FORMATS", "ConvertedSource"]

#: format -> file name suffixes it reads
FORMATS = FILE_SUFFIXES
CACHE_FILE = "omnibert-cache.json"  # sources and largest token id of a converted cache


def resolve_files(key: str, path: str, fmt: str) -> list[str]:
    """The files a directory, a glob or one file names, all of format ``fmt``."""
    suffixes = FORMATS[fmt]
    if Path(path).is_dir():
        found = sorted(str(p) for p in Path(path).iterdir() if p.name.lower().endswith(suffixes))
    elif glob.has_magic(path):
        found = sorted(glob.glob(path))
    else:
        found = [path]
    if not found:
        raise DataConfigError(
            f"{key}={path} holds no {' / '.join('*' + s for s in suffixes)} files; fix {key} "
            "or the data format (data=arrow|tfrecord|hdf5)."
        )
    wrong = [f for f in found if not f.lower().endswith(suffixes)]
    if wrong:
        raise DataConfigError(
            f"{key}: {wrong[0]} is not a {fmt} file (names end in {', '.join(suffixes)}); "
            "fix the path or the data format (data=arrow|tfrecord|hdf5)."
        )
    return found


def file_layout(fmt: str, path: str) -> tuple[int, int, int | None] | None:
    """(max_seq_length, max_predictions_per_seq, rows or None) of a TFRecord / HDF5 file,
    after reading and validating its first record; None for an empty file."""
    if fmt == "hdf5":
        import h5py

        from omnibert.formats.hdf5 import read_hdf5

        if next(read_hdf5(path, chunk_rows=1), None) is None:  # raises on a foreign layout
            return None
        with h5py.File(path, "r") as f:
            rows = int(f["input_ids"].shape[0])
            return int(f["input_ids"].shape[1]), int(f["masked_lm_positions"].shape[1]), rows
    from omnibert.formats.example_proto import decode_varints, parse_example_raw
    from omnibert.formats.tfrecord import iter_tfrecord_payloads, read_tfrecord

    if next(read_tfrecord(path, block_size=1), None) is None:  # validates the first example
        return None
    for _, payload in iter_tfrecord_payloads(path):
        raw = parse_example_raw(payload)
        ids, positions = raw["input_ids"][1], raw["masked_lm_positions"][1]
        assert isinstance(ids, bytes) and isinstance(positions, bytes)
        return int(decode_varints(ids).size), int(decode_varints(positions).size), None
    return None


class ConvertedSource(ArrowSource):
    """TFRecord or HDF5 files, converted once into an Arrow cache (module docstring).

    Args:
        format: ``tfrecord`` or ``hdf5``.
        train_path / eval_path: a directory of such files, one file, or a glob.
        vocab_file: the data's vocab.txt (these formats do not record the vocab, so the
            model's vocab size comes from here); token ids are checked against it.
        eval_samples: evaluate only the first N eval rows; ``None``: all.
        cache_dir: where conversions are kept; ``None``: ``arrow/`` in
            :func:`omnibert.paths.user_cache_dir` (``$OMNIBERT_CACHE_DIR``, or
            ``~/.cache/omnibert``).
        num_proc: processes of a conversion.
    """

    #: offline pack indexes live next to omnibert-prepare shards only
    pack_index = RowSource.pack_index

    def __init__(
        self,
        format: str,
        train_path: str | None,
        eval_path: str | None = None,
        vocab_file: str | None = None,
        eval_samples: int | None = None,
        cache_dir: str | None = None,
        num_proc: int = 1,
    ) -> None:
        super().__init__(train_path, eval_path, vocab_file, eval_samples)
        if format not in FORMATS:
            raise DataConfigError(
                f"data.format={format!r} is not one of {sorted(FORMATS)}; use the data config "
                "that matches your files (data=arrow, data=tfrecord or data=hdf5)."
            )
        self.format = format
        self.cache_dir = Path(cache_dir) if cache_dir else user_cache_dir() / "arrow"
        self.num_proc = max(1, int(num_proc))
        self._spec: RowSpec | None = None

    def expects(self) -> str:
        return f"a directory, file or glob of {self.format} files"

    def inspect(self, key: str, path: str | None, spec: RowSpec) -> Split:
        if path is None or path in ("", "???"):
            raise DataConfigError(f"{key} is not set; set {key} to {self.expects()}.")
        if not glob.has_magic(path) and not Path(path).exists():
            raise DataConfigError(f"{key}={path} does not exist; fix {key}.")
        files = resolve_files(key, path, self.format)
        rows: int | None = 0
        for file in files:
            try:
                layout = file_layout(self.format, file)
            except ValueError as err:  # TFRecordError / HDF5FormatError name the file
                raise DataConfigError(f"{key}: {err}") from err
            if layout is not None:
                seq, preds, count = layout
                settings = {"max_seq_length": seq, "max_predictions_per_seq": preds}
                check_widths(key, file, settings, spec)
                self.found_shape = self.found_shape or (seq, preds)
                rows = None if rows is None or count is None else rows + count
        if self.found_shape is not None:  # the widths the conversion pads to
            spec = RowSpec(*self.found_shape, seed=spec.seed)
        self._spec = spec
        cache = self._cache_path(files, spec)
        split = Split(key, path, arrow_dir=str(cache), rows=rows, files=tuple(files))
        if (cache / CACHE_FILE).is_file():
            self._adopt(split)
        return split

    @property
    def num_train_known(self) -> bool:
        return "train" in self.splits and self.splits["train"].rows is not None

    def _cache_path(self, files: list[str], spec: RowSpec) -> Path:
        identity = {
            "format": self.format,
            "files": [[os.path.abspath(f), os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files],
            "settings": [spec.max_seq_length, spec.max_predictions_per_seq],
        }  # fmt: skip
        digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
        return self.cache_dir / f"{self.format}-{digest}"

    def _adopt(self, split: Split) -> None:
        split.metadata = read_metadata(split.key, split.arrow_dir)
        split.rows = int(split.metadata["counts"]["instances"])
        top = json.loads((Path(split.arrow_dir) / CACHE_FILE).read_text())["max_token_id"]
        if self._vocab is not None and top >= self._vocab[1]:
            raise DataConfigError(
                f"{split.key}={split.path} holds token id {top} but data.vocab_file="
                f"{self._vocab_file} has only {self._vocab[1]} tokens; use the vocab the data "
                "was made with."
            )

    def materialize(self) -> None:
        """Convert every split that has no cache yet (once per cache entry, under a lock)."""
        for split in self.splits.values():
            if split.metadata is not None:
                continue
            self.cache_dir.mkdir(parents=True, exist_ok=True)
            with open(f"{split.arrow_dir}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not (Path(split.arrow_dir) / CACHE_FILE).is_file():
                    self._convert(split)
            self._adopt(split)
        if "train" in self.splits and "eval" in self.splits:
            compare_splits(self.splits["train"], self.splits["eval"])
        self.check_eval_samples()

    def _convert(self, split: Split) -> None:
        import pyarrow.compute as pc

        from omnibert.data.conversion import convert_to_arrow

        assert self._spec is not None
        scratch = tempfile.mkdtemp(prefix=".convert-", dir=self.cache_dir)
        try:
            out = Path(scratch) / "data"
            dataset = convert_to_arrow(
                list(split.files),
                out,
                max_seq_length=self._spec.max_seq_length,
                max_predictions_per_seq=self._spec.max_predictions_per_seq,
                num_proc=self.num_proc,
                vocab_size=None if self._vocab is None else self._vocab[1],
            )
            ids = dataset.data.column("input_ids")
            top = max((pc.max(c.flatten()).as_py() or 0 for c in ids.chunks), default=0)
            (out / CACHE_FILE).write_text(json.dumps({"files": split.files, "max_token_id": top}))
            del dataset, ids
            try:
                os.replace(out, split.arrow_dir)  # the cache appears complete or not at all
            except OSError:  # another machine finished the same conversion first
                if not (Path(split.arrow_dir) / CACHE_FILE).is_file():
                    raise
        except ValueError as err:  # TFRecordError / HDF5FormatError name the file
            raise DataConfigError(f"{split.key}: {err}") from err
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
