"""The checks a data source runs on an ``omnibert-prepare`` directory before any compute:
its ``metadata.json``, the row width and vocab it was made with, its Arrow files against the
integrity record (sizes and row counts always, CRC-32C on request; a damaged file is
refused with the ``omnibert-prepare`` command that regenerates it) and their rows. Every
problem is one :class:`DataConfigError` sentence naming the key and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.data.integrity import file_problems, repair_command
from omnibert.data.schema import COLUMNS, FORMAT_NAME, METADATA_FILE
from omnibert.errors import UserError

# settings that must agree between the train and the eval set (when both record them).
# Not masked_lm_prob: MosaicBERT and ModernBERT train at 30 % masking and evaluate at 15 %
# (an eval set at the same max_predictions_per_seq, prepared with masked_lm_prob=0.15).
COMPARED = (
    "max_seq_length",
    "max_predictions_per_seq",
    "do_lower_case",
    "do_whole_word_mask",
)


class DataConfigError(UserError):
    """The data configuration cannot work; the message names the key/path and the fix."""


@dataclass(frozen=True)
class RowSpec:
    """What the data module asks of a source: the run's row width and masked positions
    (``phase.*``, checked against the data) and the run's data seed (generated rows are
    drawn from it)."""

    max_seq_length: int | None  # None: the data's (evaluation of a checkpoint)
    max_predictions_per_seq: int | None
    seed: int = 12345


def read_metadata(key: str, path: str) -> dict[str, Any]:
    """``metadata.json`` of a finished omnibert-prepare directory (``key`` names the setting)."""
    meta_path = Path(path) / METADATA_FILE
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
    if meta.get("format") != FORMAT_NAME:
        raise DataConfigError(
            f"{meta_path} has format={meta.get('format')!r}, not {FORMAT_NAME!r}; point "
            f"{key} at an omnibert-prepare output directory."
        )
    return meta


def read_vocab(path: str) -> tuple[str, int]:
    """(sha256, size) of a vocab.txt (``data.vocab_file``)."""
    from omnibert.tokenization.vocab import Vocab, VocabError

    try:
        vocab = Vocab.from_file(path)
    except VocabError as err:
        raise DataConfigError(f"data.vocab_file: {err}") from err
    return vocab.sha256, vocab.size


def check_widths(key: str, path: str, settings: dict[str, Any], spec: RowSpec) -> None:
    """The data's row width and masked positions must be the run's (``phase.*``)."""
    for name in ("max_seq_length", "max_predictions_per_seq"):
        have, want = settings.get(name), getattr(spec, name)
        if have is not None and want is not None and have != want:
            raise DataConfigError(
                f"{key}={path} was prepared with {name}={have} but phase.{name} "
                f"(data.{name}) is {want}; set phase.{name}={have} or use data prepared "
                f"with {name}={want}."
            )


@dataclass
class Split:
    """One checked set of rows (train or eval)."""

    key: str  # config key, e.g. "data.train_path"
    path: str
    arrow_dir: str
    metadata: dict[str, Any] | None = None  # metadata.json once the Arrow data exists
    rows: int | None = None
    files: tuple[str, ...] = ()  # TFRecord / HDF5 inputs of a converted source


def compare_splits(train: Split, other: Split) -> None:
    """Train and eval sets must be prepared alike (settings and vocab)."""
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


def load_arrow(split: Split) -> Any:
    """The split's Arrow rows, memory-mapped, checked against its metadata.json."""
    import datasets

    try:
        dataset = datasets.load_from_disk(split.arrow_dir)
    except Exception as err:  # datasets raises many types for broken directories
        raise DataConfigError(
            f"{split.key}={split.path}: the Arrow shards cannot be loaded ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); {repair_hint(split)}"
        ) from err
    missing = [c for c in COLUMNS if c not in dataset.column_names]
    if missing or not isinstance(dataset, datasets.Dataset):
        raise DataConfigError(
            f"{split.key}={split.path} lacks the columns {missing}; it is not omnibert "
            "pretraining data, re-run omnibert-prepare into it."
        )
    expected = (split.metadata or {}).get("counts", {}).get("instances")
    if expected is not None and expected != len(dataset):
        raise DataConfigError(
            f"{split.key}={split.path} holds {len(dataset)} rows but its metadata.json says "
            f"{expected}; the shards were altered, {repair_hint(split)}"
        )
    return dataset


def split_repair_command(split: Split) -> str | None:
    """The ``omnibert-prepare`` command that regenerates the split's damaged files, when its
    metadata.json records its files (None for data made otherwise or by older versions)."""
    meta = split.metadata or {}
    if meta.get("files") and meta.get("inputs") and (meta.get("vocab") or {}).get("path"):
        return repair_command(meta, split.arrow_dir)
    return None


def repair_hint(split: Split) -> str:
    """How to regenerate a split's damaged data, ending the sentence: the exact command last
    (no full stop after it, so it can be copied as it is), or the general advice."""
    command = split_repair_command(split)
    if command is not None:
        return f"repair it with: {command}"
    return f"re-run omnibert-prepare into {split.path}."


#: ``data.verify_checksums=auto`` reads the CRC-32C of a split whose Arrow files hold at
#: most this many bytes, and leaves larger ones to the batch range checks: at the cost
#: scripts/bench_integrity.py measures (docs/faults.md, "What the checks cost") that is a few
#: seconds at start, less than starting torch and Lightning takes
AUTO_CHECKSUM_BYTES = 2 << 30


def wants_checksums(setting: bool | str, records: list[dict[str, Any]]) -> bool:
    """Whether ``data.verify_checksums`` (``true``, ``false`` or ``auto``) asks for the
    CRC-32C of these recorded files."""
    if setting == "auto":
        return sum(int(r.get("bytes") or 0) for r in records) <= AUTO_CHECKSUM_BYTES
    if isinstance(setting, bool):
        return setting
    raise DataConfigError(
        f"data.verify_checksums={setting!r} must be auto, true or false; fix data.verify_checksums."
    )


def check_files(split: Split, checksums: bool | str) -> None:
    """The split's Arrow files against metadata.json's record: each present with its size
    and row count (cheap: file sizes and Arrow batch headers), and its CRC-32C when
    ``checksums`` (``data.verify_checksums``: ``auto`` below :data:`AUTO_CHECKSUM_BYTES`)."""
    records = (split.metadata or {}).get("files")
    if not records:
        return  # written before omnibert-prepare recorded its files: the row count still checks
    crc = wants_checksums(checksums, records)
    problems = file_problems(Path(split.arrow_dir), records, rows=True, checksums=crc)
    if problems:
        record, what = problems[0]
        others = f" (and {len(problems) - 1} more file(s))" if len(problems) > 1 else ""
        raise DataConfigError(
            f"{split.key}={split.path}: {record['filename']} {what}{others}, so the data is "
            f"damaged; {repair_hint(split)}"
        )
