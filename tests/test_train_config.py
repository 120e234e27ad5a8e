"""conf/pretrain.yaml: every option of every group composes and builds; the recipes' values;
the derived batch arithmetic and its refusals."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import compose, group_options
from omnibert.models import BertConfig
from omnibert.run.plan import (
    TrainConfigError,
    batch_plan,
    check_optimizer,
    describe_clipping,
    resolve_ckpt_path,
    resolve_clipping,
    resolve_vocab_size,
)

GROUPS = (
    "paths",
    "accelerator",
    "model",
    "data",
    "optimizer",
    "optimizer/schedule@schedule",
    "phase",
    "trainer",
    "logger",
    "callbacks",
    "experiment",
    "debug",
)


def _options(group: str) -> list[str]:
    return group_options(group.split("@")[0])


def _compose(*overrides: str) -> DictConfig:
    return compose("pretrain", list(overrides))


def _base_overrides(tmp_path: Path) -> list[str]:
    # fill the data paths (MISSING in the arrow config) and keep outputs in tmp
    return [f"paths.output_root={tmp_path}", "data.train_path=x", "data.eval_path=null"]


def _build(cfg: DictConfig) -> dict[str, Any]:
    """Instantiate what the app instantiates (data module, optimiser + schedule, callbacks,
    loggers, Trainer, model config) with the app's derived keyword arguments."""
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    plan = batch_plan(
        c["phase"]["global_batch_size"],
        c["accelerator"]["devices"],
        c["accelerator"]["num_nodes"],
        c["micro_batch_size"],
        c["eval_micro_batch_size"],
    )
    data = instantiate(
        cfg.data,
        micro_batch_size=plan.micro_batch_size,
        eval_micro_batch_size=plan.eval_micro_batch_size,
    )
    assert isinstance(data, pl.LightningDataModule)
    check_optimizer(c["optimizer"], c["schedule"])
    config = BertConfig(**{**c["model"]["config"], "vocab_size": 30522})
    callbacks = [instantiate(v) for v in cfg.callbacks.values() if v is not None]
    loggers = [instantiate(v) for v in cfg.logger.values() if v is not None] if cfg.logger else []
    trainer = instantiate(
        cfg.trainer,
        accumulate_grad_batches=plan.accumulate_grad_batches,
        val_check_interval=plan.accumulate_grad_batches,
        limit_train_batches=plan.accumulate_grad_batches,
        callbacks=callbacks,
        logger=loggers or False,
    )
    assert isinstance(trainer, pl.Trainer)
    if not trainer.fast_dev_run:
        assert trainer.max_steps == c["phase"]["max_steps"]
    return {"config": config, "plan": plan, "c": c, "trainer": trainer}


def test_defaults_are_the_lamb_phase1_recipe(tmp_path):
    cfg = _compose(*_base_overrides(tmp_path))
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    assert c["optimizer"]["_target_"] == "omnibert.optim.Lamb"
    assert c["optimizer"]["lr"] == 6.0e-3
    assert c["schedule"]["_target_"] == "omnibert.optim.schedules.PolyWarmupLR"
    assert c["schedule"]["warmup_proportion"] == 0.2843 and c["schedule"]["power"] == 0.5
    phase = c["phase"]
    assert (phase["max_seq_length"], phase["max_predictions_per_seq"]) == (128, 20)
    assert (phase["global_batch_size"], phase["max_steps"]) == (65536, 7038)
    # one step count: the trainer and the schedule read phase.max_steps
    assert c["trainer"]["max_steps"] == c["schedule"]["total_steps"] == 7038
    assert c["trainer"]["use_distributed_sampler"] is False
    assert c["trainer"]["precision"] == "32-true"
    assert c["data"]["max_seq_length"] == 128 and c["data"]["seed"] == c["seed"]
    assert c["paths"]["checkpoint_dir"] == f"{tmp_path}/{c['run_name']}/checkpoints"
    assert c["ckpt_path"] is None and c["micro_batch_size"] is None


