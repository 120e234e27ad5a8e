"""What ``omnibert-prepare`` finds in its ``output_dir`` before it works: nothing, an
unfinished run to resume, a finished directory of this very data (verified file by file;
damaged files are listed for repair), or data made from something else, which is refused
with the setting or input file that differs unless ``overwrite=true``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    :func:`omnibert.prepare.metadata.build_metadata` records them, to name what differs.

    Only what omnibert's own records list is ever replaced or removed (:func:`owned_entries`):
    a directory with an entry they do not list is refused, with or without ``overwrite``."""
    if not output_dir.exists():
        return None
    if not output_dir.is_dir():
        raise PrepareError(f"output_dir {str(output_dir)!r} is a file; choose a directory.")
    existing, owned = owned_entries(output_dir)
    foreign = sorted(p.name for p in output_dir.iterdir() if p.name not in owned)
    same = existing is not None and existing.get("fingerprint") == fingerprint
    if same and not any(name.endswith(".arrow") for name in foreign):
        return existing  # this very data: checked and repaired file by file, the rest untouched
    if foreign:
        raise PrepareError(
            f"output_dir {str(output_dir)!r} holds {foreign[0]!r}, not written by "
            "omnibert-prepare (no record of ours lists it); choose an empty or new directory "
            "(overwrite=true only replaces files omnibert-prepare wrote)."
        )
    if existing and not overwrite:
        raise PrepareError(
            f"output_dir {str(output_dir)!r} already holds data prepared from other inputs "
            f"or settings ({difference(existing, identity)}); choose another output_dir or "
            "pass overwrite=true to replace it."
        )
    if existing is not None or overwrite:  # a damaged metadata.json (existing == {}): redo
        _remove(output_dir, owned)
    return None


#: entries every directory of ours may hold besides its Arrow files
_FIXED = (schema.METADATA_FILE, "state.json", "dataset_info.json", shards.PARTS_DIR, "packs")
_TEMPORARY = re.compile(r"\.(metadata|state)\.json\.tmp-\d+")
_ARROW = re.compile(r"data-\d{5}-\d{5}\.arrow")


def owned_entries(output_dir: Path) -> tuple[dict[str, Any] | None, set[str]]:
    """``(metadata, names)``: the directory's ``metadata.json`` (``{}`` when it is damaged,
    None when there is none) and the names of its entries that omnibert-prepare's records
    say it wrote: the Arrow files ``metadata.json`` lists (with ``state.json``,
    ``dataset_info.json``, ``packs/``); for an unfinished run (no ``metadata.json``, a
    ``.parts/`` work directory) or a damaged ``metadata.json``, the Arrow files of our
    ``data-PPPPP-KKKKK.arrow`` naming. Nothing (an empty set) when no record of ours is
    there: such a directory was not written by omnibert-prepare."""
    meta_path = output_dir / schema.METADATA_FILE
    existing: dict[str, Any] | None = None
    if meta_path.is_file():
        try:
            existing = json.loads(meta_path.read_text(encoding="utf-8"))
        except ValueError:
            existing = {}
        if not isinstance(existing, dict):
            existing = {}
    unfinished = (output_dir / shards.PARTS_DIR).is_dir()
    if existing is None and not unfinished:
        return None, set()
    names = set(_FIXED)
    records = (existing or {}).get("files")
    if isinstance(records, list) and records and not unfinished:
        names |= {str(r.get("filename")) for r in records if isinstance(r, dict)}
    else:
        names |= {p.name for p in output_dir.iterdir() if _ARROW.fullmatch(p.name)}
    names |= {p.name for p in output_dir.iterdir() if _TEMPORARY.fullmatch(p.name)}
    return existing, names


def _remove(output_dir: Path, owned: set[str]) -> None:
    """Delete the entries of ``output_dir`` named in ``owned`` (and nothing else)."""
    for path in output_dir.iterdir():
        if path.name not in owned:
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


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


@contextmanager
def discarded_when_refused(output_dir: Path) -> Iterator[None]:
    """A refusal (a :class:`UserError`) inside the block, of a run that found no
    ``output_dir``, leaves none behind (no empty directory, no ``.parts/``) unless a part
    with rows was finished: that one stays for the re-run to resume from."""
    absolute = Path(os.path.abspath(output_dir))
    existed = next(p for p in (absolute, *absolute.parents) if p.exists())
    try:
        yield
    except UserError:
        if existed != absolute and absolute.is_dir() and not _finished_rows(absolute):
            shutil.rmtree(absolute, ignore_errors=True)
            parent = absolute.parent  # and the folders it was created in
            while parent != existed and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        raise


def _finished_rows(output_dir: Path) -> bool:
    for record in (output_dir / shards.PARTS_DIR).glob(f"*/{shards.PART_FILE}"):
        try:
            if json.loads(record.read_text(encoding="utf-8")).get("instances", 0) > 0:
                return True
        except ValueError:
            continue
    return False
