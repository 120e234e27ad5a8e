"""What ``omnibert-prepare`` records about its output: per-file statistics (``part.json``), the
run's summary, the counts over the rows kept and ``metadata.json`` (settings, provenance,
vocab, counts and the sequence-length histogram packing uses), plus the data fingerprint
that identifies what the data was made from.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import omnibert
from omnibert.data import schema
from omnibert.data.schema import RowStats
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
    #: Arrow files found damaged in a finished directory and regenerated
    repaired: list[str] = field(default_factory=list)
    #: what was produced short of what was asked, and why (also in metadata.json)
    shortfalls: list[dict[str, Any]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def skipped(self) -> list[PartStats]:
        return [p for p in self.parts if p.instances == 0]

    def render(self) -> str:
        if self.already_complete:
            return (
                f"{self.output_dir} already holds this data (metadata.json matches and every "
                "Arrow file's size and CRC-32C are as recorded); nothing to do."
            )
        if self.repaired:
            inputs = ", ".join(p.input_file for p in self.parts)
            return (
                f"repaired {self.output_dir}: regenerated {', '.join(self.repaired)} from "
                f"{inputs} in {self.seconds:.1f} s; the other files were intact"
            )
        lines = [
            f"prepared {self.output_dir}: {self.files} file{'s' if self.files != 1 else ''} "
            f"({self.resumed_files} resumed, {len(self.skipped)} skipped), "
            f"{self.documents:,} documents, {self.instances:,} instances, {self.tokens:,} tokens "
            f"in {self.seconds:.1f} s ({self.tokens_per_second:,.0f} tokens/s)"
        ]
        lines += [f"  skipped {p.input_file}: {skip_reason(p)}" for p in self.skipped]
        lines += [f"  note: {note['message']}" for note in self.shortfalls]
        return "\n".join(lines)


def skip_reason(part: PartStats) -> str:
    """Why an input file gave no rows (the reference makes no instances from it either)."""
    if part.documents == 0:
        return "it holds no documents (empty, or no line with a token); no instances from it"
    return "its documents give no instances"


def eval_shortfall(eval_samples: int | None, rows: int) -> list[dict[str, Any]]:
    """A shortfall note when an eval set keeps fewer rows than ``eval_samples`` asks."""
    if eval_samples is None or rows >= eval_samples:
        return []
    return [
        {
            "key": "eval_samples",
            "requested": eval_samples,
            "produced": rows,
            "message": (
                f"eval_samples={eval_samples:,} asked, {rows:,} kept: the input files give "
                f"only {rows:,} instances; add input text to reach {eval_samples:,}"
            ),
        }
    ]


@dataclass(frozen=True)
class RunOptions:
    """The settings of a run besides the reference's instance flags."""

    do_lower_case: bool
    input_format: str
    eval_samples: int | None
    max_shard_size: str | int


def identity_of(
    settings: InstanceSettings,
    options: RunOptions,
    vocab: Vocab,
    paths: Sequence[Path],
    hashes: Sequence[str],
    patterns: Sequence[str] = (),
) -> dict[str, Any]:
    """The settings, vocab and inputs entries of ``metadata.json`` and ``input_files`` as
    given (a glob stays a glob), all with absolute paths so a repair command works from
    anywhere and stays short."""
    return {
        "input_files": [os.path.join(os.getcwd(), p) for p in patterns],
        "settings": {**settings.record(), **asdict(options)},
        "vocab": {"path": str(Path(vocab.path).absolute()), "sha256": vocab.sha256},
        "inputs": [
            {"input_file": str(path.absolute()), "sha256": sha}
            for path, sha in zip(paths, hashes, strict=True)
        ],
    }


def row_stats(parts: Sequence[PartStats], max_seq_length: int) -> RowStats:
    """The counts over every row of the per-file ``parts``."""
    histogram = np.zeros(max_seq_length + 1, dtype=np.int64)
    for part in parts:
        histogram += np.asarray(part.length_histogram, dtype=np.int64)
    return RowStats(
        rows=sum(p.instances for p in parts),
        masked=sum(p.masked for p in parts),
        random_next=sum(p.random_next for p in parts),
        histogram=histogram,
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
        "settings": settings.record(),
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
    options: RunOptions,
    fingerprint: str,
    kept: RowStats,
    files: list[dict[str, Any]],
    identity: dict[str, Any],
    shortfalls: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """``metadata.json``: settings, provenance, the Arrow files' integrity records, the counts
    and histogram of the rows kept and what was produced short of what was asked."""
    histogram = kept.histogram
    inputs = []
    for part, entry in zip(parts, identity["inputs"], strict=True):
        record = {k: v for k, v in asdict(part).items() if k not in ("length_histogram", "resumed")}
        record["input_file"] = entry["input_file"]
        if part.instances == 0:
            record["skipped"] = skip_reason(part)
        inputs.append(record)
    return {
        "format": schema.FORMAT_NAME,
        "format_version": schema.FORMAT_VERSION,
        "fingerprint": fingerprint,
        "created_by": f"omnibert {omnibert.__version__}",
        "python": platform.python_version(),
        "command": sys.argv,
        "input_files": identity.get("input_files") or [e["input_file"] for e in identity["inputs"]],
        "settings": identity["settings"],
        "vocab": {**identity["vocab"], "size": vocab.size},
        "columns": {
            name: str(feature)
            for name, feature in schema.features(vocab.size, settings.max_seq_length).items()
        },
        "inputs": inputs,
        "files": files,
        "counts": {
            "files": len(parts),
            "skipped_files": sum(p.instances == 0 for p in parts),
            "documents": sum(p.documents for p in parts),
            "segments": sum(p.segments for p in parts),
            "text_tokens": sum(p.text_tokens for p in parts),
            "instances_created": sum(p.instances for p in parts),
            "instances": kept.rows,
            "tokens": int((histogram * np.arange(histogram.shape[0])).sum()),
            "masked": kept.masked,
            "random_next": kept.random_next,
        },
        "shortfalls": list(shortfalls),
        "sequence_length_histogram": histogram.tolist(),
    }
