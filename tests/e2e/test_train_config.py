"""conf/pretrain.yaml through the app's own wiring: every option of every group composes and
runs a training step (or is refused with one sentence where this machine lacks the device or
SDK); the recipes' values; what a phase owns; types checked when composing, ranges before
compute; the derived batch arithmetic and its refusals."""

from __future__ import annotations

from pathlib import Path

import datasets
import pytest
from hydra.errors import ConfigCompositionException
from test_experiments import SMALL

from omnibert.apps.compose import compose, group_options
from omnibert.apps.train import run_or_exit
from omnibert.checkpoints.resuming import resolve_ckpt_path
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.config.node import Optimizer
from omnibert.errors import UserError
from omnibert.formats.hdf5 import write_hdf5
from omnibert.formats.tfrecord import write_tfrecord
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare as prepare_shards
from omnibert.run.pretraining.batches import batch_plan
from omnibert.run.pretraining.checks import (
    check_optimizer,
    describe_clipping,
    resolve_clipping,
    resolve_vocab_size,
)
from omnibert.run.pretraining.job import build, prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
GROUPS = (
    "paths",
    "accelerator",
    "model",
    "data",
    "task",
    "phase",
    "optimizer",
    "schedule",
    "trainer",
    "logger",
    "callbacks",
    "experiment",
    "debug",
)
# experiment=smoke: a 1-layer 32-wide BERT on generated rows, seq 32 with 5 masks
SMOKE = ("experiment=smoke", "phase.max_steps=2", "val_every_n_steps=2")
# the same run spelled out, so that any data, model or experiment option can be combined
TINY = (
    "model.config.hidden_size=32",
    "model.config.num_hidden_layers=1",
    "model.config.num_attention_heads=2",
    "model.config.intermediate_size=64",
    "model.config.max_position_embeddings=64",
    "phase.max_seq_length=32",
    "phase.max_predictions_per_seq=5",
    "phase.global_batch_size=8",
    "phase.max_steps=2",
    "micro_batch_size=4",
    "val_every_n_steps=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
)
GENERATED = ("data=generated", "data.vocab_size=128", "data.num_train_samples=64",
             "data.num_eval_samples=8", "data.num_workers=0")  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> dict[str, str]:
    """Real data at the smoke shape (seq 32, 5 masks) in every format the data configs read."""
    root = tmp_path_factory.mktemp("data")
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    for split, text in (("train", "wiki_like.txt"), ("eval", "tiny_docs.txt")):
        prepare_shards([str(REFERENCE / text)], bert_vocab_file, root / split, settings,
                       progress=False)  # fmt: skip
    rows = datasets.load_from_disk(str(root / "train")).to_list()
    write_tfrecord(root / "train.tfrecord", rows, 32, 5)
    write_hdf5(root / "train.hdf5", rows, 32, 5)
    return {"root": str(root), "vocab": str(bert_vocab_file)}


def _data_overrides(option: str, files: dict[str, str]) -> list[str]:
    root = files["root"]
    paths = {
        "arrow": (f"{root}/train", f"{root}/eval"),
        "tfrecord": (f"{root}/train.tfrecord", "null"),
        "hdf5": (f"{root}/train.hdf5", "null"),
    }
    if option not in paths:
        return [f"data={option}"]
    train, evaluation = paths[option]
    out = [f"data={option}", f"data.train_path={train}", f"data.eval_path={evaluation}"]
    out += [f"data.vocab_file={files['vocab']}", "data.num_workers=0"]
    if option != "arrow":
        out.append(f"data.cache_dir={root}/cache-{option}")
    return out


