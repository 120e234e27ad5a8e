"""SQuAD v1.1 EM/F1 by the official evaluate-v1.1.py rules, on hand-computed cases (one where
torchmetrics' SQuAD metric would differ); the GLUE metrics: test_glue_metrics.py."""

from __future__ import annotations

import pytest

from omnibert.finetune.squad_metric import f1, normalize_answer, score_question, squad_scores


def test_normalisation_follows_the_official_order():
    assert normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    # articles go only as whole words, after punctuation is removed
    assert normalize_answer("Theatre of an Anthem, a.") == "theatre of anthem"
    assert normalize_answer("  A\tcat\u00a0 ") == "cat"


def test_f1_over_token_multisets_by_hand():
    # prediction "the cat sat on the mat" -> cat sat on mat (4); gold "a cat on a mat" -> cat on mat
    # common = {cat, on, mat} = 3: precision 3/4, recall 3/3, F1 = 2*0.75*1/1.75 = 6/7
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # repeated tokens count once per occurrence: pred "x x y" vs gold "x y y": common {x:1, y:1}
    assert f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert f1("Paris", "London") == 0.0


def test_two_empty_normalised_answers_score_zero_f1_unlike_torchmetrics():
    """Official: no common token -> F1 0 (torchmetrics' squad returns 1 when both are empty);
    exact match is 1 because the normalised strings are equal."""
    assert f1("the", "a") == 0.0
    assert score_question("the", ["a"]) == (1.0, 0.0)


def test_best_over_gold_answers_and_average_over_all_questions():
    data = [{"paragraphs": [{"context": "c", "qas": [
        {"id": "1", "answers": [{"text": "Denver Broncos"}, {"text": "The Broncos"}]},
        {"id": "2", "answers": [{"text": "in 1990"}, {"text": "1990"}]},
        {"id": "3", "answers": [{"text": "blue"}]},
    ]}]}]  # fmt: skip
    # q1: "broncos" vs {denver broncos -> F1 2/3, broncos -> EM 1}: EM 1, F1 1
    # q2: "1990 season" vs {in 1990: F1 0.5, 1990: F1 2/3}: EM 0, F1 2/3
    # q3: unanswered -> 0, still counted
    scores = squad_scores(data, {"1": "Broncos", "2": "1990 season"})
    assert scores["exact_match"] == pytest.approx(100 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
    assert scores["questions"] == 3 and scores["unanswered"] == 1
