"""``omnibert-export``: a complete Hugging Face repository from an omnibert pretraining
checkpoint or a TensorFlow 1 one (:func:`export_pretrained`), or from a fine-tuned run
(:func:`export_hf_finetuned`: ``BertForQuestionAnswering`` or ``BertForSequenceClassification``
with the tokenizer files ``AutoTokenizer`` reads).

What a pretrained export writes:

* the weights as the class ``heads=`` names. BERT: ``heads=mlm`` (the default)
  ``BertForMaskedLM``, the encoder and the masked-LM head, without the pooler and the
  next-sentence head, so ``AutoModelForMaskedLM`` and ``pipeline("fill-mask")`` load it with
  no unexpected key; ``heads=pretraining`` ``BertForPreTraining`` with both heads (what
  ``AutoModelForPreTraining`` loads, and ``omnibert-eval`` scores next-sentence prediction
  on). ModernBERT has no next-sentence head: ``ModernBertForMaskedLM`` either way.
* the tokenizer files (:mod:`omnibert.convert.hub_tokenizer`), lower-casing as trained
  (:func:`lower_casing`);
* the model card (:func:`omnibert.run.tools.model_cards.pretrained_card`) from the checkpoint's
  hyper-parameters and its run's ``summary.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from omnibert.checkpoints.reading import Finetuned
from omnibert.config.recorded import RecordedRecipe, RecordedTraining
from omnibert.convert.hf import ConversionError
from omnibert.convert.hf_export import export_hf
from omnibert.convert.hub_tokenizer import tokenizer_problem
from omnibert.finetune.tokenizer import FineTuneInputError, vocab_is_uncased
from omnibert.run.finetuning.inputs import task_data
from omnibert.run.tools.model_cards import Pretrained, finetuned_card, pretrained_card
from omnibert.tokenization.vocab import sha256_file

__all__ = [
    "HEADS",
    "Pretrained",
    "checked_vocab",
    "export_hf_finetuned",
    "export_hf_question_answering",
    "export_pretrained",
    "lower_casing",
]

#: ``heads=``: the Hugging Face class of a BERT pretraining export
HEADS = {"mlm": "BertForMaskedLM", "pretraining": "BertForPreTraining"}
#: the modules BertForMaskedLM lacks
_NOT_IN_MASKED_LM = ("bert.pooler", "cls.seq_relationship")


def lower_casing(given: bool | None, recorded: Any, vocab_file: str) -> tuple[bool, str]:
    """Whether the tokenizer lower-cases, and why: ``do_lower_case=`` as given, else the
    checkpoint's record of its data (``metadata.json``'s ``do_lower_case``), else the vocab
    (an uncased vocab has no upper-case word piece)."""
    if given is not None:
        if recorded is not None and bool(recorded) != given:
            print(
                f"omnibert-export: note: do_lower_case={str(given).lower()} differs from the "
                f"training data's do_lower_case={str(bool(recorded)).lower()}; exporting it.",
                file=sys.stderr,
            )
        return given, f"do_lower_case={str(given).lower()} as given"
    if recorded is not None:
        flag = str(bool(recorded)).lower()
        return bool(recorded), f"as the training data was prepared: do_lower_case={flag}"
    uncased = vocab_is_uncased(vocab_file)
    why = "no word piece" if uncased else "word pieces"
    return uncased, f"from the vocab: it has {why} with upper-case letters"


def checked_vocab(ckpt: str, given: str | None, hparams: RecordedTraining) -> str:
    """The vocab.txt to export: ``vocab_file=`` or the one the checkpoint was trained with,
    whose sha256 (recorded by the task) must still be the file's."""
    recorded, sha = hparams.vocab_file, hparams.vocab_sha256
    vocab_file = given if given is not None else recorded
    if vocab_file is None:
        raise ConversionError(
            f"checkpoint {ckpt} records no vocab_file; pass vocab_file= with the vocab.txt "
            "the model was trained with."
        )
    if sha is None or not Path(vocab_file).is_file():
        return str(vocab_file)  # an older checkpoint; export_hf says when the file is missing
    now = sha256_file(vocab_file)
    if now == sha:
        return str(vocab_file)
    if given is None:
        raise ConversionError(
            f"vocab file {vocab_file} changed since checkpoint {ckpt} was trained with it "
            f"(sha256 {sha[:12]} then, {now[:12]} now); pass vocab_file= with the vocab.txt "
            "the model was trained with."
        )
    print(
        f"omnibert-export: note: vocab_file={given} is not the vocab checkpoint {ckpt} was "
        f"trained with ({recorded}, sha256 {sha[:12]}; this one {now[:12]}); exporting it.",
        file=sys.stderr,
    )
    return str(vocab_file)


