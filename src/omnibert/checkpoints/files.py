"""Checkpoint files that torch cannot read: damaged or foreign, and the intact one beside it.

A ``last.ckpt`` cut short (a full disk, an interrupted copy, a file system that lost its
tail) or overwritten cannot be loaded; what the user needs then is to hear that the file is
damaged, not that it was not written by omnibert, and the name of the newest checkpoint in
the same directory that still opens (``omnibert-train`` keeps ``step-*.ckpt`` files beside
``last.ckpt``). :func:`unreadable_checkpoint` writes that sentence for every app that reads
checkpoints (``omnibert-export``, ``-eval``, a resume, ``init_from``, ``omnibert-predict``).

A checkpoint written by ``torch.save`` is a zip archive: a file that starts with the zip
signature but does not open is a damaged checkpoint; anything else is not one at all.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["intact_neighbour", "saved_step", "unreadable_checkpoint"]

#: the first bytes of every file ``torch.save`` writes (a zip archive's local header)
ZIP_MAGIC = b"PK\x03\x04"


def _opens(path: Path) -> bool:
    from omnibert.compat import load_checkpoint

    try:
        load_checkpoint(path, mmap=True)  # memory-mapped: the archive's index, no tensors read
    except Exception:
        return False
    return True


def saved_step(path: str | Path) -> int | None:
    """The ``global_step`` a Lightning checkpoint records, read memory-mapped (no tensor is
    read); None when the file cannot be read or records none."""
    from omnibert.compat import load_checkpoint

    try:
        value = load_checkpoint(path, mmap=True).get("global_step")
    except Exception:
        return None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def intact_neighbour(path: str | Path) -> Path | None:
    """The newest ``step-*.ckpt`` in ``path``'s directory, other than ``path``, that torch
    opens (``step-%08d`` names sort by step), or None."""
    target = Path(path)
    candidates = sorted(target.parent.glob("step-*.ckpt"), reverse=True)
    for candidate in candidates:
        if candidate.resolve() != target.resolve() and _opens(candidate):
            return candidate
    return None


def _root(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    text = str(err).strip().splitlines()
    if not text:
        return type(err).__name__
    first = text[0].split(". ", 1)[0].rstrip(".")  # torch adds sentences of advice
    return f"{type(err).__name__}: {first}"


def unreadable_checkpoint(key: str, path: str | Path, err: BaseException) -> str:
    """One sentence for ``key=path`` that torch could not load (``err``): damaged (a torch
    archive that does not open) or not a checkpoint, and which checkpoint beside it to pass
    instead as ``key``."""
    target = Path(path)
    try:
        with open(target, "rb") as handle:
            head = handle.read(len(ZIP_MAGIC))
        size = target.stat().st_size
    except OSError as os_err:
        return f"{key}={path} cannot be read ({os_err.strerror or os_err}); fix {key}."
    if size == 0:
        what = "is empty, so it is damaged (cut short while it was written or copied)"
    elif head == ZIP_MAGIC:
        what = (
            f"is damaged: a torch checkpoint of {size:,} bytes that cannot be loaded, cut short "
            f"or overwritten after it was written ({_root(err)})"
        )
    else:
        what = f"is not a torch checkpoint ({_root(err)})"
    neighbour = intact_neighbour(target)
    if neighbour is not None:
        fix = f"the checkpoint {neighbour.name} beside it is intact: pass {key}={neighbour}"
    else:
        fix = f"no checkpoint beside it can be read, so pass another one as {key}"
    return f"{key}={path} {what}; {fix}"
