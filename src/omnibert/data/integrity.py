"""The integrity record of an ``omnibert-prepare`` directory's Arrow files, and its checks.

``omnibert-prepare`` records every Arrow file it writes (``part.json`` while a part waits,
``metadata.json["files"]`` once the directory is complete): its name, rows, size in bytes,
CRC-32C and the input files (by index) whose rows it holds. The same record is verified
by ``omnibert-prepare`` (a resumed part, a finished directory: a bad file is regenerated
from its input file) and by training (sizes and row counts at start; checksums with
``data.verify_checksums=true``), which then refuses the data with the command that repairs
it (:func:`repair_command`).

Why CRC-32C: it is there to catch accidents (a truncated copy, overwritten bytes, a bad
disk), not tampering, so a cryptographic hash buys nothing; ``google-crc32c`` (already a
dependency for TFRecords) runs it on the CPU's CRC instruction, several times faster than
SHA-256, so checking a Wikipedia-sized directory costs seconds (docs/faults.md, "What the
checks cost").
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import google_crc32c

__all__ = [
    "arrow_rows",
    "crc32c_file",
    "file_problems",
    "file_record",
    "repair_command",
]

_CHUNK = 8 << 20
#: metadata.json["settings"] keys that become ``omnibert-prepare`` arguments, in this order
_SETTINGS = (
    "input_format",
    "do_lower_case",
    "max_seq_length",
    "max_predictions_per_seq",
    "masked_lm_prob",
    "short_seq_prob",
    "dupe_factor",
    "random_seed",
    "do_whole_word_mask",
    "next_sentence",
    "eval_samples",
    "max_shard_size",
)


def crc32c_file(path: str | Path) -> str:
    """CRC-32C of a file's bytes as 8 hex digits."""
    crc = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            crc = google_crc32c.extend(crc, chunk)
    return f"{crc:08x}"


def arrow_rows(path: str | Path) -> int:
    """Rows of an Arrow stream file (what ``datasets`` writes), reading only the batch
    headers through a memory map; raises ``pyarrow.ArrowInvalid`` for a damaged file."""
    import pyarrow as pa

    with pa.memory_map(str(path)) as source:
        return sum(batch.num_rows for batch in pa.ipc.open_stream(source))


def file_record(path: Path, inputs: Sequence[int], rows: int | None = None) -> dict[str, Any]:
    """The integrity record of one Arrow file as omnibert-prepare writes it."""
    return {
        "filename": path.name,
        "rows": arrow_rows(path) if rows is None else rows,
        "bytes": path.stat().st_size,
        "crc32c": crc32c_file(path),
        "inputs": list(inputs),
    }


def file_problems(
    directory: Path, records: Iterable[Mapping[str, Any]], *, rows: bool, checksums: bool
) -> list[tuple[Mapping[str, Any], str]]:
    """``(record, what is wrong)`` for each recorded file of ``directory`` that is missing,
    has another size, (``rows``) another row count or (``checksums``) another CRC-32C."""
    problems: list[tuple[Mapping[str, Any], str]] = []
    for record in records:
        path = directory / str(record["filename"])
        try:
            size = path.stat().st_size
        except OSError:
            problems.append((record, "is missing"))
            continue
        if size != record["bytes"]:
            problems.append((record, f"has {size:,} bytes instead of {record['bytes']:,}"))
            continue
        if rows:
            try:
                found = arrow_rows(path)
            except Exception as err:  # pyarrow raises several types for damaged streams
                problems.append((record, f"cannot be read as Arrow ({type(err).__name__})"))
                continue
            if found != record["rows"]:
                problems.append((record, f"holds {found:,} rows instead of {record['rows']:,}"))
                continue
        if checksums:
            crc = crc32c_file(path)
            if crc != record["crc32c"]:
                problems.append((record, f"has CRC-32C {crc} instead of {record['crc32c']}"))
    return problems


_PLAIN = re.compile(r"[A-Za-z0-9_/.\-]+")
_LOOKS_TYPED = re.compile(r"[-+]?[\d.]+(e[-+]?\d+)?|true|false|null|nan|inf", re.IGNORECASE)


def _hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar: a string stays bare when Hydra reads it back
    as that string (paths, names), else goes in double quotes."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_hydra_value(v) for v in value) + "]"
    text = str(value)
    if _PLAIN.fullmatch(text) and not _LOOKS_TYPED.fullmatch(text):
        return text
    # inside quotes Hydra reads a backslash literally unless it precedes a quote or ends the
    # string; ${...} would be interpolated
    text = re.sub(r'(\\*)"', lambda m: m.group(1) * 2 + '\\"', text)
    text = re.sub(r"(\\+)$", lambda m: m.group(1) * 2, text).replace("${", "\\${")
    return f'"{text}"'


def repair_command(metadata: Mapping[str, Any], directory: str | Path) -> str:
    """The ``omnibert-prepare`` command that regenerates ``directory``'s missing or damaged
    files from the inputs, vocab and settings its ``metadata.json`` records (only the input
    files whose rows are affected are processed again)."""
    settings = metadata.get("settings") or {}
    # the input files as given (a glob stays one), else every file
    inputs = metadata.get("input_files") or [entry["input_file"] for entry in metadata["inputs"]]
    args = [
        "input_files=" + _hydra_value(list(inputs)),
        "vocab_file=" + _hydra_value(metadata["vocab"]["path"]),
        "output_dir=" + _hydra_value(str(Path(directory).absolute())),
    ]
    args += [f"{key}={_hydra_value(settings[key])}" for key in _SETTINGS if key in settings]
    return shlex.join(["omnibert-prepare", *args])
