"""BERT in pure torch (no Lightning/Hydra): the config dataclass and the pretraining model.

The config (:mod:`omnibert.models.config`) imports no torch, so the apps can check a
config before torch loads; the model classes are imported on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from omnibert.models.config import BertConfig, BertConfigError

if TYPE_CHECKING:
    from omnibert.models.attention import block_diagonal_mask
    from omnibert.models.bert import BertModel
    from omnibert.models.pretraining import BertForPreTraining

__all__ = [
    "BertConfig",
    "BertConfigError",
    "BertForPreTraining",
    "BertModel",
    "block_diagonal_mask",
]

#: the torch side, imported on first use: name -> its module
_LAZY = {
    "BertForPreTraining": "omnibert.models.pretraining",
    "BertModel": "omnibert.models.bert",
    "block_diagonal_mask": "omnibert.models.attention",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
