"""``compile_only=true``: build and compile one training step at the run's shapes, report, stop.

What a sweep over micro batch size or sequence length needs to find what fits, without
training (``omnibert-train -m data=generated compile_only=true micro_batch_size=8,16,32``):

1. **Counted on the meta device** and **estimated**
   (:mod:`omnibert.run.sizing.activation_memory`): parameters, FLOPs of forward + backward, the
   activations one micro-batch keeps with the kernels the run's device runs, and the
   memory a step needs; when the estimate exceeds the memory the device has (CPU:
   ``MemAvailable``; CUDA: the GPU's total memory) the step is not run and the report says
   ``fits: false`` instead of being killed by the kernel's OOM killer.
2. **Measured**: the accelerator plugin's :meth:`~omnibert.accelerators.base.AcceleratorPlugin.compile_only`
   moves the model and a real batch of the run's data (``data=generated`` needs no files) to
   the device, compiles (``torch.compile`` where the plugin is configured to, the backend's
   graph build on HPU, poptorch's offline ``compile()`` on IPU) and runs one step, then a
   second timed one. Peak memory is the device's own counter where the plugin has one
   (``torch.cuda.max_memory_allocated``, HPU's ``max_memory_allocated``); on the CPU it is
   the process's peak resident set size (``VmHWM`` in ``/proc/self/status``, reset through
   ``/proc/self/clear_refs`` first) minus the resident size before: everything the step
   allocated (gradients, optimiser state, activations, compiler workspace). The optimiser
   state is measured after the step by summing its tensors.

The report is printed and written as ``<output dir>/compile_report.json`` (rank 0 only);
nothing is trained and no checkpoint is written.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from torch import Tensor
from torch.utils.data import DataLoader

from omnibert.accelerators.base import lightning_precision
from omnibert.accelerators.float8 import convert_to_float8
from omnibert.compat import flop_counter_name, seed_everything
from omnibert.models import BertForPreTraining
from omnibert.optim.build import build_optimizer
from omnibert.run.sizing.activation_memory import estimate

__all__ = ["available_memory", "compile_only", "format_report", "report_metrics"]

REPORT_FILE = "compile_report.json"


def _proc_status(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes (Linux), else ``None``."""
    try:
        text = Path("/proc/self/status").read_text()
    except OSError:
        return None
    found = re.search(rf"^{field}:\s+(\d+) kB", text, re.MULTILINE)
    return int(found.group(1)) * 1024 if found else None


def available_memory(device: torch.device) -> tuple[int | None, str | None]:
    """Memory a step on ``device`` may use: ``(bytes, source)`` or ``(None, None)``."""
    if device.type == "cuda":
        _, total = torch.cuda.mem_get_info(device)
        return int(total), "torch.cuda.mem_get_info (total)"
    if device.type == "cpu":
        try:
            text = Path("/proc/meminfo").read_text()
        except OSError:
            return None, None
        found = re.search(r"^MemAvailable:\s+(\d+) kB", text, re.MULTILINE)
        if found:
            return int(found.group(1)) * 1024, "/proc/meminfo MemAvailable"
    return None, None


class _HostPeak:
    """Peak resident set size of this process during a block, above the size before it."""

    def __enter__(self) -> _HostPeak:
        try:  # "5" resets VmHWM to the current RSS (Linux >= 4.0)
            Path("/proc/self/clear_refs").write_text("5")
            self.reset = True
        except OSError:
            self.reset = False
        self.start = _proc_status("VmRSS")
        self.bytes: int | None = None
        return self

    def __exit__(self, *exc: object) -> None:
        peak = _proc_status("VmHWM")
        if self.reset and peak is not None and self.start is not None:
            self.bytes = max(0, peak - self.start)


def _is_out_of_memory(err: BaseException) -> bool:
    oom = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    return isinstance(err, oom) or "out of memory" in str(err).lower()


def _first_batch(datamodule: Any) -> dict[str, Tensor]:
    """The run's first training batch, read in this process (no loader workers)."""
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    single = DataLoader(
        loader.dataset, batch_sampler=loader.batch_sampler, collate_fn=loader.collate_fn
    )
    batch: dict[str, Tensor] = next(iter(single))
    return batch


