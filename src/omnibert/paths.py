"""Where the apps write: checked before any work, so an unwritable path is one sentence
naming its key instead of a traceback after minutes of work."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from omnibert.errors import UserError

__all__ = ["PathError", "check_writable_dir", "check_writable_file"]


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


def check_writable_file(path: str | Path, key: str) -> Path:
    """``path`` as given, once it is known to name a file this process can write (not a
    directory; its folder exists or can be created, and takes new entries); raises
    :class:`PathError` naming ``key`` otherwise, leaving nothing behind."""
    target = Path(path)
    if target.is_dir():
        raise PathError(f"{key}={path} is a directory; name a file in it instead.")
    parent = Path(os.path.abspath(target)).parent
    try:
        check_writable_dir(parent, key)
    except PathError as err:
        raise PathError(str(err).replace(f"{key}={parent}", f"{key}={path}", 1)) from None
    return target
