"""``model.init_from=<Hugging Face dir>`` takes the model's architecture from the directory's
config.json (BERT and ModernBERT, whatever the model preset), so no ``model.config.*`` needs
typing; a ``model.config.*`` set on the command line that contradicts config.json is refused
in one sentence before compute (also when Hydra's command line says so), a dropout set there
is applied."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from in_process import logging_restored

from omnibert.apps.compose import compose
from omnibert.checkpoints.init_from import InitFromError
from omnibert.config import TrainConfig
from omnibert.config.train import override_keys
from omnibert.convert import export_hf
from omnibert.models import BertForPreTraining
from omnibert.run.pretraining.job import prepare

QUICK = ("data=generated", "data.num_workers=0", "phase.max_seq_length=32",
         "phase.max_predictions_per_seq=5", "phase.global_batch_size=8", "micro_batch_size=8",
         "phase.max_steps=1", "logger=none", "callbacks=minimal")  # fmt: skip


def _prepared(tmp_path: Path, *overrides: str, typed: tuple[str, ...] = ()):
    cfg = compose("pretrain", [*QUICK, f"paths.output_root={tmp_path / 'runs'}", *overrides])
    return prepare(TrainConfig.of(cfg, command_line=typed))


def test_a_bert_directory_gives_its_sizes_and_a_contradiction_is_refused(tmp_path, tiny_hf):
    """The default preset is bert_large; the tiny directory (L2-H32-A4, 64 positions) wins."""
    prepared = _prepared(tmp_path, f"model.init_from={tiny_hf}")
    model = prepared.plan.model
    sizes = (model.num_hidden_layers, model.hidden_size, model.num_attention_heads,
             model.intermediate_size, model.max_position_embeddings)  # fmt: skip
    assert sizes == (2, 32, 4, 64, 64) and model.is_bert
    assert "the architecture is its config.json's: BERT L2-H32-A4, intermediate 64" in (
        prepared.plan.table()
    )
    dropout = ("model.config.hidden_dropout_prob=0.0",)
    kept = _prepared(tmp_path, f"model.init_from={tiny_hf}", *dropout, typed=dropout)
    assert kept.plan.model.hidden_dropout_prob == 0.0  # training, not architecture: applied
    same = ("model.config.hidden_size=32",)  # typed and equal to config.json's: fine
    assert _prepared(tmp_path, f"model.init_from={tiny_hf}", *same, typed=same).plan.model
    typed = ("model.config.num_hidden_layers=3", "model.config.hidden_size=32")
    with pytest.raises(InitFromError) as refused:
        _prepared(tmp_path, f"model.init_from={tiny_hf}", *typed, typed=typed)
    assert str(refused.value) == (
        f"init_from={tiny_hf} is a Hugging Face checkpoint whose config.json gives the model's "
        "architecture, and model.config.num_hidden_layers=3 (config.json: 2) contradicts it; "
        "drop that override (or start from another checkpoint)."
    )


def test_a_modernbert_directory_gives_its_family_and_sizes(tmp_path):
    from test_modernbert_interop import preset, random_model

    torch.manual_seed(0)
    config = preset("modern_tiny").replace(vocab_size=30522, num_hidden_layers=3)
    hf = tmp_path / "modern"
    export_hf(random_model(config), hf, None)
    prepared = _prepared(tmp_path, f"model.init_from={hf}", "data.next_sentence=false")
    model = prepared.plan.model
    assert not model.is_bert and model.position_encoding == "rope" and model.feed_forward == "geglu"
    assert (model.num_hidden_layers, model.hidden_size, model.local_window) == (3, 128, 64)
    assert not model.next_sentence_head
    task = BertForPreTraining(model)
    loaded = prepared.init.load_into(task)
    assert "loaded" in loaded and torch.equal(
        task.bert.encoder.layer[2].attention.output.dense.weight,
        random_model(config).bert.encoder.layer[2].attention.output.dense.weight,
    )


def test_the_hydra_command_line_is_what_counts_as_typed(tmp_path, tiny_hf, monkeypatch, capsys):
    assert override_keys(["+model.config.x=1", "~model.y", "seed=3"]) == {"model.config.x", "seed"}
    assert override_keys(None) == frozenset()  # outside a Hydra app nothing was typed
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the app's default, left as it was
    monkeypatch.setattr(sys, "argv", [
        "omnibert-train", *QUICK, f"paths.output_root={tmp_path / 'runs'}",
        f"model.init_from={tiny_hf}", "model.config.intermediate_size=128",
    ])  # fmt: skip
    capsys.readouterr()
    with pytest.raises(SystemExit) as stop, logging_restored():
        from omnibert.apps import train

        train.main()
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(
        "model.config.intermediate_size=128 (config.json: 64) contradicts it; drop that "
        "override (or start from another checkpoint)."
    ), err
