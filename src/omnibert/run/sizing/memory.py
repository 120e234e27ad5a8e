"""A micro batch that fits: chosen from the compile-only memory estimate, or refused before
compute when the one the user set cannot fit.

The estimate is :func:`omnibert.run.sizing.activation_memory.estimate` (counted on the meta device
at the run's shapes, packing included, as the kernels of the device's type keep tensors in the run's
precision: on CUDA fused attention and autocast's bf16; on the CPU, with attention dropout, the
math kernel's probabilities): parameters + gradients + optimiser state (fixed) plus the
activations autograd keeps, which grow linearly with the micro batch. Two meta forwards (micro
batch 1 and 2) give both parts; the memory budget is ``memory_fraction`` of what the device
has (CPU: ``MemAvailable``; CUDA: the GPU's memory). Without ``micro_batch_size`` the largest
size within the budget that divides the per-device batch (unpacked; with packing any size: the
plan rounds rows to whole groups) is used, never above the rows each device gets; a
``micro_batch_size`` over the budget stops the run with one sentence naming the estimate, the
memory and the largest size that fits. Where the device's memory cannot be read (HPU, IPU),
the largest divisor up to :data:`UNKNOWN_MEMORY_CAP` is used and the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omnibert.config import TrainConfigError
from omnibert.run.sizing.activation_memory import estimate
from omnibert.run.sizing.compile_only import available_memory as available_memory_of

__all__ = ["UNKNOWN_MEMORY_CAP", "MicroBatchChoice", "choose_micro_batch", "largest_micro_batch"]

#: micro batch used when the device's memory is unknown and the user set none
UNKNOWN_MEMORY_CAP = 32


@dataclass(frozen=True)
class MicroBatchChoice:
    """The micro batch and why (printed in the plan)."""

    size: int
    reason: str
    bytes_fixed: int | None = None
    bytes_per_row: int | None = None
    budget: int | None = None
    #: the speed probe's measurements (omnibert.run.sizing.speed_probe), when it ran
    probe: dict[str, Any] | None = None

    def bytes_at(self, size: int) -> int | None:
        if self.bytes_fixed is None or self.bytes_per_row is None:
            return None
        return self.bytes_fixed + size * self.bytes_per_row


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def choose_micro_batch(
    model_config: Any,
    shapes: dict[str, list[int]],
    *,
    precision: str,
    clip: float | None,
    device: Any,
    requested: int | None,
    per_device: int,
    max_rows: int,
    packed: bool,
    memory_fraction: float,
    optimizer_ranks: int = 1,
) -> MicroBatchChoice:
    """The micro batch of a run (module docstring). ``shapes`` are the batch shapes at micro
    batch 1 (``input_ids`` [1,S], ``masked_lm_positions`` [1,P], ``nsp_labels`` [1,K]);
    ``per_device`` the rows one device runs per optimiser step when unpacked; ``max_rows``
    the training rows each device gets per pass; ``optimizer_ranks`` the ranks the optimiser
    state is split over (``accelerator.optimizer_sharding=zero1``)."""
    available, source = available_memory_of(device)
    if available is None:
        if requested is not None:
            return MicroBatchChoice(requested, "set by micro_batch_size (device memory unknown)")
        size = largest_micro_batch(per_device, min(UNKNOWN_MEMORY_CAP, max_rows), packed)
        return MicroBatchChoice(
            size, f"device memory unknown: the largest size up to {UNKNOWN_MEMORY_CAP} that "
            "divides the per-device batch; set micro_batch_size to choose"
        )  # fmt: skip

    def at(rows: int) -> int:
        sized = {k: [rows, *v[1:]] for k, v in shapes.items()}
        counted = estimate(
            model_config, sized, precision, clip, device.type, flops=False,
            optimizer_ranks=optimizer_ranks,
        )  # fmt: skip
        return int(counted["memory"]["total"])

    one, two = at(1), at(2)
    per_row = max(two - one, 1)
    fixed = one - per_row
    budget = int(available * memory_fraction)
    facts: dict[str, Any] = {"bytes_fixed": fixed, "bytes_per_row": per_row, "budget": budget}
    fits = (budget - fixed) // per_row
    where = f"{memory_fraction:.0%} of {_gib(available)} ({source})"
    if requested is not None:
        need = fixed + requested * per_row
        if need > budget:
            best = largest_micro_batch(per_device, min(fits, max_rows), packed) if fits >= 1 else 0
            fix = f"set micro_batch_size={best} or less" if best else "use a smaller model or "
            fix += "" if best else "sequence length, or a device with more memory"
            raise TrainConfigError(
                f"micro_batch_size={requested} needs an estimated {_gib(need)} (parameters, "
                f"gradients, optimiser state and activations) but the budget is {where}; "
                f"{fix}."
            )
        return MicroBatchChoice(
            requested, f"set by micro_batch_size; estimate {_gib(need)}", **facts
        )
    if fits < 1:
        raise TrainConfigError(
            f"even micro batch 1 needs an estimated {_gib(fixed + per_row)} but the budget is "
            f"{where}; use a smaller model or sequence length, or a device with more memory."
        )
    size = largest_micro_batch(per_device, min(fits, max_rows), packed)
    need = fixed + size * per_row
    rule = (
        f"packed rows, at most the per-device batch of {per_device} (the plan rounds them)"
        if packed
        else f"divides the per-device batch of {per_device}"
    )
    return MicroBatchChoice(
        size, f"the largest that fits {where} (estimate {_gib(need)} at {size}) and {rule}",
        **facts,
    )  # fmt: skip


def largest_micro_batch(per_device: int, limit: int, packed: bool) -> int:
    """The largest micro batch <= limit: any size when packed, else a divisor of per_device."""
    limit = max(1, min(limit, per_device))
    if packed:
        return limit
    return max(d for d in range(1, limit + 1) if per_device % d == 0)
