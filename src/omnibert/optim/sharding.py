"""Which ranks hold the pieces of a parameter: LAMB's norms must be summed over them.

Under FSDP every rank holds a shard of every tensor, so LAMB's global gradient norm and each
tensor's ``‖p‖`` and ``‖u‖`` (the trust ratio) are sums of squares over the ranks' shards.
:class:`omnibert.optim.Lamb` all-reduces those sums once per stage when it knows the group:

* FSDP2 (``torch.distributed.fsdp.fully_shard``): parameters are ``DTensor``s, so the group is
  read from each parameter's device mesh (:func:`dtensor_shard_group`), with no wiring;
* FSDP1 (Lightning's ``FSDPStrategy`` with ``use_orig_params=True``, the GPU plugin's
  ``strategy: fsdp``): parameters are plain flat slices (possibly empty) of a sharded flat
  buffer, so the task finds the wrapping modules' process group (:func:`fsdp_shard_group`)
  and hands it to the optimiser (:func:`attach_shard_group`). ``NO_SHARD`` is not sharded
  (FSDP1 switches to it by itself on a one-process group): every rank holds the whole
  tensors, so there is no group and LAMB's norms are the local ones.

Imports only torch; ``torch.distributed`` pieces that older builds lack are optional.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from torch import Tensor, nn


def _dtensor_type() -> type | None:
    try:
        # lazy: half a second to import, paid at the first step, not by every importer of
        # omnibert.optim; compat: torch >= 2.4
        from torch.distributed.tensor import DTensor
    except ImportError:
        return None
    return DTensor


def local(t: Tensor) -> Tensor:
    """The rank's own part of ``t`` (a DTensor's local shard; ``t`` itself otherwise)."""
    dtensor = _dtensor_type()
    if dtensor is not None and isinstance(t, dtensor):
        return t.to_local()  # type: ignore[attr-defined]
    return t


def dtensor_shard_group(params: Iterable[Tensor]) -> Any:
    """The process group along which DTensor ``params`` are sharded (FSDP2), or ``None``."""
    dtensor = _dtensor_type()
    if dtensor is None:
        return None
    groups = []
    for p in params:
        if not isinstance(p, dtensor):
            continue
        dims = [i for i, pl in enumerate(p.placements) if pl.is_shard()]  # type: ignore[attr-defined]
        if len(dims) > 1:
            raise ValueError(
                "Lamb takes parameters sharded along one device-mesh dimension (FSDP); "
                f"this one has placements {p.placements} (tensor parallelism is not supported)."  # type: ignore[attr-defined]
            )
        if dims:
            groups.append(p.device_mesh.get_group(dims[0]))  # type: ignore[attr-defined]
    if not groups:
        return None
    if any(g is not groups[0] for g in groups):
        raise ValueError("Lamb takes parameters sharded over one process group, found several.")
    return groups[0]


def fsdp_shard_group(module: nn.Module | None) -> Any:
    """The process group over which FSDP1 (``FullyShardedDataParallel``) shards the
    parameters of ``module`` or its submodules; ``None`` without FSDP1 or with ``NO_SHARD``."""
    if module is None:
        return None
    try:
        # lazy: half a second to import; only a run with a module to inspect pays it
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    except ImportError:
        return None
    for m in module.modules():
        if isinstance(m, FullyShardedDataParallel):
            if m.sharding_strategy == ShardingStrategy.NO_SHARD:
                return None
            return m.process_group
    return None


def attach_shard_group(optimizer: Any, module: nn.Module | None) -> Any:
    """Tell ``optimizer`` (if it takes per-tensor norms: ``shard_norms_over``) the FSDP1 group
    that shards ``module``; returns that group (``None``: not sharded by FSDP1)."""
    group = fsdp_shard_group(module)
    if group is None:
        return None
    shard = getattr(optimizer, "shard_norms_over", None)
    if shard is not None:
        shard(group)
    return group
