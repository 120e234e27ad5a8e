"""omnibert-predict for every task, from tiny fine-tuned runs: a sentence pair (MRPC), one
sentence (SST-2) and a score (STS-B) from the command line, the task's GLUE TSV / Hub split,
a column-named TSV and JSON Lines give one record per input with the label name and its
probability (the file's metrics when labelled) equal to what the run predicted; SQuAD v2.0
from a question, a SQuAD JSON and JSON Lines; a checkpoint of one task asked to predict
another, and inputs of the wrong kind, are one sentence before the model runs (exit 2)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from finetune_data import mrpc_file, squad_file
from glue_data import hub_glue_dir
from in_process import logging_restored

from omnibert.apps import finetune, predict
from omnibert.apps.compose import compose
from omnibert.convert import export_hf
from omnibert.errors import UserError
from omnibert.models import BertConfig, BertForPreTraining

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128)  # fmt: skip
FAST = ["task.epochs=1", "task.batch_size=8", "task.lr=1e-3", "task.max_seq_length=64",
        "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false"]  # fmt: skip


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bert_vocab_file):
    tmp = tmp_path_factory.mktemp("predict")
    torch.manual_seed(0)
    hf = tmp / "hf"
    export_hf(BertForPreTraining(BertConfig(vocab_size=30522, **TINY)), hf, bert_vocab_file)
    hub = hub_glue_dir(tmp / "glue", ["sst2", "stsb"], train=16, evaluation=10, test=4)
    files = {
        "mrpc": (mrpc_file(tmp / "train.tsv", 16, 1), mrpc_file(tmp / "dev.tsv", 12, 2)),
        "squad_v2": (squad_file(tmp / "train.json", 6, 1, facts=2, unanswerable=1),
                     squad_file(tmp / "dev.json", 4, 2, facts=2, unanswerable=1)),
        "squad": (squad_file(tmp / "train11.json", 6, 3, facts=2),
                  squad_file(tmp / "dev11.json", 5, 4, facts=3)),
    }  # fmt: skip
    out = {}
    for task in ("mrpc", "squad_v2", "squad", "sst2", "stsb"):
        if task in files:
            data = [f"data.train_file={files[task][0]}", f"data.eval_file={files[task][1]}"]
        else:
            data = [f"data.dataset={hub}", f"data.cache_dir={tmp / 'cache'}"]
        summary = finetune.run(compose("finetune", [
            f"task={task}", *data, f"model.init_from={hf}",
            f"paths.output_root={tmp / 'runs'}", *FAST,
        ]))  # fmt: skip
        out[task] = (Path(summary["run_dir"]), files.get(task, (None, None))[1], summary)
    return out


def _predict(*overrides: str) -> dict:
    return predict.run(compose("predict", list(overrides)))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pairs_from_the_command_line_tsv_and_jsonl_agree_with_the_run(runs, tmp_path, capsys):
    run_dir, dev, summary = runs["mrpc"]
    capsys.readouterr()
    result = _predict(f"ckpt={run_dir}", f"input_file={dev}", f"out={tmp_path / 'a.jsonl'}")
    records = _jsonl(tmp_path / "a.jsonl")
    assert len(records) == 12
    # a file shows the forward passes' progress (lines: stdout is not a terminal here)
    progress = [x for x in capsys.readouterr().out.splitlines() if "features" in x]
    assert progress[0].startswith("omnibert-predict: ") and "12/12 features" in progress[-1]
    rows = (run_dir / "eval" / "validation.tsv").read_text().splitlines()[1:]
    names = ["not_equivalent", "equivalent"]
    assert [r["label"] for r in records] == [names[int(x.split("\t")[1])] for x in rows]
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
        assert [r["label"] for r in _jsonl(tmp_path / "b.jsonl")] == [r["label"] for r in records]
        assert "accuracy" not in other  # no labels in these files
    capsys.readouterr()
    one = _predict(f"ckpt={run_dir}", f"text='{pairs[3][0]}'", f"text_pair='{pairs[3][1]}'")
    assert json.loads(capsys.readouterr().out) == one
    assert one["label"] == records[3]["label"]
    assert one["probability"] == pytest.approx(records[3]["probability"], abs=1e-5)


def test_one_sentence_and_a_score_from_the_command_line_and_jsonl(runs, tmp_path):
    sst2_dir, _, _ = runs["sst2"]
    eval_rows = (sst2_dir / "eval" / "validation.tsv").read_text().splitlines()[1:]
    import datasets

    split = datasets.load_dataset(
        "parquet", data_files=str(next((sst2_dir.parent.parent / "glue" / "sst2").glob("val*")))
    )["train"]
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text("".join(json.dumps({"sentence": s}) + "\n" for s in split["sentence"]))
    _predict(f"ckpt={sst2_dir}", f"input_file={jsonl}", f"out={tmp_path / 's_out.jsonl'}")
    records = _jsonl(tmp_path / "s_out.jsonl")
    names = ["negative", "positive"]
    assert [r["label"] for r in records] == [names[int(x.split("\t")[1])] for x in eval_rows]
    one = _predict(f"ckpt={sst2_dir}", f"text='{split['sentence'][0]}'")
    assert one["label"] == records[0]["label"] and set(one["probabilities"]) == set(names)
    parquet = next((sst2_dir.parent.parent / "glue" / "sst2").glob("val*"))  # the Hub's split
    scored = _predict(f"ckpt={sst2_dir}", f"input_file={parquet}", f"out={tmp_path / 'p.jsonl'}")
    assert [r["label"] for r in _jsonl(tmp_path / "p.jsonl")] == [r["label"] for r in records]
    assert scored["accuracy"] == pytest.approx(  # labelled: its metric
        sum(r["label"] == names[x] for r, x in zip(records, split["label"], strict=True)) / 10
    )
    with pytest.raises(UserError, match=re.escape("input_file=")):
        _predict(f"ckpt={sst2_dir}",  # another task's Parquet (STS-B pairs): one sentence
                 f"input_file={next((sst2_dir.parent.parent / 'glue' / 'stsb').glob('val*'))}",
                 f"out={tmp_path / 'x.jsonl'}")  # fmt: skip
    stsb_dir, _, _ = runs["stsb"]
    scores = [float(x.split("\t")[1]) for x in
              (stsb_dir / "eval" / "validation.tsv").read_text().splitlines()[1:]]  # fmt: skip
    pair = datasets.load_dataset(
        "parquet", data_files=str(next((stsb_dir.parent.parent / "glue" / "stsb").glob("val*")))
    )["train"][0]
    one = _predict(f"ckpt={stsb_dir}", f"text='{pair['sentence1']}'",
                   f"text_pair='{pair['sentence2']}'")  # fmt: skip
    assert set(one) == {"index", "score"} and one["score"] == pytest.approx(scores[0], abs=1e-4)


def test_squad_v2_from_a_question_a_squad_file_and_jsonl(runs, tmp_path, capsys):
    run_dir, dev, summary = runs["squad_v2"]
    result = _predict(f"ckpt={run_dir}", f"input_file={dev}", f"out={tmp_path / 'a.jsonl'}")
    records = _jsonl(tmp_path / "a.jsonl")
    official = json.loads((run_dir / "eval" / "predictions.json").read_text())
    assert {r["id"]: r["answer"] for r in records} == official
    odds = json.loads((run_dir / "eval" / "null_odds.json").read_text())
    assert all(r["null_score_diff"] == pytest.approx(odds[r["id"]], abs=1e-4) for r in records)
    assert result["f1"] == pytest.approx(summary["f1"])
    data = json.loads(dev.read_text())["data"]
    jsonl = tmp_path / "q.jsonl"
    jsonl.write_text("".join(
        json.dumps({"id": qa["id"], "question": qa["question"], "context": p["context"]}) + "\n"
        for a in data for p in a["paragraphs"] for qa in p["qas"]
    ))  # fmt: skip
    again = _predict(f"ckpt={run_dir}", f"input_file={jsonl}", f"out={tmp_path / 'b.jsonl'}")
    assert "f1" not in again
    assert {r["id"]: r["answer"] for r in _jsonl(tmp_path / "b.jsonl")} == official
    from omnibert.finetune.squad import SquadV2Data

    parquet = tmp_path / "dev.parquet"  # the file in the Hub's columns (rajpurkar/squad_v2)
    SquadV2Data().read_file(dev, "x").to_parquet(parquet)
    third = _predict(f"ckpt={run_dir}", f"input_file={parquet}", f"out={tmp_path / 'c.jsonl'}")
    assert {r["id"]: r["answer"] for r in _jsonl(tmp_path / "c.jsonl")} == official
    assert third["f1"] == pytest.approx(summary["f1"])
    para = data[0]["paragraphs"][0]
    qa = para["qas"][0]
    capsys.readouterr()
    one = _predict(
        f"ckpt={run_dir}", f"question='{qa['question']}'", f"context='{para['context']}'"
    )
    assert json.loads(capsys.readouterr().out) == one
    assert one["answer"] == official[qa["id"]]


def test_a_checkpoint_of_one_task_refuses_another_in_one_sentence(runs, tmp_path):
    mrpc_dir, mrpc_dev, _ = runs["mrpc"]
    squad_dir, squad_dev, _ = runs["squad_v2"]
    sst2_dir, _, _ = runs["sst2"]
    bad_tsv = tmp_path / "bad.tsv"
    bad_tsv.write_text("left\tright\na\tb\n")
    out = f"out={tmp_path / 'x.jsonl'}"
    cases = {
        f"ckpt={squad_dir} is a task=squad_v2 model and cannot predict task_name=mrpc": [
            f"ckpt={squad_dir}", "task_name=mrpc", "text=a", "text_pair=b"],
        "is a task=mrpc model: it classifies text=, not question/context=": [
            f"ckpt={mrpc_dir}", "question=Who?", "context=Nobody."],
        "is a task=squad_v2 model: it answers question= over context=, not text=": [
            f"ckpt={squad_dir}", "text=a"],
        "is a task=sst2 model, which reads one sentence: drop text_pair=": [
            f"ckpt={sst2_dir}", "text=a", "text_pair=b"],
        "task=mrpc reads sentence pairs: pass text=": [f"ckpt={mrpc_dir}", "text=a"],
        f"input_file={squad_dev} is a JSON file; task=mrpc reads a TSV or JSON Lines": [
            f"ckpt={mrpc_dir}", f"input_file={squad_dev}", out],
        "is not JSON": [f"ckpt={squad_dir}", f"input_file={mrpc_dev}", out],
        "task=mrpc reads sentence1 and sentence2 (or text and text_pair)": [
            f"ckpt={mrpc_dir}", f"input_file={tmp_path / 'bad.jsonl'}", out],
        "input_file= needs out=": [f"ckpt={mrpc_dir}", f"input_file={mrpc_dev}"],
    }  # fmt: skip
    (tmp_path / "bad.jsonl").write_text(json.dumps({"left": "a", "right": "b"}) + "\n")
    for message, overrides in cases.items():
        with pytest.raises(UserError, match=re.escape(message)):
            _predict(*overrides)
    with pytest.raises(UserError, match=re.escape(f"{bad_tsv}")):
        _predict(f"ckpt={mrpc_dir}", f"input_file={bad_tsv}", out)
    assert not (tmp_path / "x.jsonl").exists()
    script = Path(sys.executable).parent / "omnibert-predict"
    bad = subprocess.run([str(script), f"ckpt={squad_dir}", "task_name=mrpc", "text=a",
                          f"hydra.run.dir={tmp_path}/h"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "cannot predict task_name=mrpc" in bad.stderr


def _mixed_lengths_dev(task: str, dev: Path, tmp_path: Path) -> Path:
    """The run's dev set with short SQuAD contexts (one fact) among its long ones, so that
    batches mix rows of very different lengths."""
    if not task.startswith("squad"):
        return dev
    data = json.loads(dev.read_text())
    short = squad_file(tmp_path / "short.json", len(data["data"]), 9, facts=1,
                       unanswerable=int(task != "squad"))  # fmt: skip
    shorts = json.loads(short.read_text())["data"]
    data["data"] = [x for pair in zip(data["data"], shorts, strict=True) for x in pair]
    mixed = tmp_path / "mixed.json"
    mixed.write_text(json.dumps(data))
    return mixed


@pytest.mark.parametrize("task", ["squad", "squad_v2", "mrpc"])
def test_predictions_do_not_depend_on_the_batch_size_or_the_padding(runs, tmp_path, task):
    """The same answers (labels), scores within 1e-5 and metrics at batch 1, 2, 7 and the
    run's default through omnibert-predict: rows of different lengths share a batch, and the
    columns one row does not use must not change another's answer (the static width: the
    per-token test below). SQuAD v1.1 never answers ""."""
    run_dir, dev, _ = runs[task]
    dev = _mixed_lengths_dev(task, dev, tmp_path)
    variants = {"default": [], **{f"batch {b}": [f"batch_size={b}"] for b in (1, 2, 7)}}
    records = {}
    for name, extra in variants.items():
        out = tmp_path / f"{name.replace(' ', '')}.jsonl"
        result = _predict(f"ckpt={run_dir}", f"input_file={dev}", f"out={out}", *extra)
        metrics = {k: v for k, v in result.items() if isinstance(v, float)}
        records[name] = (_jsonl(out), metrics)
    key = "answer" if task.startswith("squad") else "label"
    score = "score" if task.startswith("squad") else "probability"
    want, want_metrics = records["default"]
    assert want_metrics, "the file is labelled: metrics are printed"
    for name, (got, metrics) in records.items():
        assert [r[key] for r in got] == [r[key] for r in want], name
        assert [r[score] for r in got] == pytest.approx([r[score] for r in want], abs=1e-5), name
        assert metrics == pytest.approx(want_metrics, abs=1e-9), name
    if task == "squad":
        assert all(r["answer"] for r in want), [r for r in want if not r["answer"]]


def test_per_token_logits_are_the_same_at_every_batch_size_and_width(runs, tmp_path):
    """What the answers are read from, row by row: a row's SQuAD logits at batch 1, batch 7
    and every row in one batch, cut to the longest row or at the static width, are the same
    numbers, and its padding columns are -inf in all of them (left in, they held what the
    head gave padding tokens, which depends on the batch's width, and took n-best slots)."""
    import numpy as np

    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.batching import TrimPadding
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning.inputs import task_data
    from omnibert.run.finetuning.outputs import logits

    run_dir, dev, _ = runs["squad"]
    finetuned = load_finetuned(run_dir)
    data = task_data(finetuned.recipe)
    dataset = data.read_file(_mixed_lengths_dev("squad", dev, tmp_path), "input_file")
    tokenizer = build_tokenizer(finetuned.vocab_file)
    feats = data.features(dataset, tokenizer, finetuned.recipe, training=False)
    lengths = feats.tensors["attention_mask"].sum(1)
    assert int(lengths.min()) < int(lengths.max()) - 16  # rows of very different lengths
    rows = len(lengths)
    runs_ = {
        "batch 1": logits(finetuned.task, feats.tensors, 1),
        "batch 7": logits(finetuned.task, feats.tensors, 7),
        "one batch": logits(finetuned.task, feats.tensors, rows),
        "static width": logits(
            finetuned.task, feats.tensors, rows, trim=TrimPadding(enabled=False)
        ),
    }
    padding = (feats.tensors["attention_mask"] == 0).numpy()
    want = runs_["batch 1"]
    for name, got in runs_.items():
        for a, b in zip(got, want, strict=True):
            assert np.all(np.isneginf(a[padding])), name
            np.testing.assert_allclose(a[~padding], b[~padding], rtol=0, atol=1e-5, err_msg=name)


# ---- text from the command line and from standard input, through omnibert-predict's main()
#: every character Hydra's override grammar reads as syntax, and more: the texts must reach
#: the model exactly as the shell passed them
TRICKY = "a; b, c (d) e=f 'g' \"h\" [i] {j} $k $(l) `m` \\n é 中文 🙂"
QUESTION = f"What is the capital of Zorbia? ({TRICKY})\nsecond line"
CONTEXT = (
    f"The capital of Zorbia is Quellton; it has (many) hills = [ponds] & {{lakes}}, {TRICKY}."
    "\nThe second line names Quellton again."
)


@pytest.fixture
def seen(monkeypatch):
    """The inputs each prediction read (the dataset the model is given)."""
    from omnibert.run.tools import predicting

    got = []
    original = predicting.read_inputs

    def spy(cfg, data):
        got.append(original(cfg, data))
        return got[-1]

    monkeypatch.setattr(predicting, "read_inputs", spy)
    return got


def _main(monkeypatch, capsys, tmp_path, *argv, stdin=None):
    """omnibert-predict's entry point with this command line (and standard input):
    ``(exit code, stdout, stderr)``."""
    import io

    monkeypatch.setattr(sys, "argv", ["omnibert-predict", *argv,
                                      f"hydra.run.dir={tmp_path / 'hydra'}"])  # fmt: skip
    if stdin is not None:
        stream = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
        monkeypatch.setattr(sys, "stdin", stream)
    capsys.readouterr()
    try:
        with logging_restored():
            predict.main()
        code = 0
    except SystemExit as stop:
        code = stop.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _records(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_any_text_on_the_command_line_reaches_the_model_as_written(
    runs, tmp_path, monkeypatch, capsys, seen
):
    squad_dir, _, _ = runs["squad"]
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={squad_dir}",
                           f"question={QUESTION}", f"context={CONTEXT}")  # fmt: skip
    assert code == 0, err
    (record,) = _records(out)
    assert seen[-1].dataset["question"] == [QUESTION]
    assert seen[-1].dataset["context"] == [CONTEXT]
    answer, start = record["answer"], record["start"]
    assert answer and CONTEXT[start : start + len(answer)] == answer  # offsets into the text
    sst2_dir, _, _ = runs["sst2"]
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={sst2_dir}", f"text={TRICKY}")
    assert code == 0, err
    assert seen[-1].dataset["sentence"] == [TRICKY]
    (one,) = _records(out)
    assert one == predict.run(predict.with_texts(compose("predict", [f"ckpt={sst2_dir}"]),
                                                 {"text": TRICKY}))  # fmt: skip
    mrpc_dir, _, _ = runs["mrpc"]
    pair = ("=(x)", "y=[1, 2]; z={'k': \"v\"}")  # text that looks like Hydra overrides
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={mrpc_dir}",
                           f"text={pair[0]}", f"text_pair={pair[1]}", "batch_size=1")  # fmt: skip
    assert code == 0, err
    assert [seen[-1].dataset[c][0] for c in ("sentence1", "sentence2")] == list(pair)
    cases = {  # exit code 2, one line
        "text= is empty; put the text after the =": [f"ckpt={sst2_dir}", "text="],
        "text= is given twice; pass it once.": [f"ckpt={sst2_dir}", "text=a", "text=b"],
        "is a task=sst2 model, which reads one sentence: drop text_pair=": [
            f"ckpt={sst2_dir}", "text=a", f"text_pair={TRICKY}"],
    }  # fmt: skip
    for message, argv in cases.items():
        code, out, err = _main(monkeypatch, capsys, tmp_path, *argv)
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_standard_input_as_plain_lines_and_json_lines(runs, tmp_path, monkeypatch, capsys, seen):
    sst2_dir, _, _ = runs["sst2"]
    lines = [TRICKY, "a gripping film", "", "中文 🙂 and more"]
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={sst2_dir}", "input_file=-",
                           stdin="\n".join(lines) + "\n")  # fmt: skip
    assert code == 0, err
    records = _records(out)
    assert out.count("\n") == len(records) == 3  # stdout holds the records alone
    assert seen[-1].dataset["sentence"] == [x for x in lines if x]
    assert [r["index"] for r in records] == [0, 1, 2]
    jsonl = tmp_path / "s.jsonl"
    jsonl.write_text("".join(json.dumps({"text": x}) + "\n" for x in lines if x))
    _predict(f"ckpt={sst2_dir}", f"input_file={jsonl}", f"out={tmp_path / 'f.jsonl'}")
    assert records == _jsonl(tmp_path / "f.jsonl")
    mrpc_dir, _, _ = runs["mrpc"]
    pairs = [(TRICKY, "He went away."), ("He left.", "中文 = 🙂")]
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={mrpc_dir}", "input_file=-",
                           stdin="".join(f"{a}\t{b}\r\n" for a, b in pairs))  # fmt: skip
    assert code == 0, err
    plain = _records(out)
    assert [(r["sentence1"], r["sentence2"]) for r in seen[-1].dataset] == pairs
    stdin = "".join(json.dumps({"sentence1": a, "sentence2": b}) + "\n" for a, b in pairs)
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={mrpc_dir}", "input_file=-",
                           f"out={tmp_path / 'm.jsonl'}", stdin=stdin)  # fmt: skip
    assert code == 0 and "2 task=mrpc records written" in out, err
    assert _jsonl(tmp_path / "m.jsonl") == plain
    squad_dir, _, _ = runs["squad"]
    stdin = json.dumps({"id": "q1", "question": QUESTION, "context": CONTEXT}) + "\n"
    code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={squad_dir}", "input_file=-",
                           stdin=stdin)  # fmt: skip
    assert code == 0, err
    (answer,) = _records(out)
    assert answer["id"] == "q1" and answer["answer"] in CONTEXT
    cases = {  # exit code 2, one line, before the model runs
        "task=squad answers a question from its context: pipe JSON Lines": (squad_dir, "Who?\n"),
        "line 2 has 1 TAB-separated fields; task=mrpc reads two texts separated by one TAB": (
            mrpc_dir, "a\tb\nno tab\n"),
        "line 1 has 2 TAB-separated fields; task=sst2 reads one text and no TAB": (
            sst2_dir, "a\tb\n"),
        "input_file=- (standard input) holds no inputs": (sst2_dir, "\n \n"),
        "input_file=- (standard input) line 2 is not JSON": (sst2_dir, '{"text": "a"}\n{x\n'),
    }  # fmt: skip
    for message, (run_dir, text) in cases.items():
        code, out, err = _main(monkeypatch, capsys, tmp_path, f"ckpt={run_dir}", "input_file=-",
                               stdin=text)  # fmt: skip
        assert code == 2 and err.count("\n") == 1 and message in err, err


