"""The MLM-only objective (a model without a next-sentence head) in the task and run layer:
no NSP metric is logged, validated, printed or reported (no 0/0 accuracy), ``val/loss`` is the
masked-LM loss, the plan says "objective: MLM only", ``omnibert-eval`` works and counts its
samples.

The model's side (``model.config.next_sentence_head=false``: no NSP head, ``nsp_count`` 0,
``loss = mlm_loss``) lives in ``omnibert.models``. Where this tree's ``BertConfig`` has that
field the tests run the real model; where it has not yet, a stand-in with that contract:
the model's outputs with the NSP terms zeroed and the objective read as MLM-only.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import re
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from omnibert.apps import eval as eval_app
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit as train
from omnibert.config import TrainConfig
from omnibert.data.collate import PretrainingCollator
from omnibert.data.generated import GeneratedRows
from omnibert.models import BertConfig
from omnibert.tasks.pretraining import PretrainingTask

HAS_FIELD = "next_sentence_head" in {f.name for f in dataclasses.fields(BertConfig)}
SMOKE = ["experiment=smoke", "phase.max_steps=2", "val_every_n_steps=1",
         "data.num_eval_samples=13", "eval_micro_batch_size=8", "logger=csv",
         "data.next_sentence=false"]  # fmt: skip


@pytest.fixture
def mlm_only(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The overrides that make the smoke model MLM-only (the real field, or the stand-in)."""
    if HAS_FIELD:
        return ["model.config.next_sentence_head=false"]
    from omnibert.models.pretraining import BertForPreTraining
    from omnibert.run.pretraining import plan as run_pretraining
    from omnibert.tasks import pretraining as task_module

    forward = BertForPreTraining.forward

    def without_nsp(self, batch, *args, **kwargs):  # the head's contract: NSP terms 0
        out = forward(self, batch, *args, **kwargs)
        zero = out["nsp_loss"] * 0.0
        return {**out, "nsp_loss": zero, "nsp_correct": zero.detach(),
                "nsp_count": zero.detach(), "loss": out["mlm_loss"]}  # fmt: skip

    monkeypatch.setattr(BertForPreTraining, "forward", without_nsp)
    monkeypatch.setattr(task_module, "next_sentence_objective", lambda config: False)
    monkeypatch.setattr(run_pretraining, "next_sentence_objective", lambda config: False)
    return []


def _no_nsp(keys) -> list[str]:
    return [k for k in keys if "nsp" in k]


def test_validation_metrics_without_a_next_sentence_head_have_no_nsp(mlm_only):
    config = dict(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=32)  # fmt: skip
    if HAS_FIELD:
        config["next_sentence_head"] = False
    task = PretrainingTask(model_config=config)
    assert task.next_sentence is False
    rows = GeneratedRows(2, vocab_size=64, max_seq_length=16, max_predictions_per_seq=3,
                         seed=1, next_sentence=False)  # fmt: skip
    # a short eval batch: 2 rows padded to 3 (the padding row weighs nothing)
    batch = PretrainingCollator(16, 3, batch_size=3)([rows[0], rows[1]])
    batch = {k: torch.as_tensor(v) for k, v in batch.items()}
    masked = int(batch["masked_lm_weights"].sum())
    with torch.no_grad():
        task.validation_step(batch, 0)
    metrics = {k: float(v) for k, v in task.validation_metrics().items()}
    assert _no_nsp(metrics) == []
    assert metrics["val/samples"] == 2.0 and metrics["val/mlm_count"] == masked
    assert metrics["val/loss"] == metrics["val/mlm_loss"]
    assert all(math.isfinite(v) for v in metrics.values())


