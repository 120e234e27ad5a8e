"""PretrainingCollator: the static batch contract from unpadded rows (dicts or Arrow blocks)."""

from __future__ import annotations

import pickle
import random
from typing import Any

import datasets
import numpy as np
import pytest
import torch

from omnibert.data.collate import (
    BATCH_KEYS,
    ArrowRows,
    CollateError,
    PretrainingCollator,
    RowBlock,
)
from omnibert.data.schema import features

SEQ, PREDS = 16, 4


def make_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        length = rng.randint(5, SEQ)
        cut = rng.randint(2, length - 2)
        positions = sorted(rng.sample(range(1, length - 1), rng.randint(1, min(PREDS, length - 2))))
        rows.append(
            {
                "input_ids": [101]
                + [rng.randrange(1000, 30000) for _ in range(length - 2)]
                + [102],
                "segment_ids": [0] * cut + [1] * (length - cut),
                "masked_lm_positions": positions,
                "masked_lm_ids": [rng.randrange(1000, 30000) for _ in positions],
                "next_sentence_label": rng.randint(0, 1),
            }
        )
    return rows


def expected_batch(rows: list[dict[str, Any]], size: int) -> dict[str, np.ndarray]:
    """The contract written out row by row (the slow, obvious way)."""
    out = {k: np.zeros((size, SEQ), np.int64) for k in BATCH_KEYS[:4]}
    out |= {k: np.zeros((size, PREDS), np.int64) for k in BATCH_KEYS[4:6]}
    out["masked_lm_weights"] = np.zeros((size, PREDS), np.float32)
    out |= {k: np.zeros((size, 1), np.int64) for k in ("nsp_positions", "nsp_labels")}
    out["nsp_weights"] = np.zeros((size, 1), np.float32)
    for i, row in enumerate(rows):
        n, m = len(row["input_ids"]), len(row["masked_lm_positions"])
        out["input_ids"][i, :n] = row["input_ids"]
        out["segment_ids"][i, :n] = row["segment_ids"]
        out["position_ids"][i, :n] = range(n)
        out["sequence_ids"][i, :n] = 1
        out["masked_lm_positions"][i, :m] = row["masked_lm_positions"]
        out["masked_lm_ids"][i, :m] = row["masked_lm_ids"]
        out["masked_lm_weights"][i, :m] = 1.0
        out["nsp_labels"][i, 0] = row["next_sentence_label"]
        out["nsp_weights"][i, 0] = 1.0
    return out


def arrow_rows(rows: list[dict[str, Any]]) -> ArrowRows:
    return ArrowRows(datasets.Dataset.from_list(rows, features=features(30522, SEQ)))


def assert_batch(batch: dict[str, torch.Tensor], expected: dict[str, np.ndarray]) -> None:
    assert list(batch) == list(BATCH_KEYS)
    for key in BATCH_KEYS:
        assert batch[key].dtype == torch.from_numpy(expected[key]).dtype, key
        np.testing.assert_array_equal(batch[key].numpy(), expected[key], err_msg=key)


def test_dict_rows_follow_the_contract() -> None:
    rows = make_rows(6)
    batch = PretrainingCollator(SEQ, PREDS)(rows)
    assert_batch(batch, expected_batch(rows, 6))
    assert batch["input_ids"].shape == (6, SEQ) and batch["nsp_labels"].shape == (6, 1)


def test_arrow_blocks_equal_dict_rows_in_sampler_order() -> None:
    rows = make_rows(20, seed=1)
    dataset = arrow_rows(rows)
    order = [13, 2, 19, 2, 7]
    block = dataset.__getitems__(order)
    assert isinstance(block, RowBlock) and block.indices.tolist() == order
    batch = PretrainingCollator(SEQ, PREDS)(block)
    assert_batch(batch, expected_batch([rows[i] for i in order], len(order)))
    assert dataset[13]["input_ids"] == rows[13]["input_ids"]


def test_eval_batches_are_padded_with_zero_weight_rows() -> None:
    rows = make_rows(3, seed=2)
    collate = PretrainingCollator(SEQ, PREDS, batch_size=8)
    batch = collate(arrow_rows(rows).__getitems__([0, 1, 2]))
    assert_batch(batch, expected_batch(rows, 8))
    assert batch["masked_lm_weights"][3:].sum() == 0 and batch["nsp_weights"][3:].sum() == 0
    empty = collate([])
    assert empty["input_ids"].shape == (8, SEQ) and empty["nsp_weights"].sum() == 0
    with pytest.raises(CollateError, match="got 9 rows for an evaluation batch of batch_size=8"):
        collate(make_rows(9))


def test_collator_pickles_and_keeps_settings() -> None:
    collate = pickle.loads(pickle.dumps(PretrainingCollator(SEQ, PREDS, batch_size=4)))
    assert (collate.max_seq_length, collate.max_predictions_per_seq, collate.batch_size) == (
        SEQ,
        PREDS,
        4,
    )
    dataset = pickle.loads(pickle.dumps(arrow_rows(make_rows(4))))
    assert len(collate(dataset.__getitems__([0, 3]))["input_ids"]) == 4


BREAKAGES = [
    ({"input_ids": [101] * 17, "segment_ids": [0] * 17},
     r"row 2 of the batch has 17 tokens, more than max_seq_length=16; set max_seq_length"),
    ({"masked_lm_positions": [1, 2, 3, 4, 5], "masked_lm_ids": [7] * 5},
     r"row 2 of the batch has 5 masked positions, more than max_predictions_per_seq=4"),
    ({"segment_ids": [0]}, r"row 2 of the batch has 1 segment_ids for \d+ input_ids"),
    ({"masked_lm_ids": [7] * 5}, r"row 2 of the batch has 5 masked_lm_ids for \d+ masked_lm_pos"),
    ({"masked_lm_positions": [1, 40], "masked_lm_ids": [7, 7]},
     r"row 2 of the batch masks position 40, outside its \d+ tokens"),
    ({"next_sentence_label": 2}, r"row 2 of the batch has next_sentence_label=2"),
]  # fmt: skip


@pytest.mark.parametrize(("change", "expected"), BREAKAGES)
def test_rows_that_do_not_fit_are_named(change: dict[str, Any], expected: str) -> None:
    rows = make_rows(4, seed=3)
    rows[2] |= change
    with pytest.raises(CollateError, match=expected):
        PretrainingCollator(SEQ, PREDS)(rows)


def test_arrow_errors_name_the_dataset_row() -> None:
    rows = make_rows(10, seed=4)
    rows[6]["input_ids"] = [101] * 20
    rows[6]["segment_ids"] = [0] * 20
    block = arrow_rows(rows).__getitems__([1, 6, 3])
    with pytest.raises(CollateError, match="row 6 of the dataset has 20 tokens"):
        PretrainingCollator(SEQ, PREDS)(block)


def test_ids_out_of_range_are_named_before_any_model_sees_them() -> None:
    """With the data's vocab size, token, segment and masked-token ids are range-checked."""
    rows = make_rows(4, seed=5)
    collate = PretrainingCollator(SEQ, PREDS, vocab_size=30522)
    collate(rows)  # in range: fine
    for key, value, bound in (
        ("input_ids", 30522, 30521),
        ("segment_ids", 2, 1),
        ("masked_lm_ids", -1, 30521),
    ):
        broken = [dict(row) for row in rows]
        broken[3][key] = [*broken[3][key][:-1], value]
        with pytest.raises(
            CollateError,
            match=rf"^row 3 of the batch has {key} value {value}, outside 0\.\.{bound}; ",
        ):
            collate(broken)
