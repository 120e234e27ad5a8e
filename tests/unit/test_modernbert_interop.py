"""Hugging Face ModernBERT interop (omnibert.convert.modernbert): omnibert's modern family
exports as ``transformers.ModernBertForMaskedLM`` with equal logits, Hugging Face ModernBERT
directories import with equal logits and export back to the same tensors, and what has no
Hugging Face class is refused in one sentence before any file is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from omegaconf import OmegaConf
from safetensors.torch import load_file

from omnibert.convert import ConversionError, export_hf, init_from_hf, read_hf_config
from omnibert.models import BertConfig, BertConfigError, BertForPreTraining

FP32 = {"rtol": 1e-5, "atol": 1e-5}
VOCAB = 99  # not a multiple of 8: our padded rows must be stripped / stay zero
CONF = Path(__file__).resolve().parents[2] / "conf" / "model"


def preset(name: str, **changes: object) -> BertConfig:
    """A conf/model preset's config with this vocabulary (and ``changes``)."""
    values = OmegaConf.to_container(OmegaConf.load(CONF / f"{name}.yaml").config)
    assert isinstance(values, dict)
    return BertConfig.from_dict({**values, "vocab_size": VOCAB, **changes})


def write_vocab(path: Path, size: int = VOCAB) -> Path:
    """A BERT-layout vocab.txt: [PAD] [UNK] [CLS] [SEP] [MASK], then words."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    path.write_text("".join(f"{t}\n" for t in specials + [f"w{i}" for i in range(size - 5)]))
    return path


def random_model(config: BertConfig, seed: int = 0) -> BertForPreTraining:
    """Every parameter perturbed (norm weights away from 1, biases away from 0), so that a
    misplaced tensor changes the logits; vocabulary padding rows zero."""
    torch.manual_seed(seed)
    model = BertForPreTraining(config)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * 0.1)
        model.bert.embeddings.word_embeddings.weight[config.vocab_size :] = 0
        if model.cls.predictions.bias is not None:
            model.cls.predictions.bias[config.vocab_size :] = 0
        if not config.tie_word_embeddings:
            model.cls.predictions.decoder.weight[config.vocab_size :] = 0
    return model.eval()


def inputs(seq: int, padded_from: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two rows of ``seq`` tokens: the first all real, the second padded from
    ``padded_from`` on (attention mask 1 real, 0 padding)."""
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(5, VOCAB, (2, seq), generator=gen)
    ids[:, 0] = 2  # [CLS]
    mask = torch.ones(2, seq, dtype=torch.long)
    mask[1, padded_from:] = 0
    ids[1, padded_from:] = 0
    return ids, mask


