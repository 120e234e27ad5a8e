"""Fine-tuning data through ``datasets``, checked before compute: GLUE's original TSV files
(bare quotes, CoLA's files without a header, label names), Parquet, directories in the Hub's
layout loaded through the same call as Hub names, and every kind of bad input as one sentence
naming the file or dataset and the fix (wrong columns or labels, another task's file, a test
split to train on, a classification file for the regression task, offline with nothing
cached; and what is cached loads offline by its Hub name). ``check_inputs`` reads and checks
the data only: no model, no torch compute."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from glue_data import glue_split, hub_glue_dir

from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig
from omnibert.finetune.glue import text_features
from omnibert.finetune.tokenizer import FineTuneInputError, build_tokenizer
from omnibert.run.finetuning.inputs import check_inputs


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    return hub_glue_dir(tmp_path_factory.mktemp("glue"), ["cola", "sst2", "mnli", "ax", "stsb"])


def _inputs(tmp_path: Path, *overrides: str):
    return check_inputs(FinetuneConfig.of(compose("finetune", [
        "model.init_from=unused-by-the-checks", f"paths.output_root={tmp_path / 'runs'}",
        f"data.cache_dir={tmp_path / 'cache'}", *overrides,
    ]), FineTuneInputError))  # fmt: skip


def test_a_directory_in_the_hub_layout_loads_with_the_hub_columns(tmp_path, hub):
    inputs = _inputs(tmp_path, "task=mnli", f"data.dataset={hub}", "data.predict_test=true")
    assert inputs.train.column_names == ["premise", "hypothesis", "label", "idx"]
    assert inputs.train.features["label"].names == ["entailment", "neutral", "contradiction"]
    assert list(inputs.evals) == ["matched", "mismatched"]
    assert list(inputs.tests) == ["MNLI-m", "MNLI-mm", "AX"]  # AX: the ax config, same model
    assert inputs.where["test:AX"] == f"{hub} (ax, split test)"
    assert set(inputs.tests["AX"]["label"]) == {-1}


def test_glue_tsv_files_read_as_the_hub_columns(tmp_path, bert_vocab_file):
    cola = tmp_path / "cola.tsv"  # CoLA: no header (source, label, annotation, sentence)
    cola.write_text('gj04\t1\t\tThe "book" is red.\ngj04\t0\t*\tRed is book the.\n')
    cola_test = tmp_path / "cola_test.tsv"
    cola_test.write_text("index\tsentence\n0\tA test.\n1\tAnother.\n")
    inputs = _inputs(tmp_path, "task=cola", f"data.train_file={cola}",
                     f"data.test_file={cola_test}", "data.predict_test=true")  # fmt: skip
    assert inputs.train["sentence"] == ['The "book" is red.', "Red is book the."]  # QUOTE_NONE
    assert inputs.train["label"] == [1, 0] and inputs.train["idx"] == [0, 1]
    assert inputs.evals == {} and inputs.tests["CoLA"]["label"] == [-1, -1]
    mnli = tmp_path / "mnli.tsv"  # labels by name; MNLI's many columns
    head = ["index", "promptID", "pairID", "genre", "s1b", "s2b", "s1p", "s2p", "sentence1",
            "sentence2", "label1", "gold_label"]  # fmt: skip
    mnli.write_text(
        "\t".join(head) + "\n" + "0\t1\t1g\tfic\t.\t.\t.\t.\tA b.\tC d.\tneutral"
        "\tneutral\n1\t2\t2g\tfic\t.\t.\t.\t.\tE.\tF.\tcontradiction\tcontradiction\n"
    )
    dev = {"matched": mnli, "mismatched": mnli}
    inputs = _inputs(tmp_path, "task=mnli", f"data.train_file={mnli}",
                     f"data.eval_file={{matched:{dev['matched']},mismatched:{mnli}}}")  # fmt: skip
    assert inputs.train["premise"] == ["A b.", "E."] and inputs.train["label"] == [1, 2]
    assert list(inputs.evals) == ["matched", "mismatched"]
    tok = build_tokenizer(bert_vocab_file)
    feats = text_features(tok, ["one two three four"], ["five six seven"], 8)
    # 4 + 3 word pieces cut longest-first to 3 + 2: [CLS] one two three [SEP] five six [SEP]
    ids = [
        tok.token_to_id(t)
        for t in ["[CLS]", "one", "two", "three", "[SEP]", "five", "six", "[SEP]"]
    ]
    assert feats["input_ids"][0].tolist() == ids
    assert feats["segment_ids"][0].tolist() == [0, 0, 0, 0, 0, 1, 1, 1]


def _parquet(tmp_path: Path, task: str, labelled: bool = True) -> Path:
    path = tmp_path / f"{task}-{'train' if labelled else 'test'}.parquet"
    glue_split(task, 6, seed=3, labelled=labelled).to_parquet(str(path))
    return path


def test_bad_inputs_are_one_sentence_before_compute(tmp_path, hub):
    sst2_tsv = tmp_path / "sst2.tsv"
    sst2_tsv.write_text("sentence\tlabel\na fine film\t1\n")
    mrpc_bad = tmp_path / "mrpc.tsv"
    mrpc_bad.write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n2\t1\t2\ta\tb\n")
    stsb_bad = tmp_path / "stsb.tsv"
    stsb_bad.write_text("index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\t"
                        "sentence2\tscore\n0\tg\tf\t2012\t0\ts\ts\ta\tb\thigh\n")  # fmt: skip
    cases = {
        # an SST-2 file given to task=cola: named as SST-2's
        "is not task=cola's GLUE TSV (its first row lacks the columns 3; it looks like sst2's "
        "(task=sst2)": ["task=cola", f"data.train_file={sst2_tsv}"],
        "line 2 has the label '2'; task=mrpc's labels are 0 (not_equivalent), 1 (equivalent)":
            ["task=mrpc", f"data.train_file={mrpc_bad}"],
        "has the score 'high', not a number; task=stsb is a regression task":
            ["task=stsb", f"data.train_file={stsb_bad}"],
        # Parquet / Hub layout: columns, label names, label kinds, unlabelled splits
        "has the columns (premise, hypothesis, label, idx), not task=cola's (sentence, label":
            ["task=cola", f"data.train_file={_parquet(tmp_path, 'mnli')}"],
        "has the labels (negative, positive), not task=cola's (unacceptable, acceptable)":
            ["task=cola", f"data.train_file={_parquet(tmp_path, 'sst2')}"],
        "has class labels (not_equivalent, equivalent); task=stsb is a regression task":
            ["task=stsb", f"data.train_file={_parquet(tmp_path, 'mrpc')}"],
        "has float labels (scores); task=rte is a classification task: STS-B's scores need "
        "task=stsb": ["task=rte", f"data.train_file={_parquet(tmp_path, 'stsb')}"],
        "has the label value -1 (a test split without labels)":
            ["task=sst2", f"data.train_file={_parquet(tmp_path, 'sst2', labelled=False)}"],
        f"{hub} (qnli, split train): {hub} has no config 'qnli' (it has ['cola', 'sst2', "
        "'mnli', 'ax', 'stsb']); add qnli/<split>-00000-of-00001.parquet and name it in its "
        "README.md.": ["task=qnli", f"data.dataset={hub}"],
        "data.train_file=missing.tsv does not exist": ["task=rte", "data.train_file=missing.tsv"],
        "data.eval_file names match, which task=mnli does not have; its eval splits are "
        "matched, mismatched.": ["task=mnli", f"data.dataset={hub}", "data.eval_file={match:a}"],
        "task.num_labels=2 but task=stsb has a regression score; set task.num_labels=1":
            ["task=stsb", "task.num_labels=2"],
    }  # fmt: skip
    for message, overrides in cases.items():
        with pytest.raises(FineTuneInputError, match=re.escape(message)) as caught:
            _inputs(tmp_path, *overrides)
        assert "\n" not in str(caught.value), str(caught.value)


def test_offline_with_nothing_cached_names_the_dataset_and_the_files(tmp_path, monkeypatch):
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FineTuneInputError) as caught:
        _inputs(tmp_path, "task=rte")
    message = str(caught.value)
    assert message.startswith(
        f"the dataset nyu-mll/glue (rte) is not in the Hugging Face cache ({tmp_path / 'cache'})"
    ), message
    assert "data.train_file= and data.eval_file=: GLUE TSV or Parquet" in message
    assert "data.dataset=<a local directory in the Hub's layout>" in message
    with pytest.raises(FineTuneInputError, match=r"the dataset rajpurkar/squad \(plain_text\)"):
        _inputs(tmp_path, "task=squad")
    # the cache as a load of nyu-mll/glue leaves it (<cache>/nyu-mll___glue/rte/0.0.0/<hash>/
    # glue-<split>.arrow), here filled by loading a Hub-layout directory named glue: offline,
    # the Hub name loads from it
    datasets.load_dataset(str(hub_glue_dir(tmp_path / "glue", ["rte"])), "rte",
                          cache_dir=tmp_path / "cache")  # fmt: skip
    (tmp_path / "cache" / "glue").rename(tmp_path / "cache" / "nyu-mll___glue")
    inputs = _inputs(tmp_path, "task=rte")
    assert inputs.where["train"] == "nyu-mll/glue (rte, split train)"
    assert len(inputs.train) == 24 and len(inputs.evals["validation"]) == 12


def test_squad_loads_the_same_rows_from_the_hub_layout_and_the_official_json(tmp_path):
    import json

    from glue_data import hub_squad_dir

    from omnibert.finetune.squad_examples import squad_json_columns

    root = hub_squad_dir(tmp_path / "squad", train=6, evaluation=4, seed=7)
    hub = _inputs(tmp_path, "task=squad", f"data.dataset={root}")
    assert hub.where["train"] == f"{root} (plain_text, split train)"
    assert hub.train.column_names == ["id", "title", "context", "question", "answers"]
    columns = {k: hub.evals["validation"][k] for k in ("id", "context", "question", "answers")}

    def qa(i, q, a):
        starts = zip(a["text"], a["answer_start"], strict=True)
        return {"id": i, "question": q, "answers": [{"text": t, "answer_start": s}
                                                    for t, s in starts]}  # fmt: skip

    paragraphs = [{"context": c, "qas": [qa(i, q, a)]}
                  for i, c, q, a in zip(*columns.values(), strict=True)]  # fmt: skip
    data = [{"title": "t", "paragraphs": paragraphs}]
    dev = tmp_path / "dev-v1.1.json"
    dev.write_text(json.dumps({"version": "1.1", "data": data}))
    train = tmp_path / "train-v1.1.json"
    train.write_text(json.dumps({"version": "1.1", "data": data}))
    files = _inputs(tmp_path, "task=squad", f"data.train_file={train}", f"data.eval_file={dev}")
    from_json = squad_json_columns(data)
    for key in ("id", "context", "question", "answers"):
        assert files.evals["validation"][key] == from_json[key] == columns[key]
    examples = files.data.examples(files.evals["validation"], "dev", training=True)
    for ex in examples:  # every answer_start points at its text in the context
        text, start = ex.answers[0]
        assert ex.context[start : start + len(text)] == text


def test_squad_v2_loads_its_hub_layout_with_the_unanswerable_questions(tmp_path):
    from glue_data import hub_squad_dir

    root = hub_squad_dir(tmp_path / "squad_v2", train=6, evaluation=4, seed=3, version_2=True)
    hub = _inputs(tmp_path, "task=squad_v2", f"data.dataset={root}")
    assert hub.where["train"] == f"{root} (squad_v2, split train)"
    assert hub.where["eval:validation"] == f"{root} (squad_v2, split validation)"
    assert len(hub.train) == 18 and len(hub.evals["validation"]) == 12  # 3 questions a context
    empty = [a for a in hub.train["answers"] if not a["text"]]
    assert len(empty) == 6 and all(a["answer_start"] == [] for a in empty)
    examples = hub.data.examples(hub.train, "train", training=True)
    assert sum(not ex.answers for ex in examples) == 6
    with pytest.raises(FineTuneInputError, match=r"has no answer.*use task=squad_v2"):
        squad = _inputs(tmp_path, "task=squad", f"data.dataset={root}", "task.data.config=squad_v2")
        squad.data.examples(squad.train, "train", training=True)
