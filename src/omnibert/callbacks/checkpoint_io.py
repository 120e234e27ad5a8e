"""Crash-safe checkpoint files: write a temporary file in the same directory, then rename.

Lightning's ``TorchCheckpointIO`` (2.5) serialises to memory and writes through an fsspec
transaction; for local paths fsspec puts the temporary file in ``$TMPDIR`` and commits with
``shutil.move``. When ``$TMPDIR`` is another file system (the usual cluster layout: local
``/tmp``, checkpoints on a shared disk) that move is a copy into the final path, so a kill
during the copy leaves a truncated ``last.ckpt`` behind, and nothing is ``fsync``'ed.
:class:`AtomicCheckpointIO` writes ``.<name>.tmp-<pid>`` next to the target, ``fsync``'s it,
``os.replace``'s it over the target (atomic on POSIX) and ``fsync``'s the directory: a reader
sees the old file or the new one, never a partial one. Remote URLs keep Lightning's path.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.plugins.io import TorchCheckpointIO

TMP_MARKER = ".tmp-"


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
        atomic_torch_save(checkpoint, path)
