"""``omnibert-export``: a checkpoint → a complete Hugging Face repository (weights,
``config.json``, the tokenizer files and a model card).

* a pretraining checkpoint (an omnibert ``.ckpt``, or the prefix of a Google / MLPerf
  TensorFlow 1 checkpoint with its ``bert_config.json``) → ``BertForMaskedLM`` (``heads=mlm``,
  the default) or ``BertForPreTraining`` (``heads=pretraining``), or
  ``ModernBertForMaskedLM`` for a model of the ModernBERT family
  (:func:`omnibert.run.tools.exporting.export_pretrained`; another architecture is refused);
* an ``omnibert-finetune`` run (its directory or ``.ckpt``) → ``BertForQuestionAnswering``
  (SQuAD) or ``BertForSequenceClassification`` (GLUE) with its tokenizer files
  (:func:`omnibert.run.tools.exporting.export_hf_finetuned`).

Wiring only: compose the config, check ``out``, tell the kind
(:func:`omnibert.checkpoints.files.checkpoint_kind`), export. Torch, Lightning and the models
are imported after those checks: a refused command answers at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.checkpoints.files import checkpoint_kind
from omnibert.errors import ConversionError, exit_on, is_rank_zero
from omnibert.paths import check_writable_dir, hydra_output_discarded_when_refused

if TYPE_CHECKING:
    from omnibert.run.tools.exporting import Pretrained

register()

#: What omnibert-export takes, for the sentence that refuses anything else.
EXPORTABLE = (
    "an omnibert-train pretraining checkpoint (.ckpt), an omnibert-finetune run (its "
    "directory or checkpoints/final.ckpt) or a TensorFlow 1 checkpoint prefix"
)


def _tf1_model(cfg: DictConfig) -> Pretrained:
    """The TF1 checkpoint's model and its vocab.txt (``vocab_file``, else the one next to it)."""
    from omnibert.config.recorded import RecordedTraining
    from omnibert.convert.tf1 import find_next_to, model_from_tf1
    from omnibert.run.tools.exporting import Pretrained

    vocab_file = cfg.vocab_file
    if vocab_file is None:
        found = find_next_to(cfg.ckpt, "vocab.txt")
        if found is None:
            raise ConversionError(
                f"the TensorFlow checkpoint {cfg.ckpt} has no vocab.txt next to it; pass "
                "vocab_file= with the vocab.txt it was trained with."
            )
        vocab_file = str(found)
    model = model_from_tf1(cfg.ckpt, cfg.bert_config)
    return Pretrained(
        model, vocab_file, str(cfg.ckpt), "tf1", RecordedTraining(None), _tf1_step(cfg.ckpt)
    )


def _tf1_step(prefix: str) -> int | None:
    """A TF1 checkpoint's ``global_step`` variable (None when it has none)."""
    from omnibert.convert.tf1_bundle import TF1Checkpoint

    path = Path(prefix)
    bundle = TF1Checkpoint(path.with_suffix("") if path.suffix == ".index" else path)
    return int(bundle.read("global_step").item()) if "global_step" in bundle else None


def _omnibert_model(cfg: DictConfig) -> Pretrained:
    """An omnibert ``.ckpt``'s model and its vocab.txt (``vocab_file``, else its hparams')."""
    from omnibert.checkpoints.files import saved_step
    from omnibert.checkpoints.reading import model_from_pretraining_checkpoint
    from omnibert.config.recorded import RecordedTraining
    from omnibert.convert.tf1 import checkpoint_hint
    from omnibert.run.tools.exporting import Pretrained, checked_vocab

    hint = checkpoint_hint(cfg.ckpt)
    if hint is not None:
        raise ConversionError(f"ckpt={cfg.ckpt} is not a checkpoint; {hint}.")
    if cfg.bert_config is not None:
        raise ConversionError(
            f"bert_config= applies to TensorFlow checkpoints only and ckpt={cfg.ckpt} is not "
            "one (no .index file); drop bert_config= or pass the TF checkpoint's prefix."
        )
    model, saved = model_from_pretraining_checkpoint(cfg.ckpt, wanted=EXPORTABLE)
    hparams = RecordedTraining(saved)
    vocab = checked_vocab(cfg.ckpt, cfg.vocab_file, hparams)
    return Pretrained(model, vocab, str(cfg.ckpt), "omnibert", hparams, saved_step(cfg.ckpt))


