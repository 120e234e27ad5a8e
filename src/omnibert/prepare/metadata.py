"""What ``omnibert-prepare`` records about its output: per-file statistics (``part.json``), the
run's summary, the counts over the rows kept and ``metadata.json`` (settings, provenance,
vocab, counts and the sequence-length histogram packing uses), plus the data fingerprint
that identifies what the data was made from.
"""

from __future__ import annotations

import hashlib
import json
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

import omnibert
from omnibert.data import schema
from omnibert.prepare.instances import InstanceSettings
from omnibert.tokenization.vocab import Vocab


@dataclass
class PartStats:
    index: int
    input_file: str
    sha256: str
    bytes: int
    documents: int
    segments: int
    text_tokens: int
    instances: int
    tokens: int
    masked: int
    random_next: int
    length_histogram: list[int]
    seconds: float
    resumed: bool = False

    def to_record(self, fingerprint: str) -> dict[str, Any]:
        record = asdict(self)
        record.pop("resumed")
        record["fingerprint"] = fingerprint
        return record


@dataclass
class PrepareSummary:
    output_dir: str
    files: int
    documents: int
    instances: int
    tokens: int
    seconds: float
    resumed_files: int = 0
    already_complete: bool = False
    parts: list[PartStats] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def render(self) -> str:
        if self.already_complete:
            return (
                f"{self.output_dir} already holds this data (metadata.json matches); nothing to do."
            )
        return (
            f"prepared {self.output_dir}: {self.files} file{'s' if self.files != 1 else ''} "
            f"({self.resumed_files} resumed), "
            f"{self.documents:,} documents, {self.instances:,} instances, {self.tokens:,} tokens "
            f"in {self.seconds:.1f} s ({self.tokens_per_second:,.0f} tokens/s)"
        )


@dataclass
class RowStats:
    """Counts over the rows a dataset keeps (all instances, or the first N for eval)."""

    rows: int
    masked: int
    random_next: int
    histogram: np.ndarray

    @classmethod
    def from_parts(cls, parts: Sequence[PartStats], max_seq_length: int) -> RowStats:
        histogram = np.zeros(max_seq_length + 1, dtype=np.int64)
        for part in parts:
            histogram += np.asarray(part.length_histogram, dtype=np.int64)
        return cls(
            rows=sum(p.instances for p in parts),
            masked=sum(p.masked for p in parts),
            random_next=sum(p.random_next for p in parts),
            histogram=histogram,
        )

    @classmethod
    def from_dataset(cls, dataset: Any, max_seq_length: int) -> RowStats:
        table = dataset.data
        lengths = np.asarray(table.column("input_ids").combine_chunks().value_lengths())
        masked = table.column("masked_lm_positions").combine_chunks().value_lengths()
        labels = np.asarray(table.column("next_sentence_label").combine_chunks())
        return cls(
            rows=len(dataset),
            masked=int(np.asarray(masked).sum()),
            random_next=int(labels.sum()),
            histogram=np.bincount(lengths.astype(np.int64), minlength=max_seq_length + 1),
        )


def fingerprint(
    settings: InstanceSettings,
    vocab: Vocab,
    do_lower_case: bool,
    input_sha256: Sequence[str],
    input_format: str = "text",
    eval_samples: int | None = None,
) -> str:
    """Identifies what data was made from: settings, vocab and input contents (in order).
    A part's fingerprint names its own file only, so parts survive changes to other files."""
    identity = {
        "settings": asdict(settings),
        "vocab_sha256": vocab.sha256,
        "do_lower_case": do_lower_case,
        "input_format": input_format,
        "inputs": list(input_sha256),
        "eval_samples": eval_samples,
        "format": [schema.FORMAT_NAME, schema.FORMAT_VERSION],
    }
    blob = json.dumps(identity, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_metadata(
    parts: list[PartStats],
    settings: InstanceSettings,
    vocab: Vocab,
    do_lower_case: bool,
    fingerprint: str,
    eval_samples: int | None,
    kept: RowStats,
) -> dict[str, Any]:
    """``metadata.json``: settings, provenance and the counts/histogram of the rows kept."""
    histogram = kept.histogram
    return {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "fingerprint": fingerprint,
        "created_by": f"omnibert {omnibert.__version__}",
        "python": platform.python_version(),
        "command": sys.argv,
        "settings": {
            **asdict(settings),
            "do_lower_case": do_lower_case,
            "eval_samples": eval_samples,
        },
        "vocab": {"path": vocab.path, "sha256": vocab.sha256, "size": vocab.size},
        "columns": {
            name: str(feature)
            for name, feature in schema.features(vocab.size, settings.max_seq_length).items()
        },
        "inputs": [
            {k: v for k, v in asdict(p).items() if k not in ("length_histogram", "resumed")}
            for p in parts
        ],
        "counts": {
            "files": len(parts),
            "documents": sum(p.documents for p in parts),
            "segments": sum(p.segments for p in parts),
            "text_tokens": sum(p.text_tokens for p in parts),
            "instances_created": sum(p.instances for p in parts),
            "instances": kept.rows,
            "tokens": int((histogram * np.arange(histogram.shape[0])).sum()),
            "masked": kept.masked,
            "random_next": kept.random_next,
        },
        "sequence_length_histogram": histogram.tolist(),
    }
