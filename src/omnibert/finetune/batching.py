"""Fine-tuning batches as wide as their longest row (dynamic padding), and evaluation in
length order.

Features are stored padded to ``task.max_seq_length``. With ``data.padding=longest`` (the
default) a batch keeps only the columns up to its longest real row, rounded up to a
multiple of ``data.pad_to_multiple_of`` (8: fewer distinct shapes for the kernel caches,
vector-friendly widths). The encoder masks padding out of attention and the heads' losses
ignore it, so every real token's output, the loss and the answers are those of the
full-width batch: only the cost of the padding columns goes. GLUE sentences are far shorter
than 128 tokens, and a SQuAD window is as long as its context.

Evaluation and ``omnibert-predict`` go further (:func:`length_order`): rows run longest
first, so each batch holds rows of similar length, and the outputs go back to input order.
Training keeps its seeded random order: sorting it would change what a step sees.

``data.padding=max_length`` keeps every batch ``task.max_seq_length`` wide: the static shape
that HPU lazy mode, CUDA graphs and ``torch.compile`` without dynamic shapes want.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import torch
from torch import Tensor

from omnibert.config.finetune import PADDINGS, FinetuneData

__all__ = ["PADDINGS", "TrimPadding", "length_order", "trimmed_length"]

#: the ``[B,S]`` keys a batch is cut along (labels and positions are ``[B]``)
ROW_KEYS = ("input_ids", "segment_ids", "attention_mask")


def trimmed_length(attention_mask: Tensor, multiple: int) -> int:
    """The longest real row of ``attention_mask`` ``[B,S]`` rounded up to ``multiple``, at
    most ``S``."""
    width = int(attention_mask.shape[1])
    if attention_mask.numel() == 0:
        return width
    longest = int(attention_mask.sum(dim=1).max())
    return min(width, max(multiple, -(-longest // multiple) * multiple))


class TrimPadding:
    """A ``DataLoader`` collate: stack the rows, then cut the ``[B,S]`` tensors to
    :func:`trimmed_length` (``enabled=False``: stack only, the static shape)."""

    def __init__(self, multiple: int = 8, enabled: bool = True) -> None:
        if int(multiple) < 1:
            raise ValueError(f"pad_to_multiple_of={multiple} must be a positive integer")
        self.multiple = int(multiple)
        self.enabled = enabled

    @classmethod
    def of(cls, data: FinetuneData) -> TrimPadding:
        """From the run's ``data`` (``padding``, ``pad_to_multiple_of``)."""
        return cls(data.pad_to_multiple_of, data.padding != "max_length")

    def __call__(self, rows: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        return self.trim({key: torch.stack([row[key] for row in rows]) for key in rows[0]})

    def trim(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        if not self.enabled:
            return dict(batch)
        length = trimmed_length(batch["attention_mask"], self.multiple)
        return {
            key: value[:, :length].contiguous() if key in ROW_KEYS else value
            for key, value in batch.items()
        }


def length_order(attention_mask: Tensor, batch_size: int) -> Iterator[Tensor]:
    """Row indices in batches of ``batch_size``, longest rows first (ties in input order)."""
    lengths = attention_mask.sum(dim=1)
    order = torch.sort(lengths, descending=True, stable=True).indices
    yield from order.split(batch_size)
