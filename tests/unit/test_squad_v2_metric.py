"""SQuAD v2.0 metrics by the official evaluate-v2.0.py rules on cases computed by hand:
empty-answer F1, thresholding on no-answer probabilities, HasAns/NoAns splits and the best
thresholds."""

from __future__ import annotations

import pytest

from omnibert.finetune.squad_v2_metric import compute_exact, compute_f1, squad_v2_scores

DATA = [{"paragraphs": [{"context": "c", "qas": [
    {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "The Broncos"}]},
    {"id": "q2", "answers": [{"text": "1990"}]},
    {"id": "q3", "answers": []},
    {"id": "q4", "answers": []},
    {"id": "q5", "answers": [{"text": "the cat sat"}]},
]}]}]  # fmt: skip
PREDICTIONS = {"q1": "Broncos", "q2": "", "q3": "", "q4": "blue", "q5": "cat on mat"}
# raw (exact, F1): q1 (1, 1); q2 (0, 0): empty vs "1990"; q3 (1, 1): empty vs empty;
# q4 (0, 0); q5 (0, 0.4): gold {cat, sat}, predicted {cat, on, mat}: P 1/3, R 1/2
NA_PROBS = {"q1": 0.5, "q2": 2.0, "q3": 3.0, "q4": 0.6, "q5": 0.2}


def test_empty_answers_score_f1_one_only_when_both_are_empty():
    assert compute_f1("", "") == 1.0
    assert compute_f1("1990", "") == 0.0 and compute_f1("", "1990") == 0.0
    assert compute_f1("the", "an") == 1.0  # both normalise to no token (v1.1 says 0)
    assert compute_f1("the cat sat", "cat on mat") == pytest.approx(0.4)
    assert compute_exact("The Broncos!", "broncos") == 1.0


def test_scores_without_probabilities_split_answerable_and_not():
    scores = squad_v2_scores(DATA, PREDICTIONS)
    assert scores["total"] == 5
    assert scores["exact"] == pytest.approx(40.0)  # q1, q3
    assert scores["f1"] == pytest.approx(100 * 2.4 / 5)
    assert scores["HasAns_total"] == 3 and scores["NoAns_total"] == 2
    assert scores["HasAns_exact"] == pytest.approx(100 / 3)
    assert scores["HasAns_f1"] == pytest.approx(100 * 1.4 / 3)
    assert scores["NoAns_exact"] == scores["NoAns_f1"] == pytest.approx(50.0)
    assert "best_f1" not in scores


def test_best_thresholds_walk_the_questions_by_no_answer_probability():
    scores = squad_v2_scores(DATA, PREDICTIONS, NA_PROBS)
    # na_prob_thresh 1.0: q2 (2.0) and q3 (3.0) count as empty answers, which they are
    assert scores["exact"] == pytest.approx(40.0) and scores["f1"] == pytest.approx(48.0)
    # exact, from all-empty = 2 (q3, q4): q5 +0 -> 2, q1 +1 -> 3 (best, at 0.5),
    # q4 "blue" for an unanswerable one -1 -> 2, q2 +0, q3 +0
    assert scores["best_exact"] == pytest.approx(60.0)
    assert scores["best_exact_thresh"] == 0.5
    # F1: q5 +0.4 -> 2.4 (at 0.2), q1 +1 -> 3.4 (best, at 0.5), q4 -1 -> 2.4, ...
    assert scores["best_f1"] == pytest.approx(68.0)
    assert scores["best_f1_thresh"] == 0.5


def test_a_low_threshold_turns_answers_into_no_answers():
    scores = squad_v2_scores(DATA, PREDICTIONS, NA_PROBS, na_prob_thresh=0.55)
    # above 0.55: q4 (now counted empty: right, 1), q2 and q3 as before; q1 (0.5), q5 raw
    assert scores["exact"] == pytest.approx(60.0)  # q1, q3, q4
    assert scores["NoAns_exact"] == pytest.approx(100.0)
    assert scores["f1"] == pytest.approx(100 * 3.4 / 5)


def test_an_answer_list_of_only_articles_is_answerable_with_gold_empty():
    data = [{"paragraphs": [{"context": "c", "qas": [{"id": "x", "answers": [{"text": "The"}]}]}]}]
    scores = squad_v2_scores(data, {"x": ""})
    assert scores["HasAns_total"] == 1 and "NoAns_total" not in scores
    assert scores["exact"] == scores["f1"] == 100.0
