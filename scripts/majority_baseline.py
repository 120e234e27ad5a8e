"""Dataset statistics that put training results in context.

`majority_baseline` is the masked-LM accuracy a model gets by always predicting the token
that is masked most often in the training shards: the number a trained model has to beat
before its accuracy means anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import datasets
import numpy as np
import numpy.typing as npt


@dataclass(frozen=True)
class MajorityBaseline:
    token_id: int
    """The id masked most often in the training shards."""
    train_share: float
    """Its share of the training set's masked tokens."""
    accuracy: float
    """Its share of the evaluation set's masked tokens: the baseline's masked-LM accuracy."""
    eval_masked: int
    """Masked tokens in the evaluation set."""


def masked_ids(path: str | Path) -> npt.NDArray[np.int64]:
    """Every `masked_lm_ids` value of an omnibert shard directory, as one flat array."""
    dataset = datasets.load_from_disk(str(path))
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"{path} holds a DatasetDict, not omnibert-prepare shards.")
    column = dataset.data.column("masked_lm_ids")
    chunks = [chunk.flatten().to_numpy(zero_copy_only=False) for chunk in column.chunks]
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(chunks).astype(np.int64, copy=False)


def majority_baseline(train_path: str | Path, eval_path: str | Path) -> MajorityBaseline:
    """Accuracy on `eval_path` of always predicting the most frequent masked id of `train_path`."""
    train = masked_ids(train_path)
    held_out = masked_ids(eval_path)
    if train.size == 0 or held_out.size == 0:
        empty = train_path if train.size == 0 else eval_path
        raise ValueError(f"{empty} has no masked tokens; cannot compute a baseline.")
    counts = np.bincount(train)
    token = int(counts.argmax())
    return MajorityBaseline(
        token_id=token,
        train_share=float(counts[token] / train.size),
        accuracy=float(np.mean(held_out == token)),
        eval_masked=int(held_out.size),
    )
