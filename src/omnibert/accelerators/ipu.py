"""Graphcore IPU through ``poptorch`` and omnibert's own Lightning strategy
(:mod:`omnibert.accelerators.ipu_strategy`).

Batch arithmetic. poptorch's ``DataLoader`` documents the *combined batch* one call of a
``trainingModel`` consumes as ``micro_batch × device_iterations × (replication_factor /
input_group_size) × gradient_accumulation`` (``input_group_size`` is 1 without popdist), laid
out, as PopART's glossary says, ``[device_iterations, gradient_accumulation, replicas,
micro_batch, ...]``; the weights are updated once per ``micro × replicas × accumulation``
samples. omnibert's batch plan gives the per-device micro-batch and
``accumulation = global / (micro × devices)`` with ``devices`` = replicas here, so:

* ``replicationFactor(devices)``, ``Training.gradientAccumulation(accumulation)``,
  ``deviceIterations(device_iterations)``; gradients are averaged
  (``accumulationAndReplicationReductionType(Mean)``), as Lightning's accumulation and DDP do;
* the host process is one Lightning process that yields micro-batches of the whole data set;
  the strategy concatenates ``devices × accumulation × device_iterations`` consecutive ones
  into one combined batch, so optimiser step *j* sees the same samples as on other backends;
* Lightning must not accumulate (``accumulate_grad_batches=1``) and one Lightning step is
  ``device_iterations`` optimiser steps: ``max_steps``, the epoch length and the validation
  interval are divided by ``device_iterations`` (which must divide them), and the LR schedule
  is stepped ``device_iterations`` times per Lightning step (the IPU uses one LR for the
  ``device_iterations`` updates of one call). Step-counted callbacks (checkpoint
  ``every_n_train_steps``, logging) count Lightning steps.

Nothing here ran on an IPU in this project: the tests use a fake ``poptorch``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin

_MISSING = (
    "accelerator=ipu needs Graphcore's poptorch, which is not importable here; run inside the "
    "Poplar SDK container (graphcore/pytorch) or `pip install -r requirements-ipu.txt` in the "
    "SDK's Python environment."
)
#: optimisers poptorch compiles into the IPU program: its own LAMB and torch's AdamW
#: (which poptorch converts to poptorch.optim.AdamW)
RUNS_ON_IPU = (
    "omnibert.optim.vendor.poptorch_lamb",
    "omnibert.optim.AdamW",
    "omnibert.optim.param_groups.AdamW",
    "torch.optim.AdamW",
)


class IPUPlugin(AcceleratorPlugin):
    """Graphcore IPU training and offline compilation.

    Args:
        devices: model replicas (data parallel); each uses ``len(layers_per_ipu)`` IPUs.
        device_iterations: optimiser steps the IPU runs per host call.
        layers_per_ipu: encoder layers on each IPU of a replica, e.g. ``[0, 4, 4, 4]``
            (embeddings and the tied MLM/NSP heads live on IPU 0); ``null``: one IPU.
        available_memory_proportion: temporary-memory proportion for matmuls, one float for
            every IPU or one per IPU.
        executable_cache_dir: where compiled executables are cached (``null``: off).
        offline_ipu_version: IPU version compile-only targets without hardware (2 = Mk2).
    """

    name = "ipu"
    samples_as_planned = False
    precisions = ("32-true", "32", "16-true")
    device_kind = "a Graphcore IPU"
    fp8_emulation = False  # poptorch compiles its own graph: torchao's float8 tensors never run

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = None,
        timeout_s: float = 300,
        optimizer_sharding: str = "none",
        device_iterations: int = 1,
        layers_per_ipu: Sequence[int] | None = None,
        available_memory_proportion: float | Sequence[float] | None = None,
        executable_cache_dir: str | None = None,
        offline_ipu_version: int = 2,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator, timeout_s, optimizer_sharding)
        if num_nodes != 1:
            raise AcceleratorError(
                f"accelerator.num_nodes={num_nodes}: the IPU plugin drives one host; set "
                "accelerator.num_nodes=1 and scale with accelerator.devices (replicas)."
            )
        if not isinstance(device_iterations, int) or device_iterations < 1:
            raise AcceleratorError(
                f"accelerator.device_iterations={device_iterations!r} must be a positive integer."
            )
        self.device_iterations = device_iterations
        self.layers_per_ipu = list(layers_per_ipu) if layers_per_ipu else None
        self.ipus_per_replica = len(self.layers_per_ipu) if self.layers_per_ipu else 1
        amp = available_memory_proportion
        if isinstance(amp, (int, float)):
            amp = [float(amp)] * self.ipus_per_replica
        if amp is not None and len(amp) != self.ipus_per_replica:
            raise AcceleratorError(
                f"accelerator.available_memory_proportion has {len(amp)} values for "
                f"{self.ipus_per_replica} IPU(s) per replica; give one value or one per IPU."
            )
        self.available_memory_proportion = None if amp is None else [float(a) for a in amp]
        self.executable_cache_dir = executable_cache_dir
        self.offline_ipu_version = offline_ipu_version
        self.gradient_accumulation = 1  # set from the batch plan by loop_kwargs
        self._pipelined: set[int] = set()

    # ------------------------------------------------------------------ checks
    def check(self) -> None:
        try:
            import poptorch  # noqa: F401
        except ImportError as err:
            raise AcceleratorError(_MISSING) from err

    def check_hardware(self) -> None:
        import poptorch

        needed = self.devices * self.ipus_per_replica
        if not poptorch.ipuHardwareIsAvailable(needed):
            raise AcceleratorError(
                f"accelerator=ipu needs {needed} IPU(s) ({self.devices} replica(s) × "
                f"{self.ipus_per_replica} IPU(s)) and poptorch finds fewer; lower "
                "accelerator.devices or run compile_only=true (offline compilation)."
            )

    # ------------------------------------------------------------------ batch arithmetic
    @property
    def host_batches_per_step(self) -> int:
        """Host micro-batches in one combined batch (one Lightning step)."""
        return self.devices * self.gradient_accumulation * self.device_iterations

    def loop_kwargs(
        self,
        accumulate_grad_batches: int,
        limit_train_batches: int,
        val_check_interval: int | None,
        max_steps: int,
    ) -> dict[str, Any]:
        self.gradient_accumulation = accumulate_grad_batches
        d = self.device_iterations
        steps_per_epoch = limit_train_batches // accumulate_grad_batches
        every = (
            None if val_check_interval is None else val_check_interval // accumulate_grad_batches
        )
        for key, value in (("phase.max_steps", max_steps), ("val_every_n_steps", every)):
            if value is not None and value % d:
                raise AcceleratorError(
                    f"{key}={value} is not a multiple of accelerator.device_iterations={d} "
                    "(one IPU call runs that many steps); make it one or change "
                    "device_iterations."
                )
        return {
            "accumulate_grad_batches": 1,  # poptorch accumulates on the device
            "limit_train_batches": max(steps_per_epoch // d, 1),
            "val_check_interval": None if every is None else every // d,
            "max_steps": max_steps // d,
        }

    # ------------------------------------------------------------------ poptorch
    def options(self, training: bool, offline: bool = False) -> Any:
        """``poptorch.Options`` from this config (inference: one replica, one iteration)."""
        import poptorch

        opts = poptorch.Options()
        if training:
            opts.deviceIterations(self.device_iterations)
            opts.replicationFactor(self.devices)
            opts.Training.gradientAccumulation(self.gradient_accumulation)
            opts.Training.accumulationAndReplicationReductionType(poptorch.ReductionType.Mean)
        opts.outputMode(poptorch.OutputMode.All)
        if self.available_memory_proportion is not None:
            opts.setAvailableMemoryProportion(
                {f"IPU{i}": p for i, p in enumerate(self.available_memory_proportion)}
            )
        if self.executable_cache_dir:
            opts.enableExecutableCaching(str(self.executable_cache_dir))
        if offline:
            opts.useOfflineIpuTarget(self.offline_ipu_version)
        return opts

    def pipeline(self, model: nn.Module) -> None:
        """Place ``model`` (a ``BertForPreTraining``) on the IPUs of a replica with
        ``poptorch.BeginBlock``: embeddings and heads on IPU 0, then ``layers_per_ipu``."""
        if not self.layers_per_ipu or id(model) in self._pipelined:
            return
        import poptorch

        bert: Any = model  # BertForPreTraining: .bert.embeddings, .bert.encoder.layer, .cls
        layers = bert.bert.encoder.layer
        if sum(self.layers_per_ipu) != len(layers):
            raise AcceleratorError(
                f"accelerator.layers_per_ipu={self.layers_per_ipu} places "
                f"{sum(self.layers_per_ipu)} layers but the model has {len(layers)}; make "
                "them add up."
            )
        bert.bert.embeddings = poptorch.BeginBlock(bert.bert.embeddings, "embeddings", ipu_id=0)
        start = 0
        for ipu, count in enumerate(self.layers_per_ipu):
            if count:
                layers[start] = poptorch.BeginBlock(layers[start], f"layer{start}", ipu_id=ipu)
            start += count
        bert.cls = poptorch.BeginBlock(bert.cls, "heads", ipu_id=0)
        self._pipelined.add(id(model))

    def training_model(self, step: nn.Module, optimizer: torch.optim.Optimizer) -> Any:
        import poptorch

        return poptorch.trainingModel(step, options=self.options(True), optimizer=optimizer)

    def inference_model(self, step: nn.Module) -> Any:
        import poptorch

        return poptorch.inferenceModel(step, options=self.options(False))

    # ------------------------------------------------------------------ Trainer
    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        self.check_precision(precision)
        self.check_hardware()
        from omnibert.accelerators.ipu_strategy import IPUAccelerator, IPUPrecision, IPUStrategy

        return {
            "accelerator": IPUAccelerator(),
            "devices": 1,  # one host process; replicas are poptorch's
            "num_nodes": 1,
            "strategy": IPUStrategy(self),
            "precision": None,
            "plugins": [IPUPrecision(_ipu_precision(precision))],
        }

    def check_optimizer(self, optimizer_cfg: Mapping[str, Any]) -> None:
        """poptorch runs the optimiser inside the IPU program: only its own optimisers."""
        target = str(optimizer_cfg.get("_target_"))
        if target in RUNS_ON_IPU:
            return
        if target in ("omnibert.optim.Lamb", "omnibert.optim.lamb.Lamb"):
            raise AcceleratorError(
                "accelerator=ipu runs the optimiser inside the IPU program, where omnibert's "
                "LAMB cannot run; choose optimizer=lamb_poptorch to train with poptorch's LAMB, "
                "whose update differs (no gradient-norm clipping, the trust ratio on every "
                "tensor, weight norms clamped at 65500; docs/lamb.md)."
            )
        raise AcceleratorError(
            f"accelerator=ipu runs the optimiser inside the IPU program and {target} is not "
            "one poptorch compiles; choose optimizer=lamb_poptorch or optimizer=adamw."
        )

    # ------------------------------------------------------------------ compile-only
    def compile_only(
        self,
        model: nn.Module,
        batch: Mapping[str, Tensor],
        optimizer: torch.optim.Optimizer,
        precision: str = "32-true",
    ) -> dict[str, Any]:
        """Compile the training graph for an offline IPU target (``compile()`` only, no run).

        ``batch`` is one host micro-batch; it is repeated into poptorch's combined batch.
        """
        import poptorch

        from omnibert.accelerators.ipu_strategy import BATCH_KEYS, PoptorchStep

        if _ipu_precision(precision) == "16-true":
            model.half()
        self.pipeline(model)
        executor = poptorch.trainingModel(
            PoptorchStep(model, training=True),
            options=self.options(True, offline=True),
            optimizer=optimizer,
        )
        group = self.host_batches_per_step
        tensors = [torch.cat([batch[k]] * group) for k in BATCH_KEYS]
        start = time.perf_counter()
        executor.compile(*tensors)
        seconds = time.perf_counter() - start
        return {
            "compile_seconds": round(seconds, 4),
            "step_seconds": None,
            "peak_memory_bytes": None,
            "peak_memory_source": None,
            "ran_steps": 0,
            "combined_batch_size": int(tensors[0].shape[0]),
            "ipus": self.devices * self.ipus_per_replica,
            "offline_ipu_version": self.offline_ipu_version,
        }

    # ------------------------------------------------------------------ report
    def kernels(self) -> dict[str, str]:
        return {"compile": "poptorch compiles the whole training step (PopART)"}

    def devices_found(self) -> dict[str, Any]:
        try:
            import poptorch
        except ImportError:
            return {"kind": "ipu", "count": 0, "names": []}
        needed = self.devices * self.ipus_per_replica
        available = bool(poptorch.ipuHardwareIsAvailable(needed))
        version = poptorch.ipuHardwareVersion() if available else None
        return {
            "kind": "ipu",
            "count": needed if available else 0,
            "names": [f"IPU Mk{version}"] if version else [],
        }

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "replicas": self.devices,
            "ipus_per_replica": self.ipus_per_replica,
            "device_iterations": self.device_iterations,
            "gradient_accumulation": self.gradient_accumulation,
            "layers_per_ipu": self.layers_per_ipu,
            "available_memory_proportion": self.available_memory_proportion,
            "executable_cache_dir": self.executable_cache_dir,
        }


def _ipu_precision(precision: str) -> str:
    return "32-true" if str(precision) == "32" else str(precision)
