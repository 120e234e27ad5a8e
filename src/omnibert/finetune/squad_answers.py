"""SQuAD post-processing: the answer of each question from its windows' start and end logits.

Per window the ``n_best`` highest start and end logits; pairs inside the context, end not
before start, at most ``max_answer_length`` tokens, start at a token's max-context window
(:mod:`omnibert.finetune.squad_windows`); the score is start + end logit over all windows of a
question; the text is cut from the original context by the offsets (no detokenisation).
SQuAD v2.0 adds the null answer (:func:`best_answers`) and ``null_odds.json``
(:func:`write_predictions`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from omnibert.finetune.squad_examples import SquadExample
from omnibert.finetune.squad_windows import SquadFeatures

__all__ = ["Prediction", "best_answers", "no_answer_scores", "write_predictions"]


@dataclass(frozen=True)
class Prediction:
    """The best answer of a question: its text, start + end logit, and its probability among
    the n-best candidates (softmax of their scores; with SQuAD v2.0 the null answer is one of
    them). ``null_score_diff`` (v2.0 only): the null score minus the best span's score, the
    question's no-answer score; ``text`` is ``""`` when it is above the threshold."""

    text: str
    score: float
    probability: float
    char_span: tuple[int, int] | None
    null_score_diff: float | None = None


def best_answers(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> dict[str, Prediction]:
    """Question id -> :class:`Prediction` from the windows' logits (module docstring). With
    ``version_2`` (SQuAD v2.0) a question's null score is the smallest ``[CLS]`` start + end
    logit over its windows (Google's run_squad.py), and the question is answered ``""`` when
    the null score minus the best span's score is above ``null_score_diff_threshold``.

    Spans are read from each window's ``n_best`` best starts and ends (Google's rule). Where
    none of those pairs is a valid span (the best logits all on the question, say), a SQuAD
    v1.1 question, which always has an answer, takes the best valid span over all positions
    instead of Google's ``"empty"``."""
    by_example: dict[int, list[int]] = {}
    for row, example in enumerate(features.example_index.tolist()):
        by_example.setdefault(example, []).append(row)
    out: dict[str, Prediction] = {}
    for index, example in enumerate(examples):
        rows = by_example.get(index, [])
        null_score = math.inf
        for row in rows:
            null_score = min(null_score, float(start_logits[row, 0]) + float(end_logits[row, 0]))
        candidates = _spans(features, rows, start_logits, end_logits, n_best, max_answer_length)
        if not candidates and not version_2:
            width = int(start_logits.shape[1])
            candidates = _spans(features, rows, start_logits, end_logits, width, max_answer_length)
        if version_2:
            out[example.qid] = _pick_v2(
                example.context, candidates, n_best, null_score, null_score_diff_threshold
            )
        else:
            out[example.qid] = _pick(example.context, candidates, n_best)
    return out


def _spans(
    features: SquadFeatures,
    rows: Sequence[int],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int,
    max_answer_length: int,
) -> list[tuple[float, int, int]]:
    """``(score, char start, char end)`` of the valid spans among each window's ``n_best``
    best starts and ends: both in the context, the start in its maximal-context window, the
    end not before it, at most ``max_answer_length`` tokens."""
    candidates: list[tuple[float, int, int]] = []
    for row in rows:
        offsets, best = features.offsets[row], features.max_context[row]
        starts = np.argsort(-start_logits[row], kind="stable")[:n_best]
        ends = np.argsort(-end_logits[row], kind="stable")[:n_best]
        for s in starts.tolist():
            first = offsets[s]
            if first is None or not best[s]:
                continue
            for e in ends.tolist():
                last = offsets[e]
                if last is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(start_logits[row, s]) + float(end_logits[row, e])
                candidates.append((score, first[0], last[1]))
    return candidates


def _n_best(
    context: str, candidates: list[tuple[float, int, int]], n_best: int
) -> dict[str, tuple[float, int, int]]:
    """Distinct texts, best score first (Google's n-best)."""
    candidates.sort(key=lambda c: -c[0])
    seen: dict[str, tuple[float, int, int]] = {}
    for score, start, end in candidates:
        seen.setdefault(context[start:end], (score, start, end))
        if len(seen) == n_best:
            break
    return seen


def _softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def _pick(context: str, candidates: list[tuple[float, int, int]], n_best: int) -> Prediction:
    if not candidates:
        return Prediction("", 0.0, 0.0, None)
    seen = _n_best(context, candidates, n_best)
    probabilities = _softmax([s for s, _, _ in seen.values()])
    text, (score, start, end) = next(iter(seen.items()))
    return Prediction(text, score, probabilities[0], (start, end))


def _pick_v2(
    context: str,
    candidates: list[tuple[float, int, int]],
    n_best: int,
    null_score: float,
    threshold: float,
) -> Prediction:
    """The best span, or ``""`` when the null score beats it by more than ``threshold``."""
    seen = _n_best(context, candidates, n_best)
    seen.pop("", None)  # an empty span text is the null answer, scored by null_score
    if not seen:  # no span (or no window) at all: the null answer, whatever the threshold
        null = null_score if math.isfinite(null_score) else 0.0
        return Prediction("", null, 1.0, None, math.inf)
    texts = list(seen)
    probabilities = _softmax([s for s, _, _ in seen.values()] + [null_score])
    score, start, end = seen[texts[0]]
    diff = null_score - score
    if diff > threshold:
        return Prediction("", null_score, probabilities[-1], None, diff)
    return Prediction(texts[0], score, probabilities[0], (start, end), diff)


def write_predictions(path: Path, predictions: Mapping[str, Prediction]) -> None:
    """The official predictions file: ``{question id: answer text}``; with SQuAD v2.0
    predictions also ``null_odds.json`` beside it (question id -> null score minus the best
    span's, evaluate-v2.0's ``--na-prob-file``; a question without a span: 1e9)."""
    path.write_text(json.dumps({k: p.text for k, p in predictions.items()}, indent=1) + "\n")
    odds = no_answer_scores(predictions)
    if odds:
        (path.parent / "null_odds.json").write_text(json.dumps(odds, indent=1) + "\n")


def no_answer_scores(predictions: Mapping[str, Prediction]) -> dict[str, float]:
    """Question id -> the null-score difference of v2.0 predictions (finite: clipped to
    +-1e9, a question without a span is 1e9); empty for v1.1 predictions."""
    return {
        k: max(-1e9, min(1e9, p.null_score_diff))
        for k, p in predictions.items()
        if p.null_score_diff is not None
    }
