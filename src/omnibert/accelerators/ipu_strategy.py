"""omnibert's own Lightning strategy around ``poptorch`` (Graphcore IPU).

``lightning-graphcore`` does not import with Lightning >= 2.1 and poptorch pins torch 2.0.1,
so this strategy drives poptorch directly. On an IPU one call of a
``poptorch.trainingModel`` runs forward, backward and the optimiser update for a whole
*combined batch* on the device, so the strategy:

* wraps ``task.model`` (whose forward returns the loss, as poptorch requires) in
  :class:`PoptorchStep`, marks the loss with ``poptorch.identity_loss`` and compiles it
  with ``poptorch.trainingModel(step, options, optimizer)``;
* hands Lightning's closure a loss with nothing left to do: the precision plugin's
  ``optimizer_step`` runs the closure (the training step, i.e. the IPU call) and never
  ``optimizer.step()``; ``backward`` is skipped;
* groups the host loader's micro-batches into combined batches (:class:`CombinedBatches`)
  and, after each step, sends a changed learning rate with ``setOptimizer``;
* validates with a separate ``poptorch.inferenceModel``, detaching one executor from the
  IPUs before attaching the other, and copies the weights to the host before checkpoints.

Nothing here ran on an IPU in this project: the tests use a fake ``poptorch`` that records
these calls (``tests/fakes/sdk``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import torch
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch import Tensor, nn

if TYPE_CHECKING:
    import lightning.pytorch as pl


# PoptorchStep's input and output order (poptorch wants tuples of tensors, not dicts)
from omnibert.models.bert import BATCH_KEYS, OUTPUT_KEYS


class PoptorchPrograms(Protocol):
    """What :class:`IPUStrategy` needs from its plugin (``omnibert.accelerators.ipu.IPUPlugin``):
    the poptorch programs and how many host micro-batches one Lightning step combines."""

    devices: int
    device_iterations: int

    @property
    def host_batches_per_step(self) -> int: ...

    def pipeline(self, model: nn.Module) -> None: ...

    def training_model(self, step: nn.Module, optimizer: torch.optim.Optimizer) -> Any: ...

    def inference_model(self, step: nn.Module) -> Any: ...


class PoptorchStep(nn.Module):
    """The module poptorch compiles: tensors in (``BATCH_KEYS`` order), a tuple out
    (``OUTPUT_KEYS`` order) whose first element is the loss marked for backpropagation."""

    def __init__(self, model: nn.Module, training: bool) -> None:
        super().__init__()
        self.model = model
        self.training_step = training

    def forward(self, *tensors: Tensor) -> tuple[Tensor, ...]:
        out = self.model(dict(zip(BATCH_KEYS, tensors, strict=True)))
        loss = out["loss"]
        if self.training_step:
            import poptorch

            loss = poptorch.identity_loss(loss, reduction="none")
        return (loss, *(out[k] for k in OUTPUT_KEYS[1:]))


class _HostView(nn.Module):
    """Stands in for ``task.model`` during a step: calls the poptorch executor with the
    batch's tensors and returns the model's output dict (each statistic averaged over the
    micro-batches poptorch returned, ``OutputMode.All``)."""

    def __init__(self, executor: Callable[..., Any]) -> None:
        super().__init__()
        self.executor = executor

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        outputs = self.executor(*(batch[k] for k in BATCH_KEYS))
        return {k: v.float().mean() for k, v in zip(OUTPUT_KEYS, outputs, strict=True)}


@contextlib.contextmanager
def _model_replaced(task: nn.Module, stand_in: nn.Module) -> Iterator[None]:
    """``task.model`` is ``stand_in`` inside the block (the state dict is untouched after)."""
    original = task._modules["model"]
    task._modules["model"] = stand_in
    try:
        yield
    finally:
        task._modules["model"] = original


class CombinedBatches:
    """A loader of host micro-batches regrouped into poptorch's combined batches: ``group``
    consecutive micro-batches concatenated along the batch dimension."""

    def __init__(self, loader: Any, group: int) -> None:
        self.loader = loader
        self.group = group

    def __len__(self) -> int:
        return len(self.loader) // self.group

    def __iter__(self) -> Iterator[dict[str, Tensor]]:
        pending: list[Mapping[str, Tensor]] = []
        for batch in self.loader:
            pending.append(batch)
            if len(pending) == self.group:
                yield {k: torch.cat([b[k] for b in pending]) for k in pending[0]}
                pending = []

    def __getattr__(self, name: str) -> Any:  # sampler, batch_sampler, dataset, ...
        return getattr(self.__dict__["loader"], name)


class IPUAccelerator(Accelerator):
    """Lightning's view of the IPUs: the host process keeps the model on the CPU and
    poptorch moves it to the device (so ``setup_device`` has nothing to do)."""

    def setup_device(self, device: torch.device) -> None:
        pass

    def teardown(self) -> None:
        pass

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        return {}

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return int(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * int(devices)

    @staticmethod
    def auto_device_count() -> int:
        return 1

    @staticmethod
    def is_available() -> bool:
        from omnibert.accelerators.environment import sdk_present

        return sdk_present("poptorch")

    @staticmethod
    def name() -> str:
        return "omnibert_ipu"


class IPUPrecision(Precision):
    """The IPU graph holds backward and the optimiser step: the closure (the IPU call) runs,
    ``optimizer.step()`` and ``backward`` do not. ``16-true`` casts the model to fp16 on
    the host before poptorch compiles it (fp32 optimiser state via ``accum_type``)."""

    def __init__(self, precision: str) -> None:
        self.precision = precision  # type: ignore[assignment]

    def convert_module(self, module: nn.Module) -> nn.Module:
        return module.half() if self.precision == "16-true" else module

    def backward(self, tensor: Tensor, model: Any, optimizer: Any, *args: Any, **kw: Any) -> None:
        pass

    def optimizer_step(  # type: ignore[override]
        self, optimizer: Any, model: Any, closure: Callable[[], Any], **kwargs: Any
    ) -> Any:
        # the closure (training step = the IPU call), then the on_before_optimizer_step hooks
        return self._wrap_closure(model, optimizer, closure)


class IPUStrategy(SingleDeviceStrategy):
    """One host process driving ``plugin.devices`` replicas through poptorch."""

    strategy_name = "omnibert_ipu"

    def __init__(self, plugin: PoptorchPrograms) -> None:
        # the accelerator and IPUPrecision come through the Trainer's arguments
        super().__init__(device=torch.device("cpu"))
        self.plugin = plugin
        self.training_executor: Any = None
        self.inference_executor: Any = None
        self._lrs: list[float] | None = None

    @property
    def _task(self) -> pl.LightningModule:
        task = self.lightning_module
        assert task is not None
        return task

    def _inner(self) -> nn.Module:
        """The task's ``model`` (BertForPreTraining) itself, not a stand-in."""
        model = self._task._modules["model"]
        assert model is not None
        return model

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        task = self._task
        if getattr(task, "clipper", None) is not None:
            from omnibert.accelerators.base import AcceleratorError

            raise AcceleratorError(
                "accelerator=ipu cannot clip each micro-batch's gradient on the host "
                "(clip_grad_per_micro_batch is set); set clip_grad_per_micro_batch=null."
            )
        from lightning.pytorch.trainer.states import TrainerFn

        if trainer.state.fn == TrainerFn.FITTING:
            optimizer = self.optimizers[0]
            step = PoptorchStep(self._inner(), training=True)
            self.plugin.pipeline(self._inner())
            self.training_executor = self.plugin.training_model(step, optimizer)
            self._lrs = [float(g["lr"]) for g in optimizer.param_groups]

    def process_dataloader(self, dataloader: Any) -> Any:
        """Training loaders (omnibert's resumable samplers, which know the epoch length in
        Lightning batches: ``batches_per_epoch``) yield combined batches; evaluation loaders
        stay micro-batches for the one-replica inference model."""
        sampler: Any = getattr(dataloader, "batch_sampler", None)
        if not hasattr(sampler, "batches_per_epoch"):
            return dataloader
        group = self.plugin.host_batches_per_step
        if sampler.batches_per_epoch is not None:
            # the data module capped the epoch in Lightning batches; one is `group` micro-batches
            sampler.batches_per_epoch *= group
        return CombinedBatches(dataloader, group)

    # ------------------------------------------------------------------ steps
    def _attach(self, executor: Any, other: Any) -> None:
        if other is not None and other.isAttachedToDevice():
            other.detachFromDevice()
        if executor is not None and executor.isCompiled() and not executor.isAttachedToDevice():
            executor.attachToDevice()

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        self._attach(self.training_executor, self.inference_executor)
        with _model_replaced(self._task, _HostView(self.training_executor)):
            return self._task.training_step(*args, **kwargs)

    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kw: Any) -> Tensor:
        return closure_loss  # done on the IPU inside the training step

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any], model: Any = None,
                       **kwargs: Any) -> Any:  # fmt: skip
        model = model or self.lightning_module
        out = self.precision_plugin.optimizer_step(optimizer, model, closure, **kwargs)
        self._extra_scheduler_steps()
        return out

    def _extra_scheduler_steps(self) -> None:
        """Each Lightning step ran ``device_iterations`` optimiser steps on the IPU: step the
        schedule for the other ``device_iterations - 1`` (Lightning steps it once)."""
        for config in self._task.trainer.lr_scheduler_configs:
            for _ in range(self.plugin.device_iterations - 1):
                config.scheduler.step()  # type: ignore[call-arg]  # not ReduceLROnPlateau

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # the schedule changed the LR after the last step: send it to the IPU
        optimizer = self.optimizers[0] if self.optimizers else None
        if optimizer is None or self.training_executor is None:
            return
        lrs = [float(g["lr"]) for g in optimizer.param_groups]
        if lrs != self._lrs:
            self.training_executor.setOptimizer(optimizer)
            self._lrs = lrs

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        if self.inference_executor is None:
            step = PoptorchStep(self._inner(), training=False)
            self.inference_executor = self.plugin.inference_model(step)
        self._attach(self.inference_executor, self.training_executor)
        with _model_replaced(self._task, _HostView(self.inference_executor)):
            return self._task.validation_step(*args, **kwargs)

    def on_validation_start(self) -> None:
        self._weights_to_host()

    # ------------------------------------------------------------------ weights
    def _weights_to_host(self) -> None:
        if self.training_executor is not None and self.training_executor.isCompiled():
            self.training_executor.copyWeightsToHost()

    def lightning_module_state_dict(self) -> dict[str, Any]:
        self._weights_to_host()
        return super().lightning_module_state_dict()

    def teardown(self) -> None:
        for executor in (self.training_executor, self.inference_executor):
            if executor is not None and executor.isAttachedToDevice():
                executor.detachFromDevice()
        super().teardown()
