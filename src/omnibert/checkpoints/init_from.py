"""Where a run's first weights come from (``model.init_from`` / ``phase.init_from``), found
once, checked before compute and loaded through this module, for both jobs. The kind of
checkpoint is :func:`omnibert.checkpoints.files.checkpoint_kind`'s answer.

Pretraining (:func:`plan_pretraining_init`, then :meth:`PretrainingInit.load_into`): a
Hugging Face BERT or ModernBERT directory (:mod:`omnibert.convert.modernbert`; one of the
other family than ``model.config`` is refused in one sentence naming the presets to use), an ``omnibert-train`` ``.ckpt`` of an earlier phase, or a
Google / MLPerf TensorFlow 1 checkpoint prefix with its ``bert_config.json``; its
architecture must be the run's (checked from the checkpoint's config, before compute), and
only the weights load (the optimiser and schedule start fresh).

Fine-tuning (:func:`load_encoder_source`):

* a pretrained checkpoint (an omnibert pretraining ``.ckpt``, a Hugging Face directory, a TF1
  prefix; :func:`omnibert.checkpoints.reading.load_pretrained`): its encoder, and a fresh head;
* an omnibert-finetune run (its directory or ``.ckpt``): encoder *and* head, to continue
  fine-tuning, only when its head is this task's kind and size; a head of another kind (a
  regression task given a classification checkpoint, 3 MNLI classes for 2 RTE ones) is one
  sentence naming ``model.init_from`` and the fix, before any compute;
* a Hugging Face fine-tuned model (``BertForQuestionAnswering`` /
  ``BertForSequenceClassification``, an ``omnibert-export`` of such a run among them): its
  encoder, and its head when it is this task's (``qa_outputs`` for SQuAD, a ``classifier``
  of the task's size for GLUE). Another head starts afresh with a note in the run's
  "initialised from" line, and its keys are among the new ones: such a directory, unlike an
  omnibert run, does not say what it started from, and the Hub's fine-tuned models are used
  as encoders for other tasks (an MNLI model for RTE), as Hugging Face's
  ``ignore_mismatched_sizes`` does.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from omnibert.checkpoints.files import unreadable_checkpoint
from omnibert.checkpoints.reading import (
    FINETUNED_CKPT,
    checkpoint_kind,
    load_pretrained,
    load_pretraining_checkpoint,
    read_finetuned,
)
from omnibert.compat import load_checkpoint
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.config.node import with_composition
from omnibert.convert.hf import (
    TIED_KEYS,
    family_mismatch,
    hf_model_type,
    init_from_hf,
    read_hf_config,
)
from omnibert.convert.tf1 import (
    check_tf1_checkpoint,
    checkpoint_hint,
    load_tf1_into,
    read_bert_config,
    resolve_bert_config,
)
from omnibert.convert.tf1_bundle import is_tf1_checkpoint
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.models.config import (
    FINETUNE_FIELDS,
    REGULARISATION_FIELDS,
    RUNTIME_FIELDS,
    BertConfigError,
    architecture_diffs,
)

__all__ = [
    "EncoderSource",
    "InitFromError",
    "PretrainingInit",
    "head_of",
    "load_encoder_source",
    "plan_pretraining_init",
    "with_checkpoint_architecture",
]


class InitFromError(TrainConfigError):
    """``init_from`` names something that cannot initialise this model."""


# ----------------------------------------------------------------------------- pretraining


@dataclass(frozen=True)
class PretrainingInit:
    """A pretraining run's initial weights, checked: where, which kind, and a TF1
    checkpoint's ``bert_config.json``."""

    path: str
    kind: str  # huggingface | omnibert | tf1
    bert_config: str | None = None

    def load_into(self, model: BertForPreTraining) -> str:
        """Copy the weights into ``model`` (a :class:`~omnibert.models.BertForPreTraining`);
        a one-line description of what was loaded."""
        if self.kind == "tf1":
            return str(load_tf1_into(model, Path(self.path)))
        if self.kind == "huggingface":
            report = init_from_hf(model, Path(self.path))
            return f"Hugging Face weights from {self.path}: {report}"
        _, state_dict, _ = load_pretraining_checkpoint(Path(self.path))
        result = model.load_state_dict(state_dict, strict=False)
        missing = [k for k in result.missing_keys if k not in TIED_KEYS]
        if missing or result.unexpected_keys:  # pragma: no cover - checked by the loader
            raise InitFromError(
                f"init_from={self.path} lacks {missing[:1]} / has extra "
                f"{result.unexpected_keys[:1]}; pass a checkpoint of this model."
            )
        return f"weights of {self.path} (fresh optimiser and schedule)"


