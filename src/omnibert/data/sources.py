"""Row sources: where the pretraining data module's unpadded rows come from.

:class:`~omnibert.data.datamodule.PretrainingDataModule` is one class; its row source is
chosen by ``data.source._target_`` (``conf/data/*.yaml``) and built with the data config's
remaining keys:

* :class:`ArrowSource` (``data=arrow``): ``omnibert-prepare`` output directories (HF
  ``datasets`` Arrow files plus ``metadata.json``), memory-mapped;
* :class:`~omnibert.data.converted.ConvertedSource` (``data=tfrecord|hdf5``): MLPerf
  TFRecords / NVIDIA HDF5 converted once into an Arrow cache, then served as Arrow;
* :class:`~omnibert.data.generated.GeneratedSource` (``data=generated``): synthetic rows.

A source checks itself against the run's spec (:meth:`RowSource.check`), says how many
rows it holds, the vocab size, the masking rate and every row's length (what packing
needs), and hands out map-style datasets whose ``__getitems__`` returns a
:class:`~omnibert.data.collate.RowBlock`. Everything that can be wrong is one
:class:`DataConfigError` sentence naming the key and the fix, before any compute.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from torch.utils.data import Dataset

from omnibert.data.checks import (
    COMPARED,
    DataConfigError,
    RowSpec,
    Split,
    check_files,
    check_widths,
    compare_splits,
    load_arrow,
    read_metadata,
    read_vocab,
    split_repair_command,
)
from omnibert.data.rows import ArrowRows, ShardMap

__all__ = [
    "COMPARED",
    "ArrowSource",
    "DataConfigError",
    "RowSource",
    "RowSpec",
    "Split",
    "check_widths",
    "compare_splits",
    "load_arrow",
    "read_metadata",
]

Ints = npt.NDArray[np.int64]


class RowSource:
    """The interface :class:`~omnibert.data.datamodule.PretrainingDataModule` reads.

    ``format`` names the source in plans and errors. ``check`` validates everything that
    can be read cheaply; ``materialize`` does the expensive one-off work (a conversion) and
    runs once per node (Lightning's ``prepare_data``) or on first use.
    """

    format = "base"
    #: (max_seq_length, max_predictions_per_seq) the data was prepared with, once checked
    found_shape: tuple[int, int] | None = None

    def check(self, spec: RowSpec, train: bool = True) -> None:
        """Validate against ``spec``; ``train=False``: only the eval set is needed."""
        raise NotImplementedError

    def materialize(self) -> None:
        """Make every split readable (no-op unless the source converts data)."""

    def rows(self, split: str) -> Dataset[Any]:
        """The map-style dataset of ``split`` (``"train"`` or ``"eval"``)."""
        raise NotImplementedError

    @property
    def num_train_samples(self) -> int:
        raise NotImplementedError

    @property
    def num_train_known(self) -> bool:
        """Whether :attr:`num_train_samples` is known without converting anything."""
        return True

    @property
    def num_eval_samples(self) -> int:
        """Rows evaluated per validation run (0 without an eval set)."""
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    @property
    def vocab_file(self) -> str | None:
        return None

    @property
    def do_lower_case(self) -> bool | None:
        """Whether the text was lower-cased when the rows were made (None when unrecorded)."""
        return None

    @property
    def masked_lm_prob(self) -> float | None:
        """The masking rate the training rows were made with (None when unrecorded)."""
        return None

    @property
    def next_sentence(self) -> bool | None:
        """Whether the training rows are sentence pairs with next-sentence labels (False:
        single segments with label 0, ``omnibert-prepare next_sentence=false``); None when
        unrecorded (TFRecord, HDF5: the reference's pairs)."""
        return None

    def row_lengths(self) -> tuple[Ints, Ints]:
        """Tokens and masked positions of every training row, in row order."""
        raise NotImplementedError

    def pack_index(self, name: str, max_sequences_per_pack: int) -> Any:
        """The offline pack index ``name`` of the training rows (Arrow sources only)."""
        raise DataConfigError(
            f"data.packing=offline reads a pack index omnibert-prepare writes next to its "
            f"Arrow shards, and data={self.format} has none; use data.packing=online."
        )

    def describe(self) -> dict[str, Any]:
        raise NotImplementedError


class ArrowSource(RowSource):
    """``omnibert-prepare`` output directories.

    Args:
        train_path: the training directory (must hold metadata.json).
        eval_path: the held-out directory; ``None``: no validation.
        vocab_file: the vocab.txt the data was prepared with (its sha256 is checked against
            metadata.json); ``None``: trust the metadata.
        eval_samples: evaluate only the first N eval rows (MLPerf: 10000); ``None``: all.
        verify_checksums: also check every Arrow file's CRC-32C against metadata.json at
            start (reads all the data once): ``true``, ``false`` or ``auto`` (the default:
            when a split holds at most 2 GiB, :data:`~omnibert.data.checks.AUTO_CHECKSUM_BYTES`);
            sizes and row counts are always checked, every batch's values are range-checked.
    """

    format = "arrow"

    def __init__(
        self,
        train_path: str | None,
        eval_path: str | None = None,
        vocab_file: str | None = None,
        eval_samples: int | None = None,
        verify_checksums: bool | str = "auto",
    ) -> None:
        self.train_path = None if train_path is None else str(train_path)
        self.verify_checksums = verify_checksums
        self.eval_path = None if eval_path is None else str(eval_path)
        self._vocab_file = None if vocab_file is None else str(vocab_file)
        self.eval_samples = eval_samples
        self.splits: dict[str, Split] = {}
        self._vocab: tuple[str, int] | None = None  # (sha256, size) of vocab_file
        self._datasets: dict[str, Any] = {}
        self._lengths: tuple[Ints, Ints] | None = None

    # ------------------------------------------------------------------ checks
    def check(self, spec: RowSpec, train: bool = True) -> None:
        """Validate the paths and the data against ``spec`` (cheap to call again)."""
        if self.eval_samples is not None and self.eval_samples < 1:
            raise DataConfigError(
                f"data.eval_samples={self.eval_samples} must be at least 1; fix data.eval_samples."
            )
        if self._vocab_file is not None and self._vocab is None:
            self._vocab = read_vocab(self._vocab_file)
        if train and "train" not in self.splits:
            self.splits["train"] = self.inspect("data.train_path", self.train_path, spec)
        if not train and self.eval_path is None:
            raise DataConfigError(f"data.eval_path is not set; set it to {self.expects()}.")
        if self.eval_path is not None and "eval" not in self.splits:
            self.splits["eval"] = self.inspect("data.eval_path", self.eval_path, spec)
            if "train" in self.splits:
                compare_splits(self.splits["train"], self.splits["eval"])
        self.check_eval_samples()

    def inspect(self, key: str, path: str | None, spec: RowSpec) -> Split:
        if path is None or path in ("", "???"):
            raise DataConfigError(f"{key} is not set; set {key} to {self.expects()}.")
        if not Path(path).exists():
            raise DataConfigError(f"{key}={path} does not exist; fix {key}.")
        split = Split(key, path, arrow_dir=path, metadata=read_metadata(key, path))
        settings = (split.metadata or {}).get("settings", {})
        check_widths(key, path, settings, spec)
        if self.found_shape is None and "max_seq_length" in settings:
            self.found_shape = (settings["max_seq_length"], settings["max_predictions_per_seq"])
        self.check_vocab(split)
        check_files(split, self.verify_checksums)
        name = "train" if key.endswith("train_path") else "eval"
        self._datasets[name] = load_arrow(split)
        split.rows = len(self._datasets[name])
        return split

    def expects(self) -> str:
        return "an omnibert-prepare output directory"

    def check_vocab(self, split: Split) -> None:
        vocab = (split.metadata or {}).get("vocab") or {}
        if self._vocab is not None and vocab.get("sha256") and vocab["sha256"] != self._vocab[0]:
            raise DataConfigError(
                f"data.vocab_file={self._vocab_file} (sha256 {self._vocab[0][:12]}…) is not the "
                f"vocab {split.key}={split.path} was prepared with ({vocab.get('path')}, sha256 "
                f"{vocab['sha256'][:12]}…); set data.vocab_file to that file or re-prepare."
            )

    def check_eval_samples(self) -> None:
        evaluation, limit = self.splits.get("eval"), self.eval_samples
        if limit is not None and evaluation is not None and limit > (evaluation.rows or limit):
            raise DataConfigError(
                f"data.eval_samples={limit} but data.eval_path={self.eval_path} holds only "
                f"{evaluation.rows} rows; lower data.eval_samples or set it to null."
            )

    # ------------------------------------------------------------------ rows
    def load(self, name: str) -> Any:
        """The ``datasets.Dataset`` of split ``name``."""
        if name not in self._datasets:
            self.materialize()
            self._datasets[name] = load_arrow(self.splits[name])
        return self._datasets[name]

    def rows(self, split: str) -> Dataset[Any]:
        dataset, checked = self.load(split), self.splits[split]
        records = (checked.metadata or {}).get("files")
        return ArrowRows(dataset, ShardMap.of(dataset, records, split_repair_command(checked)))

    @property
    def num_train_samples(self) -> int:
        self.materialize()
        rows = self.splits["train"].rows
        assert rows is not None, "check() first"
        return rows

    @property
    def num_eval_samples(self) -> int:
        if "eval" not in self.splits:
            return 0
        self.materialize()
        rows = self.splits["eval"].rows
        assert rows is not None
        return rows if self.eval_samples is None else min(rows, self.eval_samples)

    @property
    def vocab_size(self) -> int:
        """From data.vocab_file when given, else from the train set's metadata.json."""
        if self._vocab is not None:
            return self._vocab[1]
        split = self.splits.get("train") or self.splits["eval"]
        size = ((split.metadata or {}).get("vocab") or {}).get("size")
        if not size:
            raise DataConfigError(
                f"the vocab size of data.train_path={self.train_path} is unknown ({self.format} "
                "files do not record it); set data.vocab_file to its vocab.txt or set "
                "model.config.vocab_size."
            )
        return int(size)

    @property
    def vocab_file(self) -> str | None:
        return self._vocab_file

    @property
    def do_lower_case(self) -> bool | None:
        split = self.splits.get("train") or self.splits.get("eval")
        settings = ((split.metadata if split else None) or {}).get("settings") or {}
        value = settings.get("do_lower_case")
        return None if value is None else bool(value)

    @property
    def masked_lm_prob(self) -> float | None:
        settings = (self.splits["train"].metadata or {}).get("settings") or {}
        prob = settings.get("masked_lm_prob")
        return None if prob is None else float(prob)

    @property
    def next_sentence(self) -> bool | None:
        # recorded only when false (absent: the pairs of every earlier version)
        settings = (self.splits["train"].metadata or {}).get("settings") or {}
        return bool(settings.get("next_sentence", True))

    def row_lengths(self) -> tuple[Ints, Ints]:
        if self._lengths is None:
            from omnibert.data.pack_index import row_lengths

            self._lengths = row_lengths(self.load("train"))
        return self._lengths

    def pack_index(self, name: str, max_sequences_per_pack: int) -> Any:
        from omnibert.data.pack_index import PackIndexError, load_pack_index

        split = self.splits["train"]
        try:
            return load_pack_index(
                split.arrow_dir,
                name,
                rows=split.rows or 0,
                fingerprint=str((split.metadata or {}).get("fingerprint")),
                max_sequence_length=int((split.metadata or {})["settings"]["max_seq_length"]),
                max_sequences_per_pack=max_sequences_per_pack,
            )
        except PackIndexError as err:
            raise DataConfigError(f"data.packing=offline: {err}") from err

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "train_path": self.train_path,
            "eval_path": self.eval_path,
            "arrow_dirs": {n: split.arrow_dir for n, split in self.splits.items()},
            "train_samples": self.num_train_samples,
            "eval_samples": self.num_eval_samples,
            "vocab_file": self._vocab_file,
        }
