"""The pretraining DataModule: checked shards → resumable, per-rank, static-shape batches.

``format=arrow`` reads ``omnibert-prepare`` output directories (HF ``datasets`` Arrow files
plus ``metadata.json``). ``format=tfrecord`` (MLPerf / Google) and ``format=hdf5`` (NVIDIA)
read the same records through :mod:`omnibert.prepare.formats`: their files are converted once
into an Arrow cache under ``cache_dir`` (one directory per set of inputs, keyed by the files'
paths, sizes and mtimes and the settings; built under a temporary name and renamed, so a
concurrent or interrupted conversion never leaves a half-written cache) and then served
exactly like ``arrow`` data: the same random access, sampler, batches and exact resume.

Everything that can be wrong with the configuration is found by :meth:`check` before any
compute and reported as one :class:`DataConfigError` sentence naming the key and the fix.

Exact resume under Lightning (verified by tests/test_datamodule.py with 0 and 2 workers and
gradient accumulation): Lightning saves ``train_dataloader().state_dict()`` in checkpoints and
restores it. Its fetcher does not prefetch a loader that has a length, and torchdata's
``StatefulDataLoader`` snapshots the sampler state per dispatched batch, so a checkpoint taken
after batch k resumes at batch k+1, provided the sampler's epoch ends where Lightning's does
(:func:`lightning_epoch_batches`; otherwise worker prefetch runs past Lightning's epoch end).
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset
from torchdata.stateful_dataloader import StatefulDataLoader

from omnibert.data.collate import ArrowRows, PretrainingCollator
from omnibert.data.packed import PackedData, PackingSettings
from omnibert.data.samplers import EvalBatchSampler, ResumableBatchSampler
from omnibert.data.schema import COLUMNS
from omnibert.errors import UserError
from omnibert.prepare.formats.convert import HDF5_SUFFIXES, TFRECORD_SUFFIXES

__all__ = [
    "FORMATS",
    "DataConfigError",
    "PretrainingDataModule",
    "build_loader",
    "lightning_epoch_batches",
]

FORMATS = {"arrow": (), "tfrecord": TFRECORD_SUFFIXES, "hdf5": HDF5_SUFFIXES}
# settings that must agree between the train and the eval set (when both record them)
COMPARED: tuple[str, ...] = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob")
COMPARED += ("do_lower_case", "do_whole_word_mask")
CACHE_FILE = "omnibert-cache.json"  # sources and largest token id of a converted cache


class DataConfigError(UserError):
    """The data configuration cannot work; the message names the key/path and the fix."""


def build_loader(
    dataset: Dataset[Any],
    collator: PretrainingCollator,
    sampler: Any,
    *,
    num_workers: int,
    seed: int,
    pin_memory: bool = False,
) -> DataLoader[Any]:
    """A loader over ``sampler``'s batches: a torchdata ``StatefulDataLoader`` (its position is
    saved in Lightning checkpoints) for the resumable training sampler, a plain ``DataLoader``
    for evaluation. Its own seeded generator leaves torch's global RNG untouched."""
    loader = DataLoader if isinstance(sampler, EvalBatchSampler) else StatefulDataLoader
    return loader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collator,
        num_workers=num_workers,
        pin_memory=pin_memory,
        persistent_workers=num_workers > 0,
        generator=torch.Generator().manual_seed(seed),
    )


class _LoaderSettings(Protocol):
    """What :func:`train_loader` / :func:`eval_loader` read from a pretraining data module."""

    trainer: Any
    max_seq_length: int
    max_predictions_per_seq: int
    micro_batch_size: int
    eval_micro_batch_size: int
    num_workers: int
    seed: int
    shuffle: bool
    pin_memory: bool
    rank: int
    world_size: int
    packing: PackingSettings

    @property
    def predictions_per_pack(self) -> int: ...

    def train_batch_sampler(
        self, batch_size: int | None = None, rank: int | None = None
    ) -> Any: ...


