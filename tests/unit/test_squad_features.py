"""SQuAD windows and answers on the real uncased vocab: labels through offsets, a stride
boundary, several windows, max-context scoring, unicode / odd whitespace, several gold
answers and a question whose answer no window holds (GLUE reading: test_glue_data.py)."""

from __future__ import annotations

import numpy as np
import pytest

from omnibert.finetune.squad_answers import best_answers
from omnibert.finetune.squad_examples import SquadExample
from omnibert.finetune.squad_windows import is_max_context, squad_features, windows
from omnibert.finetune.tokenizer import build_tokenizer, vocab_is_uncased


@pytest.fixture(scope="module")
def tok(bert_vocab_file):
    assert vocab_is_uncased(bert_vocab_file)
    return build_tokenizer(bert_vocab_file)


def labelled_text(ex, feats, row):
    s, e = feats.start_positions[row], feats.end_positions[row]
    return ex.context[feats.offsets[row][s][0] : feats.offsets[row][e][1]] if s else None


def test_windows_follow_googles_stride_and_max_context():
    assert windows(10, 4, 3) == [(0, 4), (3, 4), (6, 4)]
    spans = windows(10, 4, 3)
    # token 3 is at the end of window 0 (0 right context) and at the start of window 1 (0 left):
    # window 1 wins the 0.01 x length tie? both length 4 -> the first best is kept (window 0)
    assert is_max_context(spans, 0, 3) and not is_max_context(spans, 1, 3)
    # token 5: window 1 (left 2, right 1 -> 1) beats window 2 (left 0)
    assert is_max_context(spans, 1, 5)


def test_labels_map_through_offsets_with_unicode_and_odd_whitespace(tok):
    context = "Zorbia\u00a0is  calm.\tThe capital of Zorbia is Québec-Ville,\u2009by the sea."
    answer = "Québec-Ville"
    ex = SquadExample("q", "What is the capital of Zorbia?", context,
                      ((answer, context.index(answer)),))  # fmt: skip
    feats = squad_features([ex], tok, max_seq_length=64, training=True)
    assert len(feats) == 1
    assert labelled_text(ex, feats, 0) == answer  # cut from the original text, accent kept
    assert feats.attention_mask.sum() == int((feats.input_ids != 0).sum())


def test_an_answer_across_a_stride_boundary_is_labelled_in_the_window_holding_it(tok):
    words = [f"w{i}" for i in range(40)]
    context = " ".join(words[:20]) + " Kelvar Tosk " + " ".join(words[20:])
    ex = SquadExample("q", "who?", context, (("Kelvar Tosk", context.index("Kelvar")),))
    # question "who?" = 2 tokens -> room = 24 - 5 = 19 context tokens, windows 8 apart
    feats = squad_features([ex], tok, max_seq_length=24, doc_stride=8, training=True)
    assert len(feats) > 3  # a long context: several windows
    labelled = [r for r in range(len(feats)) if feats.start_positions[r]]
    unlabelled = [r for r in range(len(feats)) if not feats.start_positions[r]]
    assert labelled and unlabelled  # windows without the whole answer point at [CLS]
    assert all(labelled_text(ex, feats, r) == "Kelvar Tosk" for r in labelled)
    assert all(feats.end_positions[r] == 0 for r in unlabelled)


def test_an_answer_no_window_holds_is_labelled_cls_everywhere(tok):
    context = " ".join(f"a{i}" for i in range(30))
    answer = " ".join(f"a{i}" for i in range(5, 15))  # 10 words: longer than any overlap
    ex = SquadExample("q", "x?", context, ((answer, context.index(answer)),))
    feats = squad_features([ex], tok, max_seq_length=16, doc_stride=8, training=True)
    assert len(feats) >= 3
    assert feats.start_positions.tolist() == [0] * len(feats)


def test_post_processing_scores_each_token_in_its_max_context_window(tok):
    context = " ".join(f"t{i}" for i in range(30)) + " Merrow Dale"
    ex = SquadExample("q", "where?", context, (("Merrow Dale", 0),))
    feats = squad_features([ex], tok, max_seq_length=20, doc_stride=6)
    n, s = feats.input_ids.shape
    start, end = np.zeros((n, s), np.float32), np.zeros((n, s), np.float32)
    target = context.index("Merrow")
    for row in range(n):
        for i, off in enumerate(feats.offsets[row]):
            if off is not None and off[0] == target:
                start[row, i] = 5.0
            if off is not None and off[1] == len(context):
                end[row, i] = 5.0
    # a decoy that is stronger but sits in a window that is not its max-context one
    row0 = 0
    first_doc = next(i for i, o in enumerate(feats.offsets[row0]) if o is not None)
    last_doc = max(i for i, o in enumerate(feats.offsets[row0]) if o is not None)
    assert not feats.max_context[row0][last_doc]
    start[row0, last_doc] = end[row0, last_doc] = 9.0
    best = best_answers([ex], feats, start, end, n_best=20, max_answer_length=30)["q"]
    assert best.text == "Merrow Dale" and best.score == pytest.approx(10.0)
    assert first_doc > 0 and 0 < best.probability <= 1


def test_several_gold_answers_read_and_training_uses_the_first(tmp_path, tok):
    from finetune_data import squad_file

    from omnibert.finetune.squad_examples import read_squad

    path = squad_file(tmp_path / "s.json", 2, 0, odd_text=True)
    import json

    payload = json.loads(path.read_text())
    qa = payload["data"][0]["paragraphs"][0]["qas"][0]
    text = qa["answers"][0]["text"]
    qa["answers"].append(
        {"text": text.split()[0], "answer_start": qa["answers"][0]["answer_start"]}
    )
    path.write_text(json.dumps(payload))
    examples = read_squad(path, "data.eval_file", training=False)
    assert len(examples[0].answers) == 2
    feats = squad_features(examples, tok, max_seq_length=96, training=True)
    assert labelled_text(examples[0], feats, 0) == text


def test_a_v11_question_whose_n_best_holds_no_span_takes_the_best_span_anywhere(tok):
    """The n best starts and ends all on the question: Google's rule finds no span (its
    "empty"); SQuAD v1.1 questions always have an answer, so the best valid span over all
    positions is taken. v2.0 keeps the rule: no span, the null answer."""
    context = "The river Nile runs north to the sea"
    ex = SquadExample("q", "which river runs north", context, (("Nile", 10),))
    feats = squad_features([ex], tok, max_seq_length=32)
    assert len(feats) == 1
    s = feats.input_ids.shape[1]
    start, end = np.full((1, s), -5.0, np.float32), np.full((1, s), -5.0, np.float32)
    question = [i for i, o in enumerate(feats.offsets[0]) if o is None][:3]
    start[0, question] = end[0, question] = 8.0  # the best logits: not in the context
    nile = next(i for i, o in enumerate(feats.offsets[0]) if o is not None and o[0] == 10)
    start[0, nile], end[0, nile] = 1.0, 0.5  # the best span of the context, 4th of each
    best = best_answers([ex], feats, start, end, n_best=3, max_answer_length=30)["q"]
    assert best.text == "Nile" and best.score == pytest.approx(1.5)
    v2 = best_answers([ex], feats, start, end, n_best=3, max_answer_length=30, version_2=True)
    assert v2["q"].text == ""
    # with a wider n-best the rule itself finds it: the fallback changes nothing then
    wide = best_answers([ex], feats, start, end, n_best=20, max_answer_length=30)["q"]
    assert (wide.text, wide.score) == (best.text, best.score)