def compile_only(prepared: Any, output_dir: Path | None) -> dict[str, Any]:
    """Run ``compile_only`` for a prepared run (:class:`~omnibert.run.pipeline.stages.Prepared`: its
    config, plan, data and plugin; module doc); returns the report, also printed and written
    to ``output_dir``."""
    plan, datamodule, plugin = prepared.plan, prepared.datamodule, prepared.plugin
    start = time.perf_counter()
    autocast = lightning_precision(plan.precision)  # fp8: bf16 autocast around fp8 matmuls
    plugin.check_precision(autocast)
    shapes = datamodule.describe()["shapes"]
    config = plan.model
    counted = estimate(
        config, shapes, autocast, plan.clip_grad_per_micro_batch, plugin.device.type,
        optimizer_ranks=prepared.config.accelerator.optimizer_ranks,
    )  # fmt: skip
    batch = plan.batch
    report: dict[str, Any] = {
        "model": prepared.config.model.name,
        "accelerator": plugin.describe(),
        "precision": plan.precision,
        "batch": {
            "micro_batch_size": batch.micro_batch_size,
            "accumulate_grad_batches": batch.accumulate_grad_batches,
            "world_size": batch.world_size,
            "global_batch_size": batch.global_batch_size,
            "shapes": dict(shapes),
        },
        "parameters": counted["parameters"],
        "flops": {
            "per_micro_batch": counted["flops_per_micro_batch"],
            "per_optimizer_step": counted["flops_per_micro_batch"]
            * batch.accumulate_grad_batches
            * batch.world_size,
            "counted_with": f"{flop_counter_name()}, forward + backward, meta device",
        },
        "memory_estimate_bytes": counted["memory"],
        "memory_estimate_counted_as": counted["counted_as"],
    }
    available, source = available_memory(plugin.device)
    report["available_memory_bytes"] = available
    report["available_memory_source"] = source
    report["fits"], report["reason"], report["measured"] = None, None, None
    if available is not None and counted["memory"]["total"] > available:
        report["fits"] = False
        report["reason"] = (
            f"the estimate ({_gib(counted['memory']['total'])}) exceeds the "
            f"{_gib(available)} the device has; the step was not run"
        )
    else:
        seed_everything(prepared.config.seed, workers=False)
        model = BertForPreTraining(config)
        if plan.float8 is not None:  # trainer.precision=fp8: the step the run would train
            convert_to_float8(model, plan.float8)
        optimizer = build_optimizer(prepared.config.optimizer, model.named_parameters())
        real = _first_batch(datamodule)
        # IPU: the device-side gradient accumulation sizes the compiled combined batch
        plugin.loop_kwargs(
            plan.batch.accumulate_grad_batches,
            plan.limit_train_batches,
            plan.val_check_interval,
            plan.max_steps,
        )
        try:
            with _HostPeak() as host:
                measured = dict(plugin.compile_only(model, real, optimizer, plan.precision))
        except (RuntimeError, MemoryError) as err:
            if not _is_out_of_memory(err):
                raise
            report["fits"] = False
            report["reason"] = f"out of memory: {str(err).splitlines()[0]}"
        else:
            if measured.get("peak_memory_bytes") is None and host.bytes is not None:
                measured["peak_memory_bytes"] = host.bytes
                measured["peak_memory_source"] = (
                    "process peak RSS (VmHWM) increase during compile + steps (pages the allocator "
                    "already held are not counted: 0 when freed memory is reused)"
                )
            measured["optimizer_state_bytes"] = sum(
                v.numel() * v.element_size()
                for state in optimizer.state.values()
                for v in state.values()
                if isinstance(v, Tensor)
            )
            report["measured"] = measured
            report["fits"] = True
    report["seconds"] = round(time.perf_counter() - start, 3)
    print(format_report(report), flush=True)
    if output_dir is not None and rank_zero_only.rank == 0:  # type: ignore[attr-defined]
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / REPORT_FILE
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"  report              {path}", flush=True)
    return report


def report_metrics(report: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of a compile-only report as logger metrics (``compile_only/*``)."""
    measured = report.get("measured") or {}
    metrics = {
        "compile_only/fits": float(bool(report["fits"])),
        "compile_only/parameters": float(report["parameters"]),
        "compile_only/flops_per_optimizer_step": float(report["flops"]["per_optimizer_step"]),
        "compile_only/memory_estimate_bytes": float(report["memory_estimate_bytes"]["total"]),
    }
    for key in ("compile_seconds", "step_seconds", "peak_memory_bytes"):
        if measured.get(key) is not None:
            metrics[f"compile_only/{key}"] = float(measured[key])
    return metrics


def _gib(n: float | None) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"


def _flops(n: float) -> str:
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:.3f} {unit}"
    return f"{n:.0f} FLOP"


def _seconds(value: Any) -> str:
    if value is None:
        return "n/a"
    return f"{value:.2f} s" if value >= 1 else f"{value * 1000:.1f} ms"


def format_report(report: Mapping[str, Any]) -> str:
    """The human-readable form of a compile-only report."""
    b, mem, flops = report["batch"], report["memory_estimate_bytes"], report["flops"]
    shape = b["shapes"]["input_ids"]
    compiled = report["accelerator"].get("compile")
    mode = "" if compiled is None else (", torch.compile" if compiled else ", eager")
    lines = [
        f"omnibert-train: compile-only, {report['model']} on "
        f"{report['accelerator']['accelerator']} ({report['precision']}{mode}), micro batch "
        f"{shape[0]} x seq {shape[1]}, {b['accumulate_grad_batches']} accumulated x "
        f"{b['world_size']} device(s)",
        f"  parameters          {report['parameters'] / 1e6:.2f} M",
        f"  FLOPs               {_flops(flops['per_micro_batch'])} per micro-batch (fwd+bwd), "
        f"{_flops(flops['per_optimizer_step'])} per optimiser step",
        f"  memory estimate     {_gib(mem['total'])} = parameters {_gib(mem['parameters'])}"
        f" + gradients {_gib(mem['gradients'])} + optimiser {_gib(mem['optimizer_state'])}"
        f" + activations {_gib(mem['activations'])}"
        f" + backward transients {_gib(mem['backward_transients'])}"
        + (f" + clip buffer {_gib(mem['clip_buffer'])}" if mem["clip_buffer"] else ""),
    ]
    if report.get("memory_estimate_counted_as"):
        lines.append(f"  counted as          {report['memory_estimate_counted_as']}")
    lines += [
        f"  available           {_gib(report['available_memory_bytes'])}"
        + (f" ({report['available_memory_source']})" if report["available_memory_source"] else ""),
    ]
    measured = report.get("measured")
    if measured:
        lines += [
            f"  measured peak       {_gib(measured.get('peak_memory_bytes'))}"
            f" ({measured.get('peak_memory_source') or 'not measurable here'})",
            f"  compile + 1st step  {_seconds(measured.get('compile_seconds'))}",
            f"  step                {_seconds(measured.get('step_seconds'))}",
        ]
    verdict = "yes" if report["fits"] else f"no: {report['reason']}"
    lines.append(f"  fits                {verdict}")
    return "\n".join(lines)