def export_pretrained(
    p: Pretrained, out: str | Path, *, heads: str | None, do_lower_case: bool | None,
    overwrite: bool,
) -> str:  # fmt: skip
    """Write the repository (module docstring); returns the line ``omnibert-export`` prints."""
    config = p.model.config
    choice = heads or "mlm"
    if choice not in HEADS:
        raise ConversionError(
            f"heads={choice} is not one of {', '.join(HEADS)}; pass heads=mlm (BertForMaskedLM, "
            "the fill-mask model) or heads=pretraining (BertForPreTraining)."
        )
    if config.is_bert:
        arch = HEADS[choice]
        leave_out = _NOT_IN_MASKED_LM if choice == "mlm" else ()
        hf_config: dict[str, Any] | None = {**config.to_hf_dict(), "architectures": [arch]}
    else:
        arch, leave_out, hf_config = "ModernBertForMaskedLM", (), None
    problem = tokenizer_problem(p.vocab_file)
    lower = lower_casing(do_lower_case, p.hparams.do_lower_case, p.vocab_file)
    out = Path(out)
    card = pretrained_card(p, out, arch, lower, kept_nsp=choice == "pretraining")
    written = export_hf(
        p.model.eval(), out, p.vocab_file, overwrite=overwrite, hf_config=hf_config,
        leave_out=leave_out, lower_case=None if problem else lower[0], card=card,
    )  # fmt: skip
    family = "BERT" if config.is_bert else "ModernBERT"
    what = {
        "BertForMaskedLM": " (pooler and next-sentence head left out: heads=mlm; "
        "heads=pretraining keeps them)",
        "BertForPreTraining": " (with the pooler and next-sentence head: heads=pretraining)",
    }.get(arch, "")
    tokenizer = (
        f"tokenizer {'lower-cased' if lower[0] else 'cased'} ({lower[1]})"
        if problem is None
        else f"no tokenizer files ({problem.rstrip('.')})"
    )
    load = f"transformers.{arch}.from_pretrained({str(out)!r})"
    if arch != "BertForPreTraining":
        load += f" or pipeline('fill-mask', model={str(out)!r})"
    return (
        f"exported {p.source} ({family} L{config.num_hidden_layers}-H{config.hidden_size}, "
        f"vocab {config.vocab_size}) as {arch}{what} to {out} "
        f"({', '.join(path.name for path in written)}); {tokenizer}; load it with {load}"
    )


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
    unless ``overwrite`` (:func:`omnibert.convert.hf_export.export_hf`).
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
    hf["finetuning_task"] = finetuned.recipe.name
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


def _qa_settings(recipe: RecordedRecipe) -> dict[str, Any]:
    """The run's windows and span rule, for :mod:`omnibert.finetune.qa_client` (config.json's
    ``question_answering``): what omnibert-predict uses on this run."""
    data = task_data(recipe)
    return {
        **recipe.qa_windows(),
        "version_2_with_negative": bool(getattr(data, "version_2", False)),
        "null_score_diff_threshold": recipe.null_score_diff_threshold,
    }


def _labels(recipe: RecordedRecipe, num_labels: int) -> dict[str, Any]:
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
