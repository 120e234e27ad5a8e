"""The GLUE metrics, as the benchmark defines them (Wang et al. 2019, and the GLUE server):

* ``accuracy``: the fraction of exact label matches (SST-2, MNLI, QNLI, RTE, WNLI; MRPC, QQP);
* ``f1``: the F1 of the positive class (label 1: MRPC "equivalent", QQP "duplicate"); 0 when
  nothing is predicted or labelled positive (scikit-learn's ``zero_division=0``);
* ``matthews_correlation``: Matthews' correlation coefficient (CoLA), 0 when a row or column
  of the confusion matrix is empty (scikit-learn's convention);
* ``pearson`` / ``spearmanr``: Pearson's and Spearman's correlation of the predicted and gold
  similarity scores (STS-B), ``scipy.stats.pearsonr`` / ``spearmanr``.

All on the 0-1 scale, as the GLUE server reports them before the x100 of its table. Computed
by torchmetrics (accuracy, F1, Matthews) and scipy (correlations), which compute exactly these.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["METRICS", "compute", "task_score"]


def _tensors(predictions: Sequence[float], labels: Sequence[float]) -> tuple:
    import torch

    if len(predictions) != len(labels) or not labels:
        raise ValueError("predictions and labels must be non-empty and of equal length")
    return torch.as_tensor(list(predictions)), torch.as_tensor(list(labels))


def accuracy(predictions: Sequence[int], labels: Sequence[int]) -> float:
    p, y = _tensors(predictions, labels)
    return float((p == y).double().mean())


def f1(predictions: Sequence[int], labels: Sequence[int]) -> float:
    from torchmetrics.functional.classification import binary_f1_score

    p, y = _tensors(predictions, labels)
    return float(binary_f1_score(p.long(), y.long()))


def matthews_correlation(predictions: Sequence[int], labels: Sequence[int]) -> float:
    from torchmetrics.functional.classification import multiclass_matthews_corrcoef

    p, y = _tensors(predictions, labels)
    classes = int(max(int(p.max()), int(y.max())) + 1)
    if classes < 2:
        return 0.0
    return float(multiclass_matthews_corrcoef(p.long(), y.long(), num_classes=classes))


def pearson(predictions: Sequence[float], labels: Sequence[float]) -> float:
    from scipy.stats import pearsonr

    _tensors(predictions, labels)
    return float(pearsonr(list(predictions), list(labels))[0])


def spearmanr(predictions: Sequence[float], labels: Sequence[float]) -> float:
    from scipy.stats import spearmanr as scipy_spearmanr

    _tensors(predictions, labels)
    return float(scipy_spearmanr(list(predictions), list(labels))[0])


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
