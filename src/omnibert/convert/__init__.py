"""Checkpoint conversion: Hugging Face BERT import/export and Google / MLPerf TensorFlow 1
checkpoints read without TensorFlow (:mod:`~omnibert.convert.tf1`,
:mod:`~omnibert.convert.tf1_bundle`)."""

from omnibert.convert.hf import (
    ConversionError,
    ImportReport,
    init_from_hf,
    read_hf_config,
)
from omnibert.convert.hf_export import export_hf
from omnibert.convert.tf1 import (
    check_tf1_checkpoint,
    load_tf1_into,
    model_from_tf1,
    read_bert_config,
    resolve_bert_config,
)
from omnibert.convert.tf1_bundle import (
    TF1Checkpoint,
    TF1CheckpointError,
    is_tf1_checkpoint,
    read_tf1_checkpoint,
)

__all__ = [
    "ConversionError",
    "ImportReport",
    "TF1Checkpoint",
    "TF1CheckpointError",
    "check_tf1_checkpoint",
    "export_hf",
    "init_from_hf",
    "is_tf1_checkpoint",
    "load_tf1_into",
    "model_from_tf1",
    "read_bert_config",
    "read_hf_config",
    "read_tf1_checkpoint",
    "resolve_bert_config",
]