def _kind(cfg: DictConfig) -> str:
    """:func:`checkpoint_kind` of ``ckpt``; a path it cannot name goes to the pretraining
    loader, whose sentence names the checkpoint files in a run directory and the TF1
    prefixes near the path."""
    from omnibert.convert.tf1_bundle import is_tf1_checkpoint

    if is_tf1_checkpoint(cfg.ckpt):
        return "tf1"
    try:
        return checkpoint_kind(cfg.ckpt)
    except ConversionError:
        return "omnibert"


def _export_finetuned(cfg: DictConfig) -> None:
    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.tokenizer import vocab_is_uncased
    from omnibert.run.tools.exporting import export_hf_finetuned

    if cfg.bert_config is not None:
        raise ConversionError(
            f"bert_config= applies to TensorFlow checkpoints only and ckpt={cfg.ckpt} is an "
            "omnibert-finetune run; drop bert_config=."
        )
    if cfg.heads is not None:
        raise ConversionError(
            f"heads={cfg.heads} applies to pretraining checkpoints and ckpt={cfg.ckpt} is an "
            "omnibert-finetune run, exported with its task head; drop heads=."
        )
    finetuned = load_finetuned(cfg.ckpt)
    lower = vocab_is_uncased(finetuned.vocab_file)  # what the run's tokenizer did
    if cfg.do_lower_case is not None and cfg.do_lower_case != lower:
        raise ConversionError(
            f"do_lower_case={str(cfg.do_lower_case).lower()} but the run {cfg.ckpt} was "
            f"fine-tuned {'lower-cased' if lower else 'cased'} (its vocab.txt decides); drop "
            "do_lower_case= so the tokenizer reads text as the model was trained."
        )
    written = export_hf_finetuned(
        finetuned, cfg.out, vocab_file=cfg.vocab_file, overwrite=cfg.overwrite
    )
    config = finetuned.task.model.config
    out = written[0].parent
    qa = finetuned.task.head == "question_answering"
    auto = "AutoModelForQuestionAnswering" if qa else "AutoModelForSequenceClassification"
    answers = (
        "; answers: omnibert.finetune.qa_client.answer_question(model, tokenizer, question, "
        "context) (transformers 5 has no question-answering pipeline)"
        if qa
        else f", or pipeline('text-classification', model={str(out)!r})"
    )
    print(
        f"exported {finetuned.checkpoint} (task={finetuned.recipe.name}, BERT "
        f"L{config.num_hidden_layers}-H{config.hidden_size}, vocab {config.vocab_size}) to "
        f"{out} ({', '.join(p.name for p in written)}); load it with transformers.{auto}"
        f".from_pretrained({str(out)!r}) and AutoTokenizer.from_pretrained({str(out)!r})"
        f"{answers}"
    )


def run(cfg: DictConfig) -> None:
    """Export as configured. Started as several processes (``torchrun``, ``srun``), rank 0
    exports and the others return at once, saying nothing: one export, one voice
    (:func:`omnibert.errors.is_rank_zero`)."""
    if not is_rank_zero():
        return
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConversionError(
            f"{', '.join(missing)} must be set, e.g. omnibert-export "
            "ckpt=outputs/run/checkpoints/last.ckpt out=exports/run"
        )
    check_writable_dir(cfg.out, "out")
    kind = _kind(cfg)
    if kind == "huggingface":
        raise ConversionError(
            f"ckpt={cfg.ckpt} is a Hugging Face directory already (config.json): load it "
            f"with transformers' from_pretrained; omnibert-export takes {EXPORTABLE}."
        )
    if kind == "finetuned":
        _export_finetuned(cfg)
        return
    from omnibert.run.tools.exporting import export_pretrained

    pretrained = _tf1_model(cfg) if kind == "tf1" else _omnibert_model(cfg)
    line = export_pretrained(
        pretrained, cfg.out, heads=cfg.heads, do_lower_case=cfg.do_lower_case,
        overwrite=cfg.overwrite,
    )  # fmt: skip
    print(line)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-export"), hydra_output_discarded_when_refused():
        run(cfg)


def main() -> None:
    preflight("omnibert-export", "export", ("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
