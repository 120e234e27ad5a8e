"""Any pretrained BERT omnibert reads, as a :class:`~omnibert.models.BertForPreTraining`:
an ``omnibert-train`` checkpoint (``.ckpt``), a Hugging Face directory (``config.json`` +
``model.safetensors`` / ``pytorch_model.bin``) or a TensorFlow 1 checkpoint prefix (Google /
MLPerf, ``<prefix>.index`` + data shards, with its ``bert_config.json``).

``omnibert-eval`` and fine-tuning start from here, so the three kinds behave alike: the
architecture comes from the checkpoint, the weights are checked against it, and anything
that cannot be read is one sentence naming the file and the fix.

:func:`checkpoint_kind` is the one place that tells the kinds apart, a fourth included: an
``omnibert-finetune`` run (its directory or ``.ckpt``), which ``omnibert-export`` writes out
as a Hugging Face task model and fine-tuning continues with its head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnibert.compat import load_checkpoint
from omnibert.convert.hf import (
    ConversionError,
    init_from_hf,
    model_from_pretraining_checkpoint,
    read_hf_config,
)
from omnibert.convert.tf1 import load_tf1_into, read_bert_config, resolve_bert_config
from omnibert.models import BertConfig, BertForPreTraining

__all__ = [
    "FINETUNED_CKPT",
    "LoadedModel",
    "checkpoint_kind",
    "finetune_recipe",
    "load_pretrained",
]

#: Where an omnibert-finetune run keeps its fine-tuned weights, under its run directory.
FINETUNED_CKPT = Path("checkpoints") / "final.ckpt"


@dataclass
class LoadedModel:
    """A model with its weights and where they came from."""

    model: BertForPreTraining
    config: BertConfig
    kind: str  # "omnibert", "huggingface" or "tf1"
    description: str
    vocab_file: str | None = None
    #: the heads the checkpoint lacked, left freshly initialised (``require_heads=False``)
    fresh_heads: tuple[str, ...] = ()
    #: a Hugging Face fine-tuned model's task head (``qa_outputs.*`` / ``classifier.*``)
    task_head: dict[str, torch.Tensor] = field(default_factory=dict)


def finetune_recipe(hparams: Any) -> dict[str, Any] | None:
    """The task recipe in an ``omnibert-finetune`` checkpoint's hyper-parameters (a recipe
    with its ``data`` node, or the ``format`` of older runs); ``None`` for any other."""
    recipe = hparams.get("recipe") if isinstance(hparams, Mapping) else None
    if isinstance(recipe, Mapping) and ("data" in recipe or "format" in recipe):
        return dict(recipe)
    return None


def _is_finetuned_file(file: Path) -> bool:
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


def load_pretrained(
    path: str | Path,
    bert_config: str | Path | None = None,
    *,
    require_heads: bool = True,
    key: str = "ckpt",
) -> LoadedModel:
    """The pretraining model (encoder and MLM/NSP heads) stored at ``path``.

    ``bert_config`` is the Google-format ``bert_config.json`` of a TF1 checkpoint (default:
    the one next to it). A checkpoint without the pretraining heads (a bare ``BertModel``) is
    refused: its masked-LM and next-sentence outputs would be random; fine-tuning, which
    reads only the encoder, passes ``require_heads=False`` and gets the missing heads listed
    in ``fresh_heads``, and a Hugging Face fine-tuned model's head in ``task_head``. An
    ``omnibert-finetune`` run is refused (fine-tuning reads those itself:
    :mod:`omnibert.run.init_from`). ``key`` is the setting that named ``path``
    (``ckpt``, ``model.init_from``): messages name it.
    """
    kind = checkpoint_kind(path, key)
    if kind == "finetuned":
        raise ConversionError(
            f"{key}={path} is an omnibert-finetune run (a fine-tuned encoder and task head, "
            "without the masked-LM and next-sentence heads); pass a pretraining checkpoint, "
            "e.g. the model.init_from that run started from."
        )
    if kind == "omnibert":
        model, hparams = model_from_pretraining_checkpoint(path, key)
        return LoadedModel(
            model, model.config, kind, f"omnibert checkpoint {path}", hparams.get("vocab_file")
        )
    if kind == "huggingface":
        config = read_hf_config(path)
        model = BertForPreTraining(config)
        report = init_from_hf(model, path)
        if report.fresh_heads == ["bert.pooler", "cls.seq_relationship"] and require_heads:
            raise ConversionError(
                f"{key}={path} is a masked-LM model (BertForMaskedLM: no pooler or "
                "next-sentence head), so its next-sentence outputs would be random; pass the "
                ".ckpt it was exported from, or export that with omnibert-export "
                "heads=pretraining (BertForPreTraining)."
            )
        if report.fresh_heads and require_heads:
            what = "a fine-tuned task model" if report.task_head else "a bare BertModel"
            raise ConversionError(
                f"{key}={path} has no {', '.join(report.fresh_heads)} weights ({what}), "
                "so its masked-LM and next-sentence outputs would be random; pass a "
                "BertForPreTraining checkpoint."
            )
        vocab = Path(path) / "vocab.txt"
        return LoadedModel(
            model,
            config,
            kind,
            report.summary(),
            str(vocab) if vocab.is_file() else None,
            tuple(report.fresh_heads),
            report.task_head,
        )
    return _load_tf1(Path(path), bert_config)


def _load_tf1(path: Path, bert_config: str | Path | None) -> LoadedModel:
    prefix = path.with_suffix("") if path.suffix == ".index" else path
    config = read_bert_config(resolve_bert_config(prefix, bert_config))
    model = BertForPreTraining(config)
    report = load_tf1_into(model, prefix)
    vocab = prefix.parent / "vocab.txt"
    return LoadedModel(model, config, "tf1", report, str(vocab) if vocab.is_file() else None)
