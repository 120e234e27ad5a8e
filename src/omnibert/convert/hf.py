"""Hugging Face BERT checkpoints in and out.

* :func:`init_from_hf` loads a ``BertForPreTraining`` or bare ``BertModel`` checkpoint directory
  (``model.safetensors`` or ``pytorch_model.bin``, sharded or not) into our model; the real
  vocabulary rows go into the padded embedding, buffers such as ``position_ids`` are ignored,
  and every mismatch is refused in one sentence before the model changes.
  A fine-tuned model's directory (``BertForQuestionAnswering`` / ``BertForSequenceClassification``)
  also holds its task head (``qa_outputs.*`` / ``classifier.*``): :attr:`ImportReport.task_head`
  hands it to fine-tuning, which keeps it when it is the task's head.
* :func:`~omnibert.convert.hf_export.export_hf` (its own module) writes the other way.

omnibert's own Lightning checkpoints are read by :mod:`omnibert.checkpoints.reading`.

Models of the ModernBERT family go through the same functions: ``export_hf`` writes them as
``ModernBertForMaskedLM`` and :func:`init_from_hf` reads a ModernBERT directory
(``model_type`` ``modernbert``), with the names and config keys of
:mod:`omnibert.convert.modernbert`; a model of neither family is refused before any file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from omnibert.compat import load_checkpoint
from omnibert.errors import ConversionError
from omnibert.models import BertConfig, BertConfigError, BertForPreTraining

#: Tensors that are other tensors under a second name (HF ties them the same way).
TIED_KEYS = ("cls.predictions.decoder.weight", "cls.predictions.decoder.bias")
#: Vocabulary-sized tensors: the checkpoint holds the real rows, our model the padded ones.
VOCAB_KEYS = ("bert.embeddings.word_embeddings.weight", "cls.predictions.bias")
#: Modules a bare ``BertModel`` checkpoint may lack; they then stay freshly initialised.
HEADS = ("bert.pooler", "cls.predictions", "cls.seq_relationship")
#: The fine-tuning heads of Hugging Face's BertForQuestionAnswering / ...SequenceClassification.
TASK_HEADS = ("qa_outputs", "classifier")
_BUFFER_SUFFIXES = ("position_ids", "token_type_ids")
_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass(frozen=True)
class ImportReport:
    """What :func:`init_from_hf` did: parameter names loaded, left as they were, ignored."""

    source: str
    loaded: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)
    #: a fine-tuned checkpoint's task head (``qa_outputs.*`` or ``classifier.*``), not loaded
    #: into the pretraining model, which has none
    task_head: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def fresh_heads(self) -> list[str]:
        """The heads (pooler, MLM, NSP) that the checkpoint lacked and stay freshly initialised."""
        return [h for h in HEADS if any(k.startswith(h + ".") for k in self.missing)]

    def summary(self) -> str:
        text = f"loaded {len(self.loaded)} tensors from {self.source}"
        if self.fresh_heads:
            text += f"; freshly initialised: {', '.join(self.fresh_heads)}"
        if self.ignored:
            text += f"; ignored: {', '.join(self.ignored)}"
        return text

    def __str__(self) -> str:
        return self.summary()


def _weights_files(path: Path) -> list[Path]:
    for name in _WEIGHT_FILES:
        index = path / f"{name}.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            return [path / shard for shard in sorted(set(weight_map.values()))]
        if (path / name).is_file():
            return [path / name]
    raise ConversionError(
        f"{path} holds no model.safetensors or pytorch_model.bin; point model.init_from at a "
        "Hugging Face BERT checkpoint directory."
    )


def _read_weights(files: list[Path]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            if file.suffix == ".safetensors":
                tensors.update(load_file(str(file)))
            else:
                tensors.update(load_checkpoint(file))
        except Exception as err:
            raise ConversionError(
                f"{file} could not be read ({type(err).__name__}: {err}); re-download the "
                "checkpoint."
            ) from err
    return tensors


def _hf_name(key: str, bare: bool) -> str:
    """Our parameter name for a checkpoint key (adds ``bert.`` to bare ``BertModel`` keys)."""
    key = key.replace("LayerNorm.gamma", "LayerNorm.weight").replace(
        "LayerNorm.beta", "LayerNorm.bias"
    )
    return f"bert.{key}" if bare else key


def _hf_config_dict(path: str | Path) -> dict[str, Any]:
    config_file = Path(path) / "config.json"
    if not config_file.is_file():
        raise ConversionError(
            f"{config_file} does not exist; point model.init_from at a Hugging Face BERT or "
            "ModernBERT checkpoint directory (config.json + model.safetensors)."
        )
    try:
        values = json.loads(config_file.read_text())
    except json.JSONDecodeError as err:
        raise ConversionError(f"{config_file} is not a usable BERT config: {err}") from err
    if not isinstance(values, dict):
        raise ConversionError(f"{config_file} is not a JSON object; re-download the checkpoint.")
    return values


def hf_model_type(path: str | Path) -> str:
    """The ``model_type`` of a Hugging Face directory's config.json (``bert`` when absent)."""
    return str(_hf_config_dict(path).get("model_type", "bert"))