#: options this machine cannot run: the sentence that refuses them, before any compute
REFUSED = {
    ("accelerator", "gpu"): "accelerator=gpu needs a CUDA GPU",
    ("accelerator", "hpu"): "accelerator=hpu needs Intel Gaudi's habana_frameworks",
    ("accelerator", "ipu"): "accelerator=ipu needs Graphcore's poptorch",
    ("optimizer", "lamb_habana"): "optimizer=lamb_habana is Intel Gaudi's FusedLamb",
    ("optimizer", "lamb_poptorch"): "optimizer=lamb_poptorch is Graphcore's poptorch",
    ("trainer", "fp16"): "trainer.precision=16-mixed is not supported by accelerator=cpu",
    # runs emulated on the CPU with trainer.fp8.emulate=true (tests/e2e/test_fp8.py)
    ("trainer", "fp8"): "trainer.precision=fp8 needs a CUDA GPU of compute capability 8.9",
}
#: what an option needs besides its name to run on CPU in seconds
EXTRA = {
    ("optimizer", "adamw"): ["optimizer.lr=1e-4"],  # the phases are tuned for LAMB only
    ("phase", "phase2"): ["phase.init_from=null"],  # no phase-1 run to start from here
    ("schedule", "step_table"): ["schedule.table=[[0,1.0e-4],[1,1.0e-3]]"],
}
# the fine-tuning tasks share the task group; omnibert-train refuses them (tested below)
FINETUNE_TASKS = set(group_options("task")) - {"pretraining"}
# the published recipes are compiled at their real shapes in test_experiments; the small
# experiments run a step here
OPTIONS = [
    (g, o)
    for g in GROUPS
    for o in group_options(g)
    if not (g == "task" and o in FINETUNE_TASKS) and not (g == "experiment" and o not in SMALL)
]


@pytest.mark.parametrize("task", sorted(FINETUNE_TASKS))
def test_pretraining_refuses_a_fine_tuning_task_with_the_app_to_use(task):
    from omnibert.config import TrainConfig

    with pytest.raises(UserError, match=f"omnibert-finetune task={task}"):
        TrainConfig.of(compose("pretrain", [*SMOKE, f"task={task}"]))


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_every_option_composes_and_runs_a_step(files, tmp_path, capsys, monkeypatch, group, option):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    if group == "data":
        data = _data_overrides(option, files)
    elif option in ("demo", "mlperf_smoke", "quickstart"):  # the demo's data, made small
        data = _data_overrides("arrow", files)[1:]
    elif option in ("two_phase", "demo_two_phase"):  # each phase on the test's shards, small
        data = _data_overrides("arrow", files)[3:]
        for name in ("phase1", "phase2"):
            data += [
                f"phases.{name}.data.train_path={files['root']}/train",
                f"phases.{name}.data.eval_path={files['root']}/eval",
            ]
            data += [
                f"phases.{name}.phase.{k}={v}"
                for k, v in (
                    ("max_seq_length", 32),
                    ("max_predictions_per_seq", 5),
                    ("global_batch_size", 8),
                    ("max_steps", 2),
                )
            ]
    else:
        data = [] if (group, option) == ("experiment", "smoke") else list(GENERATED)
    overrides = [f"paths.output_root={tmp_path}", f"{group}={option}", *data, *TINY]
    if group != "logger":
        overrides.append("logger=none")
    if group != "callbacks":
        overrides.append("callbacks=minimal")
    cfg = compose("pretrain", overrides + EXTRA.get((group, option), []))
    if (group, option) in REFUSED:
        with pytest.raises(SystemExit) as info:
            run_or_exit(cfg, tmp_path / "out")
        assert info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and REFUSED[(group, option)] in err[0], err
        assert not (tmp_path / "out" / "plan.json").exists()
        return
    summary = run_or_exit(cfg, tmp_path / "out")
    if "phases" in summary:  # a multi-phase experiment: every phase ran and validated
        steps = {"phase1": 4 if option == "smoke_two_phase" else 2, "phase2": 2}
        assert {n: s["steps"] for n, s in summary["phases"].items()} == steps
        assert all(s["validation"]["val/mlm_count"] > 0 for s in summary["phases"].values())
        return
    # fast_dev_run: Lightning's dry run of 2 micro-batches = 1 step of 2, no checkpoint
    assert summary["steps"] == (1 if option == "fast_dev_run" else 2)
    if (group, option) == ("callbacks", "finetune"):  # fine-tuning's: final.ckpt, no last.ckpt
        assert [p.name for p in tmp_path.rglob("*.ckpt")] == ["final.ckpt"]
    elif option != "fast_dev_run":
        assert Path(summary["last_checkpoint"]).is_file()
    if option not in ("tfrecord", "hdf5", "fast_dev_run"):  # those run without an eval set
        assert summary["validation"]["val/mlm_count"] > 0
    assert (tmp_path / "out" / "summary.json").is_file()