#: BertConfig fields a run keeps whatever a checkpoint's config.json says: the vocab (the
#: data's, checked against the checkpoint's later), its padding and the runtime / fine-tuning
#: choices config.json does not hold
_RUN_FIELDS = ("vocab_size", "pad_vocab_size_multiple", *RUNTIME_FIELDS, *FINETUNE_FIELDS)


def with_checkpoint_architecture(config: TrainConfig) -> TrainConfig:
    """``config`` with the model's architecture from ``init_from``'s ``config.json`` when it
    is a Hugging Face directory (BERT or ModernBERT): its sizes and family replace the
    preset's, so ``model.init_from=<dir>`` needs no ``model.config.*``. A
    ``model.config.<field>`` set on the command line that contradicts config.json is refused
    in one sentence; a dropout or init range set there is kept (it is training, not
    architecture). Any other ``config`` is returned as it is."""
    init = config.model.init_from or config.phase.init_from
    path = Path(str(init)) if init is not None else None
    if path is None or not (path.is_dir() and (path / "config.json").is_file()):
        return config
    fields = dict(config.model.config)
    pad = int(fields.get("pad_vocab_size_multiple") or 8)
    theirs = dataclasses.asdict(read_hf_config(path).replace(pad_vocab_size_multiple=pad))
    typed = {k.removeprefix("model.config.") for k in config.composition.command_line}
    contradicted = [
        f"model.config.{name}={fields.get(name)!r} (config.json: {value!r})"
        for name, value in theirs.items()
        if name in typed and name not in (*_RUN_FIELDS, *REGULARISATION_FIELDS)
        and fields.get(name) != value
    ]  # fmt: skip
    if contradicted:
        raise InitFromError(
            f"init_from={path} is a Hugging Face checkpoint whose config.json gives the model's "
            f"architecture, and {', '.join(contradicted)} contradicts it; drop that override "
            "(or start from another checkpoint)."
        )
    for name, value in theirs.items():
        if name not in _RUN_FIELDS and name not in typed:
            fields[name] = value
    recorded = copy.deepcopy(dict(config.composition.recorded))
    if recorded:
        recorded["model"]["config"] = {**recorded["model"]["config"], **fields}
    model = dataclasses.replace(config.model, config=fields)
    composed = dataclasses.replace(config.composition, recorded=MappingProxyType(recorded))
    return with_composition(dataclasses.replace(config, model=model), composed)


def plan_pretraining_init(
    init_from: str | None, bert_config: str | None, model_config: Mapping[str, Any]
) -> PretrainingInit | None:
    """``init_from`` must exist and hold this architecture: a Hugging Face directory's
    config.json, a .ckpt's ``hyper_parameters['model_config']`` (read lazily), or a TensorFlow 1
    checkpoint prefix with its ``bert_config.json`` (``model.bert_config``, else the one next
    to it), whose index is checked against the model (names, shapes, every shard present)."""
    if init_from is None:
        if bert_config is not None:
            raise InitFromError(
                f"model.bert_config={bert_config} applies only to a TensorFlow 1 init_from and "
                "none is set; set model.init_from=<checkpoint prefix> or model.bert_config=null."
            )
        return None
    path = Path(str(init_from))
    tf1 = _tf1_bert_config(init_from, bert_config)
    if tf1 is None:
        _refuse_what_is_not_a_checkpoint(path, init_from)
    kind = "tf1" if tf1 is not None else checkpoint_kind(path, "init_from")
    if tf1 is not None:
        pad = int(model_config.get("pad_vocab_size_multiple", 8))
        theirs = read_bert_config(tf1, pad_vocab_size_multiple=pad)
        saved = dataclasses.asdict(theirs)
        where = f"init_from={path} (architecture from {tf1})"
    elif kind == "huggingface":
        ours = _model_config(model_config)
        family = None if ours is None else family_mismatch(path, hf_model_type(path), ours)
        if family is not None:
            raise InitFromError(family)
        saved = dataclasses.asdict(read_hf_config(path))
        where = f"init_from={path}"
    elif kind == "finetuned":
        raise InitFromError(
            f"init_from={path} is an omnibert-finetune run (a fine-tuned encoder and task head); "
            "pretraining starts from a pretraining checkpoint, a Hugging Face BERT directory or "
            "a TensorFlow checkpoint prefix."
        )
    else:
        saved = _saved_model_config(path)
        where = f"init_from={path}"
    diffs = architecture_diffs(saved, model_config)
    if diffs:
        raise InitFromError(
            f"{where} holds a different architecture: {', '.join(diffs)}; use the same model "
            "config (or model.config.vocab_size of the same vocab)."
        )
    if tf1 is not None:
        check_tf1_checkpoint(path, theirs)  # names, shapes and shards before any compute
    return PretrainingInit(str(path), kind, tf1)


