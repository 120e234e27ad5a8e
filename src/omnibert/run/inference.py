"""A fine-tuned checkpoint back as a task (``omnibert-predict``, tests, benchmarks) and its
Hugging Face export.

A checkpoint of :mod:`omnibert.tasks.finetuning` holds its hparams (model config, recipe,
vocab path) and ``state_dict`` (``model.`` + Hugging Face names), so it rebuilds from itself;
the vocab is the run directory's ``vocab.txt`` (the path recorded in the checkpoint, else the
one two levels up from ``checkpoints/final.ckpt``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["Finetuned", "export_hf_question_answering", "load_finetuned", "task_class"]

FINAL = Path("checkpoints") / "final.ckpt"


@dataclass
class Finetuned:
    task: Any
    recipe: dict[str, Any]
    vocab_file: Path
    checkpoint: Path


def _checkpoint_file(path: Path) -> Path:
    if path.is_dir():
        if (path / FINAL).is_file():
            return path / FINAL
        raise FineTuneInputError(
            f"ckpt={path} is a directory without {FINAL}; pass the run directory of a finished "
            "omnibert-finetune run or its .ckpt file."
        )
    if not path.is_file():
        raise FineTuneInputError(
            f"ckpt={path} does not exist; pass an omnibert-finetune run directory or its .ckpt."
        )
    return path


def task_class(recipe: dict[str, Any]) -> Any:
    """The LightningModule a fine-tuned recipe was trained with: question answering for a
    recipe with windows (``doc_stride``; SQuAD), sequence classification otherwise."""
    from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

    squad = "doc_stride" in recipe or recipe.get("format") == "squad"
    return QuestionAnsweringTask if squad else SequenceClassificationTask


def load_finetuned(path: str | Path) -> Finetuned:
    """The fine-tuned task stored at ``path`` (a run directory or a ``.ckpt``), in eval mode."""
    from omnibert.compat import load_checkpoint

    file = _checkpoint_file(Path(path))
    try:
        ckpt = load_checkpoint(file)
    except Exception as err:
        from omnibert.ckpt_files import unreadable_checkpoint

        raise FineTuneInputError(unreadable_checkpoint("ckpt", file, err)) from err
    hparams = ckpt.get("hyper_parameters") or {}
    recipe = hparams.get("recipe") or {}
    if "data" not in recipe and "format" not in recipe:
        raise FineTuneInputError(
            f"ckpt={file} is not an omnibert-finetune checkpoint (no task recipe); pass the "
            "run directory of an omnibert-finetune run."
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


def export_hf_question_answering(finetuned: Finetuned, out_dir: str | Path) -> Path:
    """``model.safetensors`` + ``config.json`` + ``vocab.txt`` that
    ``transformers.BertForQuestionAnswering.from_pretrained`` loads with no missing or
    unexpected key (the real vocab rows; no pooler, which HF's QA model lacks)."""
    from safetensors.torch import save_file

    model = finetuned.task.model
    config = model.config
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name.startswith("bert.pooler."):
            continue
        if name == "bert.embeddings.word_embeddings.weight":
            tensor = tensor[: config.vocab_size]
        tensors[name] = tensor.detach().cpu().contiguous().clone()
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    hf = config.to_hf_dict()
    hf["architectures"] = ["BertForQuestionAnswering"]
    (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    (out / "vocab.txt").write_bytes(finetuned.vocab_file.read_bytes())
    return out