def test_defaults_are_the_lamb_phase1_recipe(tmp_path, compose_config):
    c = compose_config.resolved(
        f"paths.output_root={tmp_path}", "data.train_path=x", "data.eval_path=null"
    )
    assert c["optimizer"]["_target_"] == "omnibert.optim.Lamb"
    assert c["optimizer"]["lr"] == 6.0e-3
    assert c["schedule"]["_target_"] == "omnibert.optim.schedules.PolyWarmupLR"
    assert c["schedule"]["warmup_proportion"] == 0.2843 and c["schedule"]["power"] == 0.5
    assert c["task"]["_target_"] == "omnibert.tasks.PretrainingTask"
    phase = c["phase"]
    assert (phase["max_seq_length"], phase["max_predictions_per_seq"]) == (128, 20)
    assert (phase["global_batch_size"], phase["max_steps"]) == (65536, 7038)
    assert c["trainer"]["max_steps"] == 7038  # one step count
    assert c["trainer"]["use_distributed_sampler"] is False
    assert c["trainer"]["precision"] == "auto"  # fp32 on CPU, bf16 on a GPU that runs it
    assert c["data"]["max_seq_length"] == 128 and c["data"]["seed"] == c["seed"]
    assert c["paths"]["checkpoint_dir"] == f"{tmp_path}/{c['run_name']}/checkpoints"
    assert c["ckpt_path"] is None and c["micro_batch_size"] is None


def test_phase2_is_the_seq512_recipe_from_phase1(tmp_path, compose_config):
    base = (f"paths.output_root={tmp_path}", "data.train_path=x", "data.eval_path=null")
    c = compose_config.resolved(*base, "phase=phase2")
    phase = c["phase"]
    assert (phase["max_seq_length"], phase["max_predictions_per_seq"]) == (512, 76)
    assert (phase["global_batch_size"], phase["max_steps"]) == (32768, 1563)
    assert c["optimizer"]["lr"] == 4.0e-3
    assert c["trainer"]["max_steps"] == 1563 and c["schedule"]["warmup_proportion"] == 0.128
    phase1 = compose_config.resolved(*base)
    # phase 2 starts from phase 1's last checkpoint, and writes its own run directory
    assert phase["init_from"] == f"{phase1['paths']['checkpoint_dir']}/last.ckpt"
    assert c["paths"]["run_dir"] != phase1["paths"]["run_dir"]


def test_the_schedule_runs_the_phase_and_the_optimizer_lr_follows_the_phase(tmp_path):
    """The task builds the schedule phase.max_steps long; LAMB's LR is the phase's."""
    built = build(prepare(TrainConfig.of(compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}",
                                               "phase.max_steps=300", "phase.lr.lamb=3e-3"]))))  # fmt: skip
    out = built.task.configure_optimizers()
    assert out["lr_scheduler"]["scheduler"].total_steps == 300
    assert out["optimizer"].defaults["lr"] == 3e-3
    assert built.trainer.max_steps == 300
    assert type(out["optimizer"]).__name__ == "Lamb"


