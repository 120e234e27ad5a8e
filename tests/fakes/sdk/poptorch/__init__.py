"""FAKE poptorch for CPU tests (not Graphcore's package).

The documented names omnibert uses (``Options`` with ``Training``, ``trainingModel``,
``inferenceModel``, ``BeginBlock``, ``identity_loss``, ``OutputMode``, ``ReductionType``,
``ipuHardwareIsAvailable``, ``ipuHardwareVersion``, ``optim.LAMB``) with their documented
signatures. Nothing is compiled: an executor runs the wrapped module's forward on the CPU
without backward or optimiser update, and everything is recorded in ``CALLS``.
"""

from __future__ import annotations

import enum
from typing import Any

import torch

from . import optim

__version__ = "0.0.0+fake"
#: (name, detail) for every call into the fake
CALLS: list[tuple[str, Any]] = []
#: IPUs the fake reports as attached to this host (tests change it)
FAKE_IPUS = 16


class OutputMode(enum.IntEnum):
    Final = 0
    EveryN = 1
    All = 2
    Sum = 3
    Default = 4


class ReductionType(enum.IntEnum):
    Sum = 0
    Mean = 1
    NoReduction = 2


class _TrainingOptions:
    def __init__(self) -> None:
        self.gradient_accumulation = 1
        self.accumulation_and_replication_reduction_type = ReductionType.Mean

    def gradientAccumulation(self, gradient_accumulation: int) -> _TrainingOptions:
        self.gradient_accumulation = gradient_accumulation
        return self

    def accumulationAndReplicationReductionType(self, reduction_type: ReductionType) -> Any:
        self.accumulation_and_replication_reduction_type = reduction_type
        return self


class Options:
    """Records what was set; the attribute names are the real ``Options``' internal keys."""

    def __init__(self) -> None:
        self.Training = _TrainingOptions()
        self.device_iterations = 1
        self.replication_factor = 1
        self.input_group_size = 1
        self.output_mode = OutputMode.Default
        self.available_memory_proportion: dict[int, float] = {}
        self.cache_path: str | None = None
        self.ipu_version: int | None = None
        self.offline = False

    def deviceIterations(self, device_iterations: int) -> Options:
        self.device_iterations = device_iterations
        return self

    def replicationFactor(self, replication_factor: int) -> Options:
        self.replication_factor = replication_factor
        return self

    def outputMode(self, output_mode: OutputMode, output_return_period: int | None = None) -> Any:
        self.output_mode = output_mode
        return self

    def setAvailableMemoryProportion(self, available_memory_proportion: dict[str, float]) -> Any:
        for key, value in available_memory_proportion.items():
            assert key.startswith("IPU"), key  # the real method asserts the same
            self.available_memory_proportion[int(key[3:])] = value
        return self

    def enableExecutableCaching(self, path: str) -> Options:
        self.cache_path = path
        return self

    def useOfflineIpuTarget(self, ipu_version: int = 2) -> Options:
        self.offline, self.ipu_version = True, ipu_version
        return self

    def combined_batch(self, micro_batch: int, training: bool) -> int:
        """``poptorch.DataLoader``'s documented combined batch size."""
        accumulation = self.Training.gradient_accumulation if training else 1
        return (
            micro_batch
            * self.device_iterations
            * (self.replication_factor // self.input_group_size)
            * accumulation
        )


class PoplarExecutor:
    def __init__(self, model: torch.nn.Module, options: Options | None, training: bool,
                 optimizer: torch.optim.Optimizer | None = None) -> None:  # fmt: skip
        self.model = model
        self.options = options or Options()
        self.training = training
        self.optimizer = optimizer
        self._compiled = False
        self._attached = False
        self.calls: list[dict[str, Any]] = []

    def _compile(self, tensors: tuple[torch.Tensor, ...]) -> None:
        if not self._compiled:
            CALLS.append(("compile", {"training": self.training, "rows": len(tensors[0])}))
            self._compiled = True
            self._attached = not self.options.offline

    def compile(self, *tensors: torch.Tensor) -> None:
        self._compile(tensors)

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.options.offline:
            raise RuntimeError("fake poptorch: an offline target cannot run")
        self._compile(tensors)
        if not self._attached:
            raise RuntimeError("fake poptorch: executor is not attached")
        self.calls.append({"rows": len(tensors[0])})
        with torch.no_grad():  # the fake runs no backward or optimiser update
            outputs = self.model(*tensors)
        return tuple(o.reshape(1) for o in outputs)  # OutputMode.All: one per iteration

    def setOptimizer(self, optimizer: torch.optim.Optimizer) -> None:
        CALLS.append(("setOptimizer", [g["lr"] for g in optimizer.param_groups]))

    def isCompiled(self) -> bool:
        return self._compiled

    def isAttachedToDevice(self) -> bool:
        return self._compiled and self._attached

    def attachToDevice(self) -> None:
        CALLS.append(("attachToDevice", self.training))
        self._attached = True

    def detachFromDevice(self) -> None:
        CALLS.append(("detachFromDevice", self.training))
        self._attached = False

    def copyWeightsToHost(self) -> None:
        CALLS.append(("copyWeightsToHost", self.training))


def trainingModel(model: torch.nn.Module, options: Options | None = None,
                  optimizer: torch.optim.Optimizer | None = None) -> PoplarExecutor:  # fmt: skip
    CALLS.append(("trainingModel", {"options": options, "optimizer": optimizer}))
    return PoplarExecutor(model, options, True, optimizer)


def inferenceModel(model: torch.nn.Module, options: Options | None = None) -> PoplarExecutor:
    CALLS.append(("inferenceModel", {"options": options}))
    return PoplarExecutor(model, options, False)


def BeginBlock(layer_to_call: torch.nn.Module, user_id: str | None = None,
               ipu_id: int | None = None) -> torch.nn.Module:  # fmt: skip
    CALLS.append(("BeginBlock", {"user_id": user_id, "ipu_id": ipu_id}))
    layer_to_call.fake_ipu_id = ipu_id  # type: ignore[assignment]
    return layer_to_call


def identity_loss(x: torch.Tensor, reduction: str) -> torch.Tensor:
    CALLS.append(("identity_loss", reduction))
    return x


def ipuHardwareIsAvailable(num_ipus: int = 1) -> bool:
    return num_ipus <= FAKE_IPUS


def ipuHardwareVersion() -> int:
    return 2


__all__ = [
    "CALLS",
    "BeginBlock",
    "Options",
    "OutputMode",
    "ReductionType",
    "identity_loss",
    "inferenceModel",
    "ipuHardwareIsAvailable",
    "ipuHardwareVersion",
    "optim",
    "trainingModel",
]
