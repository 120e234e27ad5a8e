"""Where the apps write: checked before any work, so an unwritable path is one sentence
naming its key instead of a traceback after minutes of work."""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from omnibert.errors import UserError

__all__ = [
    "CACHE_DIR_ENV",
    "OLD_CACHE_DIR_ENV",
    "PathError",
    "cache_dir_from_env",
    "check_writable_dir",
    "check_writable_file",
    "hydra_output_discarded_when_refused",
    "note_hydra_dir",
    "user_cache_dir",
    "write_json_atomic",
]

#: the folder omnibert keeps what outlives a run in (the micro-batch probe's choices, data
#: conversions, and, where it is set, compiled code: :mod:`omnibert.run.pipeline.compile_cache`)
CACHE_DIR_ENV = "OMNIBERT_CACHE_DIR"
#: the name data conversions read before :data:`CACHE_DIR_ENV` was the one name: still read,
#: where :data:`CACHE_DIR_ENV` is unset, so conversions made under it are found again
OLD_CACHE_DIR_ENV = "OMNIBERT_CACHE"


def cache_dir_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """``$OMNIBERT_CACHE_DIR``, else ``$OMNIBERT_CACHE`` (its older name), else None."""
    env = os.environ if environ is None else environ
    return env.get(CACHE_DIR_ENV) or env.get(OLD_CACHE_DIR_ENV) or None


def user_cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The folder of omnibert's caches: :func:`cache_dir_from_env`, else
    ``$XDG_CACHE_HOME/omnibert``, else ``~/.cache/omnibert``."""
    env = os.environ if environ is None else environ
    chosen = cache_dir_from_env(env)
    if chosen:
        return Path(chosen)
    return Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "omnibert"


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


#: the nearest directory that existed before Hydra created its run directory (set by
#: :func:`omnibert.apps.preflight.check_command_line`): empty folders below it are Hydra's
_EXISTING_BEFORE: list[Path] = []


def note_hydra_dir(path: str | Path) -> None:
    """Remember where Hydra's run (or sweep) directory ``path`` starts to be created."""
    _EXISTING_BEFORE[:] = [_nearest_existing(Path(os.path.abspath(path)))]


@contextmanager
def hydra_output_discarded_when_refused() -> Iterator[None]:
    """Inside a Hydra app: a refusal (a :class:`UserError`) removes the job's output
    directory when it holds only what Hydra put there (``.hydra/``, ``<job>.log``), and the
    empty folders Hydra created above it, so a refused run leaves nothing behind."""
    try:
        yield
    except UserError:
        _discard_hydra_output()
        raise


def _discard_hydra_output() -> None:
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return
    hydra = HydraConfig.get()
    output = Path(str(hydra.runtime.output_dir))
    if not output.is_dir():
        return
    ours = {str(hydra.output_subdir), f"{hydra.job.name}.log"}
    if any(entry.name not in ours for entry in output.iterdir()):
        return  # the app wrote something there: it stays
    root = logging.getLogger()
    for handler in list(root.handlers):
        name = getattr(handler, "baseFilename", None)
        if name is not None and Path(name).parent == output:
            root.removeHandler(handler)
            handler.close()
    shutil.rmtree(output, ignore_errors=True)
    if not _EXISTING_BEFORE:
        return
    stop, parent = _EXISTING_BEFORE[0], output.parent
    while stop in parent.parents and parent.is_dir() and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


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