def test_switching_the_optimizer_never_inherits_another_optimizers_lr(tmp_path, capsys):
    """optimizer=adamw under a LAMB phase used to train AdamW at LAMB's 6e-3."""
    with pytest.raises(SystemExit):
        run_or_exit(compose("pretrain", [*SMOKE, "optimizer=adamw"]), tmp_path)
    err = capsys.readouterr().err.strip()
    assert "phase.lr.adamw" in err and "optimizer.lr=" in err and len(err.splitlines()) == 1
    built = build(prepare(TrainConfig.of(compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}",
                                               "optimizer=adamw", "+phase.lr.adamw=2e-4"]))))  # fmt: skip
    optimizer = built.task.configure_optimizers()["optimizer"]
    assert type(optimizer).__name__ == "AdamW" and optimizer.defaults["lr"] == 2e-4


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("phase.global_batch_size=abc", "phase.global_batch_size"),
        ("micro_batch_size=two", "micro_batch_size"),
        ("data.pack.buffer_size=big", "data.pack.buffer_size"),
        ("model.config.hidden_size=wide", "model.config.hidden_size"),
        ("compile_only=maybe", "compile_only"),
    ],
)
def test_type_errors_are_reported_when_composing_with_the_key(override, words):
    with pytest.raises(ConfigCompositionException) as info:
        compose("pretrain", ["experiment=smoke", override])
    assert words in str(info.value.__cause__)


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("phase.max_steps=0", "phase.max_steps=0 must be at least 1"),
        ("phase.warmup_proportion=1.5", "phase.warmup_proportion=1.5 must lie in [0, 1]"),
        ("phase.lr.lamb=-1", "phase.lr.lamb=-1.0 must be positive"),
        ("micro_batch_size=0", "micro_batch_size=0 must be at least 1"),
        ("val_every_n_steps=0", "val_every_n_steps=0 must be at least 1"),
        ("trainer.stop_within_s=0", "trainer.stop_within_s=0 must be a number of seconds above 0"),
        ("trainer.stop_within_s=soon", "trainer.stop_within_s='soon' is not a number of seconds"),
    ],
)
def test_range_errors_stop_before_compute_naming_the_key(tmp_path, capsys, override, words):
    with pytest.raises(SystemExit) as info:
        run_or_exit(compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", override]),
                    tmp_path / "out")  # fmt: skip
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
    assert not (tmp_path / "out").exists()


def test_experiments_are_small(tmp_path, compose_config):
    smoke = prepare(
        TrainConfig.of(compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}"]))
    )
    assert smoke.plan.batch.accumulate_grad_batches == 2
    assert smoke.config.data["source"]["_target_"].endswith("GeneratedSource")
    demo = compose_config.resolved(f"paths.output_root={tmp_path}", "experiment=demo")
    assert demo["data"]["train_path"] == "outputs/demo/train"
    assert demo["model"]["config"]["num_hidden_layers"] <= 4
    assert demo["phase"]["max_steps"] * demo["phase"]["global_batch_size"] <= 50_000
    quick = compose_config.resolved(f"paths.output_root={tmp_path}", "experiment=quickstart", "data.train_path=d",
               "data.eval_path=e")  # fmt: skip
    assert quick["model"]["config"]["num_hidden_layers"] <= 4
    assert quick["phase"]["global_batch_size"] <= 64
    assert quick["phase"]["max_steps"] * quick["phase"]["global_batch_size"] <= 50_000
    assert quick["val_every_n_steps"] <= quick["phase"]["max_steps"] // 4


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
    assert resolve_vocab_size(None, 7335) == 7335
    assert resolve_vocab_size(7335, 7335) == 7335
    with pytest.raises(TrainConfigError, match=r"model\.config\.vocab_size=30522"):
        resolve_vocab_size(30522, 7335)


def test_clipping_is_decided_once():
    lamb = Optimizer({"_target_": "omnibert.optim.Lamb", "max_grad_norm": 1.0})
    mlperf = Optimizer({"_target_": "omnibert.optim.Lamb", "max_grad_norm": None})
    adamw = Optimizer({"_target_": "omnibert.optim.AdamW"})
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


def test_lamb_mlperf_turns_on_micro_batch_clipping(tmp_path, compose_config):
    c = compose_config.resolved(
        f"paths.output_root={tmp_path}", "experiment=smoke", "optimizer=lamb_mlperf"
    )
    assert resolve_clipping(c["clip_grad_per_micro_batch"], Optimizer(c["optimizer"])) == 1.0


def test_bad_optimizer_or_schedule_keys_fail_before_compute():
    with pytest.raises(TrainConfigError, match="optimizer"):
        check_optimizer(
            Optimizer({"_target_": "omnibert.optim.Lamb", "_partial_": True, "lr": 1, "x": 1}),
            None,
            10,
        )
    opt = Optimizer({"_target_": "omnibert.optim.Lamb", "_partial_": True, "lr": 1e-3})
    sched = {"_target_": "omnibert.optim.schedules.PolyWarmupLR", "_partial_": True}
    with pytest.raises(TrainConfigError, match="schedule"):
        check_optimizer(opt, sched, 0)


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
