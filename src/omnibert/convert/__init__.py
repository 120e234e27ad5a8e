"""Checkpoint conversion: Hugging Face BERT import/export and Google / MLPerf TensorFlow 1
checkpoints read without TensorFlow (:mod:`~omnibert.convert.tf1`,
:mod:`~omnibert.convert.tf1_bundle`).

The names below are imported on first use (PEP 562), so a light submodule
(:mod:`~omnibert.convert.hub_tokenizer`) does not bring torch and the models with it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: each public name → the submodule that defines it
_HOMES = {
    "ConversionError": "omnibert.errors",
    "ImportReport": "omnibert.convert.hf",
    "init_from_hf": "omnibert.convert.hf",
    "read_hf_config": "omnibert.convert.hf",
    "export_hf": "omnibert.convert.hf_export",
    "check_tf1_checkpoint": "omnibert.convert.tf1",
    "load_tf1_into": "omnibert.convert.tf1",
    "model_from_tf1": "omnibert.convert.tf1",
    "read_bert_config": "omnibert.convert.tf1",
    "resolve_bert_config": "omnibert.convert.tf1",
    "TF1Checkpoint": "omnibert.convert.tf1_bundle",
    "TF1CheckpointError": "omnibert.convert.tf1_bundle",
    "is_tf1_checkpoint": "omnibert.convert.tf1_bundle",
    "read_tf1_checkpoint": "omnibert.convert.tf1_bundle",
}

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

if TYPE_CHECKING:
    from omnibert.convert.hf import ImportReport, init_from_hf, read_hf_config
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
    from omnibert.errors import ConversionError


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'omnibert.convert' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # once
    return value
