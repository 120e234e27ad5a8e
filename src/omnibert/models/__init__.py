"""BERT in pure torch (no Lightning/Hydra): the config dataclass and the pretraining model."""

from omnibert.models.bert import BertForPreTraining, BertModel, block_diagonal_mask
from omnibert.models.config import BertConfig, BertConfigError

__all__ = [
    "BertConfig",
    "BertConfigError",
    "BertForPreTraining",
    "BertModel",
    "block_diagonal_mask",
]
