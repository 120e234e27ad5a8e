"""Fine-tuning from modern-family checkpoints: an omnibert modern pretraining checkpoint and a
Hugging Face ModernBERT directory (omnibert.convert.modernbert) start GLUE (MRPC, on the
tiny TSV fixture) and SQuAD runs with the whole encoder loaded, the classifier pools per the
family (``pooling``: ModernBERT's ``classifier_pooling``), omnibert-predict gives the run's
own metrics and answers, and the fine-tuned modern model, whose heads are not Hugging Face's
ModernBertFor* heads, is refused by omnibert-export in one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from finetune_data import mrpc_file, squad_file

from omnibert.apps import export as export_app
from omnibert.apps import finetune, predict
from omnibert.apps.compose import compose
from omnibert.convert import export_hf
from omnibert.errors import UserError
from omnibert.models import BertConfig, BertForPreTraining

#: modern_tiny's options at test size: layer 0 global, layer 1 local (window 16 < 64 tokens)
MODERN = dict(
    vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=48, max_position_embeddings=128, type_vocab_size=0,
    position_encoding="rope", rope_theta=160000.0, feed_forward="geglu", norm_position="pre",
    bias=False, local_window=16, global_every=2, next_sentence_head=False,
    layer_norm_eps=1e-5, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
)  # fmt: skip
FAST = ["task.epochs=1", "task.batch_size=8", "task.lr=1e-3", "task.max_seq_length=64",
        "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false"]  # fmt: skip


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def modern_sources(tmp_path_factory, bert_vocab_file) -> dict[str, Path]:
    """A random modern encoder as a Hugging Face ModernBERT directory (mean pooling) and as
    an omnibert pretraining checkpoint (cls pooling)."""
    tmp = tmp_path_factory.mktemp("modern_sources")
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(**MODERN, pooling="mean"))
    hf = tmp / "hf"
    export_hf(model, hf, bert_vocab_file)
    ckpt = tmp / "last.ckpt"
    torch.save(
        {
            "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "hyper_parameters": {
                "model_config": BertConfig(**MODERN).to_dict(),
                "vocab_file": str(bert_vocab_file),
            },
            "global_step": 1,
        },
        ckpt,
    )
    return {"huggingface": hf, "omnibert": ckpt}


@pytest.mark.parametrize("source", ["huggingface", "omnibert"])
def test_glue_from_a_modern_checkpoint_trains_and_predicts(tmp_path, modern_sources, source):
    from omnibert.checkpoints.reading import load_finetuned

    train, dev = mrpc_file(tmp_path / "train.tsv", 16, 1), mrpc_file(tmp_path / "dev.tsv", 8, 2)
    summary = finetune.run(compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={modern_sources[source]}", f"paths.output_root={tmp_path / 'runs'}",
        *FAST,
    ]))  # fmt: skip
    # the whole encoder loaded (it has no pooler), only the classifier is new
    assert summary["new_keys"] == ["classifier.weight", "classifier.bias"]
    assert summary["steps"] == 2 and summary["train_loss_first"] != summary["train_loss_last"]
    run_dir = Path(summary["run_dir"])
    config = load_finetuned(run_dir).task.model.config
    assert (config.position_encoding, config.local_window, config.type_vocab_size) == (
        "rope",
        16,
        0,
    )
    # Hugging Face's classifier_pooling=mean came with the directory; the .ckpt pools cls
    assert config.pooling == ("mean" if source == "huggingface" else "cls")
    out = tmp_path / "p.jsonl"
    scored = predict.run(compose("predict", [f"ckpt={run_dir}", f"input_file={dev}", f"out={out}"]))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 8
    assert {r["label"] for r in records} <= {"equivalent", "not_equivalent"}
    assert scored["accuracy"] == pytest.approx(summary["accuracy"])
    # the fine-tuned modern classifier has no Hugging Face class: one sentence, no file
    with pytest.raises(UserError, match="modern") as err:
        export_app.run(compose("export", [f"ckpt={run_dir}", f"out={tmp_path / 'x'}"]))
    assert "\n" not in str(err.value)
    assert not (tmp_path / "x").exists()


def test_squad_from_a_hf_modernbert_directory(tmp_path, modern_sources):
    train = squad_file(tmp_path / "train.json", 4, 3, facts=2)
    dev = squad_file(tmp_path / "dev.json", 3, 4, facts=2)
    summary = finetune.run(compose("finetune", [
        "task=squad", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={modern_sources['huggingface']}",
        f"paths.output_root={tmp_path / 'runs'}", *FAST,
    ]))  # fmt: skip
    assert summary["new_keys"] == ["qa_outputs.weight", "qa_outputs.bias"]
    assert summary["eval_examples"] == 6
    run_dir = Path(summary["run_dir"])
    out = tmp_path / "a.jsonl"
    result = predict.run(compose("predict", [f"ckpt={run_dir}", f"input_file={dev}", f"out={out}"]))
    records = [json.loads(line) for line in out.read_text().splitlines()]
    official = json.loads((run_dir / "eval" / "predictions.json").read_text())
    assert {r["id"]: r["answer"] for r in records} == official
    assert result["f1"] == pytest.approx(summary["f1"])