def _model_config(model_config: Mapping[str, Any]) -> BertConfig | None:
    """``model_config`` as a :class:`BertConfig` (``None`` where it is not one yet: the
    architecture comparison then names what differs)."""
    try:
        return BertConfig.from_dict(model_config)
    except (BertConfigError, TypeError, ValueError):
        return None


def _refuse_what_is_not_a_checkpoint(path: Path, init_from: Any) -> None:
    """A path that does not exist, or a file or directory of TF checkpoints named the wrong
    way: one sentence with what to pass instead."""
    hint = checkpoint_hint(path)
    if not path.exists():
        fix = hint or (
            "point model.init_from at a Hugging Face BERT directory or a TensorFlow checkpoint "
            "prefix, or phase.init_from at a .ckpt of the previous phase"
        )
        raise InitFromError(f"init_from={init_from} does not exist; {fix}.")
    if path.is_dir() and not (path / "config.json").is_file() and hint:
        raise InitFromError(f"init_from={path} is a directory of TF checkpoints; {hint}.")
    if path.is_file() and hint:
        raise InitFromError(f"init_from={path} is a file of a TF checkpoint; {hint}.")
    bare = not (path / "config.json").is_file() and not (path / FINETUNED_CKPT).is_file()
    if path.is_dir() and bare:
        read_hf_config(path)  # names the config.json a Hugging Face directory must hold


def _saved_model_config(path: Path) -> dict[str, Any]:
    try:
        ckpt = load_checkpoint(path, mmap=True)
    except Exception as err:
        raise InitFromError(unreadable_checkpoint("init_from", path, err)) from err
    try:
        return dict(ckpt["hyper_parameters"]["model_config"])
    except Exception as err:
        raise InitFromError(
            f"init_from={path} is not a checkpoint written by omnibert-train "
            f"({_root(err)}); pass the previous phase's .ckpt."
        ) from err


