"""A fine-tuned model leaves omnibert and comes back: ``omnibert-export`` of tiny fine-tuned
runs (MRPC, STS-B, SQuAD) gives directories that Hugging Face's ``AutoTokenizer`` and
``AutoModelFor{SequenceClassification,QuestionAnswering}`` load unchanged, whose logits are
omnibert's on the same features, whose ``text-classification`` pipeline gives
``omnibert-predict``'s labels, probabilities and scores, and whose span decoding gives its
answers; ``omnibert-finetune model.init_from=<export>`` continues with the head (the same
predictions as the run exported), a head of another task starts afresh with a note, and a
checkpoint that omnibert did not write is one sentence. Nothing reaches the network
(``HF_HUB_OFFLINE=1``: every model and tokenizer comes from a local directory)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from finetune_data import mrpc_file, squad_file
from glue_data import hub_glue_dir

from omnibert.apps import export as export_app
from omnibert.apps import finetune, predict
from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig
from omnibert.convert import ConversionError, export_hf, init_from_hf
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.models import BertConfig, BertForPreTraining

TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=128)  # fmt: skip
FAST = ["task.epochs=1", "task.batch_size=8", "task.lr=1e-3", "task.max_seq_length=64",
        "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false"]  # fmt: skip
AUTO = {"mrpc": "AutoModelForSequenceClassification", "stsb": "AutoModelForSequenceClassification",
        "squad": "AutoModelForQuestionAnswering"}  # fmt: skip


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@dataclass
class Runs:
    """``runs[task]``: ``(run_dir, dev inputs, export_dir)``; ``tmp``: where they live;
    ``hub``: the GLUE fixture in the Hub's layout."""

    tasks: dict[str, tuple[Path, Path, Path]]
    tmp: Path
    hub: Path

    def __getitem__(self, task: str) -> tuple[Path, Path, Path]:
        return self.tasks[task]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, bert_vocab_file) -> Runs:
    """Tiny fine-tuned runs built as tests/e2e/test_predict.py builds them, each exported with
    omnibert-export."""
    tmp = tmp_path_factory.mktemp("finetune_export")
    torch.manual_seed(0)
    hf = tmp / "hf"
    export_hf(BertForPreTraining(BertConfig(vocab_size=30522, **TINY)), hf, bert_vocab_file)
    hub = hub_glue_dir(tmp / "glue", ["stsb"], train=16, evaluation=10, test=4)
    files = {
        "mrpc": (mrpc_file(tmp / "train.tsv", 16, 1), mrpc_file(tmp / "dev.tsv", 12, 2)),
        "squad": (squad_file(tmp / "train.json", 6, 3, facts=2),
                  squad_file(tmp / "dev.json", 6, 4, facts=2)),
    }  # fmt: skip
    out: dict[str, tuple[Path, Path, Path]] = {}
    for task in ("mrpc", "stsb", "squad"):
        if task in files:
            data = [f"data.train_file={files[task][0]}", f"data.eval_file={files[task][1]}"]
            dev = files[task][1]
        else:
            data = [f"data.dataset={hub}", f"data.cache_dir={tmp / 'cache'}"]
            dev = next((hub / task).glob("validation-*"))
        summary = finetune.run(compose("finetune", [
            f"task={task}", *data, f"model.init_from={hf}",
            f"paths.output_root={tmp / 'runs'}", *FAST,
        ]))  # fmt: skip
        run_dir = Path(summary["run_dir"])
        exported = tmp / "exports" / task
        export_app.run(compose("export", [f"ckpt={run_dir}", f"out={exported}"]))
        out[task] = (run_dir, dev, exported)
    return Runs(out, tmp, hub)


def _predict(run_dir: Path, inputs: Path, out: Path) -> list[dict]:
    predict.run(compose("predict", [f"ckpt={run_dir}", f"input_file={inputs}", f"out={out}"]))
    return [json.loads(line) for line in out.read_text().splitlines()]


def _features(run_dir: Path, dev: Path):
    """The run's task, recipe and its own features of ``dev`` (what omnibert-predict runs)."""
    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning.inputs import task_data

    finetuned = load_finetuned(run_dir)
    data = task_data(finetuned.recipe)
    if dev.suffix == ".parquet":  # a split in the Hub's columns
        import datasets

        dataset = datasets.load_dataset("parquet", data_files=str(dev))["train"]
    else:
        dataset = data.read_file(dev, "input_file")
    tokenizer = build_tokenizer(finetuned.vocab_file)
    return finetuned, data, dataset, data.features(dataset, tokenizer, finetuned.recipe, False)


