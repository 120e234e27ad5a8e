"""Packed batches: collate layout, the same maths as unpacked, no cross-contamination,
window packers, the packed batch plan."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
import torch.nn.functional as F
from test_model import NO_DROPOUT, model_of

from omnibert.data.collate import ArrowRows, CollateError, PretrainingCollator, RowBlock
from omnibert.data.packed import PackingSettings, default_predictions_per_pack
from omnibert.models import BertForPreTraining
from omnibert.packing.online import best_fit_decreasing, pack_window
from omnibert.run.pretraining.batches import batch_plan, packed_batch_plan

VOCAB = 61
S, P, K = 32, 5, 3


def make_sequences(lengths: list[int], seed: int = 0) -> list[dict]:
    """Rows as omnibert-prepare stores them: [CLS] A [SEP] B [SEP], masks inside."""
    rng = np.random.default_rng(seed)
    rows = []
    for i, n in enumerate(lengths):
        ids = rng.integers(5, VOCAB, n).tolist()
        ids[0], ids[n // 2], ids[-1] = 2, 3, 3
        masked = sorted(rng.choice(np.arange(1, n - 1), size=min(P, max(1, n // 6)), replace=False))
        rows.append(
            {
                "input_ids": ids,
                "segment_ids": [0] * (n // 2 + 1) + [1] * (n - n // 2 - 1),
                "masked_lm_positions": [int(m) for m in masked],
                "masked_lm_ids": rng.integers(5, VOCAB, len(masked)).tolist(),
                "next_sentence_label": i % 2,
            }
        )
    return rows


def block(rows: list[dict], packs: list[list[int]]) -> RowBlock:
    """What ArrowRows.__getitems__ returns for a batch of packs."""
    dataset = ArrowRows(__import__("datasets").Dataset.from_list(rows))
    return dataset.__getitems__(packs)


LENGTHS = [20, 9, 12, 7, 30, 14, 16, 5, 11]
PACKS = [[0, 3], [4], [6, 2], [5, 8, 7], [1]]  # 5 rows for 9 sequences


def test_packed_collate_follows_the_batch_contract() -> None:
    rows = make_sequences(LENGTHS)
    collator = PretrainingCollator(S, P, max_sequences_per_pack=K, max_predictions_per_pack=12)
    batch = collator(block(rows, PACKS))
    assert batch["input_ids"].shape == (5, S) and batch["nsp_labels"].shape == (5, K)
    assert batch["masked_lm_positions"].shape == (5, 12)
    for r, pack in enumerate(PACKS):
        offset, mask_slot = 0, 0
        for k, i in enumerate(pack):
            n, row = LENGTHS[i], rows[i]
            span = slice(offset, offset + n)
            assert batch["input_ids"][r, span].tolist() == row["input_ids"]
            assert batch["segment_ids"][r, span].tolist() == row["segment_ids"]
            assert batch["position_ids"][r, span].tolist() == list(range(n))
            assert batch["sequence_ids"][r, span].tolist() == [k + 1] * n
            m = len(row["masked_lm_positions"])
            got = batch["masked_lm_positions"][r, mask_slot : mask_slot + m].tolist()
            assert got == [p + offset for p in row["masked_lm_positions"]]
            assert (
                batch["masked_lm_ids"][r, mask_slot : mask_slot + m].tolist()
                == row["masked_lm_ids"]
            )
            assert batch["nsp_positions"][r, k] == offset
            assert batch["nsp_labels"][r, k] == row["next_sentence_label"]
            assert batch["nsp_weights"][r, k] == 1.0
            offset, mask_slot = offset + n, mask_slot + m
        assert (batch["sequence_ids"][r, offset:] == 0).all()  # padding after the last one
        assert batch["masked_lm_weights"][r].sum() == mask_slot
        assert batch["nsp_weights"][r, len(pack) :].sum() == 0  # unused NSP slots weigh 0


def test_unpacked_blocks_are_packs_of_one() -> None:
    rows = make_sequences(LENGTHS)
    flat = PretrainingCollator(S, P)(block(rows, list(range(len(rows)))))
    singles = PretrainingCollator(S, P)(block(rows, [[i] for i in range(len(rows))]))
    for key, value in flat.items():
        assert torch.equal(value, singles[key]), key


@pytest.mark.parametrize(
    ("packs", "limits", "expected"),
    [
        ([[6, 0]], {}, "holds 36 tokens, more than max_seq_length=32"),
        ([[1, 3, 7, 8]], {"max_predictions_per_pack": 20}, "holds 4 sequences"),
        ([[0, 2]], {"max_predictions_per_pack": 4}, "holds 5 masked positions, more than"),
    ],
)
def test_packs_that_do_not_fit_are_named(packs, limits, expected) -> None:
    rows = make_sequences(LENGTHS)
    collator = PretrainingCollator(S, 3, max_sequences_per_pack=K, **limits)
    with pytest.raises(CollateError, match=expected) as err:
        collator(block(rows, packs))
    assert "dataset rows" in str(err.value)


# ---------------------------------------------------------------------- same maths


def tiny_model() -> BertForPreTraining:
    """test_model's BERT (non-zero biases, dropout off) with this file's vocab and length."""
    return model_of(NO_DROPOUT.replace(vocab_size=VOCAB, max_position_embeddings=S))


def per_sequence_losses(
    model: BertForPreTraining, batch: dict[str, torch.Tensor], sequences: list[int]
) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
    """MLM cross-entropy of every masked token and NSP cross-entropy, keyed by sequence."""
    out = model(batch, return_logits=True)
    mlm_logits = out["mlm_logits"][..., :VOCAB].float()
    owner = torch.gather(batch["sequence_ids"], 1, batch["masked_lm_positions"])
    mlm, nsp = {}, {}
    rows = []
    for r in range(batch["input_ids"].shape[0]):  # sequence k+1 of row r, in collate order
        count = int(batch["nsp_weights"][r].sum())
        rows.extend((r, k) for k in range(count))
    for i, (r, k) in zip(sequences, rows, strict=True):
        pick = (owner[r] == k + 1) & (batch["masked_lm_weights"][r] > 0)
        mlm[i] = F.cross_entropy(
            mlm_logits[r][pick], batch["masked_lm_ids"][r][pick], reduction="none"
        )
        nsp[i] = F.cross_entropy(out["nsp_logits"][r, k], batch["nsp_labels"][r, k])
    return mlm, nsp


def test_packed_and_unpacked_batches_give_the_same_losses_and_gradients() -> None:
    rows = make_sequences(LENGTHS, seed=3)
    order = [i for pack in PACKS for i in pack]
    unpacked = PretrainingCollator(S, P)(block(rows, order))
    packed = PretrainingCollator(S, P, max_sequences_per_pack=K, max_predictions_per_pack=12)(
        block(rows, PACKS)
    )
    assert packed["input_ids"].shape[0] == 5 < unpacked["input_ids"].shape[0] == 9

    results = []
    for batch in (unpacked, packed):
        model = tiny_model()
        out = model(batch)
        out["loss"].backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        with torch.no_grad():
            losses = per_sequence_losses(model, batch, order)
        results.append((out, grads, losses))
    (a, grads_a, (mlm_a, nsp_a)), (b, grads_b, (mlm_b, nsp_b)) = results
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_count", "nsp_count", "mlm_correct"):
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)
    assert a["nsp_count"] == 9 and a["mlm_count"] == sum(len(r["masked_lm_ids"]) for r in rows)
    for i in order:
        torch.testing.assert_close(mlm_a[i], mlm_b[i], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(nsp_a[i], nsp_b[i], rtol=1e-5, atol=1e-6)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) > 20
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-6, msg=name)


def test_no_information_crosses_between_packed_sequences() -> None:
    rows = make_sequences(LENGTHS, seed=4)
    collator = PretrainingCollator(S, P, max_sequences_per_pack=K, max_predictions_per_pack=12)
    model = tiny_model().eval()
    before = model(collator(block(rows, PACKS)), return_logits=True)
    changed = [dict(r) for r in rows]
    changed[6] = dict(rows[6], input_ids=[2] + [7] * (LENGTHS[6] - 2) + [3])  # 1st of row 2
    changed[6]["segment_ids"] = [1] * LENGTHS[6]
    after = model(collator(block(changed, PACKS)), return_logits=True)
    batch = collator(block(rows, PACKS))
    owner = torch.gather(batch["sequence_ids"], 1, batch["masked_lm_positions"])
    mine = (torch.arange(5)[:, None] == 2) & (owner == 1)
    real = batch["masked_lm_weights"] > 0
    # sequence 6's own predictions change; every other sequence's are bit-for-bit equal
    assert not torch.equal(before["mlm_logits"][mine & real], after["mlm_logits"][mine & real])
    others = ~mine & real
    assert torch.equal(before["mlm_logits"][others], after["mlm_logits"][others])
    assert torch.equal(before["nsp_logits"][2, 1], after["nsp_logits"][2, 1])  # seq 2, same row
    assert not torch.equal(before["nsp_logits"][2, 0], after["nsp_logits"][2, 0])


# ---------------------------------------------------------------------- window packers


def _check_packs(offsets, members, lengths, masks, s, k, p) -> None:
    assert sorted(members.tolist()) == list(range(lengths.size))  # every sequence once
    sizes = np.diff(offsets)
    assert sizes.min() >= 1 and sizes.max() <= k
    assert np.add.reduceat(lengths[members], offsets[:-1]).max() <= s
    assert np.add.reduceat(masks[members], offsets[:-1]).max() <= p


@pytest.mark.parametrize("algorithm", ["bfd", "lpfhp", "nnlshp"])
def test_window_packers_respect_every_limit_and_are_deterministic(algorithm) -> None:
    rng = np.random.default_rng(7)
    lengths = rng.integers(3, 129, 3000)
    masks = np.minimum(20, np.maximum(1, np.rint(lengths * 0.15))).astype(np.int64)
    offsets, members = pack_window(lengths, masks, 128, 3, 22, algorithm, seed=5)
    _check_packs(offsets, members, lengths, masks, 128, 3, 22)
    again = pack_window(lengths, masks, 128, 3, 22, algorithm, seed=5)
    assert np.array_equal(again[0], offsets) and np.array_equal(again[1], members)
    efficiency = lengths.sum() / ((offsets.size - 1) * 128)
    assert efficiency > 0.9  # uniform 3..128 packs well at K=3 (unpacked: 0.52)


@pytest.mark.parametrize("algorithm", ["bfd", "lpfhp"])
def test_window_packers_split_packs_over_a_tight_mask_budget(algorithm) -> None:
    lengths = np.array([10, 10, 10, 10, 40])
    masks = np.array([3, 3, 3, 3, 6])
    offsets, members = pack_window(lengths, masks, 100, 4, 6, algorithm, seed=0)
    _check_packs(offsets, members, lengths, masks, 100, 4, 6)  # tokens/K would allow 2 packs
    assert offsets.size - 1 >= 3  # 15 masked positions need 3 rows of 6


def test_best_fit_honours_a_tight_mask_budget() -> None:
    lengths = np.array([10, 10, 10, 10])
    masks = np.array([3, 3, 3, 3])
    offsets, members = best_fit_decreasing(lengths, masks, 100, 4, 6)
    assert np.diff(offsets).tolist() == [2, 2]  # tokens and K would allow one pack of 4
    _check_packs(offsets, members, lengths, masks, 100, 4, 6)


def test_default_mask_budget_covers_googles_masking_rule() -> None:
    assert default_predictions_per_pack(76, 512, 3, 0.15) == 79
    assert default_predictions_per_pack(20, 128, 3, 0.15) == 22
    assert default_predictions_per_pack(20, 128, 3, None) == 60
    rng = np.random.default_rng(0)  # Google: max(1, round(n · prob)) capped at P per sequence
    for _ in range(2000):
        n = rng.integers(3, 126, 3)
        n = n[np.cumsum(n) <= 128]
        got = np.minimum(20, np.maximum(1, np.rint(n * 0.15))).sum()
        assert got <= default_predictions_per_pack(20, 128, 3, 0.15)


# ---------------------------------------------------------------------- settings and plan


def test_packing_settings_name_the_bad_key() -> None:
    with pytest.raises(ValueError, match=r"data.packing='yes' is not one of"):
        PackingSettings.parse("yes", {}, ValueError)
    with pytest.raises(ValueError, match=r"data.pack.buffer_size=0 must be an integer >= 1"):
        PackingSettings.parse("online", {"buffer_size": 0}, ValueError)
    with pytest.raises(ValueError, match=r"data.pack has unknown keys \['bufer_size'\]"):
        PackingSettings.parse("online", {"bufer_size": 9}, ValueError)
    assert PackingSettings.parse("offline", {"algorithm": "bfd"}, ValueError).index_name() == (
        "lpfhp-k3"
    )


def test_an_automatic_micro_batch_caps_the_packed_split_instead_of_fixing_it() -> None:
    # global 32 sequences at 1.71 per row: 19 rows, not the 32 rows (≈ 55 sequences) of a micro
    # batch chosen for 32 unpacked rows
    plan = packed_batch_plan(batch_plan(32, 1, 1, None), 1.71, None, max_micro_batch_size=32)
    assert (plan.micro_batch_size, plan.accumulate_grad_batches) == (19, 1)
    assert plan.sequences_per_step == pytest.approx(32.49)
    # memory allows only 8 rows: accumulate to the rows the global batch needs
    plan = packed_batch_plan(batch_plan(64, 1, 1, None), 2.0, None, max_micro_batch_size=8)
    assert (plan.micro_batch_size, plan.accumulate_grad_batches) == (8, 4)


@pytest.mark.parametrize(
    ("micro", "per_row", "expected"),
    [
        (None, 2.0, (16, 1)),
        (4, 2.0, (4, 4)),
        (4, 1.9, (4, 4)),
        (4, 1.3, (4, 6)),
        (64, 2.0, (64, 1)),
    ],
)
def test_packed_batch_plan_keeps_counting_sequences(micro, per_row, expected) -> None:
    plan = packed_batch_plan(batch_plan(64, 2, 1, None), per_row, micro)
    assert (plan.micro_batch_size, plan.accumulate_grad_batches) == expected
    assert plan.global_batch_size == 64
    assert plan.rows_per_step == expected[0] * expected[1] * 2
    assert plan.sequences_per_step == pytest.approx(plan.rows_per_step * per_row)


def test_arrow_rows_fetch_packs_in_one_gather() -> None:
    rows = make_sequences(LENGTHS)
    got = block(rows, PACKS)
    assert got.indices.tolist() == [i for pack in PACKS for i in pack]
    assert got.pack_sizes is not None and got.pack_sizes.tolist() == [2, 1, 2, 3, 1]
    assert isinstance(got.table, pa.Table) and got.table.num_rows == 9
