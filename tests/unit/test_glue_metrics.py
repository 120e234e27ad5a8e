"""The GLUE metrics on cases computed by hand, and the GLUE table of a sweep (medians over
seeds, task scores, the average) from summaries of all nine tasks."""

from __future__ import annotations

import json
import math

import pytest

from omnibert.finetune.glue_metrics import METRICS, compute, task_score
from omnibert.run.finetuning.glue_report import GLUE_ORDER, glue_table, markdown, write_glue_report


def test_accuracy_and_positive_class_f1_by_hand():
    # tp=2 (idx 0,1), fp=1 (idx 2), fn=1 (idx 3), tn=1 (idx 4): acc 3/5, F1 = 4/(4+1+1)
    result = compute(["accuracy", "f1"], [1, 1, 1, 0, 0], [1, 1, 0, 1, 0])
    assert result == {"accuracy": pytest.approx(0.6), "f1": pytest.approx(4 / 6)}
    assert METRICS["f1"]([0, 0], [0, 0]) == 0.0  # no positive anywhere: 0, not NaN


def test_matthews_correlation_by_hand():
    # tp=2, fp=1, tn=2, fn=0: (2*2 - 1*0) / sqrt(3*2*3*2) = 4/6
    assert METRICS["matthews_correlation"]([1, 1, 0, 0, 1], [1, 0, 0, 0, 1]) == pytest.approx(4 / 6)
    # one predicted class only: an empty confusion-matrix column gives 0 (GLUE's CoLA rule)
    assert METRICS["matthews_correlation"]([1, 1, 1, 1], [1, 0, 1, 0]) == 0.0
    assert METRICS["matthews_correlation"]([0, 1, 0, 1], [1, 0, 1, 0]) == pytest.approx(-1.0)


def test_pearson_and_spearman_by_hand():
    # x - 2 = (-1, 0, 1), y - 7/3 = (-4/3, -1/3, 5/3): r = 3 / (sqrt(2) * sqrt(42)/3)
    assert METRICS["pearson"]([1, 2, 3], [1, 2, 4]) == pytest.approx(9 / math.sqrt(84))
    # ranks (1,2,3,4) vs (1,3,2,4): d^2 sums to 2, rho = 1 - 6*2/(4*15) = 0.8
    assert METRICS["spearmanr"]([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(0.8)
    assert task_score([0.8, 0.9]) == pytest.approx(0.85)


METRIC_NAMES = {
    "cola": ["matthews_correlation"], "sst2": ["accuracy"], "mrpc": ["accuracy", "f1"],
    "qqp": ["accuracy", "f1"], "stsb": ["pearson", "spearmanr"],
    "mnli": ["accuracy_matched", "accuracy_mismatched"], "qnli": ["accuracy"],
    "rte": ["accuracy"], "wnli": ["accuracy"],
}  # fmt: skip


def _summaries():
    for t, task in enumerate(GLUE_ORDER):
        for seed in (1, 2, 3):
            # seed 1 -> 0.5+t/100, seed 2 -> 0.7+t/100, seed 3 -> 0.6+t/100: median 0.6+t/100
            value = {1: 0.5, 2: 0.7, 3: 0.6}[seed] + t / 100
            metrics = {k: value for k in METRIC_NAMES[task]}
            yield {"benchmark": "glue", "task": task, "task_label": task.upper(), "seed": seed,
                   "metrics": metrics}  # fmt: skip
    yield {"benchmark": "squad", "task": "squad", "seed": 1, "metrics": {"f1": 90.0}}


def test_glue_table_takes_medians_over_seeds_and_averages_task_scores(tmp_path):
    table = glue_table(_summaries())
    assert list(table["tasks"]) == list(GLUE_ORDER) and table["missing"] == []
    for t, task in enumerate(GLUE_ORDER):
        entry = table["tasks"][task]
        assert entry["seeds"] == [1, 2, 3]
        assert list(entry["metrics"]) == METRIC_NAMES[task]
        for stats in entry["metrics"].values():
            assert stats["median"] == pytest.approx(0.6 + t / 100)
        assert entry["score"] == pytest.approx(0.6 + t / 100)
    assert table["average"] == pytest.approx(0.6 + sum(range(9)) / 900)
    text = markdown(table)
    assert "| MRPC | accuracy / f1 | 62.0 / 62.0 | 3 | 62.0 |" in text
    assert "| **GLUE average** (9 tasks) | | | | 64.0 |" in text
    for job, summary in enumerate(_summaries()):  # the sweep's job directories
        (tmp_path / f"job{job}").mkdir()
        (tmp_path / f"job{job}" / "summary.json").write_text(json.dumps(summary))
    written = write_glue_report(tmp_path)
    assert json.loads((tmp_path / "glue_report.json").read_text()) == written
    assert (tmp_path / "glue_report.md").read_text() == text
