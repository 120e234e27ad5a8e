"""BERT in pure torch (no Lightning/Hydra): the config dataclass and the pretraining model.

The config (:mod:`omnibert.models.config`) imports no torch, so the apps can check a
config before torch loads; the model classes are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnibert.models.config import BertConfig, BertConfigError

if TYPE_CHECKING:
    from omnibert.models.bert import BertForPreTraining, BertModel, block_diagonal_mask

__all__ = [
    "BertConfig",
    "BertConfigError",
    "BertForPreTraining",
    "BertModel",
    "block_diagonal_mask",
]

_FROM_BERT = ("BertForPreTraining", "BertModel", "block_diagonal_mask")


def __getattr__(name: str) -> Any:
    if name in _FROM_BERT:
        return getattr(importlib.import_module("omnibert.models.bert"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
