"""Every experiment (the seed recipes as one-word configs) composes and compiles one training
step of each of its phases with ``compile_only=true`` on CPU: the experiment's own batch
arithmetic (devices, micro batch, accumulation), shapes, optimiser and schedule, with the
model shrunk in width (hidden 32, every layer kept, so pipeline stages still divide it) and
generated rows instead of files. GPU recipes run with ``accelerator=cpu`` (same device count
and micro batch; fp32, as CPU has no fp16 autocast); Gaudi and IPU recipes keep their
accelerator through the fake SDKs of tests/fakes/sdk, which follow the vendors' documented APIs
and are no evidence that anything runs on that hardware."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from omnibert.apps.compose import compose, group_options
from omnibert.apps.train import run_or_exit

SHRUNK = ("model.config.hidden_size=32", "model.config.num_attention_heads=2",
          "model.config.intermediate_size=64")  # fmt: skip
GENERATED = ("data=generated", "data.vocab_size=128",
             "data.num_eval_samples=8", "data.num_workers=0")  # fmt: skip
#: what each experiment is, checked on the composed config before it compiles
RECIPES: dict[str, dict[str, Any]] = {
    "bert_large_gpu8_phase1": {"accelerator": "gpu", "devices": 8, "micro": 64,
                               "global": 65536, "precision": "16-mixed"},
    "bert_large_gpu8_phase2": {"accelerator": "gpu", "devices": 8, "micro": 16,
                               "global": 32768, "precision": "16-mixed"},
    "bert_large_gpu8": {"accelerator": "gpu", "devices": 8, "precision": "16-mixed",
                        "phases": {"phase1": (64, 65536, 128), "phase2": (16, 32768, 512)}},
    "bert_large_hpu8_phase1": {"accelerator": "hpu", "devices": 8, "micro": 64,
                               "global": 65536, "precision": "bf16-mixed"},
    "bert_large_hpu8_phase2": {"accelerator": "hpu", "devices": 8, "micro": 8,
                               "global": 32768, "precision": "bf16-mixed"},
    "bert_large_pod16_phase1": {"accelerator": "ipu", "devices": 4, "micro": 8,
                                "global": 65536, "precision": "16-true"},
    "bert_large_pod16_phase2": {"accelerator": "ipu", "devices": 4, "micro": 2,
                                "global": 16384, "precision": "16-true"},
    "bert_base": {"accelerator": "cpu", "devices": 1, "precision": "auto",
                  "phases": {"phase1": (None, 256, 128), "phase2": (None, 256, 512)}},
    "bert_tiny": {"accelerator": "cpu", "devices": 1, "precision": "auto",
                  "phases": {"phase1": (None, 256, 128), "phase2": (None, 256, 512)}},
    "mlperf_gpu8": {"accelerator": "gpu", "devices": 8, "micro": 56, "global": 448,
                    "precision": "16-mixed"},
    "mosaicbert_base_gpu8": {"accelerator": "gpu", "devices": 8, "micro": 128, "global": 4096,
                             "precision": "bf16-mixed"},
    "modernbert_base_gpu8": {"accelerator": "gpu", "devices": 8, "micro": 96, "global": 4608,
                             "precision": "bf16-mixed"},
}  # fmt: skip
#: the small ones for a laptop and the tests, checked by training elsewhere (test_train_config)
SMALL = {"demo", "demo_two_phase", "mlperf_smoke", "quickstart", "smoke", "smoke_two_phase",
         "two_phase"}  # fmt: skip
#: the modern recipe's CPU runs, trained end to end in test_mlm_only.py (their own step
#: counts, schedules and MLM-only data, not the common smoke overrides of test_train_config)
MODERN_SMALL = {"modern_smoke", "modern_quickstart"}
#: the fine-tuning recipes (omnibert-finetune): task, epochs, LR, global batch
FINETUNE = {"squad_bert_base": ("squad", 3, 5e-5, 32), "mrpc_bert_base": ("mrpc", 3, 2e-5, 32)}


def test_every_experiment_is_listed_here():
    listed = set(RECIPES) | SMALL | MODERN_SMALL | set(FINETUNE) | {"glue"}
    assert set(group_options("experiment")) == listed


def test_the_glue_suite_sweeps_every_glue_task_over_three_seeds():
    import omnibert.conf
    from omegaconf import OmegaConf

    path = Path(omnibert.conf.__file__).parent / "experiment" / "glue.yaml"
    params = OmegaConf.load(path).hydra.sweeper.params
    tasks = params.task.split(",")
    assert tasks == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
    assert set(tasks) <= set(group_options("task")) and params.seed == "1,2,3"


@pytest.mark.parametrize("name", sorted(FINETUNE))
def test_the_fine_tuning_experiments_set_the_published_recipe(name, tmp_path):
    task, epochs, lr, batch = FINETUNE[name]
    cfg = compose("finetune", [f"experiment={name}", f"paths.output_root={tmp_path}"])
    assert (cfg.task.name, cfg.task.epochs, cfg.task.batch_size) == (task, epochs, batch)
    assert cfg.task.lr == lr and cfg.optimizer.lr == lr  # the optimiser reads the task's
    assert cfg.run_name == f"{task}-bert-base-seed{cfg.seed}"


def _overrides(name: str, recipe: dict[str, Any], tmp_path: Path) -> list[str]:
    largest = max([recipe.get("global", 0)] + [g for _, g, _ in recipe.get("phases", {}).values()])
    out = [
        f"experiment={name}",
        f"paths.output_root={tmp_path}",
        "compile_only=true",
        *SHRUNK,
        *GENERATED,
        f"data.num_train_samples={largest}",
    ]  # one global batch
    if recipe["accelerator"] != "ipu":  # (the IPU pipeline places all 24 layers)
        out.append("model.config.num_hidden_layers=2")
    if recipe["accelerator"] == "gpu":  # no CUDA here: the same world size on CPU, fp32
        out += ["accelerator=cpu", "trainer.precision=32-true"]
    if recipe["accelerator"] == "hpu":  # no Gaudi (the fake FusedLamb refuses CPU tensors;
        # bf16 is slow on CPUs without native support): the same world size on CPU, fp32
        out += [
            "accelerator=cpu",
            "~accelerator.mode",
            "optimizer=lamb",
            "trainer.precision=32-true",
        ]
    for phase in recipe.get("phases", {}):
        out.append(f"~phases.{phase}.data")  # generated rows instead of each phase's files
    if name == "mlperf_gpu8":  # the MLPerf TF1 checkpoint; its 10,000 eval rows
        out += ["model.init_from=null", "data.eval_samples=null"]
    if name.endswith("_phase2"):
        out.append("phase.init_from=null")  # phase 1's last.ckpt
    return out


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_experiment_compiles_each_phase_at_its_shapes(name, fake_sdk, tmp_path, capsys):
    recipe = RECIPES[name]
    cfg = compose("pretrain", [f"experiment={name}"])
    assert cfg.accelerator.accelerator == recipe["accelerator"]
    assert cfg.accelerator.devices == recipe["devices"]
    assert cfg.trainer.precision == recipe["precision"]
    # the 8-GPU DDP recipes shard the optimiser over the GPUs (ZeRO-1)
    zero1 = "zero1" if recipe["accelerator"] == "gpu" else "none"
    assert cfg.accelerator.optimizer_sharding == zero1
    if recipe["accelerator"] in ("hpu", "ipu"):  # the vendor's own LAMB
        assert cfg.optimizer._target_.endswith(("habana_lamb", "poptorch_lamb")), cfg.optimizer
    if "phases" not in recipe:
        assert cfg.micro_batch_size == recipe["micro"]
        assert cfg.phase.global_batch_size == recipe["global"]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            summary = run_or_exit(compose("pretrain", _overrides(name, recipe, tmp_path)),
                                  tmp_path / "out")  # fmt: skip
    finally:
        torch.set_num_threads(threads)

    if "phases" in recipe:
        assert list(summary["phases"]) == list(recipe["phases"])
        for phase, (micro, global_batch, seq) in recipe["phases"].items():
            report = json.loads((tmp_path / "out" / phase / "compile_report.json").read_text())
            _check(report, recipe, micro, global_batch, seq)
    else:
        report = json.loads((tmp_path / "out" / "compile_report.json").read_text())
        _check(report, recipe, recipe["micro"], recipe["global"], cfg.phase.max_seq_length)


def _check(report: dict[str, Any], recipe: dict[str, Any], micro: int | None, global_batch: int,
           seq: int) -> None:  # fmt: skip
    batch = report["batch"]
    assert report["fits"], report.get("reason")
    assert batch["global_batch_size"] == global_batch and batch["world_size"] == recipe["devices"]
    if micro is not None:
        assert batch["micro_batch_size"] == micro
    assert (batch["micro_batch_size"] * batch["accumulate_grad_batches"] * recipe["devices"]
            == global_batch)  # fmt: skip
    assert batch["shapes"]["input_ids"] == [batch["micro_batch_size"], seq]


def test_an_experiment_for_another_accelerator_names_the_keys_to_drop():
    from omnibert.accelerators import AcceleratorError, build_plugin

    cfg = compose("pretrain", ["experiment=bert_large_hpu8_phase1", "accelerator=cpu"])
    with pytest.raises(AcceleratorError, match=r"accelerator\.mode is not a setting of CPUPlugin"):
        build_plugin(cfg.accelerator)
    cfg = compose("pretrain", ["experiment=bert_large_hpu8_phase1", "accelerator=cpu",
                               "~accelerator.mode", "accelerator.compile=false"])  # fmt: skip
    assert build_plugin(cfg.accelerator).name == "cpu"


def test_generated_rows_take_eval_samples_like_the_file_formats():
    from omnibert.data.generated import GeneratedSource
    from omnibert.data.sources import DataConfigError

    assert GeneratedSource(num_eval_samples=64, eval_samples=10).num_eval_samples == 10
    assert GeneratedSource(num_eval_samples=64).num_eval_samples == 64
    with pytest.raises(
        DataConfigError, match=r"data\.eval_samples=100 but data\.num_eval_samples=64"
    ):
        GeneratedSource(num_eval_samples=64, eval_samples=100)
