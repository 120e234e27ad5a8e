"""Multi-tensor LAMB in Triton: every parameter tensor of every group in four launches per step.

Like apex's ``multi_tensor_apply``, the tensors are cut into chunks of ``chunk_size`` elements
(a tensor of 100 elements is one chunk, one of 23M is 358 chunks of 65,536) and each Triton
program handles one chunk, finding its tensor's addresses in a pointer table. A step is

1. ``_grad_sumsq``: per chunk, ``Σg²`` into a buffer; the global gradient norm is the sum of
   that buffer (one torch reduction: apex clips with it inside the step);
2. ``_moments``: per chunk, the clip factor from that norm, ``m, v`` updated in place, the
   update ``u`` computed and ``Σu²``, ``Σp²`` written per chunk (``p`` before the update);
3. ``_segment_sums``: per tensor, its chunks' partial sums added in chunk order (a segmented
   reduction, deterministic: no atomics), giving ``‖u‖², ‖p‖²`` per tensor;
4. ``_apply``: per chunk, the trust ratio from its tensor's norms, ``u`` recomputed from
   ``m, v, p`` (cheaper than storing it) and ``p ← p − lr·r·u``; where the optimiser keeps an
   fp32 master copy of a bf16/fp16 parameter, the rounded value is written to the model's
   tensor in the same pass.

Between 1 and 2 and between 3 and 4 the sums are plain device tensors, so a sharded run
(FSDP: each rank holds part of every tensor) all-reduces them there (the ``all_reduce``
argument) and gets whole-tensor norms. Memory traffic for fp32 tensors: 4 (norm) + 24 (moments)
+ 16 (apply) = 44 bytes per parameter, with no temporaries.

Per-group hyperparameters (lr, betas, eps, bias corrections, the weight-norm clamp) live in a
small table uploaded each step; per-tensor weight decay and trust-ratio flags in another. The
maths is apex ``FusedLAMB``'s as stated in docs/lamb.md (``omnibert.optim.lamb_math`` is the
torch statement; tests compare both with a float64 reference under ``TRITON_INTERPRET=1``).
``triton`` is imported lazily, on the first step.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

#: elements per chunk (one Triton program) and per inner block on a GPU
CHUNK_SIZE = 65536
BLOCK_SIZE = 1024
# dtype codes in the pointer table (Triton pointers are typed: the kernels branch on these)
_DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
# columns of the per-group coefficient table
_LR, _B1, _B3, _B2, _OMB2, _INV_BC1, _INV_SQRT_BC2, _EPS, _MAX_WNORM = range(9)
_NCOEF = 9


def triton_available(device: torch.device | None = None) -> bool:
    """True when Triton imports and can run on ``device`` (CUDA, or anything when interpreting)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    return device is not None and device.type == "cuda" and torch.cuda.is_available()


@dataclass
class GroupCoefficients:
    """One parameter group's numbers for this step (apex names; bias corrections resolved)."""

    lr: float
    beta1: float
    beta2: float
    beta3: float
    bias_correction1: float
    bias_correction2: float
    eps: float
    max_weight_norm: float | None

    def row(self) -> list[float]:
        return [
            self.lr,
            self.beta1,
            self.beta3,
            self.beta2,
            1.0 - self.beta2,
            1.0 / self.bias_correction1,
            1.0 / math.sqrt(self.bias_correction2),
            self.eps,
            math.inf if self.max_weight_norm is None else self.max_weight_norm,
        ]


@functools.cache
def kernels() -> dict[str, Any]:
    """The four ``@triton.jit`` kernels (imported on first use; wrap them to count launches)."""
    from omnibert_kernels import lamb_triton_jit as jit

    return {
        "grad_sumsq": jit.grad_sumsq,
        "moments": jit.moments,
        "segment_sums": jit.segment_sums,
        "apply": jit.apply,
    }


def chunk_table(numels: Sequence[int], chunk_size: int) -> tuple[list[list[int]], list[int]]:
    """Apex-style chunks: ``(tensor index, start element, length)`` columns, tensor by tensor,
    and the first chunk of each tensor (``len(numels) + 1`` entries; empty tensors get none)."""
    tensors: list[int] = []
    starts: list[int] = []
    first = [0]
    for t, n in enumerate(numels):
        for start in range(0, n, chunk_size):
            tensors.append(t)
            starts.append(start)
        first.append(len(tensors))
    lengths = [min(chunk_size, numels[t] - s) for t, s in zip(tensors, starts, strict=True)]
    return [tensors, starts, lengths], first


