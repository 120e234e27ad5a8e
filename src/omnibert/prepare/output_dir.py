"""What ``omnibert-prepare`` finds in its ``output_dir`` before it works: nothing, an
unfinished run to resume, a finished directory of this very data (verified file by file;
damaged files are listed for repair), or data made from something else, which is refused
with the setting or input file that differs unless ``overwrite=true``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omnibert.data import schema
from omnibert.data.integrity import file_problems
from omnibert.errors import UserError
from omnibert.prepare import shards


class PrepareError(UserError):
    """A problem with the inputs or the output directory, said in one sentence."""


def check_output_dir(
    output_dir: Path,
    fingerprint: str,
    overwrite: bool,
    identity: Mapping[str, Any],
) -> dict[str, Any] | None:
    """The ``metadata.json`` of ``output_dir`` when it already holds exactly this data
    (``fingerprint``), else None (work to do). Raises when it holds something else, unless
    ``overwrite``; ``identity`` is the new data's ``settings``, ``vocab`` and ``inputs`` as
    :func:`omnibert.prepare.metadata.build_metadata` records them, to name what differs."""
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        raise PrepareError(f"output_dir {str(output_dir)!r} is a file; choose a directory.")
    meta_path = output_dir / schema.METADATA_FILE
    if meta_path.is_file():
        try:
            existing: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError:
            existing = {}  # a damaged metadata.json: ours (written_by_us), redo everything
        if existing.get("fingerprint") == fingerprint:
            return existing
        if not overwrite and existing:
            raise PrepareError(
                f"output_dir {str(output_dir)!r} already holds data prepared from other inputs "
                f"or settings ({difference(existing, identity)}); choose another output_dir or "
                "pass overwrite=true to replace it."
            )
        shards.remove_outputs(output_dir)
        return None
    foreign = [p.name for p in output_dir.iterdir() if not shards.written_by_us(p)]
    if foreign and not overwrite:
        raise PrepareError(
            f"output_dir {str(output_dir)!r} is not empty and was not written by omnibert-prepare "
            f"(it holds {foreign[0]!r}); choose an empty or new directory."
        )
    if overwrite:
        shards.remove_outputs(output_dir)
    return None


def difference(existing: Mapping[str, Any], identity: Mapping[str, Any]) -> str:
    """What differs between the data in a directory and the data asked for, old vs new."""
    old, new = existing.get("settings") or {}, identity["settings"]
    for key, value in new.items():
        if key in old and old[key] != value and key != "max_shard_size":
            return f"{key}={old[key]} there, {value} now"
    old_vocab, new_vocab = existing.get("vocab") or {}, identity["vocab"]
    if old_vocab.get("sha256") != new_vocab["sha256"]:
        return (
            f"vocab_file {new_vocab['path']} (sha256 {new_vocab['sha256'][:12]}) is not the "
            f"vocab there ({old_vocab.get('path')}, sha256 {str(old_vocab.get('sha256'))[:12]})"
        )
    return _input_difference(existing.get("inputs") or [], identity["inputs"]) or (
        f"it was written by {existing.get('created_by', 'another version')} in format version "
        f"{existing.get('format_version')}, this is version {schema.FORMAT_VERSION}"
    )


def _input_difference(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> str | None:
    for number, (before, now) in enumerate(zip(old, new, strict=False), start=1):
        if before.get("sha256") != now["sha256"]:
            same_path = before.get("input_file") == now["input_file"]
            what = "changed since" if same_path else f"is not {before.get('input_file')}, used"
            return (
                f"input file {number}, {now['input_file']}, {what} there (sha256 "
                f"{str(before.get('sha256'))[:12]} there, {now['sha256'][:12]} now)"
            )
    if len(old) != len(new):
        return f"input_files names {len(new)} files, the data there was made from {len(old)}"
    return None


def damaged_files(output_dir: Path, metadata: Mapping[str, Any]) -> list[tuple[Any, str]]:
    """``(file record, what is wrong)`` of each Arrow file of a finished directory whose
    size or CRC-32C is not what ``metadata.json`` recorded (none for directories written
    before files were recorded); a missing ``state.json`` or ``dataset_info.json`` damages
    them all (they are rewritten with the files)."""
    records = metadata.get("files")
    if not records:
        return []
    if not all((output_dir / name).is_file() for name in ("state.json", "dataset_info.json")):
        return [(record, "is not listed (state.json is missing)") for record in records]
    return file_problems(output_dir, records, rows=False, checksums=True)