def train_loader(module: _LoaderSettings, rows: Dataset[Any], num_rows: int) -> DataLoader[Any]:
    """The resumable, per-rank training loader of a data module over ``rows`` (packed rows
    when ``data.packing`` is on: see :mod:`omnibert.data.packed`)."""
    sampler: Any
    if module.packing.enabled:
        sampler = module.train_batch_sampler()
    else:
        sampler = ResumableBatchSampler(
            num_rows,
            module.micro_batch_size,
            shuffle=module.shuffle,
            seed=module.seed,
            drop_last=True,
            num_replicas=module.world_size,
            rank=module.rank,
        )
    sampler.batches_per_epoch = lightning_epoch_batches(module.trainer, len(sampler))
    collator = PretrainingCollator(
        module.max_seq_length,
        module.max_predictions_per_seq,
        max_sequences_per_pack=module.packing.sequences_per_row_max,
        max_predictions_per_pack=module.predictions_per_pack,
    )
    return build_loader(
        rows, collator, sampler, num_workers=module.num_workers, seed=module.seed,
        pin_memory=module.pin_memory,
    )  # fmt: skip


def eval_loader(module: _LoaderSettings, rows: Dataset[Any], num_rows: int) -> DataLoader[Any]:
    """In-order, full-size (zero-weight padded) evaluation batches of this rank's share."""
    sampler = EvalBatchSampler(
        num_rows, module.eval_micro_batch_size, num_replicas=module.world_size, rank=module.rank
    )
    collator = PretrainingCollator(
        module.max_seq_length, module.max_predictions_per_seq, module.eval_micro_batch_size
    )
    return build_loader(
        rows, collator, sampler, num_workers=module.num_workers, seed=module.seed,
        pin_memory=module.pin_memory,
    )  # fmt: skip


def lightning_epoch_batches(trainer: pl.Trainer | None, batches: int) -> int | None:
    """Training batches per epoch that make the sampler's epoch end exactly where Lightning's
    does: capped by an integer ``limit_train_batches`` and rounded down to whole
    ``accumulate_grad_batches`` groups (every optimiser step sees a full global batch).

    Without the cap, Lightning ends its epoch early while the sampler's epoch goes on: the
    next Lightning epoch would start with the leftover batches, and loader workers would have
    consumed sampler positions past the end that a resumed run would see again.
    """
    if trainer is None:
        return None
    limit, accumulate = trainer.limit_train_batches, int(trainer.accumulate_grad_batches)
    if isinstance(limit, int):  # a float fraction is applied by Lightning to len(loader)
        batches = min(batches, limit)
    if batches < accumulate:
        raise DataConfigError(
            f"each device gets {batches} micro batches per epoch, fewer than the "
            f"{accumulate} accumulated per optimiser step; lower the global batch size or "
            "use more data."
        )
    return batches // accumulate * accumulate


@dataclass
class _Split:
    """One checked data source (train or eval)."""

    key: str  # config key, e.g. "data.train_path"
    path: str
    arrow_dir: str
    files: list[str] = field(default_factory=list)  # tfrecord / hdf5 inputs
    metadata: dict[str, Any] | None = None  # metadata.json once the Arrow data exists
    rows: int | None = None


def _read_metadata(key: str, path: str) -> dict[str, Any]:
    meta_path = Path(path) / "metadata.json"
    if not Path(path).is_dir() or not meta_path.is_file():
        raise DataConfigError(
            f"{key}={path} is not an omnibert-prepare output directory (no metadata.json; an "
            f"interrupted omnibert-prepare leaves none); run omnibert-prepare into it or fix {key}."
        )
    try:
        meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise DataConfigError(
            f"{meta_path} cannot be read ({err}); re-run omnibert-prepare into {path}."
        ) from err
    if meta.get("format") != "omnibert-pretraining":
        raise DataConfigError(
            f"{meta_path} has format={meta.get('format')!r}, not 'omnibert-pretraining'; point "
            f"{key} at an omnibert-prepare output directory."
        )
    return meta


