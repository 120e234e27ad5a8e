"""Fine-tuning batches cut to their longest row (dynamic padding).

Features are stored padded to ``task.max_seq_length``; with ``data.padding=longest`` every
batch keeps only the columns up to its longest real row, rounded up to a multiple of
``data.pad_to_multiple_of`` (8: tensor-core / AVX-512 friendly shapes, and fewer distinct
shapes for kernel caches). The model's attention masks padding out, so a real token's
output, the loss and the answers are those of the full-length batch: only the cost of the
padding columns goes (SQuAD's template and GLUE's sentences are far shorter than 384 / 128).
``data.padding=max_length`` keeps the static shape that HPU lazy mode, CUDA graphs and
``torch.compile`` without dynamic shapes want.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

__all__ = ["PADDINGS", "TrimPadding", "trimmed_length"]

PADDINGS = ("longest", "max_length")
#: the [B,S] keys a batch is cut along (labels are [B])
ROW_KEYS = ("input_ids", "segment_ids", "attention_mask")


def trimmed_length(attention_mask: Tensor, multiple: int) -> int:
    """The longest real row of ``attention_mask`` ``[B,S]`` rounded up to ``multiple``, at
    most ``S`` (one host sync: the mask lives on the host in a loader)."""
    longest = int(attention_mask.sum(dim=1).max()) if attention_mask.numel() else 0
    length = max(multiple, -(-longest // multiple) * multiple)
    return min(length, int(attention_mask.shape[1]))


class TrimPadding:
    """A ``DataLoader`` collate: stack the rows, then cut the ``[B,S]`` tensors to
    :func:`trimmed_length` (``multiple`` 0 or ``enabled=False``: stack only)."""

    def __init__(self, multiple: int = 8, enabled: bool = True) -> None:
        self.multiple = max(1, int(multiple))
        self.enabled = enabled

    def __call__(self, rows: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
        batch = {key: torch.stack([row[key] for row in rows]) for key in rows[0]}
        return self.trim(batch) if self.enabled else batch

    def trim(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        length = trimmed_length(batch["attention_mask"], self.multiple)
        return {
            key: value[:, :length].contiguous() if key in ROW_KEYS else value
            for key, value in batch.items()
        }


def pad_columns(array: Any, width: int, value: float) -> Any:
    """Numpy ``[N,s]`` -> ``[N,width]`` filled with ``value`` on the right."""
    import numpy as np

    if array.shape[1] == width:
        return array
    out = np.full((array.shape[0], width), value, dtype=array.dtype)
    out[:, : array.shape[1]] = array
    return out
