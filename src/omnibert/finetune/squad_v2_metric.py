"""SQuAD v2.0 metrics by the rules of the official ``evaluate-v2.0.py``.

Written from the published definition (omnibert's own code), pure Python:

* answers are normalised as in v1.1 (:func:`~omnibert.finetune.squad_metric.normalize_answer`);
* the gold answers of a question are its answers whose normalised text is not empty; a
  question with none has the single gold answer ``""``; a question is answerable
  (``HasAns``) when the file lists any answer for it;
* exact: the normalised strings are equal; F1 over the normalised whitespace tokens, except
  that when either side has no token F1 is 1 if both have none and 0 otherwise (v1.1 scores
  that 0); each question takes the best over its gold answers;
* with no-answer probabilities (``na_probs``: question id -> a score that grows with the
  belief that there is no answer; omnibert writes the null-score difference, as Google's
  ``null_odds.json`` and Hugging Face's ``scores_diff_json``), a question whose value is above
  ``na_prob_thresh`` (default 1.0) counts as answered with the empty string;
* ``exact``/``f1`` average over the questions that have a prediction, ``HasAns_*`` and
  ``NoAns_*`` over the answerable and the unanswerable ones (a question without a prediction
  scores 0 there, where the official script stops), all times 100;
* with ``na_probs``, ``best_exact``/``best_f1`` are the scores of the best threshold on them
  and ``best_*_thresh`` that threshold: questions sorted by ``na_probs``, each in turn is
  answered with its prediction (gaining its score if answerable, losing 1 if unanswerable
  and the prediction is not empty) instead of empty, starting from all empty (the
  unanswerable count), keeping the first strict maximum.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from omnibert.finetune.squad_metric import normalize_answer

__all__ = ["best_threshold", "compute_exact", "compute_f1", "squad_v2_scores"]


def _tokens(text: str) -> list[str]:
    return normalize_answer(text).split() if text else []


def compute_exact(gold: str, prediction: str) -> float:
    return float(normalize_answer(gold) == normalize_answer(prediction))


def compute_f1(gold: str, prediction: str) -> float:
    gold_tokens, predicted = _tokens(gold), _tokens(prediction)
    if not gold_tokens or not predicted:
        return float(gold_tokens == predicted)
    same = sum((Counter(gold_tokens) & Counter(predicted)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(predicted), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def _questions(
    dataset: Iterable[Mapping[str, Any]],
) -> tuple[dict[str, list[str]], dict[str, bool]]:
    """Question id -> gold answers (``[""]`` when none normalises to text), and question id
    -> whether the file lists any answer (the official ``qid_to_has_ans``)."""
    golds: dict[str, list[str]] = {}
    has_answer: dict[str, bool] = {}
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                answers = qa.get("answers") or []
                texts = [a["text"] for a in answers if normalize_answer(a["text"])]
                golds[str(qa["id"])] = texts or [""]
                has_answer[str(qa["id"])] = bool(answers)
    return golds, has_answer


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    na_probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """(best score on the 0-100 scale, its threshold) over thresholds on ``na_probs``."""
    current = best = float(sum(1 for has in has_answer.values() if not has))
    threshold = 0.0
    for qid in sorted(na_probs, key=lambda k: na_probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, na_probs[qid]
    return 100.0 * best / max(len(scores), 1), threshold


def squad_v2_scores(
    dataset: Iterable[Mapping[str, Any]],
    predictions: Mapping[str, str],
    na_probs: Mapping[str, float] | None = None,
    na_prob_thresh: float = 1.0,
) -> dict[str, float]:
    """The official evaluate-v2.0 dictionary (module docstring): ``exact``, ``f1``,
    ``total``, ``HasAns_exact``, ``HasAns_f1``, ``HasAns_total``, ``NoAns_*`` (each group
    only when it has questions) and, with ``na_probs``, ``best_exact``,
    ``best_exact_thresh``, ``best_f1``, ``best_f1_thresh``."""
    golds, has_answer = _questions(dataset)
    probs = dict(na_probs) if na_probs is not None else dict.fromkeys(predictions, 0.0)
    exact_raw: dict[str, float] = {}
    f1_raw: dict[str, float] = {}
    for qid, answers in golds.items():
        if qid not in predictions:
            continue
        exact_raw[qid] = max(compute_exact(a, predictions[qid]) for a in answers)
        f1_raw[qid] = max(compute_f1(a, predictions[qid]) for a in answers)

    def thresholded(raw: dict[str, float]) -> dict[str, float]:
        return {
            qid: float(not has_answer[qid]) if probs.get(qid, 0.0) > na_prob_thresh else score
            for qid, score in raw.items()
        }

    exact, f1 = thresholded(exact_raw), thresholded(f1_raw)
    total = len(exact)
    out: dict[str, float] = {
        "exact": 100.0 * sum(exact.values()) / max(total, 1),
        "f1": 100.0 * sum(f1.values()) / max(total, 1),
        "total": total,
    }
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [qid for qid, has in has_answer.items() if has == wanted]
        if ids:
            out[f"{prefix}_exact"] = 100.0 * sum(exact.get(q, 0.0) for q in ids) / len(ids)
            out[f"{prefix}_f1"] = 100.0 * sum(f1.get(q, 0.0) for q in ids) / len(ids)
            out[f"{prefix}_total"] = len(ids)
    if na_probs is not None:
        answered = {qid: predictions[qid] for qid in exact_raw}
        best_exact, exact_thresh = best_threshold(answered, exact_raw, probs, has_answer)
        best_f1, f1_thresh = best_threshold(answered, f1_raw, probs, has_answer)
        out.update(
            best_exact=best_exact,
            best_exact_thresh=exact_thresh,
            best_f1=best_f1,
            best_f1_thresh=f1_thresh,
        )
    return out
