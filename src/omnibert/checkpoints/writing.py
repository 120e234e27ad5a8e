"""Crash-safe checkpoint files: write a temporary file in the same directory, then rename.

Lightning's ``TorchCheckpointIO`` (2.5) serialises to memory and writes through an fsspec
transaction; for local paths fsspec puts the temporary file in ``$TMPDIR`` and commits with
``shutil.move``. When ``$TMPDIR`` is another file system (the usual cluster layout: local
``/tmp``, checkpoints on a shared disk) that move is a copy into the final path, so a kill
during the copy leaves a truncated ``last.ckpt`` behind, and nothing is ``fsync``'ed.
:class:`AtomicCheckpointIO` writes ``.<name>.tmp-<pid>`` next to the target, ``fsync``'s it,
``os.replace``'s it over the target (atomic on POSIX) and ``fsync``'s the directory: a reader
sees the old file or the new one, never a partial one. Remote URLs keep Lightning's path.

A write that fails (``OSError`` from the write, the ``fsync`` or the rename: a full disk,
a quota, the file size limit, a read-only remount, an I/O error) removes its temporary file,
leaves the file it was to replace as it was, and raises :class:`CheckpointWriteError`: the
path, what the error means, about how many bytes the checkpoint needs and how
many are free on that file system. :class:`omnibert.callbacks.PretrainingCheckpoint` decides
what the run does then (``callbacks.checkpoint.on_write_error``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

from omnibert.errors import RunFailed

TMP_MARKER = ".tmp-"

#: what to do about each kind of write error, ending "... and resume with ckpt_path=last"
#: ({lower}: the keep_last clause where the run keeps more than one step checkpoint)
_FIXES = {
    errno.ENOSPC: "free space there (or {lower}set paths.checkpoint_dir to a file system with "
    "room)",
    errno.EDQUOT: "free space within your quota there (or {lower}set paths.checkpoint_dir "
    "elsewhere)",
    errno.EFBIG: "raise the file size limit of the job (ulimit -f) above the checkpoint's size",
    errno.EROFS: "the file system was made read-only (often after disk errors: see dmesg); "
    "remount it or set paths.checkpoint_dir elsewhere",
    errno.EIO: "the disk reported an I/O error (see dmesg); check it or set "
    "paths.checkpoint_dir elsewhere",
}


def format_bytes(count: float) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units, one decimal)."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if abs(count) < 1024 or unit == "TiB":
            return f"{int(count)} bytes" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    raise AssertionError("unreachable")


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    """Free bytes (for this user) on the file system of ``path`` or of its nearest existing
    parent; None where it cannot be read."""
    where = Path(path).absolute()
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        return shutil.disk_usage(where).free
    except OSError:
        return None


#: zip entry, pickle and alignment bytes per tensor in a torch checkpoint (what torch.save
#: writes per tensor, rounded; tests/e2e/test_checkpoint_faults.py checks the estimates built on it)
BYTES_PER_TENSOR = 400


def checkpoint_file_bytes(obj: Any) -> int:
    """About the size of ``torch.save(obj)``: its tensor storages (nested dicts, lists and
    tuples; each storage once), :data:`BYTES_PER_TENSOR` for each and 2 KiB for the rest: what
    a failed write's message says it needed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            storage = item.untyped_storage()
            key = (storage.data_ptr(), storage.nbytes())
            if key not in seen:
                seen.add(key)
                total += storage.nbytes() + BYTES_PER_TENSOR
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return total + 2048


def os_error(error: BaseException) -> OSError | None:
    """The ``OSError`` behind ``error``: itself, or the one a ``RuntimeError`` of torch's
    archive writer was raised while handling (a write that fails inside ``torch.save`` ends in
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos``, the disk's error
    as its context)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class CheckpointWriteError(RunFailed):
    """A checkpoint could not be written (module docstring); the previous file at ``path``,
    if any, is untouched and no temporary file is left. Exit code 74 (``EX_IOERR`` of
    sysexits.h). :meth:`explain` completes the sentence with the run's side: the step, the
    checkpoint that is intact, what to do."""

    exit_code = 74

    def __init__(self, path: str, error: OSError, needed: int | None, free: int | None) -> None:
        self.path = path
        self.errno = error.errno
        self.strerror = error.strerror or str(error)
        self.needed = needed
        self.free = free
        self.context = ""
        super().__init__(self.message)

    @classmethod
    def of(cls, path: _PATH, error: OSError, checkpoint: Any) -> CheckpointWriteError:
        return cls(
            str(path), error, checkpoint_file_bytes(checkpoint), free_bytes(Path(str(path)).parent)
        )

    @property
    def message(self) -> str:
        code = errno.errorcode.get(self.errno or -1)
        text = f"could not write the checkpoint {self.path}: {self.strerror}"
        text += f" ({code})" if code else ""
        if self.needed:
            text += f"; it needs about {format_bytes(self.needed)}"
            if self.free is not None:
                text += f" and {format_bytes(self.free)} are free on that file system"
        return text + self.context

    def fix(self, fewer_files: bool = True) -> str:
        """What to do about it, for the end of the sentence; ``fewer_files``: the run could
        keep fewer step checkpoints (a lower ``keep_last`` is advised only then: fine-tuning
        keeps its one ``final.ckpt``)."""
        lower = "lower callbacks.checkpoint.keep_last, or " if fewer_files else ""
        return _FIXES.get(self.errno or -1, "make paths.checkpoint_dir writable").format(
            lower=lower
        )

    def explain(self, context: str) -> CheckpointWriteError:
        """Append ``context`` (``" at step 4; ..."``) to the message; returns self."""
        self.context = context
        self.args = (self.message,)
        return self


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """``torch.save`` to ``path`` so that ``path`` is never seen half-written."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}{TMP_MARKER}{os.getpid()}")
    try:
        with open(tmp, "wb") as handle:
            torch.save(obj, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    with contextlib.suppress(OSError):  # persist the rename (not supported everywhere)
        fd = os.open(target.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_copy(source: str | os.PathLike[str], path: str | os.PathLike[str]) -> None:
    """A copy of the file ``source`` at ``path``, written as :func:`atomic_torch_save` writes
    (never seen half-written); a failed write raises :class:`CheckpointWriteError`."""
    target = Path(path)
    tmp = target.with_name(f".{target.name}{TMP_MARKER}{os.getpid()}")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        size = Path(source).stat().st_size if Path(source).is_file() else None
        raise CheckpointWriteError(str(target), err, size, free_bytes(target)) from err


def stale_temporary_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Temporary files left in ``directory`` by writers that were killed mid-write."""
    folder = Path(directory)
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob(f".*{TMP_MARKER}*") if p.is_file())


class AtomicCheckpointIO(TorchCheckpointIO):
    """:class:`TorchCheckpointIO` whose local saves are atomic (module docstring)."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None
    ) -> None:
        protocol = get_filesystem(path).protocol
        protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
        if storage_options is not None or "file" not in protocols:
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        try:
            atomic_torch_save(checkpoint, path)
        except (OSError, RuntimeError) as err:
            cause = os_error(err)
            if cause is None:
                raise
            raise CheckpointWriteError.of(path, cause, checkpoint) from err
