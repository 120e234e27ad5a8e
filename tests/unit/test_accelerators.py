"""Accelerator plugins: what each conf/accelerator/*.yaml may change (only the accelerator
group), the CPU plugin end to end, and the one-sentence refusals when a backend is missing."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import torch
from omegaconf import OmegaConf

from omnibert.accelerators import AcceleratorError, build_plugin
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.gpu import GPUPlugin
from omnibert.apps.compose import group_options
from omnibert.apps.train import run, run_or_exit

ACCELERATORS = group_options("accelerator")
#: trainer keys that read the accelerator group (trainer/default.yaml interpolations)
HARDWARE_TRAINER_KEYS = {"trainer.accelerator", "trainer.devices", "trainer.num_nodes",
                         "trainer.strategy"}  # fmt: skip
SMOKE = ("experiment=smoke",)


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out |= _flat(value, f"{prefix}{key}.")
        return out or {prefix[:-1]: {}}
    return {prefix[:-1]: node}


def _differences(compose_config, name: str, resolve: bool, tmp_path: Path) -> set[str]:
    base = [f"paths.output_root={tmp_path}", "data.train_path=x"]
    a = _flat(OmegaConf.to_container(compose_config(*base, "accelerator=cpu"), resolve=resolve))
    b = _flat(OmegaConf.to_container(compose_config(*base, f"accelerator={name}"), resolve=resolve))
    return {k for k in a.keys() | b.keys() if a.get(k, "<absent>") != b.get(k, "<absent>")}


@pytest.mark.parametrize("name", ACCELERATORS)
def test_an_accelerator_changes_only_the_accelerator_group(name, tmp_path, compose_config):
    diffs = _differences(compose_config, name, resolve=False, tmp_path=tmp_path)
    outside = sorted(k for k in diffs if not k.startswith("accelerator."))
    assert not outside, f"accelerator={name} changes {outside}"
    # resolved, only the hardware keys the trainer reads from the group may follow it
    resolved = _differences(compose_config, name, resolve=True, tmp_path=tmp_path)
    assert {k for k in resolved if not k.startswith("accelerator.")} <= HARDWARE_TRAINER_KEYS
    if name != "cpu":
        assert diffs, f"accelerator={name} is the cpu config"
    node = OmegaConf.to_container(compose_config(f"accelerator={name}").accelerator)
    assert isinstance(node, dict)
    assert node["_target_"].startswith("omnibert.accelerators.")
    assert {"accelerator", "devices", "num_nodes", "strategy"} <= node.keys()


def test_every_accelerator_config_names_an_existing_plugin_class(compose_config):
    import importlib

    for name in ACCELERATORS:
        target = str(compose_config(f"accelerator={name}").accelerator._target_)
        module, cls = target.rsplit(".", 1)
        assert hasattr(importlib.import_module(module), cls), target


def test_importing_the_plugins_imports_no_vendor_sdk():
    import omnibert.accelerators.hpu
    import omnibert.accelerators.ipu
    import omnibert.accelerators.ipu_strategy  # noqa: F401

    for sdk in ("poptorch", "habana_frameworks", "lightning_habana"):
        assert sdk not in sys.modules


def test_cpu_plugin_trainer_kwargs_and_ddp_for_several_processes():
    kwargs = CPUPlugin().trainer_kwargs("bf16-mixed")
    assert kwargs == {"accelerator": "cpu", "devices": 1, "num_nodes": 1, "strategy": "auto",
                      "precision": "bf16-mixed", "plugins": []}  # fmt: skip
    from omnibert.accelerators.ddp import OmnibertDDPStrategy

    assert isinstance(
        CPUPlugin(devices=2).trainer_kwargs("32-true")["strategy"], OmnibertDDPStrategy
    )
    assert CPUPlugin(devices=2, num_nodes=3).world_size == 6
    with pytest.raises(AcceleratorError, match=r"trainer.precision=16-mixed .* accelerator=cpu"):
        CPUPlugin().trainer_kwargs("16-mixed")
    with pytest.raises(AcceleratorError, match=r"accelerator.devices=0"):
        CPUPlugin(devices=0)


def test_cpu_compile_keeps_state_dict_keys_and_compile_only_reports_a_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    keys = list(model.state_dict())
    plugin = CPUPlugin(compile=True, compile_options={"backend": "eager"})
    assert plugin.compile_model(model) is model and list(model.state_dict()) == keys

    class Loss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 1)

        def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            return {"loss": self.linear(batch["x"]).square().mean()}

    net = Loss()
    before = net.linear.weight.detach().clone()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    report = CPUPlugin().compile_only(net, {"x": torch.ones(2, 4)}, optimizer, "bf16-mixed")
    assert report["ran_steps"] == 2 and report["compile_seconds"] > 0
    assert report["peak_memory_bytes"] is None  # the CPU plugin does not measure it
    assert not torch.equal(before, net.linear.weight)  # the steps updated the weights


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a CUDA-less host")
def test_gpu_without_cuda_stops_with_one_sentence():
    with pytest.raises(AcceleratorError) as err:
        GPUPlugin().check()
    message = str(err.value)
    assert message.startswith("accelerator=gpu needs a CUDA GPU") and "accelerator=cpu" in message
    assert message.count(". ") == 0 and message.endswith(".")


def test_gpu_fsdp_takes_omnibert_lamb_and_adamw_and_refuses_vendor_lamb():
    """omnibert's Lamb sums its norms over shards (tests/e2e/test_lamb_sharded.py); a vendor
    LAMB would take them per shard."""
    plugin = GPUPlugin(strategy="fsdp")
    plugin.check_optimizer({"_target_": "omnibert.optim.Lamb", "lr": 1e-3})
    plugin.check_optimizer({"_target_": "omnibert.optim.AdamW", "lr": 1e-3})
    with pytest.raises(AcceleratorError, match=r"strategy=fsdp .* optimizer=lamb or"):
        plugin.check_optimizer({"_target_": "omnibert.optim.vendor.habana_lamb", "lr": 1e-3})


@pytest.mark.parametrize(
    ("name", "needs"),
    [("hpu", "habana_frameworks"), ("ipu", "poptorch")],
)
def test_missing_sdk_stops_before_any_compute_with_one_sentence(
    name, needs, tmp_path, capsys, monkeypatch, compose_config
):
    for sdk in ("poptorch", "habana_frameworks", "lightning_habana"):
        monkeypatch.setitem(sys.modules, sdk, None)  # importing it raises ImportError
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    cfg = compose_config(*SMOKE, f"paths.output_root={tmp_path}", f"accelerator={name}")
    with pytest.raises(SystemExit) as exit_info:
        run_or_exit(cfg, tmp_path / "out")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"omnibert-train: error: accelerator={name} needs")
    assert needs in err and f"requirements-{name}.txt" in err and "container" in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # stopped before the plan was written


def test_smoke_run_on_cpu_plugin_writes_the_environment_report(tmp_path, capsys, compose_config):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        cfg = compose_config(*SMOKE, f"paths.output_root={tmp_path}", "val_every_n_steps=6")
        summary = run(cfg, tmp_path / "out")
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 6
    printed = capsys.readouterr().out
    assert "omnibert-train: environment" in printed and "accelerator   cpu" in printed
    env = json.loads((tmp_path / "out" / "environment.json").read_text())
    assert env["accelerator"]["plugin"] == "omnibert.accelerators.cpu.CPUPlugin"
    assert env["versions"]["torch"] == metadata.version("torch")
    assert env["sdks"]["poptorch"]["present"] is False
    assert env["devices_found"]["kind"] == "cpu" and env["devices_found"]["count"] >= 1


def test_build_plugin_refuses_a_config_without_target():
    with pytest.raises(AcceleratorError, match="no _target_"):
        build_plugin(OmegaConf.create({"accelerator": "cpu", "devices": 1}))
