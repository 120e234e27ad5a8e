"""HPU and IPU plugins against FAKE ``habana_frameworks`` / ``lightning_habana`` / ``poptorch``
modules (tests/fakes/sdk) that follow the documented APIs and record their calls. These tests
show that the plugins call those APIs with the right arguments; they are no evidence that
anything runs on Gaudi or IPU hardware."""

from __future__ import annotations

import math
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from omnibert.accelerators import AcceleratorError, build_plugin
from omnibert.accelerators.hpu import HPUPlugin
from omnibert.apps.train import run
from omnibert.config import TrainConfig

FAKE_SDK = Path(__file__).parents[1] / "fakes" / "sdk"  # (conftest.fake_sdk puts it on sys.path)


# ---------------------------------------------------------------------------------- HPU


def _checked_optimizer(plugin, named_parameters, optimizer_cfg):
    """What a run does with the configured optimiser: the plugin checks it, then it is built
    (omnibert.optim.build)."""
    from omnibert.optim.build import build_optimizer

    plugin.check_optimizer(optimizer_cfg)
    return build_optimizer(optimizer_cfg, named_parameters)


def test_hpu_fake_lazy_mode_is_set_before_the_sdk_is_imported(fake_sdk, compose_config):
    plugin = build_plugin(compose_config("accelerator=hpu").accelerator)
    import habana_frameworks.torch.core as htcore

    assert plugin.mode == "lazy" and htcore.LAZY_MODE_AT_IMPORT == "1"


def test_hpu_fake_eager_mode_and_mode_conflicts(fake_sdk, compose_config):
    build_plugin(compose_config("accelerator=hpu", "accelerator.mode=eager").accelerator)
    import habana_frameworks.torch.core as htcore

    assert htcore.LAZY_MODE_AT_IMPORT == "0"
    with pytest.raises(AcceleratorError, match=r"already imported with PT_HPU_LAZY_MODE=0"):
        HPUPlugin(mode="lazy").check()
    with pytest.raises(AcceleratorError, match=r"compile=true needs accelerator.mode=eager"):
        HPUPlugin(mode="lazy", compile=True)
    with pytest.raises(AcceleratorError, match=r"hpu_graphs=true needs accelerator.mode=lazy"):
        HPUPlugin(mode="eager", hpu_graphs=True)


def test_hpu_fake_single_device_trainer_kwargs(fake_sdk, compose_config):
    plugin = build_plugin(compose_config("accelerator=hpu").accelerator)
    kwargs = plugin.trainer_kwargs("bf16-mixed")
    from lightning_habana.pytorch.accelerator import HPUAccelerator
    from lightning_habana.pytorch.plugins import HPUPrecisionPlugin
    from lightning_habana.pytorch.strategies import SingleHPUStrategy

    assert isinstance(kwargs["accelerator"], HPUAccelerator)
    assert isinstance(kwargs["strategy"], SingleHPUStrategy)
    assert kwargs["precision"] is None  # Lightning refuses precision= next to a precision plugin
    (precision,) = kwargs["plugins"]
    assert isinstance(precision, HPUPrecisionPlugin) and precision.precision == "bf16-mixed"
    assert (kwargs["devices"], kwargs["num_nodes"]) == (1, 1)
    with pytest.raises(AcceleratorError, match=r"trainer.precision=16-mixed"):
        plugin.trainer_kwargs("16-mixed")


def test_hpu_fake_parallel_strategy_and_device_count(fake_sdk, compose_config):
    plugin = build_plugin(
        compose_config(
            "accelerator=hpu", "accelerator.devices=8", "accelerator.num_nodes=2"
        ).accelerator
    )
    kwargs = plugin.trainer_kwargs("32-true")
    from lightning_habana.pytorch.strategies import HPUParallelStrategy

    strategy = kwargs["strategy"]
    assert isinstance(strategy, HPUParallelStrategy)
    assert strategy.parallel_devices == [torch.device("hpu")] * 8
    assert kwargs["plugins"][0].precision == "32-true" and plugin.world_size == 16
    with pytest.raises(AcceleratorError, match=r"accelerator.devices=9 but this node has 8"):
        build_plugin(compose_config("accelerator=hpu", "accelerator.devices=9").accelerator)


