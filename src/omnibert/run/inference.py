"""A fine-tuned checkpoint back as a task (``omnibert-predict``, tests, benchmarks) and its
Hugging Face export (``omnibert-export``): ``BertForQuestionAnswering`` or
``BertForSequenceClassification`` with the tokenizer files ``AutoTokenizer`` reads.

A checkpoint of :mod:`omnibert.tasks.finetuning` holds its hparams (model config, recipe,
vocab path) and ``state_dict`` (``model.`` + Hugging Face names), so it rebuilds from itself;
the vocab is the run directory's ``vocab.txt`` (the path recorded in the checkpoint, else the
one two levels up from ``checkpoints/final.ckpt``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.checkpoints.init_from import read_finetuned
from omnibert.checkpoints.reading import FINETUNED_CKPT as FINAL
from omnibert.convert.hf_export import export_hf
from omnibert.finetune.tokenizer import FineTuneInputError, vocab_is_uncased
from omnibert.run.finetuning.inputs import task_data
from omnibert.run.model_cards import finetuned_card
from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

__all__ = [
    "Finetuned",
    "export_hf_finetuned",
    "export_hf_question_answering",
    "load_finetuned",
    "task_class",
]


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
    squad = "doc_stride" in recipe or recipe.get("format") == "squad"
    return QuestionAnsweringTask if squad else SequenceClassificationTask


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


def export_hf_finetuned(
    finetuned: Finetuned,
    out_dir: str | Path,
    *,
    vocab_file: str | Path | None = None,
    overwrite: bool = False,
) -> list[Path]:
    """The fine-tuned model as Hugging Face's task model; returns the files written.

    SQuAD (v1.1, v2.0): ``BertForQuestionAnswering`` (no pooler: HF's QA model has none);
    GLUE: ``BertForSequenceClassification`` with the task's label names as
    ``id2label``/``label2id``, STS-B as ``problem_type="regression"`` with one output.
    ``model.safetensors`` + ``config.json`` (``architectures``, ``finetuning_task``; SQuAD:
    the run's windows and span rule as ``question_answering``, which
    :mod:`omnibert.finetune.qa_client` reads) + ``vocab.txt`` (the run's, or ``vocab_file``) +
    the tokenizer files (:mod:`omnibert.convert.hub_tokenizer`) lower-casing as the run did
    + a model card (``README.md``), so that
    ``AutoModelFor...`` and ``AutoTokenizer.from_pretrained`` (and ``pipeline``) load the
    directory unchanged, with no missing or unexpected key. ``out_dir``: empty or absent
    unless ``overwrite`` (:func:`omnibert.convert.hf.export_hf`).
    """

    model = finetuned.task.model
    if not model.config.is_bert:
        raise FineTuneInputError(
            "this fine-tuned model has a modern (non-BERT) encoder, and omnibert's task heads "
            "on it (the pooled hidden state straight into the classifier or QA Linear) are not "
            "Hugging Face's ModernBertFor* heads (dense, activation and norm first), so only "
            "BERT fine-tuned runs export; export the pretraining checkpoint it started from "
            "instead."
        )
    hf = model.config.to_hf_dict()  # refuses a non-BERT architecture, before any file
    if finetuned.task.head != "question_answering" and model.config.pooling != "cls":
        raise FineTuneInputError(
            f"this classifier pools with model.config.pooling={model.config.pooling!r}, which "
            "Hugging Face's BertForSequenceClassification (pooler on [CLS]) cannot express; "
            "export a model fine-tuned with pooling=cls."
        )
    hf["finetuning_task"] = finetuned.recipe.get("name")
    leave_out: tuple[str, ...] = ()
    qa = finetuned.task.head == "question_answering"
    if qa:
        hf["architectures"] = ["BertForQuestionAnswering"]
        hf["question_answering"] = _qa_settings(finetuned.recipe)
        leave_out = ("bert.pooler",)
    else:
        hf["architectures"] = ["BertForSequenceClassification"]
        hf.update(_labels(finetuned.recipe, int(model.num_labels)))
    return export_hf(
        model,
        out_dir,
        vocab_file if vocab_file is not None else finetuned.vocab_file,
        overwrite=overwrite,
        hf_config=hf,
        leave_out=leave_out,
        lower_case=vocab_is_uncased(finetuned.vocab_file),  # what the run's tokenizer did
        card=finetuned_card(finetuned, Path(out_dir), qa),
    )


def _qa_settings(recipe: dict[str, Any]) -> dict[str, Any]:
    """The run's windows and span rule, for :mod:`omnibert.finetune.qa_client` (config.json's
    ``question_answering``): what omnibert-predict uses on this run."""
    data = task_data(recipe)
    return {
        **{key: recipe[key] for key in ("max_seq_length", "doc_stride", "max_query_length",
                                        "n_best_size", "max_answer_length")},
        "version_2_with_negative": bool(getattr(data, "version_2", False)),
        "null_score_diff_threshold": float(recipe.get("null_score_diff_threshold") or 0.0),
    }  # fmt: skip


def _labels(recipe: dict[str, Any], num_labels: int) -> dict[str, Any]:
    """``problem_type``, ``id2label`` and ``label2id`` of a classification head: the task's
    label names (:class:`omnibert.finetune.glue.GlueData`), Hugging Face's ``LABEL_<i>``
    where the task has none (STS-B's one score)."""

    names = getattr(task_data(recipe), "label_names", None)
    if names is None or len(names) != num_labels:
        names = [f"LABEL_{i}" for i in range(num_labels)]
    regression = num_labels == 1
    return {
        # HF's pipeline applies no function to a regression output (a sigmoid to any other
        # single output) and HF's loss is MSE for it, as omnibert's STS-B head
        "problem_type": "regression" if regression else "single_label_classification",
        "id2label": {str(i): name for i, name in enumerate(names)},
        "label2id": {name: i for i, name in enumerate(names)},
    }


def export_hf_question_answering(finetuned: Finetuned, out_dir: str | Path) -> Path:
    """:func:`export_hf_finetuned` of a SQuAD run; returns the directory."""
    return export_hf_finetuned(finetuned, out_dir)[0].parent
