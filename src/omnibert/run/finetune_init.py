"""Where a fine-tuning run's weights come from (``model.init_from``).

* a pretrained checkpoint (an omnibert pretraining ``.ckpt``, a Hugging Face directory, a TF1
  prefix; :func:`omnibert.convert.checkpoints.load_pretrained`): its encoder, and a fresh head;
* an omnibert-finetune run (its directory or ``.ckpt``): encoder *and* head, to continue
  fine-tuning, only when its head is this task's kind and size; a head of another kind (a
  regression task given a classification checkpoint, 3 MNLI classes for 2 RTE ones) is one
  sentence naming ``model.init_from`` and the fix, before any compute.
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
        return list(task.load_encoder(encoder, self.fresh_heads))


def head_of(recipe: dict[str, Any]) -> str:
    """A readable description of a task's head from its recipe: ``question answering`` (a
    recipe with windows: ``doc_stride``), ``regression (1 output)``, ``classification (3
    labels)``."""
    if "doc_stride" in recipe:
        return "question answering (start/end logits)"
    labels = int(recipe.get("num_labels", 2))
    return "regression (1 output)" if labels == 1 else f"classification ({labels} labels)"


def _finetuned_file(path: Path) -> Path | None:
    if path.is_dir():
        candidate = path / "checkpoints" / "final.ckpt"
        return candidate if candidate.is_file() else None
    return path if path.suffix == ".ckpt" and path.is_file() else None


def load_encoder_source(c: dict[str, Any], recipe: dict[str, Any]) -> EncoderSource:
    """The weights ``model.init_from`` names (module docstring)."""
    from omnibert.compat import load_checkpoint
    from omnibert.models import BertConfig

    init_from = str(c["model"]["init_from"])
    file = _finetuned_file(Path(init_from))
    if file is not None:
        ckpt = load_checkpoint(file)
        hparams = ckpt.get("hyper_parameters") or {}
        saved = hparams.get("recipe")
        if isinstance(saved, dict) and ("data" in saved or "format" in saved):
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
    from omnibert.convert.checkpoints import load_pretrained

    loaded = load_pretrained(
        init_from, c["model"].get("bert_config"), require_heads=False, key="model.init_from"
    )
    return EncoderSource(
        loaded.config,
        loaded.vocab_file,
        loaded.description,
        model=loaded.model,
        fresh_heads=tuple(loaded.fresh_heads),
    )