def test_an_mlm_only_run_logs_and_reports_no_nsp(mlm_only, tmp_path, capsys, caplog):
    out = tmp_path / "out"
    with caplog.at_level(logging.WARNING):
        summary = train(compose("pretrain", [*SMOKE, *mlm_only, f"paths.output_root={tmp_path}"]),
                        out)  # fmt: skip
    assert not [r for r in caplog.records if "next-sentence" in r.getMessage()]
    printed = capsys.readouterr().out
    assert summary["objective"] == "MLM only"
    assert summary["plan"]["objective"] == "MLM only"
    assert re.search(r"^  objective +MLM only$", printed, re.M)  # the plan
    val = summary["validation"]
    assert _no_nsp(val) == [] and _no_nsp(summary) == []
    assert val["val/loss"] == pytest.approx(val["val/mlm_loss"])
    assert val["val/samples"] == 13
    assert "NSP" not in printed and "nan" not in printed.lower()
    saved = json.loads((out / "summary.json").read_text())
    assert _no_nsp(saved) == [] and _no_nsp(saved["validation"]) == []
    # the CSV logger's columns: the train and validation metrics, none of NSP
    metrics = next(tmp_path.rglob("metrics.csv"))
    with metrics.open(newline="") as f:
        columns = next(csv.reader(f))
    assert "train/mlm_acc" in columns and "val/mlm_acc" in columns
    assert _no_nsp(columns) == []

    # omnibert-eval of the run's checkpoint on the same generated eval rows
    cfg = compose("eval", [f"ckpt={summary['last_checkpoint']}", "data=generated",
                           "data.vocab_size=128", "data.num_eval_samples=13",
                           "data.next_sentence=false", "phase.max_seq_length=32",
                           "phase.max_predictions_per_seq=5", "eval_micro_batch_size=8"])  # fmt: skip
    with open_dict(cfg):  # eval.yaml's data.train_path is the file sources'
        cfg.data.pop("train_path")
    report = eval_app.run_or_exit(cfg, tmp_path / "eval")
    printed = capsys.readouterr().out
    assert report["objective"] == "MLM only" and _no_nsp(report) == []
    assert report["samples"] == 13
    assert report["mlm_accuracy"] == pytest.approx(val["val/mlm_acc"], abs=1e-6)
    assert report["loss"] == pytest.approx(val["val/mlm_loss"], rel=1e-5)
    assert "next-sentence" not in printed and "objective           MLM only" in printed


def test_a_next_sentence_head_on_rows_without_pairs_is_warned_about(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="omnibert.train"):
        train(compose("pretrain", [*SMOKE, "phase.max_steps=1", "val_every_n_steps=null",
                                   f"paths.output_root={tmp_path}"]), None)  # fmt: skip
    warned = [r.getMessage() for r in caplog.records if "next-sentence head" in r.getMessage()]
    assert len(warned) == 1 and "set model.config.next_sentence_head=false" in warned[0]


def test_a_bert_run_still_reports_next_sentence(tmp_path):
    summary = train(compose("pretrain", [*SMOKE[:-1], "phase.max_steps=1",
                                         f"paths.output_root={tmp_path}"]), None)  # fmt: skip
    assert summary["objective"] == "MLM + next-sentence"
    val = summary["validation"]
    assert {"val/nsp_acc", "val/nsp_loss", "val/nsp_count"} <= set(val)
    assert val["val/loss"] == pytest.approx(val["val/mlm_loss"] + val["val/nsp_loss"])
    assert val["val/samples"] == val["val/nsp_count"] == 13
    assert "nsp_majority_baseline" in summary


def test_generated_rows_without_sentence_pairs_and_at_another_masking_rate():
    kw = dict(vocab_size=128, max_seq_length=64, max_predictions_per_seq=40, seed=3)
    bert = GeneratedRows(200, **kw).__getitems__(list(range(200))).table.to_pylist()
    single = GeneratedRows(200, **kw, masked_lm_prob=0.3, next_sentence=False)
    rows = single.__getitems__(list(range(200))).table.to_pylist()
    for row in rows:
        ids = row["input_ids"]
        assert row["next_sentence_label"] == 0 and set(row["segment_ids"]) == {0}
        assert ids[0] == 2 and ids[-1] == 3 and 3 not in ids[1:-1]  # [CLS] A [SEP]
        assert len(row["masked_lm_positions"]) == min(40, max(1, round(len(ids) * 0.3)))
        assert (
            0 not in row["masked_lm_positions"] and len(ids) - 1 not in row["masked_lm_positions"]
        )
    masked = sum(len(r["masked_lm_positions"]) for r in rows)
    tokens = sum(len(r["input_ids"]) for r in rows)
    assert masked / tokens == pytest.approx(0.3, abs=0.01)
    # the default rows: sentence pairs at 15 %, as before
    assert any(r["next_sentence_label"] == 1 for r in bert)
    assert sum(len(r["masked_lm_positions"]) for r in bert) / sum(
        len(r["input_ids"]) for r in bert
    ) == pytest.approx(0.15, abs=0.01)


