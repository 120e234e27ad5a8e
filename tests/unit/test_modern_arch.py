"""Modern encoder options (rope / alibi, gated feed-forwards, pre-norm, RMSNorm, no biases,
sliding-window layers, no NSP head) against an independent dense reference.

The reference below is written plainly from the definitions: one sequence at a time, explicit
norms, explicit softmax, rotary as pairs (i, i + d/2) rotated by cos/sin, alibi as
``-slope_h * |pos_i - pos_j|``, the window as ``|pos_i - pos_j| <= local_window // 2``; it reads
the model's parameters by name and shares no code with the package. Forward hidden states at
real tokens and gradients of every parameter agree in fp32 to 1e-5 for math, sdpa and varlen
(flex: forward only, it has no CPU backward).
"""

from __future__ import annotations

import math

import pytest
import torch

from omnibert.models import BertConfig, BertConfigError, BertForPreTraining
from omnibert.models.attention import alibi_slopes

FP32 = {"rtol": 1e-5, "atol": 1e-5}
BASE = {
    "vocab_size": 61,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 48,
    "max_position_embeddings": 64,
    "hidden_dropout_prob": 0.0,
    "attention_probs_dropout_prob": 0.0,
}
#: ModernBERT's choices, scaled down: layers 0 global, 1 and 2 local (the last layer is local,
#: so the queries-only path of the pretraining forward meets the window)
MODERN = BertConfig(
    **{**BASE, "num_hidden_layers": 3},
    position_encoding="rope",
    rope_theta=160000.0,
    rope_theta_local=500.0,
    feed_forward="geglu",
    norm_position="pre",
    layer_norm_eps=1e-5,
    bias=False,
    type_vocab_size=0,
    local_window=8,
    global_every=3,
    next_sentence_head=False,
)
#: MosaicBERT's: alibi (3 heads: the non-power-of-two slopes), GeGLU, post-norm with biases
MOSAIC = BertConfig(
    **{**BASE, "hidden_size": 48, "num_attention_heads": 3},
    position_encoding="alibi",
    feed_forward="geglu",
    next_sentence_head=False,
)
SINGLE = {
    "rope": {"position_encoding": "rope"},
    "alibi": {"position_encoding": "alibi"},
    "swiglu": {"feed_forward": "swiglu"},
    "geglu": {"feed_forward": "geglu"},
    "pre": {"norm_position": "pre"},
    "rmsnorm": {"norm": "rmsnorm", "layer_norm_eps": 1e-6},
    "no_bias": {"bias": False, "decoder_bias": False},
    "window": {"local_window": 6, "global_every": 2},
    "rope_window": {
        "position_encoding": "rope",
        "local_window": 6,
        "global_every": 2,
        "rope_theta_local": 100.0,
    },
    "alibi_window": {"position_encoding": "alibi", "local_window": 6, "global_every": 2},
    "no_embedding_norm": {"embedding_norm": False, "type_vocab_size": 0},
}


# ----------------------------------------------------------------------------- the reference


