"""The run pipeline plans once and builds once: through each app's own entry point, the
typed config is made (every range checked) once, the pretraining data is checked once,
fine-tuning's inputs are checked once, and every optimiser is built by
``omnibert.optim.build``: the check before compute and the task's, nowhere else."""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

import pytest
from finetune_data import mrpc_file

from omnibert.apps import finetune as finetune_app
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import FinetuneConfig, TrainConfig
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.optim import build as optim_build
from omnibert.run.finetuning import inputs as finetune_inputs
from omnibert.run.finetuning import job as finetuning
from omnibert.run.pretraining import checks
from omnibert.tasks import base


def _counting(monkeypatch: pytest.MonkeyPatch, counts: Counter, owner: Any, name: str,
              *also: Any) -> None:  # fmt: skip
    """Count the calls of ``owner.name`` (a function, a method or a classmethod), and of the
    same function where ``also`` (modules) imported it by name."""
    original = getattr(owner, name)
    function = getattr(original, "__func__", original)

    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return function(*args, **kwargs)

    monkeypatch.setattr(
        owner, name, classmethod(counted) if inspect.ismethod(original) else counted
    )
    for module in also:
        monkeypatch.setattr(module, name, counted)


def test_a_training_run_types_its_config_and_checks_its_data_once(tmp_path, monkeypatch):
    counts: Counter = Counter()
    _counting(monkeypatch, counts, TrainConfig, "of")
    _counting(monkeypatch, counts, PretrainingDataModule, "check")
    _counting(monkeypatch, counts, optim_build, "build_optimizer", checks, base)
    cfg = compose("pretrain", ["experiment=smoke", "phase.max_steps=2", "val_every_n_steps=2",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    summary = run_or_exit(cfg, tmp_path / "out")
    assert summary["steps"] == 2 and summary["validation"] is not None  # trained, validated
    # the dry run before compute and the task's own: two builds, both through optim.build
    assert counts == {"of": 1, "check": 1, "build_optimizer": 2}, counts


def test_a_finetuning_run_types_its_config_and_checks_its_inputs_once(
    tmp_path, monkeypatch, tiny_hf
):
    counts: Counter = Counter()
    _counting(monkeypatch, counts, FinetuneConfig, "of")
    _counting(monkeypatch, counts, finetune_inputs, "check_inputs", finetuning)
    _counting(monkeypatch, counts, optim_build, "build_optimizer", base)
    train = mrpc_file(tmp_path / "train.tsv", 8, 1)
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
        f"paths.output_root={tmp_path / 'runs'}", "task.batch_size=4", "task.epochs=1",
        "task.max_seq_length=32", "logger=none", "trainer.enable_progress_bar=false",
    ])  # fmt: skip
    summary = finetune_app.run(cfg)
    assert summary["steps"] == 2
    assert counts == {"of": 1, "check_inputs": 1, "build_optimizer": 1}, counts