def test_a_bad_masking_rate_is_named(tmp_path, capsys):
    with pytest.raises(SystemExit):
        train(compose("pretrain", ["experiment=smoke", "data.masked_lm_prob=1.5",
                                   f"paths.output_root={tmp_path}"]), None)  # fmt: skip
    assert "data.masked_lm_prob=1.5 must be between 0 and 1" in capsys.readouterr().err


def test_the_modern_smoke_experiment_trains_mlm_only_on_the_wsd_schedule(tmp_path, capsys):
    """experiment=modern_smoke end to end (needs conf/model/modern_tiny.yaml and the model's
    next_sentence_head field): MLM only, 30 % masking, AdamW, and the LR of every step on
    the warmup-stable-decay curve (2 warmup steps, peak 1e-3, 1-sqrt decay over the last 4
    of 12)."""
    out = tmp_path / "out"
    cfg = compose("pretrain", ["experiment=modern_smoke", "logger=csv",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    summary = train(cfg, out)
    assert summary["steps"] == 12 and summary["objective"] == "MLM only"
    assert _no_nsp(summary["validation"]) == [] and summary["validation"]["val/samples"] == 20
    metrics = next(tmp_path.rglob("metrics.csv"))
    with metrics.open(newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/lr")]
    assert _no_nsp(rows[0]) == []
    lrs = {int(r["step"]): float(r["train/lr"]) for r in rows}
    peak = 1e-3
    want = [0.0, peak / 2, *[peak] * 7] + [peak * (1 - math.sqrt(p)) for p in (0.25, 0.5, 0.75)]
    assert [lrs[t] for t in range(12)] == pytest.approx(want, rel=1e-6, abs=1e-12)


def test_modern_quickstart_fits_data_prepared_as_its_comment_says(tmp_path, bert_vocab_file):
    """experiment=modern_quickstart on shards prepared as docs/modern.md says (no sentence
    pairs, 30 % masking, 40 masks at seq 128; the eval set at 15 % with 40): every check
    before compute passes with no other key (row shape, MLM only, AdamW's LR, the schedule).
    docs/modern.md quotes a full run of it."""
    from omnibert.prepare.instances import InstanceSettings
    from omnibert.prepare.pipeline import prepare as prepare_shards
    from omnibert.run.pretraining.job import prepare

    reference = Path(__file__).parents[1] / "fixtures" / "reference"
    for split, rate, text in (("train", 0.3, "wiki_like.txt"), ("eval", 0.15, "tiny_docs.txt")):
        settings = InstanceSettings(
            max_seq_length=128,
            max_predictions_per_seq=40,
            masked_lm_prob=rate,
            next_sentence=False,
            dupe_factor=1,
        )
        prepare_shards([str(reference / text)], bert_vocab_file, tmp_path / split, settings,
                       progress=False)  # fmt: skip
    cfg = compose("pretrain", [
        "experiment=modern_quickstart", f"data.train_path={tmp_path / 'train'}",
        f"data.eval_path={tmp_path / 'eval'}", f"data.vocab_file={bert_vocab_file}",
        f"paths.output_root={tmp_path / 'runs'}", "data.num_workers=0",
    ])  # fmt: skip
    plan = prepare(TrainConfig.of(cfg)).plan
    assert (plan.max_steps, plan.batch.global_batch_size, plan.objective) == (600, 32, "MLM only")
    assert plan.data["max_predictions_per_seq"] == 40 and not plan.model.next_sentence_head
    assert cfg.optimizer.lr == 1e-3 and cfg.schedule._target_.endswith("WarmupStableDecayLR")
