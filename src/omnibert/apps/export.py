"""``omnibert-export``: a pretraining checkpoint → a Hugging Face ``BertForPreTraining`` directory.

Wiring only: compose the config, read the checkpoint (an omnibert ``.ckpt``, or the prefix of a
Google / MLPerf TensorFlow 1 checkpoint with its ``bert_config.json``),
:func:`omnibert.convert.hf.export_hf`.
"""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH
from omnibert.apps.schema import register
from omnibert.convert.hf import ConversionError, export_hf, model_from_pretraining_checkpoint
from omnibert.convert.tf1 import checkpoint_hint, find_next_to, model_from_tf1
from omnibert.convert.tf1_bundle import is_tf1_checkpoint
from omnibert.errors import exit_on
from omnibert.models import BertForPreTraining

register()


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
    if Path(cfg.ckpt).is_dir():
        raise ConversionError(
            f"ckpt={cfg.ckpt} is a directory; pass a .ckpt file written by omnibert-train or the "
            "prefix of a TensorFlow checkpoint (the path of its .index without .index)."
        )
    if cfg.bert_config is not None:
        raise ConversionError(
            f"bert_config= applies to TensorFlow checkpoints only and ckpt={cfg.ckpt} is not "
            "one (no .index file); drop bert_config= or pass the TF checkpoint's prefix."
        )
    model, hparams = model_from_pretraining_checkpoint(cfg.ckpt)
    vocab_file = cfg.vocab_file if cfg.vocab_file is not None else hparams.get("vocab_file")
    return model, vocab_file


def run(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConversionError(
            f"{', '.join(missing)} must be set, e.g. omnibert-export "
            "ckpt=outputs/run/checkpoints/last.ckpt out=exports/run"
        )
    tf1 = is_tf1_checkpoint(cfg.ckpt)
    model, vocab_file = _tf1_model(cfg) if tf1 else _omnibert_model(cfg)
    if vocab_file is None:
        raise ConversionError(
            f"checkpoint {cfg.ckpt} records no vocab_file; pass vocab_file= with the vocab.txt "
            "the model was trained with."
        )
    written = export_hf(model.eval(), cfg.out, vocab_file, overwrite=cfg.overwrite)
    names = ", ".join(path.name for path in written)
    print(
        f"exported {cfg.ckpt} (BERT L{model.config.num_hidden_layers}-H"
        f"{model.config.hidden_size}, vocab {model.config.vocab_size}) to {written[0].parent} "
        f"({names}); load it with transformers.BertForPreTraining.from_pretrained"
        f"({str(written[0].parent)!r})"
    )


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="export")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-export"):
        run(cfg)


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
