"""Compile, precision, CUDA graphs and the kernel report, on CPU.

The training step compiles once: a real ``omnibert-train`` run (experiment=smoke) with
``accelerator.compile=true`` is watched through ``torch._dynamo``'s counters, and after its
first step no training batch compiles anything again (one graph, no graph break), also after
validation compiled its own. The GPU plugin's defaults (bf16 autocast where the device runs
it, compile on, CUDA graphs as an option) are checked with ``torch.cuda`` answering as an
H100 would; the plan's kernel rows are compared with the optimiser the run built.
"""

from __future__ import annotations

from typing import Any

import dynamo_counts
import pytest
import torch
from omegaconf import OmegaConf

from omnibert.accelerators import AcceleratorError
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.gpu import GPUPlugin, compile_settings
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config.node import Optimizer
from omnibert.optim import AdamW
from omnibert.run.pipeline.kernels import adamw_choice, kernel_choices
from omnibert.tasks.pretraining import PretrainingTask

SMOKE = ("experiment=smoke", "accelerator.threads=1")


def test_compiled_training_compiles_once_and_never_recompiles(tmp_path, fresh_dynamo):
    """4 optimiser steps of 2 micro-batches, validation after step 3 and at the end. The
    backend is aot_eager: which frames compile and when is Dynamo's decision (guards on
    shapes, dtypes, the training flag), the same with inductor, minus its C++ build time."""
    summary = run_or_exit(
        compose(
            "pretrain",
            [
                *SMOKE,
                f"paths.output_root={tmp_path}",
                "phase.max_steps=4",
                "accelerator.compile=true",
                "+accelerator.compile_options.backend=aot_eager",
                "+accelerator.compile_options.dynamic=false",
                "+callbacks.dynamo={_target_:dynamo_counts.DynamoCounts}",
            ],
        ),
        tmp_path / "out",
    )
    assert summary["steps"] == 4
    seen = dynamo_counts.SEEN
    train = [s for s in seen if s["event"] == "train"]
    assert len(train) == 8  # every micro-batch went through the compiled forward
    first = train[0]
    assert (first["frames"], first["graphs"], first["breaks"]) == (1, 1, 0), first
    validation = seen.index(next(s for s in seen if s["event"] == "validation"))
    before, after = seen[:validation], seen[validation + 1 :]
    assert all(s == first for s in before), before  # steps 1-3: no recompile
    evaluated = seen[validation]
    assert (evaluated["frames"], evaluated["breaks"]) == (2, 0)  # eval mode: its own graph
    resumed = [s for s in after if s["event"] == "train"]
    assert len(resumed) == 2, after
    assert all({**s, "event": "validation"} == evaluated for s in resumed), after  # no recompile
    # (the final trainer.validate runs under inference mode: Dynamo guards on it, one graph)
    kernels = summary["plan"]["kernels"]
    assert kernels["compile"] == "torch.compile, mode default (backend=aot_eager, dynamic=False)"
    assert kernels["optimizer"].startswith(f"LAMB {dynamo_counts.OPTIMIZER['impl']} ")


def test_eager_run_reports_its_kernels_and_adamw_as_built(tmp_path, fresh_dynamo, capsys):
    summary = run_or_exit(
        compose(
            "pretrain",
            [
                *SMOKE,
                f"paths.output_root={tmp_path}",
                "phase.max_steps=1",
                "optimizer=adamw",
                "optimizer.lr=1e-4",
                "+callbacks.dynamo={_target_:dynamo_counts.DynamoCounts}",
            ],
        ),
        tmp_path / "out",
    )
    kernels = summary["plan"]["kernels"]
    assert kernels["optimizer"] == f"AdamW {dynamo_counts.OPTIMIZER['impl']} (torch)"
    assert (
        kernels["compile"]
        == "off (eager: compile=auto; no timed rate to project the run's length (eager))"
    )
    # the tests' environment turns the CPU's bf16 rule off (tests/conftest.py)
    assert (
        kernels["precision"]
        == "32-true (trainer.precision=auto: fp32 (accelerator.auto_bf16=false))"
    )
    assert summary["plan"]["precision"] == "32-true"
    out = capsys.readouterr().out
    assert "  optimizer " in out and "AdamW for-loop (torch)" in out  # printed in the plan
    assert dynamo_counts.SEEN and all(s["frames"] == 0 for s in dynamo_counts.SEEN)


# ----------------------------------------------------------------------------- GPU plugin


