"""omnibert-predict for every task, with tiny fine-tuned runs: sentence pairs from the command
line, GLUE's TSV, a column-named TSV and JSON Lines give one record per input with the label
name and its probability (and the file's metrics when labelled); SQuAD v2.0 from a question
on the command line, a SQuAD JSON and JSON Lines; records equal the run's own predictions;
a checkpoint of one task asked to predict another, and inputs of the wrong kind, are one
sentence before the model runs (exit 2 from the CLI)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from finetune_data import mrpc_file, squad_file

from omnibert.apps import finetune, predict
from omnibert.apps.compose import compose
from omnibert.convert import export_hf
from omnibert.errors import UserError
from omnibert.models import BertConfig, BertForPreTraining

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128)  # fmt: skip
FAST = ["task.epochs=1", "task.batch_size=8", "logger=none", "trainer.enable_progress_bar=false"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bert_vocab_file):
    tmp = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    hf = tmp / "hf"
    export_hf(BertForPreTraining(BertConfig(vocab_size=30522, **TINY)), hf, bert_vocab_file)
    mrpc_train, mrpc_dev = mrpc_file(tmp / "train.tsv", 16, 1), mrpc_file(tmp / "dev.tsv", 12, 2)
    squad_train = squad_file(tmp / "train.json", 6, 1, facts=2, unanswerable=1)
    squad_dev = squad_file(tmp / "dev.json", 4, 2, facts=2, unanswerable=1)
    out = {}
    for task, train, dev in (("mrpc", mrpc_train, mrpc_dev), ("squad_v2", squad_train, squad_dev)):
        summary = finetune.run(compose("finetune", [
            f"task={task}", f"data.train_file={train}", f"data.eval_file={dev}",
            f"model.init_from={hf}", f"paths.output_root={tmp / 'runs'}", "task.lr=1e-3",
            "task.max_seq_length=64", *FAST,
        ]))  # fmt: skip
        out[task] = (Path(summary["run_dir"]), dev, summary)
    return out


def _predict(*overrides: str) -> dict:
    return predict.run(compose("predict", list(overrides)))


def test_pairs_from_the_command_line_tsv_and_jsonl_agree(runs, tmp_path, capsys):
    run_dir, dev, summary = runs["mrpc"]
    # the final checkpoint holds weights and hparams, not AdamW's moments (never resumed)
    saved = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=True)
    assert "optimizer_states" not in saved and "hyper_parameters" in saved
    result = _predict(f"ckpt={run_dir}", f"input_file={dev}", f"out={tmp_path / 'a.jsonl'}")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert [r["index"] for r in records] == list(range(12))
    submitted = [
        int(x.split("\t")[1]) for x in (run_dir / "MRPC.tsv").read_text().split("\n")[1:-1]
    ]
    names = ["not_equivalent", "equivalent"]
    assert [r["label"] for r in records] == [names[p] for p in submitted]  # as the run predicted
    for r in records:
        assert set(r["probabilities"]) == set(names)
        assert r["probability"] == max(r["probabilities"].values())
        assert sum(r["probabilities"].values()) == pytest.approx(1.0)
    assert result["accuracy"] == pytest.approx(summary["accuracy"])  # labelled: metrics too
    pairs = [line.split("\t")[3:5] for line in dev.read_text().splitlines()[1:]]
    named = tmp_path / "pairs.tsv"
    named.write_text("sentence1\tsentence2\n" + "".join(f"{a}\t{b}\n" for a, b in pairs))
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text("".join(json.dumps({"text": a, "text_pair": b}) + "\n" for a, b in pairs))
    for path in (named, jsonl):
        other = _predict(f"ckpt={run_dir}", f"input_file={path}", f"out={tmp_path / 'b.jsonl'}")
        assert [r["label"] for r in other["records"]] == [r["label"] for r in records]
        assert "accuracy" not in other
    capsys.readouterr()
    one = _predict(f"ckpt={run_dir}", f"text='{pairs[3][0]}'", f"text_pair='{pairs[3][1]}'")
    printed = json.loads(capsys.readouterr().out.strip())
    assert printed == one["records"][0]
    assert printed["label"] == records[3]["label"]
    assert printed["probability"] == pytest.approx(records[3]["probability"], abs=1e-5)


def test_squad_v2_from_a_question_a_squad_file_and_jsonl(runs, tmp_path, capsys):
    run_dir, dev, summary = runs["squad_v2"]
    result = _predict(f"ckpt={run_dir}", f"input_file={dev}", f"out={tmp_path / 'a.jsonl'}")
    records = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    official = json.loads((run_dir / "predictions.json").read_text())
    assert {r["id"]: r["answer"] for r in records} == official
    odds = json.loads((run_dir / "null_odds.json").read_text())
    assert all(r["null_score_diff"] == pytest.approx(odds[r["id"]], abs=1e-4) for r in records)
    assert result["HasAns_total"] == 8 and result["f1"] == pytest.approx(summary["f1"])
    data = json.loads(dev.read_text())["data"]
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(
        json.dumps({"id": qa["id"], "question": qa["question"], "context": p["context"]}) + "\n"
        for a in data for p in a["paragraphs"] for qa in p["qas"]
    ))  # fmt: skip
    again = _predict(f"ckpt={run_dir}", f"input_file={jsonl}", f"out={tmp_path / 'b.jsonl'}")
    assert {r["id"]: r["answer"] for r in again["records"]} == official
    para = data[0]["paragraphs"][0]
    qa = para["qas"][0]
    capsys.readouterr()
    one = _predict(
        f"ckpt={run_dir}", f"question='{qa['question']}'", f"context='{para['context']}'"
    )
    assert json.loads(capsys.readouterr().out)["answer"] == official[qa["id"]]
    assert one["records"][0]["answer"] in para["context"]


def test_a_checkpoint_of_one_task_refuses_another_in_one_sentence(runs, tmp_path):
    mrpc_dir, mrpc_dev, _ = runs["mrpc"]
    squad_dir, squad_dev, _ = runs["squad_v2"]
    cases = {
        f"ckpt={squad_dir} is a task=squad_v2 model and cannot predict task_name=mrpc": [
            f"ckpt={squad_dir}", "task_name=mrpc", "text=a", "text_pair=b"],
        "is a task=mrpc model: it classifies text= and text_pair=, not question/context=": [
            f"ckpt={mrpc_dir}", "question=Who?", "context=Nobody."],
        "is a task=squad_v2 model: it answers question= over context=, not text=": [
            f"ckpt={squad_dir}", "text=a"],
        "task=mrpc classifies sentence pairs: pass text=": [f"ckpt={mrpc_dir}", "text=a"],
        f"input_file={squad_dev} is a JSON file; task=mrpc reads a TSV or JSON Lines": [
            f"ckpt={mrpc_dir}", f"input_file={squad_dev}", f"out={tmp_path / 'x.jsonl'}"],
        "is not JSON": [
            f"ckpt={squad_dir}", f"input_file={mrpc_dev}", f"out={tmp_path / 'x.jsonl'}"],
        "name them sentence1 and sentence2": [
            f"ckpt={mrpc_dir}", f"input_file={_bad_tsv(tmp_path)}", f"out={tmp_path / 'x.jsonl'}"],
    }  # fmt: skip
    for message, overrides in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            _predict(*overrides)
    assert not (tmp_path / "x.jsonl").exists()
    script = Path(sys.executable).parent / "omnibert-predict"
    bad = subprocess.run([str(script), f"ckpt={squad_dir}", "task_name=mrpc", "text=a",
                          f"hydra.run.dir={tmp_path}/h"], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "cannot predict task_name=mrpc" in bad.stderr


def _bad_tsv(tmp_path: Path) -> Path:
    path = tmp_path / "bad.tsv"
    path.write_text("left\tright\na\tb\n")
    return path
