"""scripts/bench_finetune.py --mode trainer on a few MRPC template pairs, so the end-to-end
benchmark against the Hugging Face Trainer cannot rot: both sides train from the same MiniLM
and the same fresh head, and the record holds each side's time and metric."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("accelerate", reason="the Trainer needs the bench extra")


def test_trainer_mode_runs_both_sides_from_the_same_head(tmp_path: Path) -> None:
    results = tmp_path / "results"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_finetune.py"), "--mode", "trainer",
         "--tasks", "mrpc", "--seeds", "3", "--epochs", "1", "--batch", "8", "--lr", "5e-5",
         "--mrpc-pairs", "16", "--mrpc-dev-pairs", "8", "--mrpc-seq", "64", "--threads", "1",
         "--results-dir", str(results)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "16 pairs training / 8 pairs dev examples" in proc.stdout
    assert "the same fresh head on both sides" in proc.stdout
    record = json.loads((results / "finetune-trainer-mrpc.json").read_text())
    measured = record["measurements"]
    for side in ("omnibert", "hf"):
        (seconds,) = measured["seconds"][side]
        (score,) = measured["scores"][side]
        assert seconds > 0, side
        assert score in {i / 8 for i in range(9)}, (side, score)  # an accuracy over 8 pairs
    assert "seed 3:" in " ".join(record["notes"])


def test_the_seed_head_is_the_same_in_both_frameworks() -> None:
    import torch
    import transformers

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_finetune

    from omnibert.models.config import BertConfig
    from omnibert.models.heads import BertForSequenceClassification

    config = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    ours = BertForSequenceClassification(BertConfig(**config), num_labels=2)
    theirs = transformers.BertForSequenceClassification(transformers.BertConfig(**config))
    for model in (ours, theirs):
        bench_finetune.set_head(model, "mrpc", seed=3)
    assert torch.equal(ours.classifier.weight, theirs.classifier.weight)
    assert torch.equal(ours.classifier.bias, torch.zeros(2))
    bench_finetune.set_head(ours, "mrpc", seed=4)  # another seed, another head
    assert not torch.equal(ours.classifier.weight, theirs.classifier.weight)
    assert 0.01 < float(theirs.classifier.weight.detach().std()) < 0.03
