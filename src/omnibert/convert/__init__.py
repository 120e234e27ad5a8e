"""Checkpoint conversion: Hugging Face BERT import/export, omnibert Lightning checkpoints."""

from omnibert.convert.hf import (
    ConversionError,
    ImportReport,
    export_hf,
    init_from_hf,
    load_pretraining_checkpoint,
    model_from_pretraining_checkpoint,
    read_hf_config,
)

__all__ = [
    "ConversionError",
    "ImportReport",
    "export_hf",
    "init_from_hf",
    "load_pretraining_checkpoint",
    "model_from_pretraining_checkpoint",
    "read_hf_config",
]