def test_hpu_fake_fused_lamb_only_when_chosen(fake_sdk, compose_config):
    """accelerator=hpu never swaps the optimiser: optimizer=lamb is omnibert's LAMB there too;
    Habana's FusedLamb is optimizer=lamb_habana (the FAKE one here)."""
    from habana_frameworks.torch.hpex.optimizers import FusedLamb

    from omnibert.optim import Lamb

    plugin = build_plugin(compose_config("accelerator=hpu").accelerator)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    lamb = _checked_optimizer(
        plugin, model.named_parameters(), compose_config("accelerator=hpu").optimizer
    )
    assert type(lamb) is Lamb
    cfg = compose_config("accelerator=hpu", "optimizer=lamb_habana").optimizer
    fused = _checked_optimizer(plugin, model.named_parameters(), cfg)
    assert isinstance(fused, FusedLamb) and fused.defaults["max_grad_norm"] == 1.0
    assert len(fused.param_groups) == 2  # decay / no decay (bias, LayerNorm)


def test_hpu_fake_lazy_step_marks_after_backward_and_after_the_update(fake_sdk, compose_config):
    plugin = build_plugin(compose_config("accelerator=hpu").accelerator)
    import habana_frameworks.torch.core as htcore

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(3, 1)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {"loss": self.linear(batch["x"]).square().mean()}

    net = Net()
    order: list[str] = []
    net.linear.weight.register_hook(lambda g: order.append("backward"))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    htcore.CALLS.clear()
    original = htcore.mark_step
    htcore.mark_step = lambda *a, **k: (order.append("mark_step"), original(*a, **k))[1]
    step = optimizer.step
    optimizer.step = lambda *a, **k: (order.append("step"), step(*a, **k))[1]  # type: ignore[method-assign]
    plugin._train_step(net, {"x": torch.ones(2, 3)}, optimizer, "32-true")
    assert order == ["backward", "mark_step", "step", "mark_step"]
    assert ("synchronize", None) in htcore.CALLS


def test_fake_lightning_habana_has_what_lightning_imports_from_the_real_one(fake_sdk):
    """Lightning 2.5.0-2.5.5 (Intel Gaudi 1.21 ships 2.5.1) imports these names from
    lightning_habana whenever the lightning-habana distribution is installed, registers them
    and asks whether an HPU is there (scripts/envs/hpu_env.sh installs the real one, which
    the FAKE shadows in these tests)."""
    import lightning_habana
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning_habana import HPUAccelerator, HPUParallelStrategy, SingleHPUStrategy
    from lightning_habana.pytorch.accelerator import REGISTERED

    assert Path(lightning_habana.__file__).is_relative_to(FAKE_SDK)
    HPUAccelerator.register_accelerators(AcceleratorRegistry)
    SingleHPUStrategy.register_strategies(None)
    HPUParallelStrategy.register_strategies(None)
    assert [kind for kind, _ in REGISTERED[-3:]] == ["accelerators", "strategies", "strategies"]
    assert HPUAccelerator.is_available() is False  # no Gaudi here


def test_hpu_fake_graphs_wrap_the_model_with_module_cacher(fake_sdk, compose_config):
    plugin = build_plugin(
        compose_config(
            "accelerator=hpu", "accelerator.hpu_graphs=true", "accelerator.max_graphs=4"
        ).accelerator
    )
    import habana_frameworks.torch.core as htcore

    model = torch.nn.Linear(2, 2)
    assert plugin.compile_model(model) is model
    assert ("ModuleCacher", {"max_graphs": 4, "inplace": True}) in htcore.CALLS


