"""omnibert-eval: an omnibert checkpoint and its Hugging Face export score the same on a
prepared eval set; masked-LM accuracy is MLPerf's (weighted sums over the whole set, checked
against Hugging Face's model run row by row); bad inputs are one sentence."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import pytest
import torch
import transformers

from omnibert.apps import eval as eval_app
from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare as prepare_shards

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"


@pytest.fixture(scope="module")
def trained(tiny_pretraining_run: dict) -> dict:
    """Seq-32 shards, a 4-step training run on them (validated at the end: conftest's tiny
    run) and its export."""
    root = tiny_pretraining_run["root"]
    ckpt = tiny_pretraining_run["ckpt"]
    export_app.run(compose("export", [f"ckpt={ckpt}", f"out={root / 'hf'}", "heads=pretraining"]))
    return {**tiny_pretraining_run, "hf": root / "hf"}


def _eval(trained: dict, *overrides: str, out: Path | None = None) -> dict:
    cfg = compose("eval", [f"data.eval_path={trained['root'] / 'eval'}", *overrides])
    return eval_app.run_or_exit(cfg, out)


def test_a_checkpoint_scores_what_its_training_run_validated(trained, tmp_path):
    report = _eval(trained, f"ckpt={trained['ckpt']}", out=tmp_path)
    assert json.loads((tmp_path / "eval.json").read_text()) == report
    val = trained["summary"]["validation"]
    assert report["checkpoint_kind"] == "omnibert"
    assert report["mlm_accuracy"] == pytest.approx(val["val/mlm_acc"], abs=1e-7)
    assert report["nsp_accuracy"] == pytest.approx(val["val/nsp_acc"], abs=1e-7)
    assert report["loss"] == pytest.approx(val["val/loss"], rel=1e-6)
    rows = len(datasets.load_from_disk(str(trained["root"] / "eval")))
    assert report["samples"] == rows and report["data"]["max_seq_length"] == 32


def test_the_hugging_face_export_scores_the_same(trained):
    ours = _eval(trained, f"ckpt={trained['ckpt']}")
    theirs = _eval(trained, f"ckpt={trained['hf']}")
    assert theirs["checkpoint_kind"] == "huggingface"
    for key in ("mlm_accuracy", "nsp_accuracy", "samples", "masked_tokens"):
        assert theirs[key] == ours[key], key
    assert theirs["loss"] == pytest.approx(ours["loss"], rel=1e-5)


def test_masked_lm_accuracy_is_mlperfs_weighted_sum_over_the_whole_set(trained):
    """Independently: Hugging Face's model on each unpadded row, argmax at every masked
    position, correct / all masked positions of the set (no mean of batch means)."""
    report = _eval(trained, f"ckpt={trained['hf']}", "eval_micro_batch_size=3")  # ragged tail
    model = transformers.BertForPreTraining.from_pretrained(trained["hf"]).eval()
    correct = total = 0
    with torch.no_grad():
        for row in datasets.load_from_disk(str(trained["root"] / "eval")):
            ids = torch.tensor([row["input_ids"]])
            logits = model(input_ids=ids, token_type_ids=torch.tensor([row["segment_ids"]]))
            scores = logits.prediction_logits[0, row["masked_lm_positions"]]
            correct += int((scores.argmax(-1) == torch.tensor(row["masked_lm_ids"])).sum())
            total += len(row["masked_lm_positions"])
    assert report["masked_tokens"] == total
    assert abs(report["mlm_accuracy"] - correct / total) <= 1 / total  # at most one tie flips


def test_eval_samples_limits_the_set(trained):
    report = _eval(trained, f"ckpt={trained['ckpt']}", "data.eval_samples=10")
    assert report["samples"] == 10


def test_progress_is_lines_when_stdout_is_not_a_terminal(trained, capsys):
    _eval(trained, f"ckpt={trained['ckpt']}")
    out = capsys.readouterr().out
    assert "\r" not in out  # no tqdm bar in a log file
    assert out.splitlines()[0].startswith("omnibert-eval: evaluating ")


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        (("ckpt=/nonexistent/model",), "does not exist"),
        (("ckpt={root}",), "is a directory without config.json"),
        (("ckpt={ckpt}", "phase.max_seq_length=64"), "max_seq_length=32 but phase.max_seq_length"),
        (("ckpt={ckpt}", "eval_micro_batch_size=0"), "eval_micro_batch_size=0"),
    ],
)
def test_bad_inputs_are_one_sentence(trained, capsys, overrides, words):
    values = {"root": trained["root"], "ckpt": trained["ckpt"]}
    with pytest.raises(SystemExit) as info:
        _eval(trained, *(o.format(**values) for o in overrides))
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err


def test_a_checkpoint_of_another_vocab_is_refused(trained, tmp_path, capsys):
    small = tmp_path / "vocab.txt"
    small.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]) + "\n")
    config = json.loads((trained["hf"] / "config.json").read_text())
    other = tmp_path / "hf"
    model = transformers.BertForPreTraining(transformers.BertConfig(**{**config, "vocab_size": 7}))
    model.save_pretrained(other)
    with pytest.raises(SystemExit):
        _eval(trained, f"ckpt={other}")
    assert (
        "7 tokens but the eval data was prepared with a 30522-token vocab"
        in capsys.readouterr().err
    )


TF1 = Path(__file__).parents[1] / "fixtures" / "tf1"


def test_a_tf1_checkpoint_scores_what_its_hugging_face_export_scores(tmp_path):
    """The TF1 fixture (written by real TensorFlow) evaluated directly and after omnibert-export
    gives the same report: the TF1 reader feeds omnibert-eval like any checkpoint."""
    vocab = tmp_path / "vocab.txt"
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz"]
    words += ["the", "of", "and", "in", "to", "a", "is", "was", "for", "on", "as", "with"]
    vocab.write_text("\n".join(words + [f"w{i}" for i in range(100 - len(words))]) + "\n")
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    prepare_shards([str(REFERENCE / "tiny_docs.txt")], vocab, tmp_path / "eval", settings,
                   progress=False)  # fmt: skip
    prefix = TF1 / "model.ckpt-7"
    base = [f"data.eval_path={tmp_path / 'eval'}"]
    direct = eval_app.run_or_exit(compose("eval", [*base, f"ckpt={prefix}"]), None)
    assert direct["checkpoint_kind"] == "tf1" and direct["samples"] > 0
    export_app.run(compose("export", [f"ckpt={prefix}", f"out={tmp_path / 'hf'}",
                                      f"vocab_file={vocab}", "heads=pretraining"]))  # fmt: skip
    exported = eval_app.run_or_exit(compose("eval", [*base, f"ckpt={tmp_path / 'hf'}"]), None)
    for key in ("mlm_accuracy", "nsp_accuracy", "samples", "masked_tokens"):
        assert exported[key] == direct[key], key
    assert exported["loss"] == pytest.approx(direct["loss"], rel=1e-5)


def test_another_rank_of_the_tools_prints_and_writes_nothing(
    trained, tmp_path, monkeypatch, capsys
):
    """One voice: rank 1 of a two-process omnibert-eval evaluates (its share, in a real launch)
    but prints no report and writes neither eval.json nor ``out``; omnibert-export and
    omnibert-predict, whose work is not split, end at once on rank 1, writing nothing. (The
    launch says rank 1; the Trainer here is one process, which the report does not depend on,
    and prints the progress lines as its own rank 0: a real rank 1's Trainer does not.)"""
    import logging
    import warnings

    from omnibert.accelerators.launchers import Launch
    from omnibert.apps import predict as predict_app
    from omnibert.errors import _ErrorsOnly, set_process_rank
    from omnibert.run.tools import evaluation

    second = Launch("torchrun", 2, 1, 1, 2)
    monkeypatch.setattr(evaluation, "check_launch_layout", lambda *args: second)
    out = tmp_path / "report.json"
    try:
        with warnings.catch_warnings():  # quiet_other_ranks drops rank 1's warnings
            report = _eval(trained, f"ckpt={trained['ckpt']}", f"out={out}", out=tmp_path / "run")
            exported = export_app.run(compose("export", [f"ckpt={trained['ckpt']}",
                                                         f"out={tmp_path / 'hf'}"]))  # fmt: skip
            command = compose("predict", [f"ckpt={trained['hf']}", f"out={tmp_path / 'p.jsonl'}"])
            texts = {"text": "the [MASK] is here"}  # as main() takes them from the command line
            predicted = predict_app.run(predict_app.with_texts(command, texts))
    finally:
        set_process_rank(None)
        for handler in logging.getLogger().handlers:  # rank 1's log filter, off again
            for f in [f for f in handler.filters if isinstance(f, _ErrorsOnly)]:
                handler.removeFilter(f)
    assert report["samples"] == trained["summary"]["validation"]["val/samples"]
    assert exported is None and predicted == {}
    captured = capsys.readouterr()  # only the one-process Trainer's own progress lines
    assert [line for line in captured.out.splitlines() if "validation" not in line
            and not line.startswith("omnibert-eval: evaluating ")] == [], captured.out  # fmt: skip
    assert captured.err == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == []
