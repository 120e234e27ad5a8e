"""The few torch / Lightning APIs omnibert uses that the vendor environments' versions lack.

The main environment runs the newest torch and Lightning 2.5. Graphcore's Poplar SDK 3.4
pins torch 2.0.1 (its poptorch wheel), which Lightning 2.3.x is the last to support
(``requirements-ipu.txt``). Each helper here uses the newer API where it exists and
otherwise a path that computes the same thing, so the shared code never branches on
versions itself; ``tests/unit/test_compat.py`` runs every fallback by taking the newer API away.
``scripts/envs/check_apis.py`` lists every line that uses a newer API on purpose (they carry
a ``compat:`` comment); ``scripts/envs/ipu_env.sh`` runs the tests under torch 2.0.1.

This module imports only torch and Lightning (the accelerator plugins use it).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "HAS_FLOP_COUNTER",
    "HAS_FOREACH_NORM_DTYPE",
    "HAS_LOAD_MMAP",
    "HAS_MODULE_COMPILE",
    "capture_data_dependent_shapes",
    "compile_in_place",
    "compiler_disable",
    "flop_counter",
    "foreach_copy_",
    "foreach_mul",
    "foreach_norm_fp32",
    "lightning_resumes_after_batch_end",
    "load_checkpoint",
    "seed_everything",
]

#: ``nn.Module.compile`` (torch >= 2.2)
HAS_MODULE_COMPILE = hasattr(nn.Module, "compile")
#: ``torch.utils.flop_counter`` (torch >= 2.1), or None
_flop_counter: Any
try:
    _flop_counter = importlib.import_module("torch.utils.flop_counter")  # compat: torch >= 2.1
except ImportError:
    _flop_counter = None
HAS_FLOP_COUNTER = _flop_counter is not None


def _load_has_mmap() -> bool:
    import inspect

    return "mmap" in inspect.signature(torch.load).parameters


#: ``torch.load(mmap=...)`` (torch >= 2.1; older versions pass unknown keywords to pickle)
HAS_LOAD_MMAP = _load_has_mmap()


# ---------------------------------------------------------------------- compile
def compile_in_place(model: nn.Module, options: dict[str, Any]) -> nn.Module:
    """``torch.compile`` ``model``'s forward in place, so that its ``state_dict`` keys (and
    so checkpoints and exports) stay those of the plain model, and return ``model``.

    ``nn.Module.compile`` where it exists (torch >= 2.2). Before, ``torch.compile(model)``
    would return a wrapper whose keys start with ``_orig_mod.``; instead the class's forward
    is compiled and bound to this instance as its ``forward`` attribute (a bound method, so
    a deep copy of the model is bound to the copy). Either way the forward is traced with
    :func:`capture_data_dependent_shapes`."""
    if HAS_MODULE_COMPILE:
        model.compile(**options)  # compat: nn.Module.compile, torch >= 2.2
        # what nn.Module.__call__ runs once compiled (the module's private attribute)
        compiled_call = getattr(model, "_compiled_call_impl", None)
        if compiled_call is not None:
            model._compiled_call_impl = capture_data_dependent_shapes(compiled_call)
        return model
    compiled = capture_data_dependent_shapes(torch.compile(type(model).forward, **options))
    model.forward = types.MethodType(compiled, model)
    return model


def capture_data_dependent_shapes(compiled: Any) -> Any:
    """``compiled`` (a ``torch.compile`` result) traced, and so compiled, with Dynamo capturing
    the ops whose output shape depends on the data (``nonzero``: the unpadded token stream of
    ``model.config.attention=varlen`` on CUDA) as graph ops of a size known only at run time,
    instead of breaking the graph there. Scoped to these calls: other compiled code in the
    process keeps Dynamo's defaults. A torch without the flag gets ``compiled`` unchanged
    (graph breaks there, the same results)."""
    from torch._dynamo import config

    if not hasattr(config, "capture_dynamic_output_shape_ops"):  # compat: newer torch
        return compiled
    # Dynamo reads the flag when it starts tracing a frame, i.e. inside these calls; the patch
    # is entered before the compiled function installs Dynamo's frame hook, so it is no part
    # of what is traced
    return config.patch(capture_dynamic_output_shape_ops=True)(compiled)


# ---------------------------------------------------------------------- checkpoints
def compiler_disable(fn: Any) -> Any:
    """``fn`` run eagerly between compiled graphs: ``torch.compiler.disable`` (compat: torch
    2.0.1 has only ``torch._dynamo.disable``)."""
    compiler = getattr(torch, "compiler", None)
    disable = getattr(compiler, "disable", None)
    if disable is None:
        from torch import _dynamo

        disable = _dynamo.disable
    return disable(fn)


def load_checkpoint(path: str | Path, *, mmap: bool = False) -> Any:
    """``torch.load(path, map_location="cpu", weights_only=True)``, memory-mapped when
    ``mmap`` and torch can (>= 2.1; before, the file is read whole: the same objects, more
    memory)."""
    if mmap and HAS_LOAD_MMAP:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # compat:
    return torch.load(path, map_location="cpu", weights_only=True)


# ---------------------------------------------------------------------- Lightning
def seed_everything(seed: int, workers: bool = False) -> int:
    """``lightning.pytorch.seed_everything(seed, workers, verbose=False)``: seed without the
    "Seed set to" log line (``verbose`` exists from Lightning 2.4; before, the line is
    silenced through its logger)."""
    import inspect

    import lightning.pytorch as pl

    if "verbose" in inspect.signature(pl.seed_everything).parameters:
        return int(pl.seed_everything(seed, workers=workers, verbose=False))  # compat:
    logger = logging.getLogger("lightning.fabric.utilities.seed")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        return int(pl.seed_everything(seed, workers=workers))
    finally:
        logger.setLevel(level)


def lightning_resumes_after_batch_end() -> bool:
    """Whether Lightning resumes a checkpoint written in ``on_train_batch_end`` with the
    next batch (2.5 and later: its loops know the restart stage, PR #20379); older versions
    train that batch index again (:class:`omnibert.checkpoints.resuming.CompletedBatchProgress`
    corrects their checkpoints)."""
    from lightning.pytorch.loops import training_epoch_loop

    return hasattr(training_epoch_loop, "RestartStage")  # compat: Lightning >= 2.5


# ---------------------------------------------------------------------- foreach ops
def _foreach_norm_takes_dtype() -> bool:
    try:
        torch._foreach_norm([torch.zeros(1)], 2, dtype=torch.float32)  # compat: torch >= 2.1
    except TypeError:
        return False
    return True


#: ``torch._foreach_norm(..., dtype=)`` (torch >= 2.1)
HAS_FOREACH_NORM_DTYPE = _foreach_norm_takes_dtype()


def foreach_norm_fp32(tensors: Sequence[Tensor]) -> list[Tensor]:
    """The L2 norm of each tensor accumulated in float32: one ``torch._foreach_norm(...,
    dtype=)`` (torch >= 2.1), before that ``torch.linalg.vector_norm`` per tensor (the same
    sums, one op per tensor)."""
    if HAS_FOREACH_NORM_DTYPE:
        return list(torch._foreach_norm(list(tensors), 2, dtype=torch.float32))  # compat:
    return [torch.linalg.vector_norm(t, 2, dtype=torch.float32) for t in tensors]


def foreach_mul(tensors: Sequence[Tensor], scale: Tensor) -> list[Tensor]:
    """``torch._foreach_mul(tensors, scale)`` with a 0-d tensor ``scale``: the Tensor
    overload exists from torch 2.1; torch 2.0 takes the 0-d tensor as a Python scalar (the
    same products, after a host read of ``scale``)."""
    mul: Any = torch._foreach_mul  # typed without the Tensor overload before torch 2.1
    return list(mul(list(tensors), scale))


def foreach_copy_(dst: Sequence[Tensor], src: Sequence[Tensor]) -> None:
    """``torch._foreach_copy_`` (torch >= 2.1), else ``copy_`` tensor by tensor."""
    copy = getattr(torch, "_foreach_copy_", None)  # compat: torch >= 2.1
    if copy is not None:
        copy(list(dst), list(src))
        return
    for d, s in zip(dst, src, strict=True):
        d.copy_(s)


# ---------------------------------------------------------------------- FLOP counting
class _MatmulFlopCounter:
    """Counts what ``torch.utils.flop_counter.FlopCounterMode`` counts for omnibert's model,
    for torches without that module (< 2.1): 2 FLOPs per multiply-accumulate of every
    ``mm``, ``addmm``, ``bmm`` and ``baddbmm`` dispatched (forward and backward; attention
    on these torches runs as ``bmm``), nothing for elementwise ops. ``tests/unit/test_compat.py``
    checks that both counters agree on the model."""

    def __init__(self) -> None:
        self.total = 0
        self._mode: Any = None

    def get_total_flops(self) -> int:
        return self.total

    def __enter__(self) -> _MatmulFlopCounter:
        from torch.utils._python_dispatch import TorchDispatchMode

        aten = torch.ops.aten
        counter = self

        def _mm(a: Tensor, b: Tensor) -> int:
            return 2 * a.shape[0] * a.shape[1] * b.shape[1]

        def _bmm(a: Tensor, b: Tensor) -> int:
            return 2 * a.shape[0] * a.shape[1] * a.shape[2] * b.shape[2]

        formulas = {
            aten.mm.default: lambda args: _mm(args[0], args[1]),
            aten.addmm.default: lambda args: _mm(args[1], args[2]),
            aten.bmm.default: lambda args: _bmm(args[0], args[1]),
            aten.baddbmm.default: lambda args: _bmm(args[1], args[2]),
        }

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(
                self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
            ) -> Any:
                formula = formulas.get(func)
                if formula is not None:
                    counter.total += int(formula(args))
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._mode.__exit__(*exc)


@contextlib.contextmanager
def flop_counter() -> Iterator[Any]:
    """A context that counts the FLOPs run inside it; ``.get_total_flops()`` reads them.
    ``FlopCounterMode(display=False)`` where torch has it (>= 2.1), else
    :class:`_MatmulFlopCounter`."""
    if _flop_counter is not None:
        with _flop_counter.FlopCounterMode(display=False) as counter:
            yield counter
    else:
        with _MatmulFlopCounter() as counter:
            yield counter


def flop_counter_name() -> str:
    """Which counter :func:`flop_counter` uses here (for reports)."""
    if _flop_counter is not None:
        return "torch.utils.flop_counter.FlopCounterMode"
    return "omnibert.compat matmul counter (torch < 2.1 has no torch.utils.flop_counter)"