# ---------------------------------------------------------------------------------- IPU
def _ipu_run(
    compose_config, tmp_path: Path, *overrides: str
) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    import poptorch

    poptorch.CALLS.clear()
    cfg = compose_config(
        "experiment=smoke",
        f"paths.output_root={tmp_path}",
        "accelerator=ipu",
        "accelerator.devices=2",
        "micro_batch_size=2",  # global 8 = 2 (micro) × 2 (replicas) × 2 (accumulation)
        "accelerator.layers_per_ipu=[0,1]",
        "accelerator.available_memory_proportion=0.3",
        f"accelerator.executable_cache_dir={tmp_path}/exe",
        "optimizer=lamb_poptorch",
        *overrides,
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the scheduler stepped without optimizer.step
            summary = run(cfg, tmp_path / "out")
    finally:
        torch.set_num_threads(threads)
    return summary, list(poptorch.CALLS)


def _calls(calls: list[tuple[str, Any]], name: str) -> list[Any]:
    return [detail for call, detail in calls if call == name]


@pytest.mark.parametrize("device_iterations", [1, 3])
def test_ipu_fake_training_sets_options_wraps_the_model_and_drives_steps(
    fake_sdk, tmp_path, device_iterations, compose_config
):
    summary, calls = _ipu_run(
        compose_config, tmp_path, f"accelerator.device_iterations={device_iterations}"
    )
    import poptorch

    (training,) = _calls(calls, "trainingModel")
    opts = training["options"]
    assert opts.replication_factor == 2 and opts.Training.gradient_accumulation == 2
    assert opts.device_iterations == device_iterations
    assert opts.Training.accumulation_and_replication_reduction_type == poptorch.ReductionType.Mean
    assert opts.output_mode == poptorch.OutputMode.All
    assert opts.available_memory_proportion == {0: 0.3, 1: 0.3}
    assert opts.cache_path == f"{tmp_path}/exe" and not opts.offline
    assert isinstance(training["optimizer"], poptorch.optim.LAMB)  # optimizer=lamb_poptorch
    # pipelining: embeddings and heads on IPU 0, the one encoder layer on IPU 1
    assert _calls(calls, "BeginBlock") == [
        {"user_id": "embeddings", "ipu_id": 0},
        {"user_id": "layer0", "ipu_id": 1},
        {"user_id": "heads", "ipu_id": 0},
    ]
    assert "none" in _calls(calls, "identity_loss")  # the loss is marked for backward
    # each host call is one combined batch: micro × replicas × accumulation × iterations
    rows = _calls(calls, "compile")[0]["rows"]
    assert rows == opts.combined_batch(2, training=True) == 2 * 2 * 2 * device_iterations
    # 6 optimiser steps = 6 / device_iterations IPU calls = Lightning steps
    assert summary["steps"] == 6 // device_iterations
    # the LR schedule (warmup) changes the LR: the new one is sent to the IPU
    assert len(_calls(calls, "setOptimizer")) >= 6 // device_iterations - 1
    # validation runs a separate inference model, detaching the training one first
    (inference,) = _calls(calls, "inferenceModel")
    assert inference["options"].replication_factor == 1
    assert True in _calls(calls, "detachFromDevice")
    assert True in _calls(calls, "copyWeightsToHost")  # weights on the host for checkpoints
    assert summary["last_checkpoint"] is not None


def test_ipu_fake_schedule_advances_one_step_per_optimiser_step(fake_sdk, tmp_path):
    from omnibert.accelerators.ipu import IPUPlugin

    plugin = IPUPlugin(devices=2, device_iterations=3)
    loop = plugin.loop_kwargs(4, limit_train_batches=40, val_check_interval=12, max_steps=6)
    assert loop == {"accumulate_grad_batches": 1, "limit_train_batches": 3,
                    "val_check_interval": 1, "max_steps": 2}  # fmt: skip
    assert plugin.gradient_accumulation == 4 and plugin.host_batches_per_step == 2 * 4 * 3
    with pytest.raises(AcceleratorError, match=r"phase.max_steps=7 is not a multiple"):
        plugin.loop_kwargs(4, limit_train_batches=40, val_check_interval=None, max_steps=7)


def test_ipu_fake_compile_only_targets_an_offline_ipu(fake_sdk, tmp_path, compose_config):
    plugin = build_plugin(
        compose_config(
            "accelerator=ipu", "accelerator.devices=4", "accelerator.device_iterations=2"
        ).accelerator
    )
    plugin.loop_kwargs(2, limit_train_batches=10, val_check_interval=None, max_steps=2)
    import poptorch

    from omnibert.data.datamodule import PretrainingDataModule
    from omnibert.data.generated import GeneratedSource
    from omnibert.models import BertConfig, BertForPreTraining

    data = PretrainingDataModule(source=GeneratedSource, vocab_size=128, max_seq_length=16, max_predictions_per_seq=3,
                               num_train_samples=8, num_eval_samples=0, micro_batch_size=2,
                               eval_micro_batch_size=2)  # fmt: skip
    data.setup("fit")
    batch = next(iter(data.train_dataloader()))
    model = BertForPreTraining(BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64,
                                          max_position_embeddings=32))  # fmt: skip
    optimizer_cfg = compose_config("accelerator=ipu", "optimizer=lamb_poptorch").optimizer
    optimizer = _checked_optimizer(plugin, model.named_parameters(), optimizer_cfg)
    poptorch.CALLS.clear()
    report = plugin.compile_only(model, batch, optimizer)
    (training,) = _calls(poptorch.CALLS, "trainingModel")
    assert training["options"].offline and training["options"].ipu_version == 2
    assert _calls(poptorch.CALLS, "compile") == [{"training": True, "rows": 2 * 4 * 2 * 2}]
    assert report["ran_steps"] == 0 and report["combined_batch_size"] == 32
    assert report["ipus"] == 4