@pytest.mark.parametrize("task", ["mrpc", "stsb", "squad"])
def test_hugging_face_loads_the_export_and_gives_omnibert_logits(runs, task):
    """No missing or unexpected key, the architecture, labels and lower-casing the run had,
    and logits within 1e-5 of omnibert's in fp32 on the run's own features (SQuAD: start and
    end on the real tokens; padding is never read)."""
    import transformers

    from omnibert.run.finetuning.outputs import logits

    run_dir, dev, exported = runs[task]
    names = sorted(p.name for p in exported.iterdir())
    assert names == ["README.md", "config.json", "model.safetensors", "special_tokens_map.json",
                     "tokenizer.json", "tokenizer_config.json", "vocab.txt"]  # fmt: skip
    config = json.loads((exported / "config.json").read_text())
    auto = getattr(transformers, AUTO[task])
    model, info = auto.from_pretrained(exported, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info["mismatched_keys"], info
    model.eval()
    assert config["finetuning_task"] == task
    if task == "squad":
        assert config["architectures"] == ["BertForQuestionAnswering"]
    else:
        assert config["architectures"] == ["BertForSequenceClassification"]
        labels = ["not_equivalent", "equivalent"] if task == "mrpc" else ["LABEL_0"]
        assert [model.config.id2label[i] for i in range(len(labels))] == labels
        assert model.config.label2id == {n: i for i, n in enumerate(labels)}
        assert model.config.problem_type == (
            "regression" if task == "stsb" else "single_label_classification"
        )
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    assert tokenizer.do_lower_case is True  # the uncased vocab: the run lower-cased
    finetuned, _, _, feats = _features(run_dir, dev)
    tensors = feats.tensors
    ours = logits(finetuned.task, tensors, 4)
    with torch.no_grad():
        theirs = model(
            input_ids=torch.as_tensor(tensors["input_ids"]),
            token_type_ids=torch.as_tensor(tensors["segment_ids"]),
            attention_mask=torch.as_tensor(tensors["attention_mask"]),
        )
    if task == "squad":
        real = np.asarray(tensors["attention_mask"]).astype(bool)
        for mine, hf in zip(ours, (theirs.start_logits, theirs.end_logits), strict=True):
            np.testing.assert_allclose(mine[real], hf.numpy()[real], rtol=0, atol=1e-5)
    else:
        np.testing.assert_allclose(ours, theirs.logits.numpy(), rtol=0, atol=1e-5)


def test_the_export_app_says_what_it_wrote_and_how_to_load_it(runs, tmp_path, capsys):
    run_dir, _, _ = runs["squad"]
    out = tmp_path / "squad"
    capsys.readouterr()
    export_app.run(compose("export", [f"ckpt={run_dir}/checkpoints/final.ckpt", f"out={out}"]))
    said = capsys.readouterr().out
    assert f"exported {run_dir / 'checkpoints' / 'final.ckpt'} (task=squad, BERT L2-H32" in said
    assert f"transformers.AutoModelForQuestionAnswering.from_pretrained('{out}')" in said
    with pytest.raises(
        ConversionError,
        match=r"is not empty; .*overwrite=true \(only "
        r"model\.safetensors, .*tokenizer_config\.json and special_tokens_map",
    ):
        export_app.run(compose("export", [f"ckpt={run_dir}", f"out={out}"]))
    export_app.run(compose("export", [f"ckpt={run_dir}", f"out={out}", "overwrite=true"]))


def test_the_exported_tokenizer_lower_cases_as_the_run_did(runs, tmp_path, bert_vocab_file):
    """``AutoTokenizer`` on the export gives omnibert's WordPiece ids for mixed-case,
    accented text: lower-cased and accents stripped from an uncased vocab, neither from a
    cased one (the same vocab with one upper-case piece: omnibert reads it as cased)."""
    from transformers import AutoTokenizer

    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.tools.exporting import export_hf_finetuned

    run_dir, _, _ = runs["mrpc"]
    finetuned = load_finetuned(run_dir)
    cased = tmp_path / "cased" / "vocab.txt"
    cased.parent.mkdir()
    cased.write_text(bert_vocab_file.read_text().replace("\nparis\n", "\nParis\n", 1))
    text = "Héllo Wörld of Zorbia, PARIS and Paris"
    for vocab, lower in ((finetuned.vocab_file, True), (cased, False)):
        finetuned.vocab_file = Path(vocab)
        out = tmp_path / f"lower-{lower}"
        export_hf_finetuned(finetuned, out)
        config = json.loads((out / "tokenizer_config.json").read_text())
        assert config["do_lower_case"] is lower and config["strip_accents"] is lower
        ours = build_tokenizer(vocab).encode(text).ids
        assert AutoTokenizer.from_pretrained(out)(text)["input_ids"] == ours, vocab
    assert ours != build_tokenizer(run_dir / "vocab.txt").encode(text).ids  # the case told


def _margin(probabilities: dict[str, float]) -> float:
    top = sorted(probabilities.values(), reverse=True)
    return top[0] - top[1]


def test_the_text_classification_pipeline_agrees_with_omnibert_predict(runs, tmp_path):
    """MRPC pairs: the pipeline's label is omnibert-predict's wherever the two classes are
    more than 1e-4 apart (a closer call may fall either way within the logits' 1e-5), and
    every probability is within 1e-4; STS-B: the regression score within 1e-4, with
    ``function_to_apply="none"`` and with the pipeline's default (``problem_type`` regression:
    no function either)."""
    import datasets
    from transformers import pipeline

    run_dir, dev, exported = runs["mrpc"]
    records = _predict(run_dir, dev, tmp_path / "mrpc.jsonl")
    pairs = [line.split("\t")[3:5] for line in dev.read_text().splitlines()[1:]]
    classify = pipeline("text-classification", model=str(exported), device="cpu")
    results = classify([{"text": a, "text_pair": b} for a, b in pairs], top_k=None)
    assert len(results) == len(records) == 12
    decided = 0
    for record, result in zip(records, results, strict=True):
        theirs = {r["label"]: r["score"] for r in result}
        assert theirs == pytest.approx(record["probabilities"], abs=1e-4)
        if _margin(record["probabilities"]) > 1e-4:
            decided += 1
            assert result[0]["label"] == record["label"]
    assert decided >= 10, decided
    run_dir, dev, exported = runs["stsb"]
    records = _predict(run_dir, dev, tmp_path / "stsb.jsonl")
    split = datasets.load_dataset("parquet", data_files=str(dev))["train"]
    inputs = [{"text": a, "text_pair": b}
              for a, b in zip(split["sentence1"], split["sentence2"], strict=True)]  # fmt: skip
    scorer = pipeline("text-classification", model=str(exported), device="cpu")
    for options in ({"function_to_apply": "none"}, {}):
        scores = [r[0]["score"] if isinstance(r, list) else r["score"]
                  for r in scorer(inputs, **options)]  # fmt: skip
        assert scores == pytest.approx([r["score"] for r in records], abs=1e-4), options


def _select_starts_ends():
    """Hugging Face's span decoding: the function the ``question-answering`` pipeline called
    (transformers 4), kept for the document-QA pipeline after transformers 5 removed it."""
    try:
        from transformers.pipelines.question_answering import select_starts_ends
    except ImportError:
        from transformers.pipelines.document_question_answering import select_starts_ends
    return select_starts_ends


def test_hugging_face_span_decoding_gives_omnibert_predict_answers(runs, tmp_path):
    """Hugging Face's QA decoding on the exported model and tokenizer gives omnibert-predict's
    answer to every question whose context fits one window and whose best span lies among
    the window's best ``n_best_size`` starts and ends (where both rules can see it).

    transformers 5 has no ``pipeline("question-answering")``; the test runs what it ran:
    the exported tokenizer on (question, context) with offsets, the exported model, and
    ``select_starts_ends`` with ``max_answer_len`` = the run's ``max_answer_length``. Where
    the two rules differ: HF scores a span by p(start) x p(end), softmaxes taken over the
    window's context tokens, across every (start, end) pair; omnibert (Google's run_squad.py)
    by the start + end logit over each window's ``n_best_size`` best starts and ends, a token
    scored only in its max-context window. Within one window the softmaxes' normalisers are
    constants, so both pick the pair with the largest logit sum, unless it falls outside the
    n-best lists; across windows the normalisers differ, so several-window contexts are left
    out. The reported probabilities differ by definition (HF: p(start) x p(end); omnibert:
    the softmax over the n-best answers' scores) and are not compared. Both cut the text from
    the context by the tokens' character offsets (the transformers 4 pipeline's
    ``align_to_words=True`` would widen it to whole words)."""
    import transformers

    run_dir, dev, exported = runs["squad"]
    records = {r["id"]: r["answer"] for r in _predict(run_dir, dev, tmp_path / "q.jsonl")}
    finetuned, _, dataset, feats = _features(run_dir, dev)
    recipe = finetuned.recipe
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(exported).eval()
    select_starts_ends = _select_starts_ends()
    _, windows_of = feats.extra
    windows = np.bincount(windows_of.example_index, minlength=len(dataset))
    compared = 0
    for index, row in enumerate(dataset):
        if windows[index] != 1:
            continue
        enc = tokenizer(row["question"], row["context"], truncation="only_second",
                        max_length=recipe["max_seq_length"], return_offsets_mapping=True,
                        return_tensors="np")  # fmt: skip
        feature = int(np.flatnonzero(windows_of.example_index == index)[0])
        width = enc["input_ids"].shape[1]
        # the exported tokenizer gives omnibert's window, token for token
        np.testing.assert_array_equal(enc["input_ids"][0],
                                      windows_of.input_ids[feature][:width])  # fmt: skip
        with torch.no_grad():
            out = model(**{k: torch.as_tensor(enc[k])
                           for k in ("input_ids", "token_type_ids", "attention_mask")})  # fmt: skip
        start, end = out.start_logits.numpy(), out.end_logits.numpy()
        p_mask = np.asarray([[s != 1 for s in enc.sequence_ids(0)]], dtype=np.int64)
        starts, ends, _, _ = select_starts_ends(
            start, end, p_mask, enc["attention_mask"], max_answer_len=recipe["max_answer_length"]
        )
        s, e = int(starts[0]), int(ends[0])
        n_best = recipe["n_best_size"]
        if s not in np.argsort(-start[0])[:n_best] or e not in np.argsort(-end[0])[:n_best]:
            continue
        offsets = enc["offset_mapping"][0]
        answer = row["context"][int(offsets[s][0]) : int(offsets[e][1])]
        assert answer == records[row["id"]], row["question"]
        compared += 1
    assert compared >= len(dataset) // 2, (compared, len(dataset))


def _eval_predictions(run_dir: Path, task: str) -> object:
    if task == "squad":
        return json.loads((run_dir / "eval" / "predictions.json").read_text())
    return (run_dir / "eval" / "validation.tsv").read_text().splitlines()


@pytest.mark.parametrize("task", ["mrpc", "squad"])
def test_init_from_an_export_continues_with_its_head(runs, task, tmp_path, capsys):
    """``omnibert-finetune model.init_from=<export>`` with a learning rate of 0 (the weights
    stay as loaded) writes the exported run's dev predictions, no head key is new (SQuAD: only
    the pooler, which Hugging Face's QA model lacks and the QA head does not read), and
    ``omnibert-predict`` on the new run answers as on the old one."""
    run_dir, dev, exported = runs[task]
    tmp = runs.tmp
    capsys.readouterr()
    summary = finetune.run(compose("finetune", [
        f"task={task}", f"data.train_file={dev}", f"data.eval_file={dev}",
        f"model.init_from={exported}", f"paths.output_root={tmp_path / 'runs'}",
        *FAST, "task.lr=0.0",
    ]))  # fmt: skip
    out = capsys.readouterr().out
    assert "head kept" in out, out
    assert summary["new_keys"] == (
        ["bert.pooler.dense.weight", "bert.pooler.dense.bias"] if task == "squad" else []
    )
    again = Path(summary["run_dir"])
    assert _eval_predictions(again, task) == _eval_predictions(run_dir, task)
    before = _predict(run_dir, dev, tmp / f"{task}-before.jsonl")
    after = _predict(again, dev, tmp_path / "after.jsonl")
    key = "answer" if task == "squad" else "label"
    assert [r[key] for r in after] == [r[key] for r in before]
    score = "score" if task == "squad" else "probability"
    assert [r[score] for r in after] == pytest.approx([r[score] for r in before], abs=1e-6)


def test_a_head_of_another_task_starts_afresh_with_a_note(runs, tmp_path):
    """The MRPC classifier (2 labels) for STS-B (1 output) and the SQuAD head for MRPC: the
    encoder is loaded, the head is new, and the "initialised from" line says why."""
    from omnibert.run.finetuning.job import build, prepare

    _, mrpc_dev, mrpc_export = runs["mrpc"]
    squad_export = runs["squad"][2]
    cases = {
        "stsb": ([f"data.dataset={runs.hub}", f"data.cache_dir={runs.tmp / 'cache'}"],
                 mrpc_export, "a classification (2 labels) head and task=stsb needs a "
                 "regression (1 output) head, so the head starts afresh"),
        "mrpc": ([f"data.train_file={mrpc_dev}"], squad_export,
                 "a question answering (start/end logits) head and task=mrpc needs a "
                 "classification (2 labels) head, so the head starts afresh"),
    }  # fmt: skip
    for task, (data, source, note) in cases.items():
        cfg = compose("finetune", [f"task={task}", *data, f"model.init_from={source}",
                                   f"paths.output_root={tmp_path / task}", *FAST])  # fmt: skip
        prepared = prepare(FinetuneConfig.of(cfg, FineTuneInputError))
        assert f"note: model.init_from={source} has {note}" in prepared.init.description
        built = build(prepared, Path(cfg.paths.run_dir))
        assert built.new_keys[:2] == ["classifier.weight", "classifier.bias"]
        encoder = built.task.model.bert.encoder.state_dict()
        theirs = BertForPreTraining(prepared.init.config)
        init_from_hf(theirs, source)
        for name, tensor in theirs.bert.encoder.state_dict().items():
            assert torch.equal(encoder[name], tensor), name


def test_what_omnibert_did_not_write_is_refused_in_one_sentence(runs, tmp_path):
    """A Hugging Face ``pytorch_model.bin`` (a plain state dict) given as ``ckpt=`` names
    what omnibert-export takes, before anything is written; so does an export directory
    given back to it; the app exits 2 with that one line."""
    _, _, exported = runs["mrpc"]
    from safetensors.torch import load_file

    foreign = tmp_path / "pytorch_model.bin"
    torch.save(load_file(str(exported / "model.safetensors")), foreign)
    out = tmp_path / "out"
    with pytest.raises(ConversionError) as refused:
        export_app.run(compose("export", [f"ckpt={foreign}", f"out={out}"]))
    assert str(refused.value) == (
        f"checkpoint {foreign} is not an omnibert checkpoint (it has no "
        "hyper_parameters['model_config']); pass an omnibert-train pretraining checkpoint "
        "(.ckpt), an omnibert-finetune run (its directory or checkpoints/final.ckpt) or a "
        "TensorFlow 1 checkpoint prefix."
    )
    with pytest.raises(ConversionError, match=r"is a Hugging Face directory already"):
        export_app.run(compose("export", [f"ckpt={exported}", f"out={out}"]))
    assert not out.exists()
    from omnibert.checkpoints.reading import load_pretrained

    run_dir = runs["mrpc"][0]
    with pytest.raises(ConversionError, match=r"is an omnibert-finetune run \(a fine-tuned"):
        load_pretrained(run_dir)  # omnibert-eval's loader: no masked-LM head to measure
    script = Path(sys.executable).parent / "omnibert-export"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    bad = subprocess.run([str(script), f"ckpt={foreign}", f"out={out}",
                          f"hydra.run.dir={tmp_path / 'h'}"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path, env=env)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "is not an omnibert checkpoint" in bad.stderr and not out.exists()


def _squad_inputs(run_dir: Path, dev: Path) -> tuple[list, list[dict]]:
    """The dev file's questions and what omnibert-predict answers them (the run's records)."""
    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.run.finetuning.inputs import task_data

    dataset = task_data(load_finetuned(run_dir).recipe).read_file(dev, "input_file")
    return list(zip(dataset["question"], dataset["context"], strict=True)), list(dataset["id"])


def test_the_qa_client_gives_omnibert_predict_answers_on_the_export(runs, tmp_path):
    """omnibert.finetune.qa_client on the exported model and tokenizer (as transformers loads
    them) answers every question as omnibert-predict does on the run: the same text and start,
    the score and probability within 1e-4 (fp32 logits agree within 1e-5), with the run's
    windows read from the export's config.json."""
    import transformers

    from omnibert.finetune.qa_client import answer_questions

    run_dir, dev, exported = runs["squad"]
    questions, ids = _squad_inputs(run_dir, dev)
    # and two contexts of several windows each (64-token windows, the run's)
    questions += [(q, " ".join([c] * 6)) for q, c in questions[:2]]
    ids += ["long-0", "long-1"]
    lines = tmp_path / "q.jsonl"
    lines.write_text("".join(json.dumps({"id": i, "question": q, "context": c}) + "\n"
                             for i, (q, c) in zip(ids, questions, strict=True)))  # fmt: skip
    records = {r["id"]: r for r in _predict(run_dir, lines, tmp_path / "a.jsonl")}
    assert json.loads((exported / "config.json").read_text())["question_answering"] == {
        "max_seq_length": 64, "doc_stride": 128, "max_query_length": 64, "n_best_size": 20,
        "max_answer_length": 30, "version_2_with_negative": False,
        "null_score_diff_threshold": 0.0,
    }  # fmt: skip
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(exported).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(exported)
    tokenizer("a question", "a context", truncation=True, max_length=8)  # leaves truncation set
    answers = answer_questions(model, tokenizer, questions, batch_size=3)
    assert len(answers) == len(ids) == 14
    for qid, answer in zip(ids, answers, strict=True):
        expected = records[qid]
        assert (answer["answer"], answer["start"]) == (expected["answer"], expected["start"])
        assert answer["score"] == pytest.approx(expected["score"], abs=1e-4)
        assert answer["probability"] == pytest.approx(expected["probability"], abs=1e-4)
    squad = next(p for p in exported.iterdir() if p.name == "README.md").read_text()
    assert "pipeline_tag: question-answering" in squad and "answer_question(model" in squad


def test_the_qa_snippet_in_the_docs_runs_as_written(runs, tmp_path, monkeypatch, capsys):
    """docs/finetuning.md's question-answering snippet, executed verbatim against an
    ``exports/squad`` directory, prints what omnibert-predict answers on the run."""
    import ast
    import re

    docs = Path(__file__).parents[2] / "docs" / "finetuning.md"
    marker = "<!-- the QA client; tests/e2e/test_finetune_export.py runs this block as written -->"
    text = docs.read_text()
    assert marker in text
    snippet = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S).group(1)
    run_dir, _, exported = runs["squad"]
    (tmp_path / "exports").mkdir()
    (tmp_path / "exports" / "squad").symlink_to(exported)
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(snippet, str(docs), "exec"), {})  # the documented code itself
    printed = ast.literal_eval(capsys.readouterr().out.strip().splitlines()[-1])
    question = re.search(r'question = "(.*?)"', snippet).group(1)
    context = re.search(r'context = "(.*?)"', snippet).group(1)
    expected = predict.run(
        predict.with_texts(compose("predict", [f"ckpt={run_dir}"]),
                           {"question": question, "context": context})
    )  # fmt: skip
    assert printed["answer"] == expected["answer"] and printed["start"] == expected["start"]