def omnibert_logits(
    model: BertForPreTraining, ids: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """MLM logits at every position (the pretraining forward computes masked positions only:
    encoder + MLM head here), real vocabulary columns only."""
    batch, seq = ids.shape
    positions = torch.arange(seq).expand(batch, seq)
    with torch.no_grad():
        hidden = model.bert(ids, torch.zeros_like(ids), positions, mask)
        logits: torch.Tensor = model.cls.predictions(hidden)
    return logits[..., : model.config.vocab_size]


def hf_logits(hf: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out: torch.Tensor = hf(input_ids=ids, attention_mask=mask).logits
    return out


def load_hf(path: Path) -> transformers.ModernBertForMaskedLM:
    hf, info = transformers.ModernBertForMaskedLM.from_pretrained(
        str(path), attn_implementation="eager", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    return hf.eval()


# ----------------------------------------------------------------------------- export

EXPORTED = {
    "modern_tiny": {},
    # every other switch the exporter maps: biases everywhere, untied decoder without bias,
    # SwiGLU (Hugging Face's hidden_activation=silu), mean pooling, a tanh-GELU head
    "switches": {
        "bias": True,
        "decoder_bias": False,
        "tie_word_embeddings": False,
        "feed_forward": "swiglu",
        "pooling": "mean",
        "hidden_act": "gelu_pytorch_tanh",
        "rope_theta": 5000.0,
    },
}


@pytest.mark.parametrize("name", sorted(EXPORTED))
def test_export_loads_in_transformers_with_equal_logits(tmp_path: Path, name: str) -> None:
    config = preset("modern_tiny", **EXPORTED[name])
    assert config.local_window == 64 and config.is_local(1) and not config.is_local(0)
    model = random_model(config)
    vocab = write_vocab(tmp_path / "vocab.txt")
    out = tmp_path / "hf"
    written = export_hf(model, out, vocab)
    assert sorted(p.name for p in written) == ["config.json", "model.safetensors", "vocab.txt"]
    hf_config = json.loads((out / "config.json").read_text())
    assert hf_config["model_type"] == "modernbert"
    assert hf_config["architectures"] == ["ModernBertForMaskedLM"]
    assert hf_config["vocab_size"] == VOCAB
    assert hf_config["layer_types"] == ["full_attention", "sliding_attention"]
    assert hf_config["local_attention"] == 64
    ids = {k: hf_config[f"{k}_token_id"] for k in ("pad", "cls", "sep", "mask")}
    assert ids == {"pad": 0, "cls": 2, "sep": 3, "mask": 4}
    tensors = load_file(str(out / "model.safetensors"))
    assert tensors["model.embeddings.tok_embeddings.weight"].shape == (VOCAB, 128)
    assert ("decoder.weight" in tensors) == (not config.tie_word_embeddings)
    hf = load_hf(out)
    # a row longer than the local window (80 > 64: layer 1 sees only part of it) and a
    # padded one
    tokens, mask = inputs(80, padded_from=50)
    ours = omnibert_logits(model, tokens, mask)
    theirs = hf_logits(hf, tokens, mask)
    real = mask.bool()  # padding rows attend to padding in omnibert, to real tokens in HF
    torch.testing.assert_close(ours[real], theirs[real], **FP32)
    # the window matters at this length: all-global attention gives other logits
    everywhere = random_model(config.replace(local_window=0))
    assert not torch.allclose(omnibert_logits(everywhere, tokens, mask)[real], theirs[real])


UNEXPORTABLE = {
    "position_encoding=alibi": ("mosaicbert_base", {}),
    "norm=rmsnorm": ("modern_tiny", {"norm": "rmsnorm"}),
    "norm_position=post": ("modern_tiny", {"norm_position": "post"}),
    "type_vocab_size=2": ("modern_tiny", {"type_vocab_size": 2}),
    "next_sentence_head=true": ("modern_tiny", {"next_sentence_head": True}),
    "embedding_norm=false": ("modern_tiny", {"embedding_norm": False}),
    "feed_forward=mlp": ("modern_tiny", {"feed_forward": "mlp"}),
}


@pytest.mark.parametrize("option", sorted(UNEXPORTABLE))
def test_architectures_without_a_hf_class_are_refused_before_writing(
    tmp_path: Path, option: str
) -> None:
    name, changes = UNEXPORTABLE[option]
    small = {"hidden_size": 32, "num_attention_heads": 2, "intermediate_size": 48}
    config = preset(name, **small, num_hidden_layers=2, **changes)
    out = tmp_path / "out"
    with pytest.raises(BertConfigError) as err:
        export_hf(BertForPreTraining(config), out, write_vocab(tmp_path / "vocab.txt"))
    text = str(err.value)
    assert option in text and "no Hugging Face class" in text, text
    assert "\n" not in text and text.endswith("."), text
    assert not out.exists()


# ----------------------------------------------------------------------------- import

#: a small Hugging Face ModernBERT in transformers' own terms (layers 0 and 3 global)
HF_CONFIG = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 40,
    "num_hidden_layers": 4,
    "num_attention_heads": 2,
    "max_position_embeddings": 128,
    "global_attn_every_n_layers": 3,
    "local_attention": 16,
    "global_rope_theta": 20000.0,
    "local_rope_theta": 700.0,
    "pad_token_id": 0,
    "cls_token_id": 2,
    "sep_token_id": 3,
    "bos_token_id": 2,
    "eos_token_id": 3,
}


def hf_checkpoint(path: Path, seed: int = 1, **changes: object) -> Path:
    """A randomly initialised ModernBertForMaskedLM (norm weights and the decoder bias
    perturbed too) saved with ``save_pretrained``."""
    torch.manual_seed(seed)
    hf = transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(**{**HF_CONFIG, **changes})
    )
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or name.endswith("bias"):
                param.add_(torch.randn_like(param) * 0.1)
    hf.save_pretrained(str(path))
    return path


def test_hf_modernbert_imports_with_equal_logits_and_exports_back(tmp_path: Path) -> None:
    source = hf_checkpoint(tmp_path / "hf")
    config = read_hf_config(source)
    assert (config.local_window, config.global_every) == (16, 3)
    assert (config.rope_theta, config.rope_theta_local) == (20000.0, 700.0)
    assert config.feed_forward == "geglu" and not config.bias and config.padded_vocab_size == 104
    model = random_model(config, seed=5)
    report = init_from_hf(model, source)
    assert not report.missing and not report.fresh_heads and not report.ignored, report
    tokens, mask = inputs(40, padded_from=25)  # 40 > 16: the window matters
    real = mask.bool()
    hf = load_hf(source)
    torch.testing.assert_close(
        omnibert_logits(model, tokens, mask)[real], hf_logits(hf, tokens, mask)[real], **FP32
    )
    assert not model.bert.embeddings.word_embeddings.weight[VOCAB:].any()
    out = tmp_path / "back"
    export_hf(model, out, None)
    original = load_file(str(source / "model.safetensors"))
    exported = load_file(str(out / "model.safetensors"))
    assert sorted(exported) == sorted(original)
    for key, tensor in original.items():
        assert torch.equal(exported[key], tensor), key
    theirs = json.loads((source / "config.json").read_text())
    ours = json.loads((out / "config.json").read_text())
    for key in ("layer_types", "rope_parameters", "local_attention", "norm_eps", "vocab_size"):
        assert ours[key] == theirs[key], key


def test_bare_modernbert_model_loads_the_encoder(tmp_path: Path) -> None:
    source = hf_checkpoint(tmp_path / "full")
    hf = transformers.ModernBertForMaskedLM.from_pretrained(str(source)).eval()
    bare = tmp_path / "bare"
    hf.model.save_pretrained(str(bare))
    model = random_model(read_hf_config(bare), seed=7)
    head_before = model.cls.predictions.transform.dense.weight.clone()
    report = init_from_hf(model, bare)
    assert report.fresh_heads == ["cls.predictions"], report
    assert torch.equal(model.cls.predictions.transform.dense.weight, head_before)
    tokens, mask = inputs(40, padded_from=30)
    with torch.no_grad():
        theirs = hf.model(input_ids=tokens, attention_mask=mask).last_hidden_state
        positions = torch.arange(40).expand(2, 40)
        ours = model.bert(tokens, torch.zeros_like(tokens), positions, mask)
    torch.testing.assert_close(ours[mask.bool()], theirs[mask.bool()], **FP32)


def test_import_refusals_name_the_fix(tmp_path: Path) -> None:
    source = hf_checkpoint(tmp_path / "hf")
    bert = BertForPreTraining(BertConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2))
    with pytest.raises(ConversionError) as err:
        init_from_hf(bert, source)
    text = str(err.value)
    assert "model=modernbert_base" in text and "ModernBERT" in text and "\n" not in text
    config = read_hf_config(source)
    wrong = BertForPreTraining(config.replace(local_window=32, intermediate_size=48))
    before = {k: v.clone() for k, v in wrong.state_dict().items()}
    with pytest.raises(ConversionError) as err:
        init_from_hf(wrong, source)
    text = str(err.value)
    assert "intermediate_size=48 vs 40" in text and "local_window=32 vs 16" in text, text
    assert all(torch.equal(before[k], v) for k, v in wrong.state_dict().items())
    # options omnibert cannot express are refused when config.json is read
    odd = hf_checkpoint(tmp_path / "odd", mlp_bias=True)
    with pytest.raises(ConversionError, match="mlp_bias=true"):
        read_hf_config(odd)
    tanh = hf_checkpoint(tmp_path / "tanh", hidden_activation="gelu_pytorch_tanh")
    with pytest.raises(ConversionError, match="hidden_activation='gelu_pytorch_tanh'"):
        read_hf_config(tanh)