def _load_arrow(key: str, split: _Split) -> Any:
    import datasets

    try:
        dataset = datasets.load_from_disk(split.arrow_dir)
    except Exception as err:  # datasets raises many types for broken directories
        raise DataConfigError(
            f"{key}={split.path}: the Arrow shards cannot be loaded ({type(err).__name__}: "
            f"{err}); re-run omnibert-prepare into it."
        ) from err
    missing = [c for c in COLUMNS if c not in dataset.column_names]
    if missing or not isinstance(dataset, datasets.Dataset):
        raise DataConfigError(
            f"{key}={split.path} lacks the columns {missing}; it is not omnibert pretraining "
            "data, re-run omnibert-prepare into it."
        )
    expected = (split.metadata or {}).get("counts", {}).get("instances")
    if expected is not None and expected != len(dataset):
        raise DataConfigError(
            f"{key}={split.path} holds {len(dataset)} rows but its metadata.json says "
            f"{expected}; the shards were altered, re-run omnibert-prepare into it."
        )
    return dataset


def _read_vocab(path: str) -> tuple[str, int]:
    from omnibert.tokenization.vocab import Vocab, VocabError

    try:
        vocab = Vocab.from_file(path)
    except VocabError as err:
        raise DataConfigError(f"data.vocab_file: {err}") from err
    return vocab.sha256, vocab.size


def _resolve_files(key: str, path: str, fmt: str) -> list[str]:
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


def _file_layout(fmt: str, path: str) -> tuple[int, int, int | None] | None:
    """(max_seq_length, max_predictions_per_seq, rows or None) of a TFRecord / HDF5 file,
    after reading and validating its first record; None for an empty file."""
    if fmt == "hdf5":
        import h5py

        from omnibert.prepare.formats.hdf5 import read_hdf5

        if next(read_hdf5(path, chunk_rows=1), None) is None:  # raises on a foreign layout
            return None
        with h5py.File(path, "r") as f:
            rows = int(f["input_ids"].shape[0])
            return int(f["input_ids"].shape[1]), int(f["masked_lm_positions"].shape[1]), rows
    from omnibert.prepare.formats.example_proto import decode_varints, parse_example_raw
    from omnibert.prepare.formats.tfrecord import iter_tfrecord_payloads, read_tfrecord

    if next(read_tfrecord(path, block_size=1), None) is None:  # validates the first example
        return None
    for _, payload in iter_tfrecord_payloads(path):
        raw = parse_example_raw(payload)
        ids, positions = raw["input_ids"][1], raw["masked_lm_positions"][1]
        assert isinstance(ids, bytes) and isinstance(positions, bytes)
        return int(decode_varints(ids).size), int(decode_varints(positions).size), None
    return None


def _compare_settings(train: _Split, other: _Split) -> None:
    a, b = (s.metadata or {} for s in (train, other))
    for name in COMPARED:
        x, y = a.get("settings", {}).get(name), b.get("settings", {}).get(name)
        if x is not None and y is not None and x != y:
            raise DataConfigError(
                f"{other.key}={other.path} was prepared with {name}={y} but "
                f"{train.key}={train.path} with {name}={x}; prepare both with the same settings."
            )
    x, y = (m.get("vocab", {}).get("sha256") for m in (a, b))
    if x and y and x != y:
        raise DataConfigError(
            f"{other.key}={other.path} and {train.key}={train.path} were prepared with different "
            "vocab files (metadata.json vocab.sha256); prepare both with the same vocab.txt."
        )