def test_pretraining_only_keys_are_refused_for_a_fine_tuned_run(runs, tmp_path, capsys):
    """heads= (a pretraining export's choice) and a do_lower_case= other than the run's are
    refused in one sentence before anything is written; the run's own value is accepted, and
    a QA export's line says how to get answers on transformers 5."""
    run_dir, _, _ = runs["squad"]
    out = tmp_path / "squad"
    with pytest.raises(ConversionError, match=r"^heads=pretraining applies to pretraining"):
        export_app.run(compose("export", [f"ckpt={run_dir}", f"out={out}", "heads=pretraining"]))
    with pytest.raises(ConversionError) as refused:
        export_app.run(compose("export", [f"ckpt={run_dir}", f"out={out}", "do_lower_case=false"]))
    assert str(refused.value) == (
        f"do_lower_case=false but the run {run_dir} was fine-tuned lower-cased (its vocab.txt "
        "decides); drop do_lower_case= so the tokenizer reads text as the model was trained."
    )
    assert not out.exists()
    capsys.readouterr()
    export_app.run(compose("export", [f"ckpt={run_dir}", f"out={out}", "do_lower_case=true"]))
    assert "answers: omnibert.finetune.qa_client.answer_question(model, tokenizer" in (
        capsys.readouterr().out
    )
