"""CUDA graphs (``accelerator.cuda_graphs``) with gradient accumulation, sound by construction.

``torch.compile`` in ``reduce-overhead`` mode replays the compiled forward and its backward as
CUDA graphs (inductor's CUDA graph trees). A replay writes its outputs into memory the graph
owns and the next replay writes there again: an output stays valid until the next step begins
(``torch.compiler.cudagraph_mark_step_begin``, which :func:`cuda_graph_step_marker`'s callback
calls before every training and validation batch).

The gradient of a parameter is an output of the backward graph. Autograd's ``AccumulateGrad``
(``torch/csrc/autograd/functions/accumulate_grad.h``) hands it to the parameter in one of two
ways:

* the parameter has no ``.grad``: with grad mode off (a plain ``backward()``) and nothing else
  holding the new gradient, it is *stolen*: ``.grad`` becomes the graph's output tensor
  itself. The next micro-batch's replay then overwrites what was accumulated so far
  (pytorch/pytorch#169545; on an H200 with torch 2.11 it raised "accessing tensor output of
  CUDAGraphs that has been overwritten"; tests/e2e/test_cuda_graph_gradients.py replays the
  overwrite on the CPU: four micro-batches summed to twice the last one);
* the parameter has a dense ``.grad`` and grad mode is off: ``grad += new_grad`` in place.
  ``.grad`` stays the tensor it was and the graph's output is only read, by a kernel queued
  before ``backward()`` returns, so a later replay cannot touch the sum.

So a run with CUDA graphs keeps only the second case: the callback sets the task's
``keep_gradient_buffers`` (:class:`omnibert.tasks.base.TrainingTask`), which gives every
trainable parameter a zero gradient of its own before any backward that finds none (the
task's ``on_before_backward``, before anything else of the task touches ``.grad``) and zeroes
gradients in place between optimiser steps (``optimizer.zero_grad(set_to_none=False)`` in
the task's ``optimizer_zero_grad``) instead of dropping them. MLPerf's per-micro-batch
clipping (:class:`omnibert.optim.accumulation.MicroBatchClipper`) sets those tensors aside
around each backward, lets it adopt the graph's output, clips that and adds it into them:
the output is again only read, before the next replay. The sum is the same numbers as
without graphs: ``0 + g1`` is ``g1`` exactly, and the micro-batches are added in the same
order. The in-place branch is documented behaviour (torch's autograd notes, "default
gradient layouts": with an existing non-sparse ``.grad`` and ``create_graph=False``,
``backward()`` accumulates into it in place; pytorch/pytorch#34904) and reads the same in
torch 2.13's header ("Case 2.3: In-place addition") and in the main branch's; the GPU's
torch 2.11 is checked by tests/unit/test_gpu_step.py. What it relies on:

* ``backward()`` without ``create_graph`` (grad mode off inside AccumulateGrad: Lightning's
  backward is one);
* dense gradients (no sparse embedding gradients) and no ``vmap``-batched tensors, which
  would take the out-of-place branches;
* compiled autograd off (torch's default): with it, the accumulation would be traced into
  the backward graph instead;
* the gradients belong to the parameters the task sees: DDP's reducer reads and writes
  ``.grad`` after AccumulateGrad has added into it (the same buffers; not run on several
  GPUs here), while FSDP keeps the
  gradients of its flat, sharded parameters itself, so ``accelerator.strategy=fsdp`` with
  CUDA graphs and accumulation is refused (:meth:`GPUPlugin.check_accumulation`).

The cost: the gradients live outside the graphs' memory pool, which still holds the
backward's outputs, so CUDA graphs use about one more copy of the gradients than a run
without them.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["cuda_graph_step_marker"]


def cuda_graph_step_marker() -> Any:
    """The Lightning callback of a run with CUDA graphs: it marks where each training and
    validation batch begins (``torch.compiler.cudagraph_mark_step_begin``: the previous
    replay's outputs may be overwritten from then on; the task has copied out what it keeps)
    and, before training, turns on the task's ``keep_gradient_buffers`` (module docstring)."""
    from lightning.pytorch.callbacks import Callback

    class CUDAGraphStepMarker(Callback):
        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if not hasattr(pl_module, "keep_gradient_buffers"):
                raise TypeError(
                    f"{type(pl_module).__name__} has no keep_gradient_buffers: CUDA graphs "
                    "accumulate gradients soundly only in an omnibert TrainingTask"
                )
            pl_module.keep_gradient_buffers = True

        def on_train_batch_start(self, *args: Any, **kwargs: Any) -> None:
            torch.compiler.cudagraph_mark_step_begin()

        def on_validation_batch_start(self, *args: Any, **kwargs: Any) -> None:
            torch.compiler.cudagraph_mark_step_begin()

    return CUDAGraphStepMarker()