def test_phase2_is_the_seq512_recipe_from_phase1(tmp_path):
    c = OmegaConf.to_container(_compose(*_base_overrides(tmp_path), "phase=phase2"), resolve=True)
    assert isinstance(c, dict)
    phase = c["phase"]
    assert (phase["max_seq_length"], phase["max_predictions_per_seq"]) == (512, 76)
    assert (phase["global_batch_size"], phase["max_steps"]) == (32768, 1563)
    assert c["optimizer"]["lr"] == 4.0e-3
    assert c["schedule"]["total_steps"] == c["trainer"]["max_steps"] == 1563
    assert c["schedule"]["warmup_proportion"] == 0.128
    phase1 = OmegaConf.to_container(_compose(*_base_overrides(tmp_path)), resolve=True)
    assert isinstance(phase1, dict)
    # phase 2 starts from phase 1's last checkpoint, and writes its own run directory
    assert phase["init_from"] == f"{phase1['paths']['checkpoint_dir']}/last.ckpt"
    assert c["paths"]["run_dir"] != phase1["paths"]["run_dir"]


def test_changing_max_steps_moves_the_schedule_with_it(tmp_path):
    c = OmegaConf.to_container(
        _compose(*_base_overrides(tmp_path), "phase.max_steps=300"), resolve=True
    )
    assert isinstance(c, dict)
    assert c["trainer"]["max_steps"] == c["schedule"]["total_steps"] == 300


OPTIONS = [(g, o) for g in GROUPS for o in _options(g)]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_builds(tmp_path, group, option):
    overrides = [*_base_overrides(tmp_path), f"{group}={option}"]
    if group == "optimizer/schedule@schedule" and option == "step_table":
        # a step table has no length: drop the keys the phase gives step-count schedules
        overrides += ["~schedule.total_steps", "~schedule.warmup_proportion"]
    if group == "experiment" or (group == "data" and option == "generated"):
        overrides = [f"paths.output_root={tmp_path}", *overrides[3:]]
    cfg = _compose(*overrides)
    if group == "accelerator" and option != "cpu":
        # the plugin must build (its constructor checks no SDK); its Trainer needs the device
        # or SDK and is built in tests/test_accelerators*.py (fakes for hpu and ipu)
        from omnibert.accelerators import AcceleratorPlugin

        assert isinstance(instantiate(cfg.accelerator, _convert_="all"), AcceleratorPlugin)
        cfg = _compose(*overrides[:-1])
    built = _build(cfg)
    c = built["c"]
    if group == "model":
        assert dataclasses.asdict(built["config"]).keys() == {
            f.name for f in dataclasses.fields(BertConfig)
        }
        assert c["model"]["config"]["vocab_size"] is None  # taken from the data
        assert set(c["model"]) >= {"name", "init_from", "config"}
    if group == "accelerator":
        assert set(c["accelerator"]) >= {"accelerator", "devices", "num_nodes", "strategy"}
    if group == "logger" and option != "none":
        assert built["trainer"].loggers
    if group == "debug":
        trainer = built["trainer"]
        checks = {
            "fast_dev_run": lambda: trainer.fast_dev_run == 2,
            "overfit": lambda: c["steps_per_epoch"] == 1 and c["data"]["shuffle"] is False,
            "profile": lambda: type(trainer.profiler).__name__ == "SimpleProfiler",
            "anomaly": lambda: c["trainer"]["detect_anomaly"] is True,
        }
        assert checks[option]()
    if group == "logger" and option.startswith("wandb"):
        assert built["trainer"].loggers[0].save_dir == c["paths"]["log_dir"]


def test_wandb_offline_logs_without_a_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    for key in ("WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(key, raising=False)
    cfg = _compose(*_base_overrides(tmp_path), "logger=wandb_offline", "run_name=offline")
    logger = instantiate(cfg.logger.wandb)
    try:
        logger.log_metrics({"train/loss": 1.5}, step=1)
    finally:
        logger.experiment.finish()
    runs = list((Path(cfg.paths.log_dir) / "wandb").glob("offline-run-*"))
    assert runs and any(runs[0].rglob("*.wandb"))


def test_experiments_are_small(tmp_path):
    smoke = _build(_compose(f"paths.output_root={tmp_path}", "experiment=smoke"))
    assert smoke["plan"].accumulate_grad_batches == 2
    assert smoke["c"]["data"]["_target_"].endswith("PretrainingDataModule")
    assert smoke["c"]["data"]["source"]["_target_"].endswith("GeneratedSource")
    demo = _build(_compose(f"paths.output_root={tmp_path}", "experiment=demo"))
    assert demo["c"]["data"]["train_path"] == "outputs/demo/train"
    assert demo["c"]["model"]["config"]["num_hidden_layers"] <= 4
    assert demo["c"]["phase"]["max_steps"] * demo["c"]["phase"]["global_batch_size"] <= 50_000


# ---------------------------------------------------------------- derived batch arithmetic


def test_batch_plan_arithmetic():
    p = batch_plan(65536, 8, 4, 64)
    assert (p.world_size, p.micro_batch_size, p.accumulate_grad_batches) == (32, 64, 32)
    assert p.eval_micro_batch_size == 64
    p = batch_plan(256, 2, 1, None, 100)
    assert (p.micro_batch_size, p.accumulate_grad_batches, p.eval_micro_batch_size) == (
        128,
        1,
        100,
    )


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ((10, 4, 1, None), ["phase.global_batch_size=10", "4 devices"]),
        ((64, 1, 1, 48), ["micro_batch_size=48", "multiple"]),
        ((64, 2, 2, 24), ["24 × 4 device(s) = 96"]),
        ((0, 1, 1, None), ["phase.global_batch_size=0", "positive"]),
        ((64, "auto", 1, None), ["accelerator.devices='auto'"]),
        ((64, 1, 1, 0), ["micro_batch_size=0"]),
    ],
)
def test_impossible_batch_arithmetic_is_one_clear_sentence(args, words):
    with pytest.raises(TrainConfigError) as info:
        batch_plan(*args)
    message = str(info.value)
    assert "\n" not in message and message.endswith(".")
    for word in words:
        assert word in message