def ref_layer_norm(x, weight, bias, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    y = (x - mean) / torch.sqrt(var + eps) * weight
    return y if bias is None else y + bias


def ref_rms_norm(x, weight, eps):
    return x / torch.sqrt((x**2).mean(-1, keepdim=True) + eps) * weight


def ref_linear(x, p, name):
    y = x @ p[name + ".weight"].T
    return y + p[name + ".bias"] if name + ".bias" in p else y


def ref_norm(x, p, name, cfg):
    if cfg.norm == "rmsnorm":
        return ref_rms_norm(x, p[name + ".weight"], cfg.layer_norm_eps)
    return ref_layer_norm(x, p[name + ".weight"], p.get(name + ".bias"), cfg.layer_norm_eps)


def ref_rotate(x, pos, theta):
    """x [heads, L, d]: pair (i, i + d/2) rotated by the angle pos * theta^(-2i/d)."""
    d = x.shape[-1]
    half = d // 2
    out = torch.empty_like(x)
    for i in range(half):
        angle = pos.double() * theta ** (-2.0 * i / d)
        c, s = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * c - b * s
        out[..., i + half] = b * c + a * s
    return out


def ref_slopes(heads):
    """ALiBi slopes written out for the head counts used here."""
    return {
        2: [2**-4, 2**-8],
        3: [2**-4, 2**-8, 2**-2],  # 2 geometric, then every other slope of 4: 2^-2
        4: [2**-2, 2**-4, 2**-6, 2**-8],
    }[heads]


def ref_attention(x, pos, p, prefix, cfg, local):
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    length = x.shape[0]

    def split(t):
        return t.view(length, heads, d).transpose(0, 1)

    q = split(ref_linear(x, p, prefix + "attention.self.query"))
    k = split(ref_linear(x, p, prefix + "attention.self.key"))
    v = split(ref_linear(x, p, prefix + "attention.self.value"))
    if cfg.position_encoding == "rope":
        theta = cfg.rope_theta_local if local else cfg.rope_theta
        q, k = ref_rotate(q, pos, theta), ref_rotate(k, pos, theta)
    scores = q @ k.transpose(1, 2) / math.sqrt(d)
    distance = (pos[:, None] - pos[None, :]).abs().to(x.dtype)
    if cfg.position_encoding == "alibi":
        slopes = torch.tensor(ref_slopes(heads), dtype=x.dtype)
        scores = scores - slopes[:, None, None] * distance
    if local:
        scores = scores.masked_fill(distance > cfg.local_window // 2, float("-inf"))
    top = scores.max(-1, keepdim=True).values
    e = torch.exp(scores - top)
    probs = e / e.sum(-1, keepdim=True)
    context = (probs @ v).transpose(0, 1).reshape(length, heads * d)
    return ref_linear(context, p, prefix + "attention.output.dense")


def ref_ffn(x, p, prefix, cfg):
    h = ref_linear(x, p, prefix + "intermediate.dense")
    if cfg.feed_forward == "mlp":
        h = 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))
    else:
        a, g = h[:, : cfg.intermediate_size], h[:, cfg.intermediate_size :]
        if cfg.feed_forward == "geglu":
            act = 0.5 * a * (1 + torch.erf(a / math.sqrt(2)))
        else:
            act = a * torch.sigmoid(a)
        h = act * g
    return ref_linear(h, p, prefix + "output.dense")


def ref_sequence(ids, segments, pos, p, cfg):
    """Hidden states [L,H] of one sequence."""
    x = p["bert.embeddings.word_embeddings.weight"][ids]
    if cfg.type_vocab_size:
        x = x + p["bert.embeddings.token_type_embeddings.weight"][segments]
    if cfg.position_encoding == "learned":
        x = x + p["bert.embeddings.position_embeddings.weight"][pos]
    if cfg.embedding_norm:
        x = ref_norm(x, p, "bert.embeddings.LayerNorm", cfg)
    for i in range(cfg.num_hidden_layers):
        prefix = f"bert.encoder.layer.{i}."
        local = cfg.local_window > 0 and i % cfg.global_every != 0
        if cfg.norm_position == "post":
            x = ref_norm(
                x + ref_attention(x, pos, p, prefix, cfg, local),
                p, prefix + "attention.output.LayerNorm", cfg,
            )  # fmt: skip
            x = ref_norm(x + ref_ffn(x, p, prefix, cfg), p, prefix + "output.LayerNorm", cfg)
        else:
            normed = x if i == 0 else ref_norm(x, p, prefix + "attn_norm", cfg)
            x = x + ref_attention(normed, pos, p, prefix, cfg, local)
            x = x + ref_ffn(ref_norm(x, p, prefix + "mlp_norm", cfg), p, prefix, cfg)
    if cfg.norm_position == "pre":
        x = ref_norm(x, p, "bert.final_norm", cfg)
    return x