def read_hf_config(path: str | Path) -> BertConfig:
    """The :class:`BertConfig` of a Hugging Face checkpoint directory's ``config.json``: a BERT
    (``model_type`` ``bert``) or a ModernBERT one (``modernbert``,
    :mod:`omnibert.convert.modernbert`)."""
    from omnibert.convert.modernbert import MODEL_TYPE, from_modernbert_dict

    values = _hf_config_dict(path)
    config_file = Path(path) / "config.json"
    what = "ModernBERT" if values.get("model_type") == MODEL_TYPE else "BERT"
    try:
        if what == "ModernBERT":
            return from_modernbert_dict(values)
        return BertConfig.from_hf_dict(values)
    except (BertConfigError, TypeError, ValueError) as err:
        raise ConversionError(f"{config_file} is not a usable {what} config: {err}") from err


def family_mismatch(path: str | Path, model_type: str, ours: BertConfig) -> str | None:
    """One sentence when a Hugging Face directory of one family (``bert`` / ``modernbert``)
    meets a model config of the other, else ``None``."""
    if model_type == "modernbert" and ours.is_bert:
        return (
            f"{Path(path) / 'config.json'} is a Hugging Face ModernBERT checkpoint (model_type "
            "modernbert) but model.config is original BERT; use model=modernbert_base, "
            "modernbert_large or modern_tiny sized like the checkpoint (or set the matching "
            "modern options: position_encoding=rope, feed_forward=geglu, norm_position=pre, "
            "type_vocab_size=0, next_sentence_head=false, ...)."
        )
    if model_type == "bert" and not ours.is_bert:
        return (
            f"{Path(path) / 'config.json'} is a Hugging Face BERT checkpoint (model_type bert) "
            "but model.config has modern options; use a model=bert_* preset sized like the "
            "checkpoint."
        )
    return None