def test_vocab_size_comes_from_the_data_or_must_match():
    assert resolve_vocab_size({"vocab_size": None}, 7335) == 7335
    assert resolve_vocab_size({"vocab_size": 7335}, 7335) == 7335
    with pytest.raises(TrainConfigError, match=r"model\.config\.vocab_size=30522"):
        resolve_vocab_size({"vocab_size": 30522}, 7335)


def test_clipping_is_decided_once():
    lamb = {"_target_": "omnibert.optim.Lamb", "max_grad_norm": 1.0}
    mlperf = {"_target_": "omnibert.optim.Lamb", "max_grad_norm": None}
    adamw = {"_target_": "omnibert.optim.AdamW"}
    assert resolve_clipping("auto", lamb) is None
    assert resolve_clipping("auto", mlperf) == 1.0
    assert resolve_clipping("auto", adamw) is None
    assert resolve_clipping(0.5, adamw) == 0.5 and resolve_clipping(None, mlperf) is None
    assert "MLPerf" in describe_clipping(1.0, mlperf, None)
    assert "optimiser" in describe_clipping(None, lamb, None)
    with pytest.raises(TrainConfigError, match="clip twice"):
        describe_clipping(1.0, lamb, None)
    with pytest.raises(TrainConfigError, match="gradient_clip_val"):
        describe_clipping(None, lamb, 1.0)


def test_lamb_mlperf_turns_on_micro_batch_clipping(tmp_path):
    c = OmegaConf.to_container(
        _compose(*_base_overrides(tmp_path), "optimizer=lamb_mlperf"), resolve=True
    )
    assert isinstance(c, dict)
    assert resolve_clipping(c["clip_grad_per_micro_batch"], c["optimizer"]) == 1.0


def test_bad_optimizer_or_schedule_keys_fail_before_compute():
    with pytest.raises(TrainConfigError, match="optimizer"):
        check_optimizer(
            {"_target_": "omnibert.optim.Lamb", "_partial_": True, "lr": 1, "x": 1}, None
        )
    opt = {"_target_": "omnibert.optim.Lamb", "_partial_": True, "lr": 1e-3}
    sched = {"_target_": "omnibert.optim.schedules.PolyWarmupLR", "_partial_": True}
    with pytest.raises(TrainConfigError, match="schedule"):
        check_optimizer(opt, {**sched, "total_steps": 0})


def test_ckpt_path_resolution(tmp_path):
    ckpts = tmp_path / "checkpoints"
    assert resolve_ckpt_path(None, ckpts) is None
    with pytest.raises(TrainConfigError) as info:
        resolve_ckpt_path("last", ckpts)
    assert str(ckpts) in str(info.value) and "ckpt_path=last" in str(info.value)
    ckpts.mkdir()
    (ckpts / "last.ckpt").write_bytes(b"x")
    assert resolve_ckpt_path("last", ckpts) == str(ckpts / "last.ckpt")
    # a fresh run must not overwrite (or prune) an earlier run's checkpoints
    with pytest.raises(TrainConfigError, match="ckpt_path=last"):
        resolve_ckpt_path(None, ckpts)
    with pytest.raises(TrainConfigError, match="does not exist"):
        resolve_ckpt_path(str(tmp_path / "nope.ckpt"), ckpts)