def ref_hidden(batch, p, cfg):
    """[B,S,H] with each sequence computed alone; zeros at padding."""
    rows, seq = batch["input_ids"].shape
    out = torch.zeros(rows, seq, cfg.hidden_size, dtype=torch.float64)
    for b in range(rows):
        ids = batch["sequence_ids"][b]
        for s in ids.unique().tolist():
            if s == 0:
                continue
            where = (ids == s).nonzero().squeeze(1)
            out[b, where] = ref_sequence(
                batch["input_ids"][b, where],
                batch["segment_ids"][b, where],
                batch["position_ids"][b, where],
                p, cfg,
            )  # fmt: skip
    return out


# ----------------------------------------------------------------------------- batches


def rows_of(layouts, seq=24, seed=0):
    """Rows of the data contract holding sequences of the given lengths (ids 1..K, positions
    restarting at 0), padding after."""
    gen = torch.Generator().manual_seed(seed)
    rows = len(layouts)
    batch = {
        key: torch.zeros(rows, seq, dtype=torch.long)
        for key in ("input_ids", "segment_ids", "position_ids", "sequence_ids")
    }
    for r, lengths in enumerate(layouts):
        start = 0
        for s, n in enumerate(lengths, start=1):
            batch["input_ids"][r, start : start + n] = torch.randint(3, 60, (n,), generator=gen)
            batch["segment_ids"][r, start + n // 2 : start + n] = 1
            batch["position_ids"][r, start : start + n] = torch.arange(n)
            batch["sequence_ids"][r, start : start + n] = s
            start += n
    return batch


PACKED = [[9, 7, 5], [13, 11], [24]]
UNPACKED = [[24], [17], [6]]


def model_of(cfg, backend, seed=0):
    torch.manual_seed(seed)
    model = BertForPreTraining(cfg.replace(attention=backend))
    with torch.no_grad():  # non-trivial norm weights and biases, so that their roles show
        for name, param in model.named_parameters():
            if "norm" in name.lower() or name.endswith(".bias"):
                param.add_(torch.randn_like(param) * 0.1)
    return model


def check(cfg, backend, layouts):
    batch = rows_of(layouts)
    model = model_of(cfg, backend)
    params = dict(model.named_parameters())
    real = batch["sequence_ids"] != 0
    # a loss of order 1 (mean over the real tokens), so that 1e-5 is an fp32-sized tolerance
    weight = torch.randn(*batch["input_ids"].shape, cfg.hidden_size) / real.sum()
    # the reference runs in float64 on the same parameters (gradients come back in fp32)
    expected = ref_hidden(batch, {n: t.double() for n, t in params.items()}, cfg).float()
    names = list(params)
    train = backend != "flex"
    with torch.set_grad_enabled(train):
        got = model.bert(
            batch["input_ids"], batch["segment_ids"], batch["position_ids"], batch["sequence_ids"]
        )
    torch.testing.assert_close(got[real], expected[real], **FP32)
    if not train:
        return
    want = torch.autograd.grad((expected[real] * weight[real]).sum(), [params[n] for n in names],
                               allow_unused=True)  # fmt: skip
    have = torch.autograd.grad((got[real] * weight[real]).sum(), [params[n] for n in names],
                               allow_unused=True)  # fmt: skip
    for name, w, h in zip(names, want, have, strict=True):
        if w is None:
            assert h is None or not h.any(), name
            continue
        torch.testing.assert_close(h, w, **FP32, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen", "flex"])
@pytest.mark.parametrize("cfg", [MODERN, MOSAIC], ids=["modernbert", "mosaicbert"])
def test_combined_configs_match_the_reference(cfg, backend):
    torch.manual_seed(1)
    check(cfg, backend, PACKED)
    check(cfg, backend, UNPACKED)


@pytest.mark.parametrize("name", sorted(SINGLE))
def test_single_options_match_the_reference_on_math(name):
    torch.manual_seed(2)
    check(BertConfig(**BASE, **SINGLE[name]), "math", PACKED)


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen", "flex"])
@pytest.mark.parametrize("cfg", [MODERN, MOSAIC], ids=["modernbert", "mosaicbert"])
def test_read_rows_respect_the_window(cfg, backend):
    """The pretraining forward's queries-only last layer (output_positions) gives the full
    forward's rows at real tokens (the last layer of MODERN is local)."""
    batch = rows_of(PACKED)
    model = model_of(cfg, backend).eval()
    reads = torch.tensor([[0, 3, 10, 20, 17], [12, 1, 5, 23, 9], [4, 8, 23, 0, 15]])
    args = (batch["input_ids"], batch["segment_ids"], batch["position_ids"], batch["sequence_ids"])
    with torch.no_grad():
        full = model.bert(*args)
        rows = model.bert(*args, output_positions=reads)
    expected = torch.gather(full, 1, reads.unsqueeze(-1).expand(-1, -1, cfg.hidden_size))
    real = torch.gather(batch["sequence_ids"], 1, reads) != 0
    torch.testing.assert_close(rows[real], expected[real], **FP32)


def test_alibi_slopes():
    # Press et al.: 8 heads 1/2 ... 1/256; 3 and 6 heads: the non-power-of-two rule
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0**-i for i in range(1, 9)]))
    assert alibi_slopes(3).tolist() == ref_slopes(3)
    assert alibi_slopes(6).tolist() == [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3]


