"""``omnibert-export``: a pretraining checkpoint → a Hugging Face ``BertForPreTraining`` directory.

Wiring only: compose the config, read the checkpoint, :func:`omnibert.convert.hf.export_hf`.
"""

from __future__ import annotations

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH
from omnibert.apps.preflight import preflight
from omnibert.convert.hf import ConversionError, export_hf, model_from_pretraining_checkpoint
from omnibert.errors import exit_on
from omnibert.paths import check_writable_dir


def run(cfg: DictConfig) -> None:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise ConversionError(
            f"{', '.join(missing)} must be set, e.g. omnibert-export "
            "ckpt=outputs/run/checkpoints/last.ckpt out=exports/run"
        )
    check_writable_dir(cfg.out, "out")
    model, hparams = model_from_pretraining_checkpoint(cfg.ckpt)
    vocab_file = cfg.vocab_file if cfg.vocab_file is not None else hparams.get("vocab_file")
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
    preflight("omnibert-export", "export", ("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
