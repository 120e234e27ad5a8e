"""omnibert-eval names the checkpoint's own step (its ``global_step``) in the report, the
summary and the validation progress line; the Trainer it builds never trained, and its step
0 used to be printed for every checkpoint. A Hugging Face directory records no step."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from omnibert.apps import eval as eval_app
from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare as prepare_shards

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"


@pytest.fixture(scope="module")
def step_300(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> dict:
    """Seq-32 eval shards and a tiny checkpoint as omnibert-train writes it at step 300."""
    root = tmp_path_factory.mktemp("eval_step")
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    prepare_shards([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, root / "eval",
                   settings, progress=False)  # fmt: skip
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=64)  # fmt: skip
    model = BertForPreTraining(config)
    ckpt = root / "step-300.ckpt"
    torch.save({
        "global_step": 300,
        "state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
        "hyper_parameters": {"model_config": config.to_dict(), "vocab_file": str(bert_vocab_file)},
    }, ckpt)  # fmt: skip
    return {"root": root, "ckpt": ckpt}


def test_the_report_and_the_lines_name_the_checkpoints_step(step_300, capsys):
    data = f"data.eval_path={step_300['root'] / 'eval'}"
    capsys.readouterr()
    report = eval_app.run_or_exit(compose("eval", [f"ckpt={step_300['ckpt']}", data]), None)
    out = capsys.readouterr().out
    assert report["step"] == 300
    assert "omnibert-eval: validation at step 300: mlm_acc" in out, out
    assert "at step 0" not in out
    assert f"omnibert-eval: {step_300['ckpt']} (omnibert, step 300) on " in out
    hf = step_300["root"] / "hf"
    # BertForPreTraining (with its NSP head): omnibert-eval scores next-sentence accuracy too
    export_app.run(
        compose("export", [f"ckpt={step_300['ckpt']}", f"out={hf}", "heads=pretraining"])
    )
    capsys.readouterr()
    exported = eval_app.run_or_exit(compose("eval", [f"ckpt={hf}", data]), None)
    out = capsys.readouterr().out
    assert exported["step"] is None and exported["mlm_accuracy"] == report["mlm_accuracy"]
    assert "omnibert-eval: validation: mlm_acc" in out and "at step" not in out, out
    assert f"omnibert-eval: {hf} (huggingface) on " in out


def test_a_tf1_checkpoint_gives_its_global_step_variable():
    from omnibert.run.tools.evaluation import checkpoint_step

    prefix = Path(__file__).parents[1] / "fixtures" / "tf1" / "model.ckpt-7"
    assert checkpoint_step(prefix, "tf1") == 7
    assert checkpoint_step(f"{prefix}.index", "tf1") == 7
    assert checkpoint_step(prefix.parent / "missing", "omnibert") is None
