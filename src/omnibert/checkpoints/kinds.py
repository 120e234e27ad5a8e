"""What a checkpoint path names, told apart without importing the model code: an
``omnibert-finetune`` run (its directory or ``.ckpt``), another omnibert ``.ckpt``, a Hugging
Face directory or a TensorFlow 1 prefix (:func:`checkpoint_kind`, the one place that does it).

Light on purpose: ``omnibert-export`` and ``omnibert-predict`` tell the kind (and refuse a path
that is none) before they import Lightning and the models; only a file is opened, with torch,
memory-mapped.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omnibert.errors import ConversionError

__all__ = ["FINETUNED_CKPT", "checkpoint_kind", "finetune_recipe"]

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