#: the state dict of a default (BERT) bert_tiny-shaped model before the modern options existed
BERT_KEYS = [
    "bert.embeddings.word_embeddings.weight", "bert.embeddings.position_embeddings.weight",
    "bert.embeddings.token_type_embeddings.weight", "bert.embeddings.LayerNorm.weight",
    "bert.embeddings.LayerNorm.bias",
    *(
        f"bert.encoder.layer.{i}.{name}"
        for i in range(2)
        for name in (
            "attention.self.query.weight", "attention.self.query.bias",
            "attention.self.key.weight", "attention.self.key.bias",
            "attention.self.value.weight", "attention.self.value.bias",
            "attention.output.dense.weight", "attention.output.dense.bias",
            "attention.output.LayerNorm.weight", "attention.output.LayerNorm.bias",
            "intermediate.dense.weight", "intermediate.dense.bias",
            "output.dense.weight", "output.dense.bias",
            "output.LayerNorm.weight", "output.LayerNorm.bias",
        )
    ),
    "bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.predictions.bias",
    "cls.predictions.transform.dense.weight", "cls.predictions.transform.dense.bias",
    "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.LayerNorm.bias",
    "cls.predictions.decoder.weight", "cls.predictions.decoder.bias",
    "cls.seq_relationship.weight", "cls.seq_relationship.bias",
]  # fmt: skip


def test_default_config_keeps_berts_state_dict():
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    model = BertForPreTraining(config)
    assert list(model.state_dict()) == BERT_KEYS
    assert config.is_bert and config.to_hf_dict()["architectures"] == ["BertForPreTraining"]


def test_modern_parameters():
    model = BertForPreTraining(MODERN.replace(tie_word_embeddings=False))
    names = set(dict(model.named_parameters()))
    assert "bert.embeddings.position_embeddings.weight" not in names
    assert "bert.embeddings.token_type_embeddings.weight" not in names
    assert not any("pooler" in n or "seq_relationship" in n for n in names)
    assert "bert.encoder.layer.0.attn_norm.weight" not in names  # ModernBERT: none in layer 0
    assert "bert.encoder.layer.1.attn_norm.weight" in names
    assert "bert.final_norm.weight" in names and "bert.final_norm.bias" not in names
    assert not any(n.endswith(".bias") for n in names if n != "cls.predictions.bias")
    wi = model.bert.encoder.layer[0].intermediate.dense.weight
    assert wi.shape == (2 * MODERN.intermediate_size, MODERN.hidden_size)
    decoder = model.cls.predictions.decoder.weight
    assert decoder is not model.bert.embeddings.word_embeddings.weight
    assert not decoder[MODERN.vocab_size :].any()


