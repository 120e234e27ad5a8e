"""Exports are complete Hugging Face repositories and pretrained models fill masked words.

From a real 4-step omnibert-train run (its summary.json where the app writes it) and a random
ModernBERT checkpoint, both with the uncased BERT vocab: ``omnibert-export`` writes
``tokenizer.json`` / ``tokenizer_config.json`` (``model_max_length`` = the positions, the
lower-casing the data was prepared with), a ``config.json`` that ``AutoModelForMaskedLM`` and
``pipeline("fill-mask")`` load with no missing or unexpected key and no load report, and a
model card whose metrics and recipe are the run's; a 2,000-word input truncates to the
model's positions; a cased vocab stays cased; ``omnibert-predict``'s fill-mask gives the
pipeline's tokens and scores (within 1e-5) from the run, its checkpoint and its export;
``omnibert-eval`` evaluates in the precision the run validated in and says so.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from test_hf_interop import lightning_checkpoint
from test_modernbert_interop import preset, random_model

from omnibert.apps import eval as eval_app
from omnibert.apps import export as export_app
from omnibert.apps import predict
from omnibert.apps.compose import compose
from omnibert.convert.hf import ConversionError
from omnibert.convert.hub_tokenizer import wordpiece_tokenizer
from omnibert.errors import UserError

FILES = ["README.md", "config.json", "model.safetensors", "special_tokens_map.json",
         "tokenizer.json", "tokenizer_config.json", "vocab.txt"]  # fmt: skip
TEXT = "the history of the [MASK] is long."


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, tiny_pretraining_run: dict,
        bert_vocab_file: Path) -> dict:  # fmt: skip
    """conftest's 4-step BERT run (its summary in <run>/hydra/<time>/ as the app writes it),
    exported; and a random ModernBERT checkpoint with the same vocab, exported."""
    root = tmp_path_factory.mktemp("hub")
    export_app.run(compose("export", [f"ckpt={tiny_pretraining_run['ckpt']}",
                                      f"out={root / 'bert'}"]))  # fmt: skip
    torch.manual_seed(0)
    modern = random_model(preset("modern_tiny").replace(vocab_size=30522))
    ckpt = lightning_checkpoint(root / "modern.ckpt", modern, bert_vocab_file)
    export_app.run(compose("export", [f"ckpt={ckpt}", f"out={root / 'modern'}"]))
    return {**tiny_pretraining_run, "data": tiny_pretraining_run["root"], "root": root,
            "modern_ckpt": ckpt, "ckpt": Path(tiny_pretraining_run["ckpt"])}  # fmt: skip


@contextlib.contextmanager
def everything_said():
    """stdout, stderr and every log record (transformers' warnings included) in one string."""
    transformers.logging.set_verbosity_warning()
    said = io.StringIO()
    handler = logging.StreamHandler(said)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        with contextlib.redirect_stdout(said), contextlib.redirect_stderr(said):
            yield said
    finally:
        root.removeHandler(handler)


def _front_matter(path: Path) -> dict:
    text = path.read_text()
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n")[1])


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_the_export_loads_silently_as_a_masked_lm_with_its_tokenizer(run, family, capfd):
    out = run["root"] / family
    assert sorted(p.name for p in out.iterdir()) == FILES
    config = json.loads((out / "config.json").read_text())
    arch = "BertForMaskedLM" if family == "bert" else "ModernBertForMaskedLM"
    assert config["architectures"] == [arch]
    capfd.readouterr()
    with everything_said() as said:
        model, info = transformers.AutoModelForMaskedLM.from_pretrained(
            out, output_loading_info=True
        )
        fill = transformers.pipeline("fill-mask", model=str(out), device="cpu")
        results = fill(TEXT)
    quoted = said.getvalue() + "".join(capfd.readouterr())
    assert type(model).__name__ == arch and not any(info.values()), info
    for word in ("UNEXPECTED", "MISSING", "LOAD REPORT", "newly initialized", "not used"):
        assert word not in quoted, quoted
    assert len(results) == 5 and all(0 < r["score"] < 1 for r in results)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    positions = 64 if family == "bert" else 512
    assert tokenizer.model_max_length == positions  # not transformers' 1e30 sentinel
    long = " ".join(["history"] * 2000)
    assert len(tokenizer(long, truncation=True)["input_ids"]) == positions
    # a long text with its [MASK] early: truncated, not "size of tensor a (2002) must match"
    assert len(fill(f"the [MASK] {long}", tokenizer_kwargs={"truncation": True})) == 5
    inputs = tokenizer("The History", return_tensors="pt")
    assert tokenizer.convert_ids_to_tokens(inputs["input_ids"][0]) == [
        "[CLS]", "the", "history", "[SEP]"]  # fmt: skip
    assert ("token_type_ids" in inputs) == (family == "bert")  # ModernBERT has no token types


def test_the_model_card_holds_the_runs_metrics_data_and_recipe(run):
    card = run["root"] / "bert" / "README.md"
    meta = _front_matter(card)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "fill-mask"
    assert {"omnibert", "bert", "fill-mask"} <= set(meta["tags"])
    metrics = {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    val = run["summary"]["validation"]
    assert metrics["masked-LM accuracy"] == pytest.approx(val["val/mlm_acc"], abs=1e-6)
    assert "next-sentence accuracy" not in metrics  # that head is not in a heads=mlm export
    text = card.read_text()
    precision = run["summary"]["plan"]["precision"]
    assert f"The run's validation at step 4 on `{run['data'] / 'eval'}`" in text
    assert f"in {precision}, from `{run['run_dir'] / 'hydra'}" in text
    assert "| optimiser steps | 4 of 4 planned |" in text
    assert "| global batch | 8 sequences (8 per micro-batch x 1 accumulated" in text
    assert "| sequence length | 32 tokens, 5 masked positions |" in text
    assert f"| precision | {precision} |" in text
    assert f"training data: `{run['data'] / 'train'}`" in text
    assert "pooler and the next-sentence head of pretraining are left out" in text
    assert "lower-cased (as the training data was prepared: do_lower_case=true)" in text
    modern = _front_matter(run["root"] / "modern" / "README.md")
    assert modern["pipeline_tag"] == "fill-mask" and "modernbert" in modern["tags"]
    assert "model-index" not in modern  # no run recorded an evaluation: none is claimed
    assert (
        "No evaluation: the checkpoint's run left no summary.json"
        in (run["root"] / "modern" / "README.md").read_text()
    )


def test_heads_pretraining_exports_bert_for_pretraining(run, tmp_path, capsys):
    out = tmp_path / "pre"
    export_app.run(compose("export", [f"ckpt={run['ckpt']}", f"out={out}", "heads=pretraining"]))
    assert (
        "as BertForPreTraining (with the pooler and next-sentence head" in capsys.readouterr().out
    )
    model, info = transformers.AutoModelForPreTraining.from_pretrained(
        out, output_loading_info=True
    )
    assert type(model).__name__ == "BertForPreTraining" and not any(info.values()), info
    with pytest.raises(ConversionError, match=r"heads=nsp is not one of mlm, pretraining"):
        export_app.run(compose("export", [f"ckpt={run['ckpt']}", f"out={out}-x", "heads=nsp"]))
    assert not (tmp_path / "pre-x").exists()


def test_a_cased_vocab_stays_cased(tmp_path, bert_vocab_file):
    """A checkpoint whose data was prepared cased (do_lower_case false) exports a tokenizer
    that keeps the case; the same checkpoint recorded lower-cased exports one that lowers it.
    ``AutoTokenizer`` gives omnibert's own WordPiece ids either way."""
    from test_hf_interop import random_model as random_bert

    from omnibert.models import BertConfig

    cased = tmp_path / "vocab.txt"
    cased.write_text(bert_vocab_file.read_text().replace("\nparis\n", "\nParis\n", 1))
    model = random_bert(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, intermediate_size=64))  # fmt: skip
    text = "Héllo Wörld, PARIS and Paris"
    ids = {}
    for lower in (False, True):
        ckpt = lightning_checkpoint(tmp_path / f"{lower}.ckpt", model, cased)
        saved = torch.load(ckpt, weights_only=True)
        saved["hyper_parameters"]["do_lower_case"] = lower
        torch.save(saved, ckpt)
        out = tmp_path / f"lower-{lower}"
        export_app.run(compose("export", [f"ckpt={ckpt}", f"out={out}"]))
        config = json.loads((out / "tokenizer_config.json").read_text())
        assert config["do_lower_case"] is lower and config["strip_accents"] is lower
        ids[lower] = transformers.AutoTokenizer.from_pretrained(out)(text)["input_ids"]
        assert ids[lower] == wordpiece_tokenizer(cased, lower).encode(text).ids
    paris = transformers.AutoTokenizer.from_pretrained(tmp_path / "lower-False")
    assert "Paris" in paris.convert_ids_to_tokens(ids[False]) and ids[False] != ids[True]


def _predict(*overrides: str, **texts: str) -> dict:
    """omnibert-predict as the app runs it: texts beside the Hydra overrides."""
    return predict.run(predict.with_texts(compose("predict", list(overrides)), texts))


def _pipeline_predictions(out: Path, text: str, top_k: int) -> list:
    fill = transformers.pipeline("fill-mask", model=str(out), device="cpu")
    return fill(text, top_k=top_k)


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_fill_mask_predict_gives_the_pipelines_tokens_and_scores(run, family, capsys):
    """omnibert-predict's top-k from the export and from the checkpoint (BERT: the run
    directory) equals Hugging Face's fill-mask pipeline on the export."""
    out = run["root"] / family
    theirs = _pipeline_predictions(out, TEXT, 7)
    sources = [out, run["run_dir"] if family == "bert" else run["modern_ckpt"]]
    for source in sources:
        record = _predict(f"ckpt={source}", "top_k=7", text=TEXT)
        assert record["text"] == TEXT and len(record["masks"]) == 1
        ours = record["masks"][0]
        assert [p["token"] for p in ours] == [p["token"] for p in theirs], source
        assert [p["token_str"] for p in ours] == [p["token_str"] for p in theirs]
        assert [p["sequence"] for p in ours] == [p["sequence"] for p in theirs]
        for mine, hf in zip(ours, theirs, strict=True):
            assert mine["score"] == pytest.approx(hf["score"], abs=1e-5)
    assert json.loads(capsys.readouterr().out.splitlines()[-1]) == record


def test_fill_mask_reads_files_json_lines_and_stdin_and_refuses_bad_texts(
    run, tmp_path, monkeypatch
):
    out = run["root"] / "bert"
    texts = ["the [MASK] of paris .", "a [MASK] and a [MASK] ."]
    plain = tmp_path / "texts.txt"
    plain.write_text(f"{texts[0]}\n\n{texts[1]}\n")
    lines = tmp_path / "texts.jsonl"
    lines.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    got = {}
    for source in (plain, lines):
        target = tmp_path / f"{source.suffix}.out.jsonl"
        result = predict.run(compose("predict", [f"ckpt={out}", f"input_file={source}",
                                                 f"out={target}", "top_k=3"]))  # fmt: skip
        assert result == {"predictions": 2, "out": str(target)}
        got[source.suffix] = [json.loads(x) for x in target.read_text().splitlines()]
    assert got[".txt"] == got[".jsonl"]
    assert [len(r["masks"]) for r in got[".txt"]] == [1, 2]
    assert [[len(m) for m in r["masks"]] for r in got[".txt"]] == [[3], [3, 3]]
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(lines.read_bytes())))
    piped = predict.run(compose("predict", [f"ckpt={out}", "input_file=-", "top_k=3"]))
    assert piped["records"] == got[".jsonl"]

    def refused(*overrides: str, **texts: str) -> str:
        with pytest.raises(UserError) as err:
            _predict(f"ckpt={out}", *overrides, **texts)
        text = str(err.value)
        assert "\n" not in text and text.endswith("."), text
        return text

    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"text": "a [MASK] ."}\n\n{"text": "  "}\n')
    assert refused(f"input_file={empty}", f"out={tmp_path / 'x.jsonl'}") == (
        f'input_file={empty} line 3\'s "text" is empty; put a text with [MASK] in it.'
    )
    assert "has no [MASK]; mark the word" in refused(text="no mask here")
    assert "it fills [MASK] in text=, not question= or context=; pass a" in refused(
        question="why", context="so"
    )
    assert "(task_name=fill-mask), not task_name=squad" in refused(
        "task_name=squad", text="a [MASK]"
    )
    assert not (tmp_path / "x.jsonl").exists()


