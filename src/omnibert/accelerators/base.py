"""The interface every accelerator plugin implements, and what they share.

A plugin is built from ``conf/accelerator/<name>.yaml`` by ``hydra.utils.instantiate``. It
turns that config into ``lightning.pytorch.Trainer`` arguments, maps the optimiser config to
the backend's implementation, compiles the model for ``compile_only`` and reports the
environment. Vendor SDKs are imported only inside the methods of the plugin that needs them,
so importing this package never imports ``poptorch`` or ``habana_frameworks``.

The accelerator group may change speed and memory, never the maths: a plugin must not
change the model, the data or the optimiser. Vendor optimisers are explicit ``optimizer=``
choices; a plugin only refuses an optimiser its backend cannot run (:meth:`check_optimizer`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from omnibert.errors import UserError


class AcceleratorError(UserError):
    """The selected accelerator cannot run here: one sentence naming what is missing and the fix."""


#: ``trainer.precision=fp8`` (omnibert's, not Lightning's: :mod:`omnibert.accelerators.float8`;
#: ``omnibert.config.sections.FP8`` spells it too, the config layer importing no torch)
FP8 = "fp8"


#: ``accelerator.optimizer_sharding``: ``none`` (every data-parallel rank holds and updates the
#: whole optimiser, as DDP does) or ``zero1`` (each rank its share of the tensors: ZeRO stage 1,
#: :mod:`omnibert.optim.zero1`)
SHARDINGS = ("none", "zero1")
#: optimisers exact on whole tensors partitioned over ranks: AdamW's update is elementwise;
#: omnibert's LAMB sums its global gradient norm over the ranks (Lamb.partition_norms_over)
ZERO1_SAFE = (
    "omnibert.optim.Lamb",
    "omnibert.optim.lamb.Lamb",
    "omnibert.optim.AdamW",
    "omnibert.optim.param_groups.AdamW",
    "torch.optim.AdamW",
)


def lightning_precision(precision: str) -> str:
    """The Lightning precision (and autocast) a run of ``precision`` trains in: ``fp8`` is
    bf16 autocast (``bf16-mixed``) around torchao's fp8 matmuls; the others are Lightning's."""
    return "bf16-mixed" if str(precision) == FP8 else str(precision)


class AcceleratorPlugin:
    """Base plugin: one process per device, Lightning's own loop, no vendor SDK.

    Args:
        devices: devices per node (Lightning processes; IPU: model replicas).
        num_nodes: nodes; the batch arithmetic's world size is ``devices * num_nodes``.
        strategy: a Lightning strategy name (``auto``, ``ddp``, ``fsdp``, ...).
        accelerator: the Lightning accelerator name this plugin passes to the Trainer.
        timeout_s: seconds a collective of a multi-process run waits for the other ranks
            before the run ends naming the rank that stopped answering (the process-group
            timeout, :mod:`omnibert.accelerators.ddp`).
        optimizer_sharding: ``none`` (every data-parallel rank holds and updates the whole
            optimiser) or ``zero1`` (each rank its share of the tensors, then the parameters
            are broadcast: :mod:`omnibert.optim.zero1`); refused where it cannot apply.
    """

    name = "base"
    #: each Lightning process samples ``micro_batch_size`` rows per batch out of
    #: ``devices * num_nodes`` shares (the batch plan's layout), so a checkpoint's sampler
    #: position can be checked against the plan before the Trainer starts (not on IPU, whose
    #: one host process loads every replica's rows)
    samples_as_planned = True
    #: precisions (Lightning spelling) this backend runs; others stop before any compute
    precisions: tuple[str, ...] = ("32-true", "32", "bf16-mixed", "bf16-true")
    #: what this backend's devices are, for sentences ("... and this run's device is the CPU")
    device_kind = "the CPU"
    #: whether ``trainer.fp8.emulate=true`` can run here: torchao's emulated fp8 maths in eager
    #: or ``torch.compile``d torch (not inside a vendor graph compiler)
    fp8_emulation = True
    #: the ``accelerator.strategy`` values under which ``optimizer_sharding=zero1`` runs (this
    #: backend's DDP); none: the backend does not partition the optimiser
    zero1_strategies: tuple[str, ...] = ()

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = None,
        timeout_s: float = 300,
        optimizer_sharding: str = "none",
    ) -> None:
        for key, value in (("devices", devices), ("num_nodes", num_nodes)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise AcceleratorError(
                    f"accelerator.{key}={value!r} must be a positive integer, e.g. "
                    f"accelerator.{key}=1."
                )
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or timeout_s <= 0:
            raise AcceleratorError(
                f"accelerator.timeout_s={timeout_s!r} must be a positive number of seconds, "
                "e.g. accelerator.timeout_s=300."
            )
        self.devices = devices
        self.num_nodes = num_nodes
        self.timeout_s = float(timeout_s)
        self.strategy = strategy
        self.accelerator = accelerator or self.name
        self.optimizer_sharding = optimizer_sharding
        self._check_optimizer_sharding()

    def _check_optimizer_sharding(self) -> None:
        """Refuse ``optimizer_sharding`` (one sentence) where it cannot apply: an unknown
        value, a backend without it, one process, a strategy that is not this backend's DDP."""
        value = self.optimizer_sharding
        if value not in SHARDINGS:
            raise AcceleratorError(
                f"accelerator.optimizer_sharding={value!r} is not one of {', '.join(SHARDINGS)}; "
                "set accelerator.optimizer_sharding=none or zero1."
            )
        if value == "none":
            return
        if not self.zero1_strategies:
            raise AcceleratorError(
                f"accelerator.optimizer_sharding={value} partitions the optimiser of the CPU and "
                f"GPU plugins' DDP runs, and accelerator={self.name} has no such run; set "
                "accelerator.optimizer_sharding=none."
            )
        if self.world_size == 1:
            raise AcceleratorError(
                f"accelerator.optimizer_sharding={value} splits the optimiser over data-parallel "
                f"ranks, but this run has one (accelerator.devices={self.devices}, "
                f"num_nodes={self.num_nodes}); set accelerator.optimizer_sharding=none or more "
                "accelerator.devices."
            )
        if self.strategy not in self.zero1_strategies:
            sharded = " (FSDP shards the optimiser already)" if self.strategy == "fsdp" else ""
            raise AcceleratorError(
                f"accelerator.optimizer_sharding={value} partitions the optimiser of DDP runs, "
                f"not of accelerator.strategy={self.strategy}{sharded}; set "
                "accelerator.optimizer_sharding=none or accelerator.strategy=ddp."
            )

    # ------------------------------------------------------------------ facts
    @property
    def world_size(self) -> int:
        """Data-parallel replicas for the batch arithmetic: ``devices * num_nodes``."""
        return self.devices * self.num_nodes

    @property
    def device(self) -> torch.device:
        """Where ``compile_only`` puts the model and the batch (the first local device)."""
        return torch.device("cpu")

    def check(self) -> None:
        """Stop with :class:`AcceleratorError` when the backend's SDK or devices are missing."""

    def resolve_precision(self, precision: Any) -> tuple[str, str]:
        """``trainer.precision`` with ``auto`` resolved for this backend, and why.

        ``auto`` (``conf/trainer/default.yaml``) is fp32 (``32-true``) here; a backend whose
        devices train faster in another precision without loss scaling overrides this (GPU:
        bf16 autocast where the device runs bf16). Any other value is kept as written."""
        if str(precision) != "auto":
            return str(precision), "set by trainer.precision"
        return "32-true", f"trainer.precision=auto: fp32 on accelerator={self.name}"

    def check_precision(self, precision: str) -> None:
        if str(precision) not in self.precisions:
            raise AcceleratorError(
                f"trainer.precision={precision} is not supported by accelerator={self.name}; "
                f"use one of {', '.join(self.precisions)}."
            )

    def fp8_unsupported(self) -> str | None:
        """Why this backend's devices cannot run fp8 matmuls (torchao's float8 training needs
        CUDA compute capability 8.9 or newer), naming the device; ``None`` where they can."""
        return f"{self.device_kind} (accelerator={self.name})"

    def decide_compile(self, run_seconds: float | None, layers: int) -> None:
        """Settle an automatic ``accelerator.compile`` from the run's projected eager length
        (``None``: not measured); backends without one keep their setting."""

    def configure_threads(self, num_workers: int, rows_per_second: float | None = None) -> str:
        """Set this process's host threads for training with ``num_workers`` loader workers
        feeding ``rows_per_second`` rows (None: not measured) and say what and why (``""``:
        left as they are)."""
        return ""

    # ------------------------------------------------------------------ Trainer
    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        """Trainer arguments: accelerator, devices, num_nodes, strategy, precision, plugins.

        The app passes them to ``instantiate(cfg.trainer, ...)``, so they override the
        trainer config's interpolated values; ``plugins`` is a list the app extends.
        ``fp8`` trains in Lightning's ``bf16-mixed`` (:func:`lightning_precision`) and
        validates under ``torch.no_grad`` instead of ``torch.inference_mode``: torchao's fp8
        tensors cannot take autocast's casts inside inference mode (``aten.to.dtype``).
        """
        fp8 = str(precision) == FP8
        precision = lightning_precision(precision)
        self.check_precision(precision)
        return {
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": self.strategy,
            "precision": precision,
            "plugins": [],
            **({"inference_mode": False} if fp8 else {}),
        }

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """Refuse (:class:`AcceleratorError`, one sentence) gradient accumulation this backend
        cannot run as configured (before compute; the batch plan decides the count)."""

    def check_attention(self, configured: str, backends: tuple[str, ...]) -> None:
        """Refuse (:class:`AcceleratorError`, one sentence) attention kernels this backend
        cannot run as configured: ``backends`` are what ``model.config.attention=configured``
        resolves to in training and in evaluation (before compute)."""

    def loop_kwargs(
        self,
        accumulate_grad_batches: int,
        limit_train_batches: int,
        val_check_interval: int | None,
        max_steps: int,
    ) -> dict[str, Any]:
        """Lightning's loop counts for the plan's numbers (all in host micro-batches and
        optimiser steps). Identity here; a backend that accumulates on the device (IPU)
        converts them to what one Lightning batch means there."""
        return {
            "accumulate_grad_batches": accumulate_grad_batches,
            "limit_train_batches": limit_train_batches,
            "val_check_interval": val_check_interval,
            "max_steps": max_steps,
        }

    # ------------------------------------------------------------------ optimiser
    def check_optimizer(self, optimizer_cfg: Mapping[str, Any]) -> None:
        """Refuse (:class:`AcceleratorError`, one sentence) an optimiser this backend cannot
        run as configured. Never substitutes one: the configured optimiser is the one built.
        Here: one that ``optimizer_sharding=zero1`` would not keep exact."""
        target = str(optimizer_cfg.get("_target_"))
        if self.optimizer_sharding == "zero1" and target not in ZERO1_SAFE:
            raise AcceleratorError(
                f"accelerator.optimizer_sharding=zero1 gives each rank whole tensors to update, "
                f"and {target} is not known to update them exactly that way (its step may couple "
                "tensors); use optimizer=lamb, lamb_mlperf or adamw, or set "
                "accelerator.optimizer_sharding=none."
            )

    # ------------------------------------------------------------------ compile
    def compile_model(self, model: nn.Module) -> nn.Module:
        """The module the training step calls (``torch.compile`` where configured)."""
        return model

    def compile_only(
        self,
        model: nn.Module,
        batch: Mapping[str, Tensor],
        optimizer: torch.optim.Optimizer,
        precision: str = "32-true",
    ) -> dict[str, Any]:
        """Build and compile one training step for ``batch``'s shapes without training.

        Moves ``model`` and ``batch`` to :attr:`device`, compiles (:meth:`compile_model`) and
        runs one forward/backward/optimiser step (the compile happens in the first), then a
        second, timed step. Returns ``compile_seconds`` (first step, compile included),
        ``step_seconds`` (second step), ``peak_memory_bytes`` and ``peak_memory_source``
        (``None`` where this backend cannot measure it) and ``ran_steps``. ``precision`` is
        ``trainer.precision`` (mixed precisions run the step under autocast).
        """
        model.to(self.device)
        moved = {k: v.to(self.device) for k, v in batch.items()}
        start = time.perf_counter()
        step = self.compile_model(model)
        self.reset_peak_memory()
        self._train_step(step, moved, optimizer, precision)
        first = time.perf_counter() - start
        start = time.perf_counter()
        self._train_step(step, moved, optimizer, precision)
        second = time.perf_counter() - start
        peak, source = self.peak_memory()
        return {
            "compile_seconds": round(first, 4),
            "step_seconds": round(second, 4),
            "peak_memory_bytes": peak,
            "peak_memory_source": source,
            "ran_steps": 2,
        }

    def _train_step(
        self,
        model: nn.Module,
        batch: Mapping[str, Tensor],
        optimizer: torch.optim.Optimizer,
        precision: str,
    ) -> None:
        optimizer.zero_grad(set_to_none=True)
        with self.autocast(precision):
            loss = model(batch)["loss"]
        loss.backward()
        self._graph_break()
        optimizer.step()
        self._graph_break()
        self.synchronize()

    def _graph_break(self) -> None:
        """Where a lazily traced backend must cut and run its graph (HPU lazy mode)."""

    def autocast(self, precision: str) -> Any:
        """The autocast context a step runs in for ``precision`` (Lightning's spelling, or
        ``fp8``: bf16 autocast)."""
        import contextlib

        precision = lightning_precision(precision)
        if str(precision) in ("bf16-mixed", "16-mixed"):
            dtype = torch.bfloat16 if str(precision).startswith("bf16") else torch.float16
            return torch.autocast(self.device.type, dtype=dtype)
        return contextlib.nullcontext()

    def synchronize(self) -> None:
        """Wait for queued device work (timings); nothing on the CPU."""

    def reset_peak_memory(self) -> None:
        """Start a new peak-memory measurement (where the backend has one)."""

    def peak_memory(self) -> tuple[int | None, str | None]:
        """``(bytes, how it was measured)`` since :meth:`reset_peak_memory`, or ``(None, None)``."""
        return None, None

    # ------------------------------------------------------------------ callbacks
    def callbacks(self) -> list[Any]:
        """Lightning callbacks this backend's training loop needs (the app appends them)."""
        return []

    # ------------------------------------------------------------------ report
    def kernels(self) -> dict[str, str]:
        """What this backend runs the step with, as ``{what: choice}`` rows for the plan
        (``omnibert.run.pipeline.kernels`` adds precision, attention and the optimiser's kernel)."""
        if not getattr(self, "compile", False):
            return {"compile": "off (eager)"}
        options = dict(getattr(self, "compile_options", {}) or {})
        mode = options.pop("mode", None) or "default"
        rest = ", ".join(f"{k}={v}" for k, v in options.items())
        return {"compile": f"torch.compile, mode {mode}" + (f" ({rest})" if rest else "")}

    def environment(self) -> dict[str, Any]:
        """Versions, devices found and SDKs present (``omnibert.accelerators.environment``)."""
        from omnibert.accelerators.environment import environment_report
        from omnibert.accelerators.launchers import detect_launcher

        launch = detect_launcher(self.devices, self.num_nodes)
        return environment_report(self.describe(), self.devices_found(), launch)

    def devices_found(self) -> dict[str, Any]:
        """What this backend sees here: ``{"kind", "count", "names"}``."""
        import os
        import platform

        return {
            "kind": "cpu",
            "count": os.cpu_count(),
            "names": [platform.processor() or platform.machine()],
        }

    def describe(self) -> dict[str, Any]:
        """This plugin's settings, for the environment report."""
        return {
            "plugin": f"{type(self).__module__}.{type(self).__qualname__}",
            "accelerator": self.accelerator,
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": self.strategy,
            "timeout_s": self.timeout_s,
            "optimizer_sharding": self.optimizer_sharding,
        }
