"""SQuAD v1.1 exact match and F1, by the rules of the official ``evaluate-v1.1.py``.

* an answer is normalised by lower-casing, removing every ``string.punctuation`` character,
  removing the articles ``a``/``an``/``the`` as whole words and collapsing whitespace;
* exact match: the normalised strings are equal; F1: over the multisets of the normalised
  answers' whitespace tokens (0 when they share none, including when one side is empty —
  two empty answers score F1 0 here, where torchmetrics' SQuAD scores them 1);
* each question scores the maximum over its gold answers; a question without a prediction
  scores 0 (the official script prints a message and counts it);
* the averages are taken over every question of the dataset, in Python floats, times 100.

Written from the published definition; pure Python so that the test can recompute it.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["exact_match", "f1", "normalize_answer", "score_question", "squad_scores"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation, drop the articles, collapse whitespace (the official
    order: lower, punctuation, articles, whitespace)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def f1(prediction: str, truth: str) -> float:
    predicted = normalize_answer(prediction).split()
    gold = normalize_answer(truth).split()
    common = Counter(predicted) & Counter(gold)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision = same / len(predicted)
    recall = same / len(gold)
    return 2 * precision * recall / (precision + recall)


def score_question(prediction: str, truths: Iterable[str]) -> tuple[float, float]:
    """(exact match, F1) of one prediction: the best over the gold answers."""
    truths = list(truths)
    return (
        max(exact_match(prediction, t) for t in truths),
        max(f1(prediction, t) for t in truths),
    )


def squad_scores(dataset: Iterable[Mapping[str, Any]], predictions: Mapping[str, str]) -> dict:
    """``{"exact_match", "f1", "questions", "unanswered"}`` of ``predictions`` (question id ->
    answer text) over ``dataset`` (the official JSON's ``data`` list), on the 0-100 scale."""
    total = em_sum = f1_sum = 0.0
    unanswered = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    unanswered += 1
                    continue
                truths = [answer["text"] for answer in qa["answers"]]
                em, f = score_question(predictions[qa["id"]], truths)
                em_sum += em
                f1_sum += f
    if total == 0:
        return {"exact_match": 0.0, "f1": 0.0, "questions": 0, "unanswered": 0}
    return {
        "exact_match": 100.0 * em_sum / total,
        "f1": 100.0 * f1_sum / total,
        "questions": int(total),
        "unanswered": unanswered,
    }
