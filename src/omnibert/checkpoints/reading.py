"""Any pretrained BERT omnibert reads, as a :class:`~omnibert.models.BertForPreTraining`:
an ``omnibert-train`` checkpoint (``.ckpt``), a Hugging Face directory (``config.json`` +
``model.safetensors`` / ``pytorch_model.bin``) or a TensorFlow 1 checkpoint prefix (Google /
MLPerf, ``<prefix>.index`` + data shards, with its ``bert_config.json``).

``omnibert-eval`` and fine-tuning start from here, so the three kinds behave alike: the
architecture comes from the checkpoint, the weights are checked against it, and anything
that cannot be read is one sentence naming the file and the fix.

:func:`~omnibert.checkpoints.files.checkpoint_kind` (in the light module
:mod:`omnibert.checkpoints.files`, re-exported here) is the one place that tells the kinds
apart, a fourth included: an ``omnibert-finetune`` run (its directory or ``.ckpt``), which
``omnibert-export`` writes out as a Hugging Face task model and fine-tuning continues with its
head.
:func:`load_pretraining_checkpoint` reads an ``omnibert-train`` checkpoint's model config,
weights and hyper-parameters, checked against each other; :func:`load_finetuned` an
``omnibert-finetune`` checkpoint back as its task (``omnibert-predict``, ``omnibert-export``,
tests, benchmarks). A checkpoint of :mod:`omnibert.tasks.finetuning` holds its hparams (model
config, recipe, vocab path) and ``state_dict`` (``model.`` + Hugging Face names), so it
rebuilds from itself; the vocab is the run directory's ``vocab.txt`` (the path recorded in the
checkpoint, else the one two levels up from ``checkpoints/final.ckpt``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from omnibert.checkpoints.files import (
    FINETUNED_CKPT,
    checkpoint_kind,
    finetune_recipe,
    unreadable_checkpoint,
)
from omnibert.compat import load_checkpoint
from omnibert.config.recorded import RecordedRecipe
from omnibert.convert.hf import (
    TIED_KEYS,
    ConversionError,
    init_from_hf,
    read_hf_config,
)
from omnibert.convert.tf1 import load_tf1_into, read_bert_config, resolve_bert_config
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.models import BertConfig, BertConfigError, BertForPreTraining
from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

__all__ = [
    "FINETUNED_CKPT",
    "Finetuned",
    "LoadedModel",
    "checkpoint_kind",
    "finetune_recipe",
    "load_finetuned",
    "load_pretrained",
    "load_pretraining_checkpoint",
    "model_from_pretraining_checkpoint",
    "read_finetuned",
    "task_class",
]

#: What the pretraining loaders ask for; an app that takes more kinds names them instead.
PRETRAINING_CHECKPOINT = "a checkpoint written by omnibert-train's pretraining task"


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
    :mod:`omnibert.checkpoints.init_from`). ``key`` is the setting that named ``path``
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


def _directory_message(path: Path) -> str:
    """What to pass instead of a directory: the checkpoints in it (or its checkpoints/)."""
    found = sorted(path.glob("*.ckpt")) or sorted(path.glob("checkpoints/*.ckpt"))
    if not found:
        return (
            f"ckpt={path} is a directory and holds no .ckpt file; pass ckpt= with a checkpoint "
            "file, e.g. <run>/checkpoints/last.ckpt."
        )
    best = next((f for f in found if f.name == "last.ckpt"), found[-1])
    names = ", ".join(str(f.relative_to(path)) for f in found[:8])
    more = ", ..." if len(found) > 8 else ""
    return (
        f"ckpt={path} is a directory; pass one checkpoint file in it, e.g. ckpt={best} "
        f"(it holds {names}{more})."
    )


def load_pretraining_checkpoint(
    ckpt_path: str | Path, key: str = "ckpt", wanted: str = PRETRAINING_CHECKPOINT
) -> tuple[BertConfig, dict[str, torch.Tensor], dict[str, Any]]:
    """``(config, model state dict, hyper-parameters)`` of a pretraining Lightning checkpoint.

    The checkpoint holds ``hyper_parameters['model_config']`` (the :class:`BertConfig` fields)
    and ``state_dict`` keys ``'model.' + <parameter name>``. ``key`` is the setting that named
    it (``ckpt``, ``model.init_from``), for the messages: a file torch cannot load is called
    damaged, with the intact checkpoint beside it (:mod:`omnibert.checkpoints.files`); a file that
    is not a pretraining checkpoint is refused with "pass ``wanted``" (what the caller takes)."""
    path = Path(ckpt_path)
    if path.is_dir():
        raise ConversionError(_directory_message(path))
    if not path.is_file():
        raise ConversionError(f"checkpoint {path} does not exist; pass ckpt= with a .ckpt file.")
    try:
        ckpt = load_checkpoint(path)
    except Exception as err:
        raise ConversionError(unreadable_checkpoint(key, path, err)) from err
    hparams = ckpt.get("hyper_parameters") if isinstance(ckpt, Mapping) else None
    if not isinstance(hparams, Mapping) or "model_config" not in hparams:
        raise ConversionError(
            f"checkpoint {path} is not an omnibert checkpoint (it has no "
            f"hyper_parameters['model_config']); pass {wanted}."
        )
    try:
        config = BertConfig.from_dict(hparams["model_config"])
    except (BertConfigError, TypeError) as err:
        raise ConversionError(f"checkpoint {path} has an unusable model_config: {err}") from err
    state = {
        key.removeprefix("model."): value
        for key, value in ckpt.get("state_dict", {}).items()
        if key.startswith("model.")
    }
    with torch.device("meta"):  # shapes only: no memory, no init cost
        expected = BertForPreTraining(config).state_dict()
    absent = [k for k in expected if k not in state and k not in TIED_KEYS]
    extra = [k for k in state if k not in expected]
    wrong = [k for k in expected if k in state and state[k].shape != expected[k].shape]
    if absent or extra or wrong:
        if absent:
            detail = f"missing {absent[0]}"
        elif extra:
            detail = f"unexpected {extra[0]}"
        else:
            shape, needed = tuple(state[wrong[0]].shape), tuple(expected[wrong[0]].shape)
            detail = f"{wrong[0]} has shape {shape}, the config needs {needed}"
        raise ConversionError(
            f"checkpoint {path} does not hold the model its model_config describes ({detail}); "
            f"pass {wanted}."
        )
    return config, state, dict(hparams)


def model_from_pretraining_checkpoint(
    ckpt_path: str | Path, key: str = "ckpt", wanted: str = PRETRAINING_CHECKPOINT
) -> tuple[BertForPreTraining, dict[str, Any]]:
    """A :class:`BertForPreTraining` with the checkpoint's weights, and its hyper-parameters
    (``key``: the setting that named it, ``wanted``: what to pass instead, for messages)."""
    config, state, hparams = load_pretraining_checkpoint(ckpt_path, key, wanted)
    model = BertForPreTraining(config)
    model.load_state_dict(state, strict=False)
    return model, hparams


def read_finetuned(
    file: Path, key: str, named: str, fix: str
) -> tuple[dict[str, Any], dict[str, Any], RecordedRecipe]:
    """An omnibert-finetune checkpoint: (the checkpoint, its hyper-parameters, its task
    recipe). One sentence when it cannot be read (naming ``key``) or holds no recipe
    (``named`` is not one; ``fix``)."""
    try:
        ckpt = load_checkpoint(file)
    except Exception as err:
        raise FineTuneInputError(unreadable_checkpoint(key, file, err)) from err
    hparams = ckpt.get("hyper_parameters") or {}
    recipe = finetune_recipe(hparams)
    if recipe is None:
        raise FineTuneInputError(
            f"{named} is not an omnibert-finetune checkpoint (no task recipe); {fix}."
        )
    return ckpt, hparams, RecordedRecipe(recipe)


@dataclass
class Finetuned:
    """A fine-tuned task back from its checkpoint (:func:`load_finetuned`), in eval mode."""

    task: Any
    recipe: RecordedRecipe
    vocab_file: Path
    checkpoint: Path


def _checkpoint_file(path: Path) -> Path:
    if path.is_dir():
        if (path / FINETUNED_CKPT).is_file():
            return path / FINETUNED_CKPT
        raise FineTuneInputError(
            f"ckpt={path} is a directory without {FINETUNED_CKPT}; pass the run directory of a "
            "finished omnibert-finetune run or its .ckpt file."
        )
    if not path.is_file():
        raise FineTuneInputError(
            f"ckpt={path} does not exist; pass an omnibert-finetune run directory or its .ckpt."
        )
    return path


def task_class(recipe: Mapping[str, Any]) -> Any:
    """The LightningModule a fine-tuned recipe was trained with: question answering for a
    recipe with windows (``doc_stride``; SQuAD), sequence classification otherwise."""
    qa = RecordedRecipe(recipe).question_answering
    return QuestionAnsweringTask if qa else SequenceClassificationTask


def load_finetuned(path: str | Path) -> Finetuned:
    """The fine-tuned task stored at ``path`` (a run directory or a ``.ckpt``), in eval mode."""
    file = _checkpoint_file(Path(path))
    ckpt, hparams, recipe = read_finetuned(
        file, "ckpt", f"ckpt={file}", "pass the run directory of an omnibert-finetune run"
    )
    task = task_class(recipe)(**hparams)
    task.load_state_dict(ckpt["state_dict"])
    task.eval()
    vocab = Path(hparams.get("vocab_file") or "")
    if not vocab.is_file():
        vocab = file.parent.parent / "vocab.txt"
    if not vocab.is_file():
        raise FineTuneInputError(
            f"ckpt={file} records no readable vocab.txt and none lies in its run directory; "
            "copy the checkpoint's vocab.txt there."
        )
    return Finetuned(task, recipe, vocab, file)