def test_the_console_script_takes_text_and_standard_input(runs, tmp_path):
    """The installed ``omnibert-predict`` itself, with no shell in between: the argument's
    bytes after ``text=`` are the sentence, and standard input is read when piped."""
    sst2_dir, _, _ = runs["sst2"]
    script = str(Path(sys.executable).parent / "omnibert-predict")
    common = dict(capture_output=True, text=True, timeout=300, cwd=tmp_path, encoding="utf-8")
    one = subprocess.run([script, f"ckpt={sst2_dir}", f"text={TRICKY}", "hydra.run.dir=h"],
                         **common)  # fmt: skip
    assert one.returncode == 0, one.stderr
    many = subprocess.run([script, f"ckpt={sst2_dir}", "input_file=-", "hydra.run.dir=h"],
                          input=f"{TRICKY}\nanother line\n", **common)  # fmt: skip
    assert many.returncode == 0, many.stderr
    records = _records(many.stdout)
    (single,) = _records(one.stdout)
    assert len(records) == 2 and records[0]["label"] == single["label"]
    assert records[0]["probability"] == pytest.approx(single["probability"], abs=1e-5)


def test_an_empty_text_in_json_lines_or_standard_input_is_refused_as_text_is(
    runs, tmp_path, monkeypatch
):
    """``text=""`` is refused; so is an empty text in a JSON Lines record (a GLUE sentence, a
    SQuAD question or context) or an empty field of a TAB-separated line on standard input,
    naming the file and line, before the model runs and before out= is written."""
    import io

    sst2_dir, mrpc_dir, squad_dir = runs["sst2"][0], runs["mrpc"][0], runs["squad"][0]
    out = tmp_path / "out.jsonl"
    with pytest.raises(UserError, match=r"^text= is empty; put the text after the ="):
        _predict(f"ckpt={sst2_dir}", "text=")
    glue = tmp_path / "glue.jsonl"
    glue.write_text('{"sentence": "fine"}\n\n{"sentence": "  "}\n')
    squad = tmp_path / "squad.jsonl"
    squad.write_text('{"question": "", "context": "Some context."}\n')
    cases = {
        f'input_file={glue} line 3 has an empty "sentence"': (sst2_dir, glue),
        f'input_file={squad} line 1 has an empty "question"': (squad_dir, squad),
    }
    for message, (ckpt, file) in cases.items():
        with pytest.raises(UserError) as refused:
            _predict(f"ckpt={ckpt}", f"input_file={file}", f"out={out}")
        assert str(refused.value) == f"{message}; put the text in it (or drop the line)."
    piped = io.TextIOWrapper(io.BytesIO(b"He left.\tHe went away.\nShe came.\t \n"))
    monkeypatch.setattr(sys, "stdin", piped)
    with pytest.raises(UserError) as refused:
        _predict(f"ckpt={mrpc_dir}", "input_file=-")
    assert str(refused.value) == (
        'input_file=- (standard input) line 2 has an empty "text_pair"; put the text in it (or '
        "drop the line)."
    )
    assert not out.exists()