def _root(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def _tf1_bert_config(init_from: Any, bert_config: Any) -> str | None:
    """The ``bert_config.json`` of a TensorFlow 1 ``init_from`` (``model.bert_config``, else
    the one next to the checkpoint); ``None`` when ``init_from`` is not a TF1 prefix, where
    a ``model.bert_config`` is refused."""
    if not is_tf1_checkpoint(init_from):
        if bert_config is not None:
            raise InitFromError(
                f"model.bert_config={bert_config} applies only to a TensorFlow 1 init_from and "
                f"init_from={init_from} is not one (no {init_from}.index); set "
                "model.bert_config=null or init_from to the TF checkpoint's prefix."
            )
        return None
    return str(resolve_bert_config(init_from, bert_config, key="model.bert_config"))


# ----------------------------------------------------------------------------- fine-tuning


@dataclass
class EncoderSource:
    config: Any
    vocab_file: str | None
    description: str
    model: Any = None  # a pretraining model (its ``bert.*`` encoder is loaded)
    fresh_heads: tuple[str, ...] = ()
    finetuned_state: dict[str, Any] | None = None  # a fine-tuned task's whole state_dict
    head: dict[str, Any] | None = None  # a Hugging Face model's head, when it is the task's

    def load_into(self, task: Any) -> list[str]:
        """Copy the weights into ``task``; the names left freshly initialised."""
        if self.finetuned_state is not None:
            task.load_state_dict(self.finetuned_state, strict=True)
            return []
        encoder = {
            k.removeprefix("bert."): v
            for k, v in self.model.state_dict().items()
            if k.startswith("bert.")
        }
        return list(task.load_encoder(encoder, self.fresh_heads, self.head))


def head_of(recipe: Mapping[str, Any]) -> str:
    """A readable description of a task's head from its recipe: ``question answering`` (a
    recipe with windows: ``doc_stride``), ``regression (1 output)``, ``classification (3
    labels)``."""
    if "doc_stride" in recipe:
        return "question answering (start/end logits)"
    labels = int(recipe.get("num_labels", 2))
    return "regression (1 output)" if labels == 1 else f"classification ({labels} labels)"


def _hf_head(
    task_head: dict[str, Any], hidden_size: int, recipe: Mapping[str, Any], init_from: str
) -> tuple[dict[str, Any] | None, str]:
    """A Hugging Face fine-tuned model's head when it is the task's (else ``None``), and what
    became of it, for the "initialised from" line (module docstring)."""
    if not task_head:
        return None, ""
    module = next(iter(task_head)).split(".")[0]
    weight, bias = task_head.get(f"{module}.weight"), task_head.get(f"{module}.bias")
    outputs = -1 if weight is None else int(weight.shape[0])
    if (
        weight is None
        or bias is None
        or tuple(weight.shape) != (outputs, hidden_size)
        or tuple(bias.shape) != (outputs,)
        or len(task_head) != 2
        or (module == "qa_outputs" and outputs != 2)
    ):
        shapes = ", ".join(f"{k} {tuple(v.shape)}" for k, v in sorted(task_head.items()))
        raise FineTuneInputError(
            f"model.init_from={init_from} has a {module} head that is not one Linear layer "
            f"over the hidden size {hidden_size} ({shapes}); it is not a Hugging Face "
            "BertForQuestionAnswering or BertForSequenceClassification, re-download it."
        )
    if module == "qa_outputs":
        theirs = "question answering (start/end logits)"
    else:
        theirs = head_of({"num_labels": outputs})
    ours = head_of(recipe)
    if theirs == ours:
        return dict(task_head), f"; its {ours} head kept"
    return None, (
        f"; note: model.init_from={init_from} has a {theirs} head and task="
        f"{recipe.get('name')} needs a {ours} head, so the head starts afresh"
    )


def load_encoder_source(
    init_from: str, bert_config: str | None, recipe: Mapping[str, Any]
) -> EncoderSource:
    """The weights ``model.init_from`` names for a fine-tuning task with ``recipe`` (module
    docstring)."""
    if checkpoint_kind(init_from, "model.init_from") == "finetuned":
        return _finetuned_source(init_from, recipe)
    loaded = load_pretrained(init_from, bert_config, require_heads=False, key="model.init_from")
    head, note = _hf_head(loaded.task_head, loaded.config.hidden_size, recipe, init_from)
    return EncoderSource(
        loaded.config,
        loaded.vocab_file,
        loaded.description + note,
        model=loaded.model,
        fresh_heads=tuple(loaded.fresh_heads),
        head=head,
    )


def _finetuned_source(init_from: str, recipe: Mapping[str, Any]) -> EncoderSource:
    """An omnibert-finetune run's encoder and head, when its head is the task's."""
    path = Path(init_from)
    file = path / FINETUNED_CKPT if path.is_dir() else path
    ckpt, hparams, saved = read_finetuned(
        file, "model.init_from", f"model.init_from={init_from}: {file}",
        "pass a pretrained checkpoint or a fine-tuned run",
    )  # fmt: skip
    theirs, ours = head_of(saved), head_of(recipe)
    if theirs != ours:
        raise FineTuneInputError(
            f"model.init_from={init_from} is a fine-tuned {saved.get('name')} model "
            f"with a {theirs} head, but task={recipe.get('name')} needs a {ours} head; "
            "start from a pretrained checkpoint (the one that run started from: "
            f"{hparams.get('init_from')})."
        )
    state = {k: v for k, v in ckpt["state_dict"].items() if k.startswith("model.")}
    return EncoderSource(
        BertConfig(**hparams["model_config"]),
        hparams.get("vocab_file"),
        f"fine-tuned {saved.get('name')} run {file} (encoder and head)",
        finetuned_state=state,
    )