class _H100:
    """``torch.cuda`` answering as a host with one bf16-capable GPU would."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, bf16: bool = True) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        name = "NVIDIA H100 80GB HBM3" if bf16 else "Tesla V100-SXM2-32GB"
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)


def _gpu_config(*overrides: str) -> dict[str, Any]:
    cfg = compose("pretrain", ["accelerator=gpu", "data.train_path=x", *overrides])
    node = OmegaConf.to_container(cfg.accelerator, resolve=True)
    assert isinstance(node, dict)
    return {k: v for k, v in node.items() if k not in ("_target_", "accelerator")}


def test_gpu_defaults_are_bf16_where_the_device_runs_it_and_compile_on(monkeypatch):
    _H100(monkeypatch)
    cfg = compose("pretrain", ["accelerator=gpu", "data.train_path=x"])
    assert cfg.trainer.precision == "auto"
    plugin = GPUPlugin(**_gpu_config())
    assert plugin.resolve_precision("auto") == (
        "bf16-mixed",
        "trainer.precision=auto: NVIDIA H100 80GB HBM3 runs bf16",
    )
    assert plugin.trainer_kwargs("bf16-mixed")["precision"] == "bf16-mixed"
    # an explicit choice is kept: trainer=fp16 / trainer.precision=32-true
    fp16 = compose("pretrain", ["accelerator=gpu", "trainer=fp16"]).trainer.precision
    assert plugin.resolve_precision(fp16) == ("16-mixed", "set by trainer.precision")
    assert plugin.resolve_precision("32-true")[0] == "32-true"
    assert plugin.compile and plugin.compile_options == {"dynamic": False}
    assert plugin.kernels() == {
        "compile": "torch.compile, mode default (dynamic=False)",
        "CUDA graphs": "off",
    }
    assert plugin.callbacks() == []
    model = torch.nn.Linear(2, 2)
    keys = list(model.state_dict())
    assert plugin.compile_model(model) is model and list(model.state_dict()) == keys


def test_gpu_auto_precision_is_fp32_on_a_gpu_without_bf16(monkeypatch):
    _H100(monkeypatch, bf16=False)
    precision, why = GPUPlugin().resolve_precision("auto")
    assert precision == "32-true" and "trainer=fp16" in why
    with pytest.raises(AcceleratorError, match=r"trainer.precision=bf16-mixed needs a GPU"):
        GPUPlugin().trainer_kwargs("bf16-mixed")


def test_auto_precision_on_a_cpu_is_fp32_unless_bf16_is_native():
    # the bf16 rule itself (native flags) is tests/unit/test_fast_defaults.py's
    assert CPUPlugin(auto_bf16=False).resolve_precision("auto") == (
        "32-true",
        "trainer.precision=auto: fp32 (accelerator.auto_bf16=false)",
    )
    assert CPUPlugin().resolve_precision("bf16-mixed")[0] == "bf16-mixed"


def test_cuda_graphs_compile_in_reduce_overhead_mode_and_mark_each_step(monkeypatch):
    plugin = GPUPlugin(**_gpu_config("accelerator.cuda_graphs=true"))
    assert plugin.compile_options == {"dynamic": False, "mode": "reduce-overhead"}
    assert plugin.uses_cuda_graphs
    assert plugin.kernels()["CUDA graphs"] == "on (torch.compile mode reduce-overhead)"
    (marker,) = plugin.callbacks()
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    marker.on_train_batch_start(None, None, {}, 0)
    marker.on_validation_batch_start(None, None, {}, 0)
    assert len(marks) == 2
    # max-autotune captures graphs itself; inductor options get triton.cudagraphs
    assert compile_settings(True, {"mode": "max-autotune"}, True) == {"mode": "max-autotune"}
    options = compile_settings(True, {"options": {"max_autotune": True}}, True)
    assert options == {"options": {"max_autotune": True, "triton.cudagraphs": True}}
    assert GPUPlugin(compile_options={"mode": "max-autotune"}).uses_cuda_graphs


@pytest.mark.parametrize(
    ("compile_", "options", "says"),
    [
        (False, {}, r"^accelerator.cuda_graphs=true .* accelerator.compile=false; set "),
        (True, {"mode": "max-autotune-no-cudagraphs"}, r"compile_options.mode=max-autotune-no"),
    ],
)
def test_cuda_graphs_that_cannot_work_stop_with_one_sentence(compile_, options, says):
    with pytest.raises(AcceleratorError, match=says) as err:
        GPUPlugin(compile=compile_, compile_options=options, cuda_graphs=True)
    assert str(err.value).endswith(".") and str(err.value).count(". ") == 0


def test_cuda_graphs_without_compile_is_refused_before_any_compute(tmp_path, capsys):
    cfg = compose(
        "pretrain",
        [*SMOKE[:1], f"paths.output_root={tmp_path}", "accelerator=gpu", "accelerator.compile=false",
         "accelerator.cuda_graphs=true"],
    )  # fmt: skip
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    assert "accelerator.cuda_graphs=true" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cuda_graphs_accumulate_gradients_except_under_fsdp_refused_before_any_compute(
    tmp_path, capsys, monkeypatch
):
    """experiment=smoke accumulates 2 micro-batches per step: CUDA graphs run it (the task
    keeps its own gradient tensors: tests/e2e/test_cuda_graph_gradients.py), except with FSDP,
    which keeps its shards' gradients itself: refused in one sentence before any compute."""
    _H100(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))
    cfg = compose(
        "pretrain",
        [*SMOKE[:1], f"paths.output_root={tmp_path}", "accelerator=gpu",
         "accelerator.cuda_graphs=true", "accelerator.strategy=fsdp"],
    )  # fmt: skip
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith("or set accelerator.cuda_graphs=false."), err
    assert "accelerator.strategy=fsdp" in err[0] and "over 2 micro-batches per step" in err[0]
    assert not (tmp_path / "out").exists()
    for strategy in ("auto", "ddp"):
        plugin = GPUPlugin(
            **_gpu_config("accelerator.cuda_graphs=true", f"accelerator.strategy={strategy}")
        )
        plugin.check_accumulation(4)  # the task owns the gradients: accumulation is sound
    (marker,) = GPUPlugin(**_gpu_config("accelerator.cuda_graphs=true")).callbacks()
    task = PretrainingTask(model_config={"vocab_size": 64, "hidden_size": 8,
                                         "num_hidden_layers": 1, "num_attention_heads": 2,
                                         "intermediate_size": 16})  # fmt: skip
    assert not task.keep_gradient_buffers
    marker.setup(None, task, "fit")
    assert task.keep_gradient_buffers
    with pytest.raises(TypeError, match="keep_gradient_buffers"):
        marker.setup(None, torch.nn.Linear(1, 1), "fit")


