"""Issue 16, point 8: accuracies are reported next to the majority baseline of the eval set
itself (always predicting its most frequent masked token / NSP label), weighted like the
accuracy, in the summary and the printed lines."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.data.generated import GeneratedRows
from omnibert.tasks.pretraining import LabelHistogram


def test_the_histogram_counts_weighted_labels_and_skips_padding():
    metric = LabelHistogram(4)
    metric.update(torch.tensor([[1, 1, 0], [0, 1, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]))
    assert metric.compute().item() == pytest.approx(3 / 5)  # the padded 0 weighs nothing
    metric.update(torch.tensor([3, 3, 3, 3]), torch.ones(4))
    assert metric.compute().item() == pytest.approx(4 / 9)
    metric.reset()
    assert metric.compute().item() == 0.0


def test_the_summary_reports_the_eval_sets_own_majority_baselines(tmp_path, capsys):
    overrides = ["experiment=smoke", "phase.max_steps=2", "val_every_n_steps=null",
                 "data.num_eval_samples=37", "eval_micro_batch_size=8",  # a short last batch
                 f"paths.output_root={tmp_path}"]  # fmt: skip
    cfg = compose("pretrain", overrides)
    summary = run_or_exit(cfg, tmp_path / "out")

    rows = GeneratedRows(37, vocab_size=128, max_seq_length=32, max_predictions_per_seq=5,
                         seed=cfg.seed, split=1).__getitems__(list(range(37))).table  # fmt: skip
    nsp = np.asarray(rows.column("next_sentence_label").to_numpy(), dtype=np.int64)
    masked = np.concatenate([np.asarray(v) for v in rows.column("masked_lm_ids").to_pylist()])
    nsp_share = np.bincount(nsp, minlength=2).max() / nsp.size
    mlm_share = np.bincount(masked).max() / masked.size
    assert nsp_share != 0.5  # the point: chance is not the baseline

    assert summary["nsp_majority_baseline"] == pytest.approx(nsp_share)
    assert summary["mlm_majority_baseline"] == pytest.approx(mlm_share)
    assert summary["validation"]["val/mlm_count"] == masked.size
    saved = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert saved["nsp_majority_baseline"] == pytest.approx(nsp_share)
    printed = capsys.readouterr().out
    assert f"NSP accuracy {summary['validation']['val/nsp_acc']:.4f} (majority baseline " \
           f"{nsp_share:.4f})" in printed  # fmt: skip
