"""``omnibert-export``: a checkpoint → a Hugging Face directory.

* a pretraining checkpoint (an omnibert ``.ckpt``, or the prefix of a Google / MLPerf
  TensorFlow 1 checkpoint with its ``bert_config.json``) → ``BertForPreTraining``
  (:func:`omnibert.convert.hf.export_hf`), or ``ModernBertForMaskedLM`` for a model of the
  ModernBERT family (:mod:`omnibert.convert.modernbert`; another architecture is refused);
* an ``omnibert-finetune`` run (its directory or ``.ckpt``) → ``BertForQuestionAnswering``
  (SQuAD) or ``BertForSequenceClassification`` (GLUE) with its tokenizer files
  (:func:`omnibert.run.inference.export_hf_finetuned`).

Wiring only: compose the config, tell the kind
(:func:`omnibert.convert.checkpoints.checkpoint_kind`), export.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.convert.checkpoints import checkpoint_kind
from omnibert.convert.hf import ConversionError, export_hf, model_from_pretraining_checkpoint
from omnibert.convert.tf1 import checkpoint_hint, find_next_to, model_from_tf1
from omnibert.convert.tf1_bundle import is_tf1_checkpoint
from omnibert.errors import exit_on
from omnibert.models import BertForPreTraining
from omnibert.paths import check_writable_dir, hydra_output_discarded_when_refused
from omnibert.tokenization.vocab import sha256_file

register()

#: What omnibert-export takes, for the sentence that refuses anything else.
EXPORTABLE = (
    "an omnibert-train pretraining checkpoint (.ckpt), an omnibert-finetune run (its "
    "directory or checkpoints/final.ckpt) or a TensorFlow 1 checkpoint prefix"
)


def _tf1_model(cfg: DictConfig) -> tuple[BertForPreTraining, str | None]:
    """The TF1 checkpoint's model and its vocab.txt (``vocab_file``, else the one next to it)."""
    vocab_file = cfg.vocab_file
    if vocab_file is None:
        found = find_next_to(cfg.ckpt, "vocab.txt")
        if found is None:
            raise ConversionError(
                f"the TensorFlow checkpoint {cfg.ckpt} has no vocab.txt next to it; pass "
                "vocab_file= with the vocab.txt it was trained with."
            )
        vocab_file = str(found)
    return model_from_tf1(cfg.ckpt, cfg.bert_config), vocab_file


def _omnibert_model(cfg: DictConfig) -> tuple[BertForPreTraining, str | None]:
    """An omnibert ``.ckpt``'s model and its vocab.txt (``vocab_file``, else its hparams')."""
    hint = checkpoint_hint(cfg.ckpt)
    if hint is not None:
        raise ConversionError(f"ckpt={cfg.ckpt} is not a checkpoint; {hint}.")
    if cfg.bert_config is not None:
        raise ConversionError(
            f"bert_config= applies to TensorFlow checkpoints only and ckpt={cfg.ckpt} is not "
            "one (no .index file); drop bert_config= or pass the TF checkpoint's prefix."
        )
    model, hparams = model_from_pretraining_checkpoint(cfg.ckpt, wanted=EXPORTABLE)
    return model, checked_vocab(cfg.ckpt, cfg.vocab_file, hparams)


def _kind(cfg: DictConfig) -> str:
    """:func:`checkpoint_kind` of ``ckpt``; a path it cannot name goes to the pretraining
    loader, whose sentence names the checkpoint files in a run directory and the TF1
    prefixes near the path."""
    if is_tf1_checkpoint(cfg.ckpt):
        return "tf1"
    try:
        return checkpoint_kind(cfg.ckpt)
    except ConversionError:
        return "omnibert"


def _export_finetuned(cfg: DictConfig) -> None:
    from omnibert.run.inference import export_hf_finetuned, load_finetuned

    if cfg.bert_config is not None:
        raise ConversionError(
            f"bert_config= applies to TensorFlow checkpoints only and ckpt={cfg.ckpt} is an "
            "omnibert-finetune run; drop bert_config=."
        )
    finetuned = load_finetuned(cfg.ckpt)
    written = export_hf_finetuned(
        finetuned, cfg.out, vocab_file=cfg.vocab_file, overwrite=cfg.overwrite
    )
    config = finetuned.task.model.config
    out = written[0].parent
    auto = (
        "AutoModelForQuestionAnswering"
        if finetuned.task.head == "question_answering"
        else "AutoModelForSequenceClassification"
    )
    print(
        f"exported {finetuned.checkpoint} (task={finetuned.recipe.get('name')}, BERT "
        f"L{config.num_hidden_layers}-H{config.hidden_size}, vocab {config.vocab_size}) to "
        f"{out} ({', '.join(p.name for p in written)}); load it with transformers.{auto}"
        f".from_pretrained({str(out)!r}) and AutoTokenizer.from_pretrained({str(out)!r})"
    )


def run(cfg: DictConfig) -> None:
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
    model, vocab_file = _tf1_model(cfg) if kind == "tf1" else _omnibert_model(cfg)
    if vocab_file is None:
        raise ConversionError(
            f"checkpoint {cfg.ckpt} records no vocab_file; pass vocab_file= with the vocab.txt "
            "the model was trained with."
        )
    written = export_hf(model.eval(), cfg.out, vocab_file, overwrite=cfg.overwrite)
    names = ", ".join(path.name for path in written)
    family, hf_class = (
        ("BERT", "BertForPreTraining")
        if model.config.is_bert
        else ("ModernBERT", "ModernBertForMaskedLM")
    )
    print(
        f"exported {cfg.ckpt} ({family} L{model.config.num_hidden_layers}-H"
        f"{model.config.hidden_size}, vocab {model.config.vocab_size}) to {written[0].parent} "
        f"({names}); load it with transformers.{hf_class}.from_pretrained"
        f"({str(written[0].parent)!r})"
    )


def checked_vocab(ckpt: str, given: str | None, hparams: dict[str, Any]) -> str:
    """The vocab.txt to export: ``vocab_file=`` or the one the checkpoint was trained with,
    whose sha256 (recorded by the task) must still be the file's."""
    recorded, sha = hparams.get("vocab_file"), hparams.get("vocab_sha256")
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


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-export"), hydra_output_discarded_when_refused():
        run(cfg)


def main() -> None:
    preflight("omnibert-export", "export", ("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