def test_cuda_graphs_with_varlen_attention_are_refused_before_any_compute(
    tmp_path, capsys, monkeypatch
):
    """varlen's token count is data-dependent: inductor would disable CUDA graphs for that
    graph, so the pair is refused instead of silently running without graphs; sdpa runs."""
    _H100(monkeypatch)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))
    cfg = compose(
        "pretrain",
        [*SMOKE[:1], f"paths.output_root={tmp_path}", "accelerator=gpu",
         "accelerator.cuda_graphs=true", "model.config.attention=varlen"],
    )  # fmt: skip
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.config.attention=varlen runs on each batch's" in err[0], err
    assert err[0].endswith("set model.config.attention=sdpa or accelerator.cuda_graphs=false.")
    assert not (tmp_path / "out").exists()
    graphs = GPUPlugin(**_gpu_config("accelerator.cuda_graphs=true"))
    with pytest.raises(AcceleratorError, match=r"attention=varlen \(auto's choice here\)"):
        graphs.check_attention("auto", ("varlen", "sdpa"))
    graphs.check_attention("auto", ("sdpa", "sdpa"))
    GPUPlugin(**_gpu_config()).check_attention("varlen", ("varlen", "varlen"))  # no graphs


# ----------------------------------------------------------------------------- AdamW


def test_adamw_fused_auto_is_torch_default_off_cuda_and_reported_as_built():
    model = torch.nn.Linear(4, 4)
    auto = AdamW(model.named_parameters(), fused="auto")
    assert auto.impl == "for-loop" and not auto.param_groups[0]["fused"]
    assert adamw_choice(Optimizer({"fused": "auto"}), torch.device("cpu")) == f"{auto.impl} (torch)"
    # the kernel auto picks on CUDA, run where torch has it on CPU too (torch >= 2.4)
    fused = AdamW(model.named_parameters(), fused=True)
    assert fused.impl == "fused"
    assert (
        adamw_choice(Optimizer({"fused": "auto"}), torch.device("cuda"))
        == "fused (torch, optimizer.fused)"
    )
    # both kernels take the same step
    torch.manual_seed(0)
    a, b = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    b.load_state_dict(a.state_dict())
    opt_a = AdamW(a.named_parameters(), lr=1e-2, fused="auto")
    opt_b = AdamW(b.named_parameters(), lr=1e-2, fused=True)
    x = torch.randn(16, 8)
    for net, opt in ((a, opt_a), (b, opt_b)):
        for _ in range(3):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    with pytest.raises(ValueError, match="fused='yes'"):
        AdamW(model.named_parameters(), fused="yes")


def test_kernel_rows_name_the_triton_lamb_on_a_cuda_device(monkeypatch):
    _H100(monkeypatch)
    monkeypatch.setattr("omnibert_kernels.lamb_triton.triton_available", lambda device: True)
    plugin = GPUPlugin()
    model = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 1,
             "num_attention_heads": 2, "intermediate_size": 64}  # fmt: skip
    rows = kernel_choices(
        plugin, model, Optimizer({"_target_": "omnibert.optim.Lamb"}), "bf16-mixed", "x"
    )
    assert rows["optimizer"] == "LAMB triton, omnibert_kernels (optimizer.impl=auto on CUDA)"
    assert rows["attention"].startswith("SDPA")
    assert rows["precision"] == "bf16-mixed (x)"
    assert list(rows) == [
        *("precision", "attention", "optimizer", "optimizer state", "compile", "CUDA graphs")
    ]


def test_lamb_row_follows_the_cpu_size_threshold():
    from omnibert.run.pipeline.kernels import lamb_choice

    cpu = torch.device("cpu")
    assert lamb_choice(Optimizer({}), cpu, 21_000_000).startswith("compiled ")
    assert lamb_choice(Optimizer({"compile_min_numel": 10**9}), cpu, 21_000_000).startswith(
        "foreach "
    )
    assert lamb_choice(Optimizer({"impl": "reference"}), cpu, 10) == "reference (optimizer.impl)"