def test_ipu_fake_refuses_more_ipus_than_the_host_has(fake_sdk, tmp_path, compose_config):
    import poptorch

    poptorch.FAKE_IPUS = 2
    try:
        plugin = build_plugin(
            compose_config("accelerator=ipu", "accelerator.devices=4").accelerator
        )
        with pytest.raises(AcceleratorError, match=r"needs 4 IPU\(s\)"):
            plugin.trainer_kwargs("32-true")
    finally:
        poptorch.FAKE_IPUS = 16


# ------------------------------------------------------------------ the optimiser, unchanged
ACCELERATORS = ("cpu", "gpu", "hpu", "ipu")
OPTIMIZERS = ("lamb", "lamb_mlperf", "adamw", "lamb_habana", "lamb_poptorch")
#: optimisers a backend cannot run: refused with one sentence, never replaced
REFUSED = {
    ("ipu", "lamb"): "omnibert's LAMB cannot run",
    ("ipu", "lamb_mlperf"): "omnibert's LAMB cannot run",
    ("ipu", "lamb_habana"): "is not one poptorch compiles",
}
#: what only builds inside the vendor's own environment (the FAKE SDKs are on the path)
VENDOR = {"lamb_habana": "FusedLamb", "lamb_poptorch": "LAMB"}


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("accelerator", ACCELERATORS)
def test_every_accelerator_builds_the_configured_optimizer(
    fake_sdk, accelerator, optimizer, compose_config
):
    """Under every accelerator config, the optimiser built (and saved in the checkpoint's
    hyper-parameters) is the one configured, or it is refused with one sentence."""
    from hydra.utils import get_class, instantiate

    cfg = compose_config("experiment=smoke", f"accelerator={accelerator}", f"optimizer={optimizer}",
                   "+phase.lr.adamw=1e-4")  # fmt: skip
    plugin = instantiate(cfg.accelerator, _convert_="all")  # gpu: no CUDA here, not checked
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    if (accelerator, optimizer) in REFUSED:
        with pytest.raises(AcceleratorError, match=REFUSED[(accelerator, optimizer)]):
            _checked_optimizer(plugin, model.named_parameters(), cfg.optimizer)
        return
    built = _checked_optimizer(plugin, model.named_parameters(), cfg.optimizer)
    if optimizer in VENDOR:
        assert type(built).__name__ == VENDOR[optimizer] and built.fake  # the FAKE SDK's
    else:
        assert type(built) is get_class(cfg.optimizer._target_)
    assert built.defaults["lr"] == cfg.optimizer.lr


@pytest.mark.parametrize(
    ("accelerator", "optimizer"),
    [("cpu", "lamb"), ("hpu", "lamb"), ("hpu", "lamb_habana"), ("ipu", "lamb_poptorch")],
)
def test_a_run_trains_with_the_configured_optimizer(
    fake_sdk, tmp_path, accelerator, optimizer, compose_config
):
    """Through the app's wiring: the task's optimiser and its saved hyper-parameters are the
    configured ones (the HPU plugin used to rewrite the _target_ before)."""
    from omnibert.run.pretraining.job import build_task, prepare

    cfg = compose_config("experiment=smoke", f"paths.output_root={tmp_path}",
                   f"accelerator={accelerator}", f"optimizer={optimizer}")  # fmt: skip
    task, _ = build_task(prepare(TrainConfig.of(cfg)))
    assert task.hparams["optimizer"]["_target_"] == cfg.optimizer._target_
    optimizer_obj = task.configure_optimizers()["optimizer"]
    expected = {"lamb": "Lamb", "lamb_habana": "FusedLamb", "lamb_poptorch": "LAMB"}[optimizer]
    assert type(optimizer_obj).__name__ == expected


# ------------------------------------------------------------------ modern encoders
#: model=modern_tiny on experiment=smoke's shapes (32 wide, seq 32): its two layers kept (0
#: global, 1 local) and a window of 16 so that the local layer's band restricts the rows;
#: rope, GeGLU, pre-norm with final_norm, no biases, no NSP head
MODERN_SMOKE = (
    "model=modern_tiny",
    "model.config.num_hidden_layers=2",
    "model.config.local_window=16",
)


