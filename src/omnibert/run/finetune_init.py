"""Where a fine-tuning run's weights come from (``model.init_from``).

* a pretrained checkpoint (an omnibert pretraining ``.ckpt``, a Hugging Face directory, a TF1
  prefix; :func:`omnibert.convert.checkpoints.load_pretrained`): its encoder, and a fresh head;
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

The kinds are told apart by :func:`omnibert.convert.checkpoints.checkpoint_kind`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["EncoderSource", "head_of", "load_encoder_source"]


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


def head_of(recipe: dict[str, Any]) -> str:
    """A readable description of a task's head from its recipe: ``question answering`` (a
    recipe with windows: ``doc_stride``), ``regression (1 output)``, ``classification (3
    labels)``."""
    if "doc_stride" in recipe:
        return "question answering (start/end logits)"
    labels = int(recipe.get("num_labels", 2))
    return "regression (1 output)" if labels == 1 else f"classification ({labels} labels)"


def _hf_head(
    task_head: dict[str, Any], hidden_size: int, recipe: dict[str, Any], init_from: str
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


def load_encoder_source(c: dict[str, Any], recipe: dict[str, Any]) -> EncoderSource:
    """The weights ``model.init_from`` names (module docstring)."""
    from omnibert.compat import load_checkpoint
    from omnibert.convert.checkpoints import (
        FINETUNED_CKPT,
        checkpoint_kind,
        finetune_recipe,
        load_pretrained,
    )
    from omnibert.models import BertConfig

    init_from = str(c["model"]["init_from"])
    if checkpoint_kind(init_from, "model.init_from") == "finetuned":
        path = Path(init_from)
        file = path / FINETUNED_CKPT if path.is_dir() else path
        try:
            ckpt = load_checkpoint(file)
        except Exception as err:
            from omnibert.ckpt_files import unreadable_checkpoint

            raise FineTuneInputError(unreadable_checkpoint("model.init_from", file, err)) from err
        hparams = ckpt.get("hyper_parameters") or {}
        saved = finetune_recipe(hparams)
        if saved is None:
            raise FineTuneInputError(
                f"model.init_from={init_from}: {file} is not an omnibert-finetune checkpoint "
                "(no task recipe); pass a pretrained checkpoint or a fine-tuned run."
            )
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
    loaded = load_pretrained(
        init_from, c["model"].get("bert_config"), require_heads=False, key="model.init_from"
    )
    head, note = _hf_head(loaded.task_head, loaded.config.hidden_size, recipe, init_from)
    return EncoderSource(
        loaded.config,
        loaded.vocab_file,
        loaded.description + note,
        model=loaded.model,
        fresh_heads=tuple(loaded.fresh_heads),
        head=head,
    )
