"""Optimiser steps whose gradients are not finite are skipped, leaving everything as it was.

A guarded optimiser looks at the global gradient norm of each step before it changes
anything: NaN or inf in any gradient makes that norm non-finite. :class:`~omnibert.optim.Lamb`
computes the norm for its clipping anyway, so its check costs one comparison of a number it
already has (:attr:`Lamb.skip_nonfinite`); any other optimiser (AdamW) is wrapped by
:func:`guard`, which computes the norm once per step (one ``foreach`` pass over the
gradients). A skipped step leaves the weights, the optimiser's state (moments and step
counts) untouched, and sets ``last_step_skipped``; the task does not step the LR schedule for
it (:meth:`omnibert.tasks.base.TrainingTask.lr_scheduler_step`), so weights, optimiser and
schedule are bitwise what they were before the step. Under fp16's dynamic loss scaling the
scaler skips the optimiser itself; :func:`mark_pending` makes such a step count as skipped
too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from omnibert.optim.lamb_math import global_grad_norm

__all__ = ["first_nonfinite_gradient", "guard", "mark_pending", "skipped"]


def guard(optimizer: torch.optim.Optimizer) -> None:
    """Skip ``optimizer``'s steps whose gradients are not finite (module docstring)."""
    if hasattr(optimizer, "skip_nonfinite"):  # Lamb: checks the norm it computes anyway
        optimizer.skip_nonfinite = True
        return
    if getattr(optimizer, "_omnibert_guarded", False):
        return
    step = optimizer.step

    @functools.wraps(step)
    def guarded(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        norm = global_grad_norm(grads) if grads else torch.zeros(())
        finite = bool(torch.isfinite(norm))  # the step's one read of a number
        optimizer.last_step_skipped = not finite  # type: ignore[attr-defined]
        if finite:
            step(**kwargs)
        return loss

    optimizer.step = guarded  # type: ignore[method-assign]
    optimizer._omnibert_guarded = True  # type: ignore[attr-defined]
    optimizer.last_step_skipped = False  # type: ignore[attr-defined]


def mark_pending(optimizer: torch.optim.Optimizer) -> None:
    """Before the step's optimiser call: count the step as skipped unless the optimiser runs
    and says otherwise (fp16's loss scaler skips the call when it finds inf or NaN)."""
    optimizer.last_step_skipped = True  # type: ignore[attr-defined]


def skipped(optimizer: Any) -> bool:
    """Whether ``optimizer``'s last step was skipped (Lightning's wrapper is looked through)."""
    inner = getattr(optimizer, "optimizer", optimizer)  # LightningOptimizer / scheduler
    inner = getattr(inner, "_optimizer", inner)
    return bool(getattr(inner, "last_step_skipped", False))


def first_nonfinite_gradient(named_parameters: Iterable[tuple[str, Tensor]]) -> str | None:
    """The name of the first parameter whose gradient holds a NaN or inf (None: none does).
    Only called once a step was found non-finite: one pass, off the hot path."""
    for name, param in named_parameters:
        grad = param.grad
        if grad is not None and not bool(torch.isfinite(grad).all()):
            return name
    return None
