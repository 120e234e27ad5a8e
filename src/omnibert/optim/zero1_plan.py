"""What ``accelerator.optimizer_sharding=zero1`` gives each rank before anything is built: the
partition of the tensors and the optimiser state each rank holds (the plan's "optimizer
state" line). The optimiser itself: :mod:`omnibert.optim.zero1`; the settings and where they
are refused: :mod:`omnibert.accelerators.base`.

The partition is torch's ``ZeroRedundancyOptimizer``'s, recomputed here from the tensors'
sizes: parameter group by parameter group, each tensor, largest first, goes to the rank that
holds the fewest elements so far (the lowest such rank on a tie).
``tests/e2e/test_lamb_zero1.py`` checks the prediction against the partition torch makes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["elements_per_rank", "state_bytes_per_element", "state_memory_line"]

_LAMB = ("omnibert.optim.Lamb", "omnibert.optim.lamb.Lamb")
_ADAMW = ("omnibert.optim.AdamW", "omnibert.optim.param_groups.AdamW", "torch.optim.AdamW")
#: precisions whose parameters are 16-bit (``*-true``): LAMB keeps an fp32 master copy
_HALF_PARAMETERS = ("bf16-true", "16-true")


def elements_per_rank(group_sizes: Sequence[Sequence[int]], world: int) -> list[int]:
    """The elements each of ``world`` ranks updates when the tensors of each group (their
    element counts, in ``group_sizes``) are partitioned as torch's ``ZeroRedundancyOptimizer``
    partitions them (module docstring)."""
    totals = [0] * world
    for sizes in group_sizes:
        for size in sorted(sizes, reverse=True):
            rank = totals.index(min(totals))
            totals[rank] += size
    return totals


def state_bytes_per_element(optimizer_cfg: Mapping[str, Any], precision: str) -> int | None:
    """Bytes of optimiser state per parameter element: LAMB's two fp32 moments (plus its fp32
    master copy of 16-bit parameters), AdamW's two moments in the parameters' dtype; ``None``
    for other optimisers (not counted)."""
    target = str(optimizer_cfg.get("_target_"))
    half = str(precision) in _HALF_PARAMETERS
    if target in _LAMB:
        return 8 + (4 if half and optimizer_cfg.get("master_weights", True) else 0)
    if target in _ADAMW:
        return 2 * (2 if half else 4)
    return None


def _size(count: float) -> str:
    """``1536`` -> ``1.5 KiB`` (binary units, one decimal, as the plan's other sizes)."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024:
            return f"{int(count)} bytes" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def state_memory_line(
    optimizer_cfg: Mapping[str, Any],
    group_sizes: Sequence[Sequence[int]],
    world: int,
    sharding: str,
    precision: str,
) -> str | None:
    """The plan's line: the optimiser state one rank holds, against the unsharded state, for
    a model whose trainable tensors per parameter group have ``group_sizes`` elements;
    ``None`` where the optimiser's state is not counted."""
    per = state_bytes_per_element(optimizer_cfg, precision)
    if per is None:
        return None
    total = sum(sum(sizes) for sizes in group_sizes)
    unsharded = f"{_size(per * total)} ({per} B x {total:,} parameters)"
    if sharding != "zero1" or world <= 1:
        ranks = f" on each of the {world} ranks, unsharded" if world > 1 else ""
        return f"{unsharded}{ranks}"
    shares = elements_per_rank(group_sizes, world)
    return (
        f"{_size(per * max(shares))} per rank at most (zero1 over {world} ranks, whole "
        f"tensors: {min(shares):,} to {max(shares):,} parameters each) against {unsharded} "
        "unsharded"
    )
