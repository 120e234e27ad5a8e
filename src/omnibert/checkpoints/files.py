"""Checkpoint files that torch cannot read: damaged or foreign, and the intact one beside it.

A ``last.ckpt`` cut short (a full disk, an interrupted copy, a file system that lost its
tail) or overwritten cannot be loaded; what the user needs then is to hear that the file is
damaged, not that it was not written by omnibert, and the name of the newest checkpoint in
the same directory that still opens (``omnibert-train`` keeps ``step-*.ckpt`` files beside
``last.ckpt``). :func:`unreadable_checkpoint` writes that sentence for every app that reads
checkpoints (``omnibert-export``, ``-eval``, a resume, ``init_from``, ``omnibert-predict``).

A checkpoint written by ``torch.save`` is a zip archive: a file that starts with the zip
signature but does not open is a damaged checkpoint; anything else is not one at all.

What a checkpoint path names is told here too (:func:`checkpoint_kind`, the one place that
does it): an ``omnibert-finetune`` run (its directory or ``.ckpt``), another omnibert
``.ckpt``, a Hugging Face directory or a TensorFlow 1 prefix. The module is light on purpose:
``omnibert-export`` and ``omnibert-predict`` tell the kind (and refuse a path that is none)
before they import Lightning and the models; only a file is opened, with torch,
memory-mapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omnibert.errors import ConversionError

__all__ = [
    "FINETUNED_CKPT",
    "checkpoint_kind",
    "finetune_recipe",
    "intact_neighbour",
    "saved_step",
    "unreadable_checkpoint",
]

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


#: Where an omnibert-finetune run keeps its fine-tuned weights, under its run directory.
FINETUNED_CKPT = Path("checkpoints") / "final.ckpt"


def finetune_recipe(hparams: Any) -> dict[str, Any] | None:
    """The task recipe in an ``omnibert-finetune`` checkpoint's hyper-parameters (a recipe
    with its ``data`` node, or the ``format`` of older runs); ``None`` for any other."""
    recipe = hparams.get("recipe") if isinstance(hparams, Mapping) else None
    if isinstance(recipe, Mapping) and ("data" in recipe or "format" in recipe):
        return dict(recipe)
    return None


def _is_finetuned_file(file: Path) -> bool:
    from omnibert.compat import load_checkpoint

    try:  # memory-mapped: only the hyper-parameters are read
        ckpt = load_checkpoint(file, mmap=True)
    except Exception:
        return False  # damaged or foreign: the loader that reads it says which, and why
    return isinstance(ckpt, Mapping) and finetune_recipe(ckpt.get("hyper_parameters")) is not None


def checkpoint_kind(path: str | Path, key: str = "ckpt") -> str:
    """``finetuned`` (an ``omnibert-finetune`` run: its directory holding
    ``checkpoints/final.ckpt``, or a file whose hyper-parameters hold a task recipe),
    ``omnibert`` (any other file: a pretraining ``.ckpt``, checked when it is loaded),
    ``huggingface`` (a directory with config.json) or ``tf1`` (a prefix whose ``.index``
    exists); one sentence naming ``key`` (the setting the user typed) when it is none of
    them."""
    path = Path(path)
    if path.is_file() and path.suffix != ".index":
        return "finetuned" if _is_finetuned_file(path) else "omnibert"
    if path.is_dir() and (path / "config.json").is_file():
        return "huggingface"
    if path.is_dir() and (path / FINETUNED_CKPT).is_file():
        return "finetuned"
    prefix = path.with_suffix("") if path.suffix == ".index" else path
    if Path(f"{prefix}.index").is_file():
        return "tf1"
    if path.is_dir():
        found = sorted(p.name for p in path.glob("*.ckpt")) + sorted(
            p.name[: -len(".index")] for p in path.glob("*.index")
        )
        hint = f" (it holds {', '.join(found[:3])})" if found else ""
        raise ConversionError(
            f"{key}={path} is a directory without config.json{hint}; pass a .ckpt file, a "
            "Hugging Face directory or a TF1 checkpoint prefix such as <dir>/model.ckpt-28252."
        )
    raise ConversionError(
        f"{key}={path} does not exist; pass an omnibert .ckpt, a Hugging Face directory or a "
        "TF1 checkpoint prefix (<prefix>.index must exist)."
    )
