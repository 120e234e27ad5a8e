"""omnibert.models: shapes, vocab padding, tying, init, attention mask semantics, losses."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from omnibert.models import BertConfig, BertConfigError, BertForPreTraining, block_diagonal_mask
from omnibert.models.attention import explicit_attention

VOCAB = 99  # not a multiple of 8: padded to 104
TINY = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=64,
)
NO_DROPOUT = TINY.replace(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def model_of(config: BertConfig = NO_DROPOUT, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(config)
    with torch.no_grad():  # non-zero biases so that every parameter matters
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
    return model


def unpacked_batch(batch: int = 3, seq: int = 16, predictions: int = 4, seed: int = 1) -> dict:
    """Rows of different lengths (padding after), 3 real masked slots, the 4th padding."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [seq, seq - 5, 7][:batch]
    out = {
        "input_ids": torch.zeros(batch, seq, dtype=torch.long),
        "segment_ids": torch.zeros(batch, seq, dtype=torch.long),
        "position_ids": torch.zeros(batch, seq, dtype=torch.long),
        "sequence_ids": torch.zeros(batch, seq, dtype=torch.long),
        "masked_lm_positions": torch.zeros(batch, predictions, dtype=torch.long),
        "masked_lm_ids": torch.zeros(batch, predictions, dtype=torch.long),
        "masked_lm_weights": torch.zeros(batch, predictions),
        "nsp_positions": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_labels": torch.tensor([[0], [1], [1]])[:batch],
        "nsp_weights": torch.ones(batch, 1),
    }
    for row, length in enumerate(lengths):
        out["input_ids"][row, :length] = torch.randint(1, VOCAB, (length,), generator=gen)
        out["segment_ids"][row, length // 2 : length] = 1
        out["position_ids"][row, :length] = torch.arange(length)
        out["sequence_ids"][row, :length] = 1
        out["masked_lm_positions"][row, :3] = torch.tensor([1, 3, length - 2])
        out["masked_lm_ids"][row, :3] = torch.randint(1, VOCAB, (3,), generator=gen)
        out["masked_lm_weights"][row, :3] = 1.0
    return out


def test_shapes_vocab_padding_and_outputs() -> None:
    model = model_of()
    assert TINY.padded_vocab_size == 104
    assert model.bert.embeddings.word_embeddings.weight.shape == (104, 32)
    assert model.cls.predictions.bias.shape == (104,)
    fresh = BertForPreTraining(TINY)
    assert torch.all(fresh.bert.embeddings.word_embeddings.weight[VOCAB:] == 0)
    out = model(unpacked_batch(), return_logits=True)
    assert out["mlm_logits"].shape == (3, 4, 104)
    assert out["nsp_logits"].shape == (3, 1, 2)
    for key in ("loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct"):
        assert out[key].shape == () and out[key].dtype == torch.float32, key
    assert out["mlm_count"] == 9 and out["nsp_count"] == 3
    assert "mlm_logits" not in model(unpacked_batch())


def test_config_validation_and_hf_dict_round_trip() -> None:
    with pytest.raises(BertConfigError, match="num_attention_heads=5"):
        TINY.replace(num_attention_heads=5)
    with pytest.raises(BertConfigError, match="hidden_act='swish'"):
        TINY.replace(hidden_act="swish")
    with pytest.raises(BertConfigError, match="unknown key"):
        BertConfig.from_dict({**TINY.to_dict(), "typo": 1})
    hf = TINY.to_hf_dict()
    assert hf["vocab_size"] == VOCAB and hf["architectures"] == ["BertForPreTraining"]
    assert BertConfig.from_hf_dict(hf) == TINY
    assert BertConfig.from_dict(TINY.to_dict()) == TINY


def test_init_is_truncated_normal_with_unit_layer_norms() -> None:
    torch.manual_seed(0)
    model = BertForPreTraining(TINY.replace(hidden_size=64, intermediate_size=256))
    ffn = model.bert.encoder.layer[0].intermediate.dense.weight
    assert ffn.abs().max() <= 0.04 + 1e-7
    assert 0.015 < ffn.std() < 0.02  # a normal(0, 0.02) truncated at ±2 std has std 0.0176
    for name, param in model.named_parameters():
        if "LayerNorm.weight" in name:
            assert torch.all(param == 1), name
        elif name.endswith("bias"):
            assert torch.all(param == 0), name


def test_decoder_tied_to_word_embeddings_through_load_to_and_copy() -> None:
    model = model_of()

    def tied(m: BertForPreTraining) -> bool:
        head = m.cls.predictions
        return (
            head.decoder.weight is m.bert.embeddings.word_embeddings.weight
            and head.decoder.bias is head.bias
        )

    assert tied(model)
    names = [n for n, _ in model.named_parameters()]
    assert "cls.predictions.decoder.weight" not in names  # one parameter, counted once
    state = model_of(seed=7).state_dict()
    model.load_state_dict(state)
    assert tied(model)
    assert torch.equal(
        model.cls.predictions.decoder.weight, state["bert.embeddings.word_embeddings.weight"]
    )
    model = model.to(torch.float64)
    assert tied(model) and model.cls.predictions.decoder.weight.dtype == torch.float64
    assert tied(copy.deepcopy(model))
    # the decoder's gradient lands on the embedding matrix
    model = model_of()
    batch = unpacked_batch()
    model(batch)["mlm_loss"].backward()
    grad = model.bert.embeddings.word_embeddings.weight.grad
    assert grad is not None and grad[batch["masked_lm_ids"][0, 0]].abs().sum() > 0
    assert torch.all(grad[VOCAB:] == 0)  # padding rows are never scored nor looked up


def packed_pair() -> tuple[dict, dict, dict]:
    """One packed row holding sequences A (len 6) and B (len 5) and 5 padding tokens, plus
    unpacked rows with A alone and B alone."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randint(1, VOCAB, (6,), generator=gen)
    b = torch.randint(1, VOCAB, (5,), generator=gen)
    seq = 16

    def row(parts: list[torch.Tensor], masked: list[int], nsp: list[int]) -> dict:
        out = {
            k: torch.zeros(1, seq, dtype=torch.long)
            for k in ("input_ids", "segment_ids", "position_ids", "sequence_ids")
        }
        start = 0
        for i, part in enumerate(parts):
            end = start + len(part)
            out["input_ids"][0, start:end] = part
            out["segment_ids"][0, start + 3 : end] = 1
            out["position_ids"][0, start:end] = torch.arange(len(part))
            out["sequence_ids"][0, start:end] = i + 1
            start = end
        out["input_ids"][0, start:] = torch.randint(1, VOCAB, (seq - start,), generator=gen)
        out["masked_lm_positions"] = torch.tensor([masked])
        out["masked_lm_ids"] = torch.tensor([[7] * len(masked)])
        out["masked_lm_weights"] = torch.ones(1, len(masked))
        out["nsp_positions"] = torch.tensor([nsp])
        out["nsp_labels"] = torch.zeros(1, len(nsp), dtype=torch.long)
        out["nsp_weights"] = torch.ones(1, len(nsp))
        return out

    packed = row([a, b], [1, 4, 7, 9], [0, 6])
    return packed, row([a], [1, 4], [0]), row([b], [1, 3], [0])


def hidden(model: BertForPreTraining, batch: dict) -> torch.Tensor:
    return model.bert(
        batch["input_ids"], batch["segment_ids"], batch["position_ids"], batch["sequence_ids"]
    )


def test_block_diagonal_mask_semantics() -> None:
    seq_ids = torch.tensor([[1, 1, 2, 2, 2, 0, 0]])
    mask = block_diagonal_mask(seq_ids)[0, 0]
    assert mask.shape == (7, 7) and mask.dtype == torch.bool
    assert mask[0, 1] and not mask[0, 2] and not mask[0, 5] and mask[5, 6] and not mask[5, 0]
    assert torch.all(mask.any(-1))  # no fully masked row


def test_packed_sequences_do_not_see_each_other_or_padding() -> None:
    model = model_of().eval()
    packed, only_a, only_b = packed_pair()
    out = hidden(model, packed)
    assert torch.isfinite(out).all()
    # each packed sequence computes exactly what it computes alone (positions restart)
    torch.testing.assert_close(out[0, :6], hidden(model, only_a)[0, :6], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out[0, 6:11], hidden(model, only_b)[0, :5], rtol=1e-5, atol=1e-5)
    # changing sequence B's tokens and the padding leaves A's outputs and losses alone ...
    changed = {k: v.clone() for k, v in packed.items()}
    changed["input_ids"][0, 6:] = (changed["input_ids"][0, 6:] + 5) % VOCAB
    changed_out = hidden(model, changed)
    torch.testing.assert_close(changed_out[0, :6], out[0, :6], rtol=0, atol=1e-6)
    assert not torch.allclose(changed_out[0, 6:11], out[0, 6:11])  # ... but not B's
    a_only = {
        **packed,
        "masked_lm_weights": torch.tensor([[1.0, 1.0, 0.0, 0.0]]),
        "nsp_weights": torch.tensor([[1.0, 0.0]]),
    }
    a_changed = {
        **changed,
        "masked_lm_weights": a_only["masked_lm_weights"],
        "nsp_weights": a_only["nsp_weights"],
    }
    for key in ("loss", "mlm_loss", "nsp_loss"):
        torch.testing.assert_close(model(a_changed)[key], model(a_only)[key], rtol=0, atol=1e-6)
    # padding never influences real tokens: an unpacked row with other padding ids
    repadded = {k: v.clone() for k, v in only_a.items()}
    repadded["input_ids"][0, 6:] = 0
    torch.testing.assert_close(
        hidden(model, repadded)[0, :6], hidden(model, only_a)[0, :6], rtol=0, atol=1e-6
    )


def test_last_layer_on_read_rows_only_equals_the_full_encoder() -> None:
    model = model_of().eval()
    packed, _, _ = packed_pair()
    positions = torch.tensor([[0, 6, 3, 3, 12, 0]])  # [CLS]s, repeats, a padding row
    args = (packed["input_ids"], packed["segment_ids"], packed["position_ids"])
    subset = model.bert(*args, packed["sequence_ids"], output_positions=positions)
    full = model.bert(*args, packed["sequence_ids"])
    torch.testing.assert_close(subset, full[:, positions[0]], rtol=1e-5, atol=1e-6)


def test_explicit_attention_equals_sdpa() -> None:
    """The CPU training path (explicit softmax, dropout) computes SDPA's maths."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 7, 8, generator=gen) for _ in range(3))
    mask = block_diagonal_mask(torch.tensor([[1, 1, 1, 2, 2, 0, 0], [1, 1, 1, 1, 1, 1, 0]]))
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    torch.testing.assert_close(explicit_attention(q, k, v, mask, 0.0), reference)
    # with dropout p, each probability is zeroed or scaled by 1/(1-p): the mean is unbiased
    torch.manual_seed(0)
    draws = torch.stack([explicit_attention(q, k, v, mask, 0.1) for _ in range(2000)])
    torch.testing.assert_close(draws.mean(0), reference, rtol=0, atol=0.05)
    assert not torch.allclose(draws[0], reference)


def test_loss_is_the_weighted_cross_entropy_of_the_returned_logits() -> None:
    model = model_of()
    batch = unpacked_batch()
    batch["nsp_positions"] = torch.tensor([[0, 5], [0, 5], [0, 5]])
    batch["nsp_labels"] = torch.tensor([[1, 0], [0, 1], [1, 1]])
    batch["nsp_weights"] = torch.tensor([[1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    out = model(batch, return_logits=True)
    logits = out["mlm_logits"][..., :VOCAB].reshape(-1, VOCAB)
    labels, weights = batch["masked_lm_ids"].reshape(-1), batch["masked_lm_weights"].reshape(-1)
    real = weights > 0
    mlm = F.cross_entropy(logits[real], labels[real])
    nsp_logits, nsp_labels = out["nsp_logits"].reshape(-1, 2), batch["nsp_labels"].reshape(-1)
    nsp_real = batch["nsp_weights"].reshape(-1) > 0
    nsp = F.cross_entropy(nsp_logits[nsp_real], nsp_labels[nsp_real])
    torch.testing.assert_close(out["mlm_loss"], mlm)
    torch.testing.assert_close(out["nsp_loss"], nsp)
    torch.testing.assert_close(out["loss"], mlm + nsp)
    assert out["mlm_count"] == 9 and out["nsp_count"] == 4
    assert out["mlm_correct"] == (logits.argmax(-1) == labels)[real].sum()
    assert out["nsp_correct"] == (nsp_logits.argmax(-1) == nsp_labels)[nsp_real].sum()
    # a batch made only of padding rows (eval padding) gives zero losses, not NaN
    empty = {**batch, "masked_lm_weights": torch.zeros(3, 4), "nsp_weights": torch.zeros(3, 2)}
    out = model(empty)
    assert out["loss"] == 0 and out["mlm_count"] == 0 and out["nsp_count"] == 0


def test_bf16_autocast_keeps_the_loss_in_fp32() -> None:
    model = model_of()
    batch = unpacked_batch()
    reference = model(batch)["loss"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(batch, return_logits=True)
    assert out["mlm_logits"].dtype == torch.bfloat16
    assert out["loss"].dtype == torch.float32 and torch.isfinite(out["loss"])
    torch.testing.assert_close(out["loss"], reference, rtol=0.03, atol=0.03)
    out["loss"].backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_dropout_is_honoured_in_train_mode_only() -> None:
    model = model_of(TINY)
    batch = unpacked_batch()
    model.eval()
    assert torch.equal(model(batch)["loss"], model(batch)["loss"])
    model.train()
    assert not torch.equal(model(batch)["loss"], model(batch)["loss"])
    no_dropout = model_of(NO_DROPOUT).train()
    torch.testing.assert_close(
        no_dropout(batch)["loss"], model_of(NO_DROPOUT).eval()(batch)["loss"]
    )


def test_forward_traces_as_one_graph() -> None:
    """torch.compile friendliness: no graph break (no .item(), no data-dependent branch)."""
    torch._dynamo.reset()
    model = model_of(TINY).train()
    compiled = torch.compile(model, backend="eager", fullgraph=True)
    out = compiled(unpacked_batch())
    out["loss"].backward()
    assert torch.isfinite(out["loss"])