def test_no_nsp_head_returns_the_same_keys():
    batch = rows_of(PACKED)
    rows = len(PACKED)
    batch.update(
        masked_lm_positions=torch.tensor([[1, 2], [3, 4], [5, 6]]),
        masked_lm_ids=torch.randint(3, 60, (rows, 2)),
        masked_lm_weights=torch.ones(rows, 2),
        nsp_positions=torch.zeros(rows, 3, dtype=torch.long),
        nsp_labels=torch.zeros(rows, 3, dtype=torch.long),
        nsp_weights=torch.ones(rows, 3),
    )
    model = BertForPreTraining(MODERN.replace(attention="sdpa"))
    out = model(batch)
    assert out["nsp_loss"].item() == 0.0 and out["nsp_count"].item() == 0.0
    torch.testing.assert_close(out["loss"], out["mlm_loss"])
    out["loss"].backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"position_encoding": "sinusoid"}, "position_encoding"),
        ({"feed_forward": "moe"}, "feed_forward"),
        ({"norm_position": "sandwich"}, "norm_position"),
        ({"norm": "batchnorm"}, "norm"),
        ({"bias": "yes"}, "bias"),
        ({"local_window": -1}, "local_window"),
        ({"global_every": 0}, "global_every"),
        ({"rope_theta": 0.5}, "rope_theta"),
        ({"pooling": "max"}, "pooling"),
        ({"type_vocab_size": -1}, "type_vocab_size"),
        ({"position_encoding": "rope", "hidden_size": 30, "num_attention_heads": 2}, "rope"),
    ],
)
def test_bad_options_are_refused_in_one_sentence(changes, key):
    with pytest.raises(BertConfigError, match=key):
        BertConfig(**{**BASE, **changes})


def test_bert_export_refuses_modern_configs():
    with pytest.raises(BertConfigError, match="ModernBERT"):
        MODERN.to_hf_dict()
    assert "position_encoding=rope vs learned" in MODERN.architecture_mismatches(
        MODERN.replace(position_encoding="learned")
    )


# ----------------------------------------------------------------------------- presets and app
PRESETS = {
    "modernbert_base": (22, 768, 12, 1152, "rope"),
    "modernbert_large": (28, 1024, 16, 2624, "rope"),
    "mosaicbert_base": (12, 768, 12, 3072, "alibi"),
    "modern_tiny": (2, 128, 2, 192, "rope"),
    "modern_mini": (4, 256, 4, 384, "rope"),
}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_compose_into_a_config(name):
    from omegaconf import OmegaConf

    from omnibert.apps.compose import compose

    cfg = compose("pretrain", [f"model={name}", "data=generated"])
    values = OmegaConf.to_container(cfg.model.config, resolve=True)
    config = BertConfig.from_dict({**values, "vocab_size": 30522})
    layers, hidden, heads, inter, positions = PRESETS[name]
    assert (config.num_hidden_layers, config.hidden_size) == (layers, hidden)
    assert (config.num_attention_heads, config.intermediate_size) == (heads, inter)
    assert config.position_encoding == positions and config.feed_forward == "geglu"
    assert not config.next_sentence_head and not config.is_bert
    kinds = {config.is_local(i) for i in range(layers)}
    assert kinds == ({False} if positions == "alibi" else {False, True})