def test_ipu_fake_trains_modern_tiny_pipelined_over_its_layer_names(
    fake_sdk, tmp_path, compose_config
):
    """The IPU plugin's pipelining places blocks by BERT's module names, which the modern
    options keep (``bert.embeddings``, ``bert.encoder.layer.N``, ``cls``); the pre-norm
    ``bert.final_norm`` runs after the last layer and stays on that layer's IPU."""
    summary, calls = _ipu_run(
        compose_config, tmp_path, *MODERN_SMOKE, "accelerator.layers_per_ipu=[0,1,1]"
    )
    plan = summary["plan"]
    assert plan["objective"] == "MLM only" and plan["attention"].startswith("auto: sdpa")
    assert _calls(calls, "BeginBlock") == [
        {"user_id": "embeddings", "ipu_id": 0},
        {"user_id": "layer0", "ipu_id": 1},
        {"user_id": "layer1", "ipu_id": 2},
        {"user_id": "heads", "ipu_id": 0},
    ]
    (training,) = _calls(calls, "trainingModel")
    assert training["options"].replication_factor == 2
    assert summary["steps"] == 6 and math.isfinite(summary["validation"]["val/loss"])
    state = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=False)
    names = set(state["state_dict"])  # the trained model is the pre-norm one, without biases
    assert {"model.bert.final_norm.weight", "model.bert.encoder.layer.1.attn_norm.weight"} <= names
    assert not any(n.endswith("attention.self.query.bias") for n in names)


@pytest.mark.parametrize(
    ("accelerator", "attention", "sentence"),
    [
        ("ipu", "flex", r"attention=flex needs FlexAttention \(torch >= 2.5\), which the IPU's"),
        ("ipu", "varlen", r"attention=varlen needs data-dependent shapes, which ipu graphs"),
        ("hpu", "varlen", r"attention=varlen needs data-dependent shapes, which hpu graphs"),
    ],
)
def test_static_graph_backends_refuse_dynamic_attention_before_compute(
    fake_sdk, tmp_path, compose_config, accelerator, attention, sentence
):
    """One sentence naming the key and what to use, from the plan (no model is built)."""
    from omnibert.models import BertConfigError
    from omnibert.run.pretraining.job import prepare

    cfg = compose_config("experiment=smoke", f"accelerator={accelerator}", *MODERN_SMOKE,
                         f"model.config.attention={attention}", "optimizer=adamw",
                         "+phase.lr.adamw=1e-4", root=tmp_path)  # fmt: skip
    with pytest.raises(BertConfigError, match=sentence) as refused:
        prepare(TrainConfig.of(cfg))
    assert str(refused.value).count(". ") == 0 and "use auto, sdpa" in str(refused.value)


@pytest.mark.parametrize("attention", ["auto", "sdpa", "math"])
def test_hpu_fake_plans_modern_tiny_and_runs_its_lazy_step(
    fake_sdk, tmp_path, compose_config, attention
):
    """accelerator=hpu plans a modern_tiny run (rope, the local layer's band: static masks of
    the batch's shape) and the plugin's lazy-mode step runs its training step, a mark_step
    after backward and after the update (the model stays on the CPU: the FAKE SDK has no
    device)."""
    from omnibert.run.pretraining.job import build_task, prepare

    cfg = compose_config("experiment=smoke", "accelerator=hpu", *MODERN_SMOKE,
                         f"model.config.attention={attention}", root=tmp_path)  # fmt: skip
    prepared = prepare(TrainConfig.of(cfg))
    assert prepared.plan.attention.startswith(attention)
    assert prepared.plan.kernels["compile"] == "lazy mode"
    task, _ = build_task(prepared)
    model = task.model
    assert model.bert.config.has_local_layers and not model.bert.config.next_sentence_head
    import habana_frameworks.torch.core as htcore

    prepared.datamodule.setup("fit")
    batch = next(iter(prepared.datamodule.train_dataloader()))
    optimizer = task.configure_optimizers()["optimizer"]
    htcore.CALLS.clear()
    prepared.plugin._train_step(model, batch, optimizer, "32-true")
    assert [c for c, _ in htcore.CALLS].count("mark_step") == 2
    grad = model.bert.encoder.layer[1].mlp_norm.weight.grad  # the local layer's pre-norm
    assert grad is not None and grad.abs().sum() > 0 and torch.isfinite(grad).all()
