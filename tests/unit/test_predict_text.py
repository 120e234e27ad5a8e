"""omnibert-predict's command line without a model: question=, context=, text= and
text_pair= are taken out before Hydra parses the rest (their values are literal text that
Hydra's override grammar refuses), ``--help`` describes predict's own keys and
``--version`` prints omnibert's version. Predictions from such text and from standard input:
tests/e2e/test_predict.py."""

from __future__ import annotations

import sys

import pytest
from in_process import logging_restored

from omnibert import __version__
from omnibert.apps import predict
from omnibert.apps.compose import compose
from omnibert.errors import UserError

TEXTS = ["a; b", "a, b", "f(x)", "k=v", "it's", '"quoted"', "[1]", "{a: 1}", "$HOME",
         "two\nlines", "é 中文 🙂"]  # fmt: skip


def test_texts_are_taken_out_of_the_command_line_literally():
    for value in TEXTS:
        texts, rest = predict.split_text_arguments(
            ["ckpt=run", f"question={value}", f"context=={value}", "batch_size=2"]
        )
        assert texts == {"question": value, "context": f"={value}"}
        assert rest == ["ckpt=run", "batch_size=2"]
        cfg = predict.with_texts(compose("predict", rest), texts)
        assert cfg.question == value and cfg.batch_size == 2
    texts, rest = predict.split_text_arguments(["text=", "text_pair=x", "input_file=-", "--cfg"])
    assert texts == {"text": "", "text_pair": "x"} and rest == ["input_file=-", "--cfg"]
    with pytest.raises(UserError, match=r"^text= is given twice; pass it once\.$"):
        predict.split_text_arguments(["text=a", "text=b"])


def _main(monkeypatch, capsys, *argv):
    monkeypatch.setattr(sys, "argv", ["omnibert-predict", *argv])
    capsys.readouterr()
    with logging_restored():
        predict.main()
    return capsys.readouterr()


def test_help_describes_predict_and_version_is_omniberts(monkeypatch, capsys):
    shown = _main(monkeypatch, capsys, "--help").out
    assert shown.startswith(f"omnibert-predict {__version__}\n")
    for key in ("ckpt=???", "question=null", "context=null", "text=null", "text_pair=null",
                "input_file=null", "out=null", "batch_size=null", "precision=32-true",
                "accelerator=cpu"):  # fmt: skip
        assert f"\n  {key}\n" in shown, key
    assert "or - for standard input" in shown  # each key with its comment from predict.yaml
    assert "experiment:" not in shown and "optimizer:" not in shown  # not pretraining's groups
    assert _main(monkeypatch, capsys, "-h").out == shown
    assert _main(monkeypatch, capsys, "--version").out == f"omnibert-predict {__version__}\n"
    version = _main(monkeypatch, capsys, "text=--version", "--version").out
    assert version == f"omnibert-predict {__version__}\n"  # text= holds "--version" here