class MultiTensorLamb:
    """The launcher: builds and caches the tables, runs the four kernels for one step.

    Args:
        chunk_size: elements per Triton program (apex uses 65,536 for LAMB), a power of two
            of at least 16; each program loops over blocks of ``min(1024, chunk_size / 4)``.
    """

    def __init__(self, chunk_size: int = CHUNK_SIZE) -> None:
        if chunk_size < 16 or chunk_size & (chunk_size - 1):
            raise ValueError(f"chunk_size={chunk_size} must be a power of two >= 16.")
        self.chunk_size = chunk_size
        self.block = min(BLOCK_SIZE, chunk_size // 4)
        self._layout_key: tuple[Any, ...] | None = None
        self._layout: dict[str, Tensor] = {}
        self._ptr_key: tuple[int, ...] | None = None
        self._ptrs: Tensor | None = None

    def _tables(
        self,
        params: Sequence[Tensor],
        device: torch.device,
        tensor_group: Sequence[int],
        decays: Sequence[float],
        adapt: Sequence[bool],
    ) -> dict[str, Tensor]:
        numels = [p.numel() for p in params]
        key = (device, tuple(numels), tuple(tensor_group), tuple(decays), tuple(adapt))
        if key != self._layout_key:
            columns, first = chunk_table(numels, self.chunk_size)
            self._layout = {
                "chunks": torch.tensor(columns, dtype=torch.int64, device=device).contiguous(),
                "first": torch.tensor(first, dtype=torch.int64, device=device),
                "group": torch.tensor(list(tensor_group), dtype=torch.int64, device=device),
                "decay": torch.tensor(list(decays), dtype=torch.float32, device=device),
                "adapt": torch.tensor([int(a) for a in adapt], dtype=torch.int32, device=device),
            }
            self._layout_key = key
        return self._layout

    def _pointers(self, rows: Sequence[Sequence[Tensor | None]], device: torch.device) -> Tensor:
        """``[5, T]`` addresses (g, p, m, v, mirror) and ``[5, T]`` dtype codes, as one tensor."""
        for x in (x for row in rows for x in row):
            if x is not None and x.dtype not in _DTYPE_CODES:
                raise ValueError(f"MultiTensorLamb handles fp32/bf16/fp16 tensors, not {x.dtype}.")
        addrs = [[0 if x is None else x.data_ptr() for x in row] for row in rows]
        codes = [[0 if x is None else _DTYPE_CODES[x.dtype] for x in row] for row in rows]
        key = tuple(a for row in addrs for a in row) + tuple(c for row in codes for c in row)
        if key != self._ptr_key or self._ptrs is None:
            self._ptrs = torch.tensor(addrs + codes, dtype=torch.int64, device=device)
            self._ptr_key = key
        return self._ptrs

    def step(
        self,
        params: Sequence[Tensor],
        grads: Sequence[Tensor],
        exp_avgs: Sequence[Tensor],
        exp_avg_sqs: Sequence[Tensor],
        *,
        tensor_group: Sequence[int],
        decays: Sequence[float],
        adapt: Sequence[bool],
        groups: Sequence[GroupCoefficients],
        adam_w_mode: bool,
        max_grad_norm: float | None,
        mirrors: Sequence[Tensor | None] | None = None,
        all_reduce: Callable[[Tensor], None] | None = None,
        proceed: Callable[[Tensor], bool] | None = None,
    ) -> Tensor:
        """One LAMB step over all tensors, in place; returns the global gradient norm (0-d).

        ``params`` are updated (fp32, or bf16/fp16 without a master copy); ``grads`` any float
        dtype; ``exp_avgs``/``exp_avg_sqs`` fp32; all contiguous and on one device.
        ``mirrors[i]``, where given, is the bf16/fp16 model tensor that receives ``params[i]``
        rounded. ``all_reduce`` sums a tensor in place over the ranks that share the
        parameters (sharded training); it is called twice, on the ``[1]`` squared gradient
        norm and on the ``[T, 2]`` squared update and parameter norms. ``proceed``, where
        given, is called with the global gradient norm before anything is changed; when it
        returns False nothing is (a step skipped for a non-finite norm).
        """
        if not params:
            raise ValueError("MultiTensorLamb.step needs at least one tensor.")
        device = params[0].device
        for name, seq in (("params", params), ("grads", grads), ("exp_avgs", exp_avgs)):
            if not all(x.is_contiguous() for x in seq):
                raise ValueError(f"MultiTensorLamb needs contiguous {name}.")
        k = kernels()
        T = len(params)
        mirrors = list(mirrors) if mirrors is not None else [None] * T
        layout = self._tables(params, device, tensor_group, decays, adapt)
        table = self._pointers([grads, params, exp_avgs, exp_avg_sqs, mirrors], device)
        ptrs, codes = table[:5], table[5:]
        coefs = torch.tensor([g.row() for g in groups], dtype=torch.float32).to(
            device, non_blocking=True
        )
        chunks = layout["chunks"]
        C = chunks.shape[1]
        sizes = {"CHUNK": self.chunk_size, "BLOCK": self.block}
        grad_sumsq = torch.empty(max(C, 1), dtype=torch.float32, device=device)
        if C:
            k["grad_sumsq"][(C,)](chunks, ptrs, codes, grad_sumsq, T, **sizes)
        else:
            grad_sumsq.zero_()
        total = grad_sumsq[:C].sum().reshape(1)
        if all_reduce is not None:
            all_reduce(total)
        if proceed is not None and not proceed(total.sqrt().reshape(())):
            return total.sqrt().reshape(())
        threshold = 0.0 if max_grad_norm is None else float(max_grad_norm)
        clip = threshold > 0
        l2 = not adam_w_mode
        partials = torch.empty(max(C, 1), 2, dtype=torch.float32, device=device)
        if C:
            k["moments"][(C,)](
                *(chunks, ptrs, codes, layout["group"], layout["decay"], coefs, total),
                *(partials, T, threshold if clip else 1.0),
                L2=l2,
                CLIP=clip,
                NCOEF=_NCOEF,
                **sizes,
            )
        sums = torch.empty(T, 2, dtype=torch.float32, device=device)
        k["segment_sums"][(T,)](layout["first"], partials, sums)
        if all_reduce is not None:
            all_reduce(sums)
        if C:
            k["apply"][(C,)](
                *(chunks, ptrs, codes, layout["group"], layout["decay"], layout["adapt"]),
                *(coefs, sums, T),
                L2=l2,
                NCOEF=_NCOEF,
                **sizes,
            )
        return total.sqrt().reshape(())
