"""The GLUE metrics, as the benchmark defines them (Wang et al. 2019, and the GLUE server):

* ``accuracy``: the fraction of exact label matches (SST-2, MNLI, QNLI, RTE, WNLI; MRPC, QQP);
* ``f1``: the F1 of the positive class (label 1: MRPC "equivalent", QQP "duplicate"); 0 when
  nothing is predicted or labelled positive (scikit-learn's ``zero_division=0``);
* ``matthews_correlation``: Matthews' correlation coefficient (CoLA), 0 when a row or column
  of the confusion matrix is empty (scikit-learn's convention);
* ``pearson`` / ``spearmanr``: Pearson's and Spearman's correlation of the predicted and gold
  similarity scores (STS-B), ``scipy.stats.pearsonr`` / ``spearmanr``.

All on the 0-1 scale, as the GLUE server reports them before the x100 of its table. Computed
by scikit-learn (accuracy, F1, Matthews) and scipy (correlations), the functions GLUE's own
baseline code calls. Not torchmetrics: its Matthews correlation of a one-class prediction is
not 0 (it smooths the empty confusion-matrix cells).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["METRICS", "compute", "task_score"]


def _arrays(predictions: Sequence[float], labels: Sequence[float]) -> tuple[Any, Any]:
    if len(predictions) != len(labels) or not labels:
        raise ValueError("predictions and labels must be non-empty and of equal length")
    return np.asarray(list(predictions)), np.asarray(list(labels))


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    from sklearn.metrics import accuracy_score  # lazy: about a second to import

    p, y = _arrays(predictions, labels)
    return float(accuracy_score(y, p))


def f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    from sklearn.metrics import f1_score  # lazy: about a second to import

    p, y = _arrays(predictions, labels)
    return float(f1_score(y, p, pos_label=1, average="binary", zero_division=0))


def matthews_correlation(predictions: Sequence[int], labels: Sequence[int]) -> float:
    from sklearn.metrics import matthews_corrcoef  # lazy: about a second to import

    p, y = _arrays(predictions, labels)
    return float(matthews_corrcoef(y, p))


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    from scipy.stats import pearsonr  # lazy: most of a second to import

    p, y = _arrays(predictions, labels)
    return float(pearsonr(p, y)[0])


def spearmanr(predictions: Sequence[float], labels: Sequence[float]) -> float:
    from scipy.stats import spearmanr as scipy_spearmanr  # lazy: most of a second to import

    p, y = _arrays(predictions, labels)
    return float(scipy_spearmanr(p, y)[0])


#: metric name (task.data.metrics) -> function(predictions, labels)
METRICS: dict[str, Callable[[Sequence, Sequence], float]] = {
    "accuracy": accuracy,
    "f1": f1,
    "matthews_correlation": matthews_correlation,
    "pearson": pearson,
    "spearmanr": spearmanr,
}


def compute(names: Sequence[str], predictions: Sequence, labels: Sequence) -> dict[str, float]:
    return {name: METRICS[name](predictions, labels) for name in names}


def task_score(metrics: Sequence[float]) -> float:
    """A task's GLUE score: the mean of its metrics (MRPC: F1 and accuracy; MNLI: matched and
    mismatched accuracy), as the GLUE paper averages tasks with several metrics."""
    return sum(metrics) / len(metrics)
