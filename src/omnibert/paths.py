"""Where the apps write: checked before any work, so an unwritable path is one sentence
naming its key instead of a traceback after minutes of work."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

from omnibert.errors import UserError

__all__ = ["PathError", "check_writable_dir", "write_json_atomic"]


class PathError(UserError):
    """An output path that cannot be written; the message names its key and the fix."""


def _nearest_existing(path: Path) -> Path:
    """``path`` itself or its closest ancestor that exists (a file or a directory)."""
    current = path
    while True:
        try:
            current.stat()
            return current
        except (FileNotFoundError, NotADirectoryError):
            if current.parent == current:
                return current
            current = current.parent


def check_writable_dir(path: str | Path, key: str) -> Path:
    """``path`` as given, once it is known to be a directory this process can create and
    write into; raises :class:`PathError` naming ``key`` otherwise.

    Nothing is left behind: a probe directory is created and removed in ``path`` or, when
    ``path`` does not exist yet, in its nearest existing ancestor (the one its creation
    starts in). A real attempt, not a permission-bit test, so root on a read-only mount,
    ``/proc`` and full disks are caught too.
    """
    target = Path(path)
    absolute = Path(os.path.abspath(target))
    existing = _nearest_existing(absolute)
    if not existing.is_dir():
        if existing == absolute:
            raise PathError(f"{key}={path} is a file, not a directory; choose a directory.")
        raise PathError(
            f"{key}={path} cannot be created because {existing} is a file; choose a path "
            "under a directory."
        )
    probe = existing / f".omnibert-write-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        probe.mkdir()
    except OSError as err:
        where = "" if existing == absolute else f" (creating it starts in {existing})"
        raise PathError(
            f"{key}={path} is not writable{where}: {err.strerror or err}; choose a directory "
            "you can write to."
        ) from err
    probe.rmdir()
    return target


def write_json_atomic(path: Path, payload: Any) -> None:
    """``payload`` as indented JSON at ``path``, written to a temporary file, synced and
    renamed: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(payload, handle, indent=2, sort_keys=False)
        handle.write("\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