def test_eval_states_its_precision_and_defaults_to_the_runs(run, tmp_path, capsys):
    """omnibert-eval evaluates in the precision the run validated in (its summary.json) and
    says so, scoring what the run's validation scored; another precision is said to be one."""
    summary = run["summary"]
    precision = summary["plan"]["precision"]
    base = [f"ckpt={run['ckpt']}", f"data.eval_path={run['data'] / 'eval'}"]
    report = eval_app.run_or_exit(compose("eval", base), None)
    assert report["precision"] == precision
    assert report["precision_note"].startswith("as its run validated, per ")
    assert report["mlm_accuracy"] == pytest.approx(summary["validation"]["val/mlm_acc"], abs=1e-7)
    assert f"  precision           {precision} (as its run validated" in capsys.readouterr().out
    other = "32-true" if precision != "32-true" else "bf16-mixed"
    set_report = eval_app.run_or_exit(compose("eval", [*base, f"precision={other}"]), None)
    assert set_report["precision"] == other
    assert set_report["precision_note"] == (
        f"as set; its run validated in {precision}, so its accuracies can differ in the last "
        f"digits: precision={precision} reproduces them"
    )
    # a Hugging Face directory records no precision: fp32, said so
    pre = tmp_path / "pre"
    export_app.run(compose("export", [f"ckpt={run['ckpt']}", f"out={pre}", "heads=pretraining"]))
    exported = eval_app.run_or_exit(compose("eval", [*base[1:], f"ckpt={pre}"]), None)
    assert exported["precision"] == "32-true"
    assert exported["precision_note"] == "the default: the checkpoint's run records no precision"
    # a heads=mlm export has no next-sentence head: the refusal names the export that has one
    with pytest.raises(
        ConversionError, match=r"masked-LM model .*omnibert-export heads=pretraining"
    ):
        eval_app.run(compose("eval", [*base[1:], f"ckpt={run['root'] / 'bert'}"]), None)
