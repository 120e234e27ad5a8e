"""The majority-token baseline that the demo prints next to the trained model's accuracy."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
from majority_baseline import majority_baseline, masked_ids


def _shards(path: Path, masked: list[list[int]]) -> Path:
    datasets.Dataset.from_dict({"masked_lm_ids": masked}).save_to_disk(str(path))
    return path


def test_majority_baseline_counts_train_and_scores_eval(tmp_path: Path) -> None:
    train = _shards(tmp_path / "train", [[5, 7, 7], [7, 9], []])
    held_out = _shards(tmp_path / "eval", [[7, 1], [2, 7, 7, 3]])
    baseline = majority_baseline(train, held_out)
    assert baseline.token_id == 7
    assert baseline.train_share == pytest.approx(3 / 5)
    assert baseline.accuracy == pytest.approx(3 / 6)
    assert baseline.eval_masked == 6
    assert masked_ids(held_out).tolist() == [7, 1, 2, 7, 7, 3]


def test_majority_baseline_refuses_sets_without_masks(tmp_path: Path) -> None:
    train = _shards(tmp_path / "train", [[5]])
    held_out = _shards(tmp_path / "eval", [[], []])
    with pytest.raises(ValueError, match="eval has no masked tokens"):
        majority_baseline(train, held_out)