class PretrainingDataModule(PackedData, pl.LightningDataModule):
    """Pretraining batches from ``omnibert-prepare`` Arrow shards, MLPerf TFRecords or NVIDIA
    HDF5 shards (see the module docstring). Rank and world size come from the Trainer in
    :meth:`setup`; build the Trainer with ``use_distributed_sampler=False``."""

    def __init__(
        self,
        *,
        train_path: str | None,
        eval_path: str | None,
        format: str = "arrow",
        max_seq_length: int,
        max_predictions_per_seq: int,
        micro_batch_size: int,
        eval_micro_batch_size: int | None = None,
        num_workers: int = 2,
        seed: int = 12345,
        shuffle: bool = True,
        vocab_file: str | None = None,
        eval_samples: int | None = None,
        pin_memory: bool = False,
        cache_dir: str | None = None,
        packing: str = "none",
        pack: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        self._packing_config = (packing, dict(pack or {}))
        self.packing = PackingSettings()
        self.train_path = None if train_path is None else str(train_path)
        self.eval_path = None if eval_path is None else str(eval_path)
        self.format = format
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.micro_batch_size = micro_batch_size
        self.eval_micro_batch_size = eval_micro_batch_size or micro_batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.shuffle = shuffle
        self.vocab_file = None if vocab_file is None else str(vocab_file)
        self.eval_samples = eval_samples
        self.pin_memory = pin_memory
        home = Path(os.environ.get("OMNIBERT_CACHE", Path.home() / ".cache" / "omnibert"))
        self.cache_dir = Path(cache_dir) if cache_dir else home / "arrow"
        self.rank, self.world_size = 0, 1
        self._splits: dict[str, _Split] = {}
        self._vocab: tuple[str, int] | None = None  # (sha256, size) of vocab_file
        self._datasets: dict[str, Any] = {}

    # ------------------------------------------------------------------ validation

    def check(self) -> None:
        """Validate the configuration against the data; raises :class:`DataConfigError`.
        Cheap to call again (what was read is kept); run it before building the model."""
        if self.format not in FORMATS:
            raise DataConfigError(
                f"data.format={self.format!r} is not one of {sorted(FORMATS)}; use the data "
                "config that matches your files (data=arrow, data=tfrecord or data=hdf5)."
            )
        for key, value, low in (
            ("micro_batch_size", self.micro_batch_size, 1),
            ("eval_micro_batch_size", self.eval_micro_batch_size, 1),
            ("data.num_workers", self.num_workers, 0),
            ("data.eval_samples", self.eval_samples, 1),
        ):
            if value is not None and value < low:
                raise DataConfigError(f"{key}={value} must be at least {low}; fix {key}.")
        self.packing = PackingSettings.parse(*self._packing_config, DataConfigError)
        if self.packing.mode == "offline" and self.format != "arrow":
            raise DataConfigError(
                f"data.packing=offline reads a pack index that omnibert-prepare writes next to "
                f"its Arrow shards, and data.format={self.format}; use data.packing=online."
            )
        if self.vocab_file is not None and self._vocab is None:
            self._vocab = _read_vocab(self.vocab_file)
        if "train" not in self._splits:
            self._splits["train"] = self._inspect("train", "data.train_path", self.train_path)
        if self.eval_path is not None and "eval" not in self._splits:
            self._splits["eval"] = self._inspect("eval", "data.eval_path", self.eval_path)
            _compare_settings(self._splits["train"], self._splits["eval"])
        self._check_sizes()
        if self.packing.mode == "offline":
            self.pack_index()

    def _inspect(self, name: str, key: str, path: str | None) -> _Split:
        if path is None or path in ("", "???"):
            what = "an omnibert-prepare output directory" if self.format == "arrow" else (
                f"a directory, file or glob of {self.format} files"
            )  # fmt: skip
            raise DataConfigError(f"{key} is not set; set {key} to {what}.")
        if not glob.has_magic(path) and not Path(path).exists():
            raise DataConfigError(f"{key}={path} does not exist; fix {key}.")
        if self.format == "arrow":
            split = _Split(key, path, arrow_dir=path, metadata=_read_metadata(key, path))
            self._check_widths(split, split.metadata or {})
            self._check_vocab(split)
            self._datasets[name] = _load_arrow(key, split)
            split.rows = len(self._datasets[name])
            return split
        files = _resolve_files(key, path, self.format)
        rows: int | None = 0
        for file in files:
            try:
                layout = _file_layout(self.format, file)
            except ValueError as err:  # TFRecordError / HDF5FormatError name the file
                raise DataConfigError(f"{key}: {err}") from err
            if layout is not None:
                seq, preds, count = layout
                meta = {"settings": {"max_seq_length": seq, "max_predictions_per_seq": preds}}
                self._check_widths(_Split(key, file, arrow_dir=""), meta)
                rows = None if rows is None or count is None else rows + count
        split = _Split(key, path, arrow_dir=str(self._cache_path(files)), files=files, rows=rows)
        if (Path(split.arrow_dir) / CACHE_FILE).is_file():
            self._adopt_cache(split)
        return split

    def _check_widths(self, split: _Split, metadata: dict[str, Any]) -> None:
        settings = metadata.get("settings", {})
        for name in ("max_seq_length", "max_predictions_per_seq"):
            have, want = settings.get(name), getattr(self, name)
            if have is not None and have != want:
                raise DataConfigError(
                    f"{split.key}={split.path} was prepared with {name}={have} but phase.{name} "
                    f"(data.{name}) is {want}; set phase.{name}={have} or use data prepared "
                    f"with {name}={want}."
                )

    def _check_vocab(self, split: _Split) -> None:
        vocab = (split.metadata or {}).get("vocab") or {}
        if self._vocab is not None and vocab.get("sha256") and vocab["sha256"] != self._vocab[0]:
            raise DataConfigError(
                f"data.vocab_file={self.vocab_file} (sha256 {self._vocab[0][:12]}…) is not the "
                f"vocab {split.key}={split.path} was prepared with ({vocab.get('path')}, sha256 "
                f"{vocab['sha256'][:12]}…); set data.vocab_file to that file or re-prepare."
            )

    def _check_sizes(self) -> None:
        train, evaluation = self._splits["train"], self._splits.get("eval")
        limit = self.eval_samples
        if limit is not None and evaluation is not None and limit > (evaluation.rows or limit):
            raise DataConfigError(
                f"data.eval_samples={limit} but data.eval_path={self.eval_path} holds only "
                f"{evaluation.rows} rows; lower data.eval_samples or set it to null."
            )
        if train.rows is None:
            return  # TFRecord rows are counted by the conversion; setup() checks again
        per_rank = train.rows // self.world_size
        if self.micro_batch_size > per_rank:
            raise DataConfigError(
                f"micro_batch_size={self.micro_batch_size} is larger than the {per_rank} "
                f"training rows each of {self.world_size} device(s) gets from "
                f"data.train_path={self.train_path} ({train.rows} rows); lower the micro batch "
                "size or the number of devices, or use more data."
            )

    # ------------------------------------------------------------------ TFRecord / HDF5 cache

    def _cache_path(self, files: list[str]) -> Path:
        identity = {
            "format": self.format,
            "files": [[os.path.abspath(f), os.stat(f).st_size, os.stat(f).st_mtime_ns] for f in files],
            "settings": [self.max_seq_length, self.max_predictions_per_seq],
        }  # fmt: skip
        digest = hashlib.sha256(json.dumps(identity).encode()).hexdigest()[:16]
        return self.cache_dir / f"{self.format}-{digest}"

    def _adopt_cache(self, split: _Split) -> None:
        split.metadata = _read_metadata(split.key, split.arrow_dir)
        split.rows = int(split.metadata["counts"]["instances"])
        top = json.loads((Path(split.arrow_dir) / CACHE_FILE).read_text())["max_token_id"]
        if self._vocab is not None and top >= self._vocab[1]:
            raise DataConfigError(
                f"{split.key}={split.path} holds token id {top} but data.vocab_file="
                f"{self.vocab_file} has only {self._vocab[1]} tokens; use the vocab the data "
                "was made with."
            )

    def _materialize(self, name: str) -> None:
        """Make sure split ``name`` exists as Arrow data (converting TFRecord / HDF5 once)."""
        split = self._splits[name]
        if split.metadata is not None:
            return
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        # one converting process per cache entry; the others wait for it, then adopt its result
        with open(f"{split.arrow_dir}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (Path(split.arrow_dir) / CACHE_FILE).is_file():
                self._convert(split)
        self._adopt_cache(split)
        self._check_sizes()

    def _convert(self, split: _Split) -> None:
        import pyarrow.compute as pc

        from omnibert.prepare.formats.convert import convert_to_arrow

        scratch = tempfile.mkdtemp(prefix=".convert-", dir=self.cache_dir)
        try:
            out = Path(scratch) / "data"
            dataset = convert_to_arrow(
                split.files,
                out,
                max_seq_length=self.max_seq_length,
                max_predictions_per_seq=self.max_predictions_per_seq,
                num_proc=max(1, self.num_workers),
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

    def _load(self, name: str) -> Any:
        if name not in self._datasets:
            self._materialize(name)
            self._datasets[name] = _load_arrow(self._splits[name].key, self._splits[name])
        return self._datasets[name]

    # ------------------------------------------------------------------ packing

    @property
    def masked_lm_prob(self) -> float | None:
        """The masking rate the training data was prepared with (None when unrecorded)."""
        settings = (self._splits["train"].metadata or {}).get("settings") or {}
        prob = settings.get("masked_lm_prob")
        return None if prob is None else float(prob)

    def row_lengths(self) -> tuple[Any, Any]:
        """Tokens and masked positions of every training row (from the Arrow offsets)."""
        cache = self._packed()
        if "lengths" not in cache:
            from omnibert.data.pack_index import row_lengths

            cache["lengths"] = row_lengths(self._load("train"))
        lengths: tuple[Any, Any] = cache["lengths"]
        return lengths

    def pack_index(self) -> Any:
        """The offline pack index of the training set (checked against the data)."""
        cache = self._packed()
        if "index" not in cache:
            from omnibert.data.pack_index import PackIndexError, load_pack_index

            split = self._splits["train"]
            try:
                cache["index"] = load_pack_index(
                    split.arrow_dir,
                    self.packing.index_name(),
                    rows=split.rows or 0,
                    fingerprint=str((split.metadata or {}).get("fingerprint")),
                    max_sequence_length=self.max_seq_length,
                    max_sequences_per_pack=self.packing.max_sequences_per_pack,
                )
            except PackIndexError as err:
                raise DataConfigError(f"data.packing=offline: {err}") from err
        return cache["index"]

    # ------------------------------------------------------------------ properties

    @property
    def vocab_size(self) -> int:
        """From data.vocab_file when given, else from the train set's metadata.json."""
        if self._vocab is not None:
            return self._vocab[1]
        self.check()
        size = ((self._splits["train"].metadata or {}).get("vocab") or {}).get("size")
        if not size:
            raise DataConfigError(
                f"the vocab size of data.train_path={self.train_path} is unknown ({self.format} "
                "files do not record it); set data.vocab_file to its vocab.txt or set "
                "model.config.vocab_size."
            )
        return int(size)

    @property
    def num_train_samples(self) -> int:
        """Rows in the training set (all ranks together)."""
        self.check()
        self._materialize("train")
        rows = self._splits["train"].rows
        assert rows is not None
        return rows

    @property
    def num_eval_samples(self) -> int:
        """Rows evaluated per validation run (0 without an eval set)."""
        self.check()
        if "eval" not in self._splits:
            return 0
        self._materialize("eval")
        rows = self._splits["eval"].rows
        assert rows is not None
        return rows if self.eval_samples is None else min(rows, self.eval_samples)

    def describe(self) -> dict[str, Any]:
        """Plain facts for logs."""
        return {
            "format": self.format,
            "train_path": self.train_path,
            "eval_path": self.eval_path,
            "arrow_dirs": {n: split.arrow_dir for n, split in self._splits.items()},
            "train_samples": self.num_train_samples,
            "eval_samples": self.num_eval_samples,
            "vocab_file": self.vocab_file,
            "shuffle": self.shuffle,
            **self.batch_facts(),
        }

    # ------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Convert TFRecord / HDF5 inputs into the Arrow cache (Lightning: once per node)."""
        self.check()
        for name in self._splits:
            self._materialize(name)

    def setup(self, stage: str | None = None) -> None:
        trainer = self.trainer
        if trainer is not None:
            self.rank, self.world_size = int(trainer.global_rank), int(trainer.world_size)
        self.check()
        for name in self._splits:
            self._load(name)

    def train_dataloader(self) -> DataLoader[Any]:
        dataset = self._load("train")
        return train_loader(self, ArrowRows(dataset), len(dataset))

    def val_dataloader(self) -> DataLoader[Any] | list[Any]:
        if self.eval_path is None:
            return []
        return eval_loader(self, ArrowRows(self._load("eval")), self.num_eval_samples)