def test_pretraining_init_from_refuses_the_other_family(tmp_path: Path) -> None:
    from omnibert.checkpoints.init_from import InitFromError, plan_pretraining_init

    source = hf_checkpoint(tmp_path / "hf")
    bert = BertConfig(vocab_size=VOCAB, hidden_size=32, num_attention_heads=2).to_dict()
    with pytest.raises(InitFromError, match="use model=modernbert_base"):
        plan_pretraining_init(str(source), None, bert)
    modern = read_hf_config(source).to_dict()
    assert plan_pretraining_init(str(source), None, modern).kind == "huggingface"


def test_train_app_starts_modern_tiny_from_a_hf_modernbert_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnibert.apps.compose import compose
    from omnibert.apps.train import run_or_exit

    tiny = preset("modern_tiny", vocab_size=128)
    source = hf_checkpoint(
        tmp_path / "hf",
        vocab_size=128,
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_hidden_layers,
        num_attention_heads=tiny.num_attention_heads,
        max_position_embeddings=tiny.max_position_embeddings,
        global_attn_every_n_layers=tiny.global_every,
        local_attention=tiny.local_window,
        global_rope_theta=tiny.rope_theta,
        local_rope_theta=tiny.rope_theta_local,
    )
    overrides = [
        "model=modern_tiny", "data=generated", f"model.init_from={source}",
        "phase.max_steps=1", "phase.global_batch_size=4", "micro_batch_size=4",
        "phase.max_seq_length=64", "phase.max_predictions_per_seq=10", "data.vocab_size=128",
        "data.num_train_samples=16", "data.num_eval_samples=4", "data.num_workers=0",
        "logger=none", "callbacks=minimal", "val_every_n_steps=1",
        f"paths.output_root={tmp_path}",
    ]  # fmt: skip
    summary = run_or_exit(compose("pretrain", overrides), tmp_path / "out")
    assert summary["steps"] == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if "initialised from" in x)
    # every parameter of the model (the tied decoder aside) loaded, no head left fresh
    count = len(BertForPreTraining(tiny).state_dict()) - 2
    assert f"Hugging Face weights from {source}: loaded {count} tensors" in line, line
    assert "freshly" not in line and "ignored" not in line, line


def test_export_app_writes_a_modern_checkpoint_as_modernbert(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_hf_interop import lightning_checkpoint

    from omnibert.apps import export as export_app
    from omnibert.apps.compose import compose

    model = random_model(preset("modern_tiny"))
    vocab = write_vocab(tmp_path / "vocab.txt")
    ckpt = lightning_checkpoint(tmp_path / "last.ckpt", model, vocab)
    out = tmp_path / "hf"
    export_app.run(compose("export", [f"ckpt={ckpt}", f"out={out}"]))
    assert "ModernBertForMaskedLM.from_pretrained" in capsys.readouterr().out
    tokens, mask = inputs(70, padded_from=40)
    real = mask.bool()
    torch.testing.assert_close(
        omnibert_logits(model, tokens, mask)[real],
        hf_logits(load_hf(out), tokens, mask)[real],
        **FP32,
    )