def test_train_app_runs_modern_tiny_end_to_end(tmp_path):
    from omnibert.apps.compose import compose
    from omnibert.apps.train import run_or_exit

    overrides = [
        "model=modern_tiny", "data=generated", "phase.max_steps=2", "phase.global_batch_size=8",
        "micro_batch_size=4", "phase.max_seq_length=64", "phase.max_predictions_per_seq=10",
        "data.vocab_size=128", "data.num_train_samples=64", "data.num_eval_samples=8",
        "data.num_workers=0", "logger=none", "callbacks=minimal", "val_every_n_steps=2",
        f"paths.output_root={tmp_path}",
    ]  # fmt: skip
    summary = run_or_exit(compose("pretrain", overrides), tmp_path / "out")
    assert summary["steps"] == 2
    val = summary["validation"]
    assert not [k for k in val if "nsp" in k]  # MLM only: no NSP metric at all
    assert val["val/loss"] == val["val/mlm_loss"] and math.isfinite(val["val/loss"])
    assert summary["plan"]["objective"] == "MLM only"


def test_exporter_refuses_a_model_without_hf_class_before_writing(tmp_path):
    from omnibert.convert.hf_export import export_hf

    # MosaicBERT (alibi, post-norm) is neither BERT nor ModernBERT; MODERN exports as
    # ModernBERT (tests/unit/test_modernbert_interop.py)
    model = BertForPreTraining(MOSAIC)
    with pytest.raises(BertConfigError, match="position_encoding=alibi"):
        export_hf(model, tmp_path / "out", None)
    assert not (tmp_path / "out").exists()


def test_norms_of_pre_norm_layers_get_no_weight_decay():
    from omnibert.optim.param_groups import BERT_NO_WEIGHT_DECAY, build_param_groups

    model = BertForPreTraining(MODERN.replace(norm="rmsnorm"))
    decayed, undecayed = build_param_groups(model, 0.01, BERT_NO_WEIGHT_DECAY)
    undecayed_ids = {id(p) for p in undecayed["params"]}
    for name, param in model.named_parameters():
        is_norm = "norm" in name.lower()
        assert (id(param) in undecayed_ids) == (is_norm or name.endswith("bias")), name
    assert decayed["weight_decay"] == 0.01


def test_mean_pooling_classifier():
    from omnibert.models.heads import BertForSequenceClassification

    torch.manual_seed(0)
    cfg = BertConfig(**BASE, pooling="mean", next_sentence_head=False)
    model = BertForSequenceClassification(cfg, num_labels=3).eval()
    ids = torch.randint(3, 60, (2, 10))
    mask = torch.tensor([[1] * 10, [1] * 6 + [0] * 4])
    with torch.no_grad():
        logits = model(ids, torch.zeros_like(ids), mask)
        hidden = model.bert(ids, torch.zeros_like(ids), torch.arange(10).expand(2, 10), mask)
    mean = torch.stack([hidden[0].mean(0), hidden[1, :6].mean(0)])
    torch.testing.assert_close(logits, model.classifier(mean), **FP32)


def test_activation_estimate_counts_the_modern_layers():
    """The automatic micro batch's estimate runs the real model on the meta device: a gated
    feed-forward keeps more, a model without position / token-type tables has fewer
    parameters, and rope, alibi and windows run there too."""
    from omnibert.run.sizing.activation_memory import estimate

    shapes = {"input_ids": [4, 64], "masked_lm_positions": [4, 10], "nsp_labels": [4, 2]}
    plain = BertConfig(**BASE)
    runs = {
        name: estimate(cfg, shapes, "32-true", None, flops=False)
        for name, cfg in {
            "mlp": plain,
            "geglu": plain.replace(feed_forward="geglu"),
            "modern": MODERN,
            "mosaic": MOSAIC.replace(local_window=16, global_every=2),
        }.items()
    }
    acts = {name: run["memory"]["activations"] for name, run in runs.items()}
    assert acts["geglu"] > acts["mlp"] and acts["modern"] > 0 and acts["mosaic"] > 0
    geglu_params = runs["geglu"]["parameters"] - runs["mlp"]["parameters"]
    assert geglu_params == BASE["num_hidden_layers"] * (BASE["hidden_size"] + 1) * 48