def init_from_hf(model: BertForPreTraining, path: str | Path) -> ImportReport:
    """Load a Hugging Face BERT checkpoint directory into ``model`` (in place).

    Accepts ``BertForPreTraining``-style keys (``bert.*``, ``cls.*``) and bare ``BertModel``
    keys (no prefix, no heads: the heads keep their current values and are reported). A
    fine-tuned model's head (``qa_outputs.*``, ``classifier.*``) is returned in the report's
    ``task_head``. Raises :class:`ConversionError` before touching ``model`` on any mismatch.
    """
    path = Path(path)
    if not path.is_dir():
        raise ConversionError(
            f"Hugging Face checkpoint directory {path} does not exist; set model.init_from to a "
            "directory holding config.json and model.safetensors (or pytorch_model.bin)."
        )
    theirs = read_hf_config(path)
    ours = model.config
    model_type = hf_model_type(path)
    family = family_mismatch(path, model_type, ours)
    if family is not None:
        raise ConversionError(family)
    mismatches = ours.architecture_mismatches(theirs)
    if mismatches:
        fix = (
            "prepare the data with the checkpoint's vocab.txt so the vocab sizes agree"
            if all(m.startswith("vocab_size=") for m in mismatches)
            else "set model.config to the checkpoint's sizes"
        )
        raise ConversionError(
            f"{path / 'config.json'} does not match the model (model vs checkpoint: "
            f"{', '.join(mismatches)}); {fix}."
        )
    files = _weights_files(path)
    tensors = _read_weights(files)
    if model_type == "modernbert":
        return _init_from_modernbert(model, path, files, tensors)
    bare = not any(k.startswith(("bert.", "cls.")) for k in tensors)
    if "cls.predictions.decoder.bias" in tensors and "cls.predictions.bias" not in tensors:
        tensors["cls.predictions.bias"] = tensors.pop("cls.predictions.decoder.bias")
    params = model.state_dict()
    vocab = ours.vocab_size
    updates: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    task_head: dict[str, torch.Tensor] = {}
    source = files[0].name if len(files) == 1 else f"{len(files)} shards"
    for key, tensor in tensors.items():
        name = _hf_name(key, bare)
        if key.split(".")[0] in TASK_HEADS:
            task_head[key] = tensor
            continue
        if name.endswith(_BUFFER_SUFFIXES) or name in TIED_KEYS or name not in params:
            ignored.append(key)
            continue
        expected = params[name].shape
        if name in VOCAB_KEYS:
            expected = torch.Size((vocab, *expected[1:]))
        if tensor.shape != expected:
            raise ConversionError(
                f"{path / source} has {key} of shape {tuple(tensor.shape)} but the model needs "
                f"{tuple(expected)}; the checkpoint does not belong to this config.json, "
                "re-download it."
            )
        updates[name] = tensor
    decoder = tensors.get("cls.predictions.decoder.weight")
    embedding = updates.get(VOCAB_KEYS[0])
    if decoder is not None and embedding is not None and not torch.equal(decoder, embedding):
        raise ConversionError(
            f"{path / source} has a decoder (cls.predictions.decoder.weight) that differs from "
            "the word embeddings; omnibert ties them, so only checkpoints with a tied MLM "
            "decoder can be loaded."
        )
    missing = [k for k in params if k not in updates and k not in TIED_KEYS]
    body = [k for k in missing if not k.startswith(HEADS)]
    if body:
        raise ConversionError(
            f"{path / source} lacks {len(body)} encoder tensor(s) such as {body[0]}; it is not a "
            "complete BERT checkpoint, re-download it."
        )
    with torch.no_grad():
        for name, tensor in updates.items():
            target = params[name]
            (target[:vocab] if name in VOCAB_KEYS else target).copy_(tensor)
    return ImportReport(
        source=str(path),
        loaded=sorted(updates),
        missing=missing,
        ignored=sorted(ignored),
        task_head=task_head,
    )


def _init_from_modernbert(
    model: BertForPreTraining, path: Path, files: list[Path], tensors: dict[str, torch.Tensor]
) -> ImportReport:
    """:func:`init_from_hf` of a ModernBertForMaskedLM / ModernBertModel directory whose
    config.json matches ``model.config`` (checked by the caller)."""
    from omnibert.convert.modernbert import modernbert_from_tensors

    config = model.config
    params = model.state_dict()
    source = files[0].name if len(files) == 1 else f"{len(files)} shards"
    updates, missing, ignored, problem = modernbert_from_tensors(tensors, config, params)
    if problem is not None:
        raise ConversionError(
            f"{path / source} has {problem}; the checkpoint does not belong to this "
            "config.json, re-download it."
        )
    embedding = updates.get(VOCAB_KEYS[0])
    decoder = tensors.get("decoder.weight")
    if config.tie_word_embeddings and decoder is not None and embedding is not None:
        if not torch.equal(decoder, embedding):
            raise ConversionError(
                f"{path / source} has a decoder.weight that differs from the token embeddings "
                "although its config.json says tie_word_embeddings=true; re-download it."
            )
        ignored = [k for k in ignored if k != "decoder.weight"]
    body = [k for k in missing if not k.startswith(HEADS)]
    if body:
        raise ConversionError(
            f"{path / source} lacks {len(body)} encoder tensor(s) such as {body[0]}; it is not a "
            "complete ModernBERT checkpoint, re-download it."
        )
    vocab = config.vocab_size
    with torch.no_grad():
        for name, tensor in updates.items():
            target = params[name]
            vocab_rows = name in (*VOCAB_KEYS, "cls.predictions.decoder.weight")
            (target[:vocab] if vocab_rows else target).copy_(tensor)
    return ImportReport(source=str(path), loaded=sorted(updates), missing=missing, ignored=ignored)
