"""ZeRO stage 1 for data-parallel (DDP) runs: each of N ranks keeps and updates the optimiser
state of its 1/N of the model's tensors, then every rank receives the updated parameters.

DDP's all-reduce gives every rank the whole averaged gradient, as before; the optimiser then
works on whole tensors partitioned over the ranks (``accelerator.optimizer_sharding=zero1``,
:mod:`omnibert.optim.zero1_plan` for the config side). The update work and the optimiser
state per rank fall to about 1/N; each step adds one broadcast of every rank's updated
tensors (one contiguous bucket per rank) and, for LAMB, one all-reduce of one number.

Why torch's own ``torch.distributed.optim.ZeroRedundancyOptimizer``: it partitions whole
parameters (largest first, each to the least-loaded rank), runs a local optimiser built for
each rank's share, broadcasts the updated shares, consolidates the state into one normal
``state_dict`` on rank 0 for checkpoints (Lightning calls ``consolidate_state_dict`` on every
rank when it saves) and loads such a ``state_dict`` back rank by rank. With whole tensors per
rank, an elementwise optimiser (AdamW) is exact as it is. LAMB couples its tensors in one
place only: the global gradient norm (clipping to ``max_grad_norm``, the non-finite check)
spans every tensor, while the trust ratio's ``‖p‖`` and ``‖u‖`` are whole-tensor norms, local
to the rank that owns the tensor. So the local :class:`~omnibert.optim.Lamb` is told, through
:meth:`~omnibert.optim.Lamb.partition_norms_over`, to sum its squared gradient norm over the
ranks before the moments (one all-reduce of one float): every other number of the step is
the unsharded step's. Where no clipping happens (the norm is below ``max_grad_norm``) the
sharded update is bitwise the unsharded one; where it clips, the clip factor's sum runs in
another order (a rounding of the fp32 norm). FSDP's ``SHARD_GRAD_OP`` (``accelerator.strategy=
fsdp``) would also be exact with LAMB (it already sums norms over shards), but it replaces
DDP: it flattens and shards the parameters, it is refused with MLPerf's per-micro-batch
clipping and with CUDA graphs under accumulation, and FSDP1 does not run on a CPU, so the
DDP recipes keep DDP and shard the optimiser only. Nothing here is home-made but the glue:

* the local optimiser is built by the run's own optimiser config (a ``_partial_``) over the
  rank's share of the groups the unsharded optimiser makes (weight decay by name), with each
  group's ``param_names`` cut to the rank's tensors; torch copies every other group key
  between the exposed groups and the local ones (the LR a schedule sets, LAMB's step count),
  and ``param_names`` stays each side's own (:meth:`Zero1Optimizer._sync_param_groups`);
* a loaded checkpoint's state lives in the local optimiser only (torch also keeps a cast copy
  in the exposed optimiser, which nothing reads; it is dropped);
* LAMB's ``impl="auto"`` chooses its kernel by the whole model's size, so every rank runs
  the kernel the unsharded optimiser would;
* the attributes the run reads on its optimiser (``skip_nonfinite``, ``last_step_skipped``,
  ``last_grad_norm``) are the local optimiser's.

A checkpoint of a sharded run is a normal one: the same ``optimizer_states`` an unsharded run
writes (global parameter indices, every tensor's state, the groups with all their names), so
a sharded run resumes from an unsharded checkpoint and the other way round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.optim import ZeroRedundancyOptimizer

from omnibert.errors import UserError

__all__ = ["Zero1Optimizer"]

#: builds an optimiser over named parameters or parameter groups (the config's ``_partial_``)
Build = Callable[[Any], torch.optim.Optimizer]
#: group keys that are not settings: the tensors and their names (each side keeps its own)
_OWN_KEYS = ("params", "param_names")


class Zero1Optimizer(ZeroRedundancyOptimizer):
    """ZeRO-1 around the optimiser ``build`` makes (module docstring).

    Args:
        build: the run's optimiser config as a callable (``build(named_parameters)``, and
            ``build(param_groups)`` for a rank's share).
        named_parameters: the model's ``(name, parameter)`` pairs (names decide the groups).
        process_group: the data-parallel ranks (default: every rank, as DDP).
        parameters_as_bucket_view: each rank's tensors are views of one contiguous buffer, so
            the parameters are sent in one broadcast per rank (torch's option; ``False``: one
            broadcast per tensor).
    """

    def __init__(
        self,
        build: Build,
        named_parameters: Iterable[tuple[str, Tensor]],
        process_group: Any = None,
        parameters_as_bucket_view: bool = True,
    ) -> None:
        prototype = build(list(named_parameters))  # the unsharded groups; no state is made
        groups = [dict(group) for group in prototype.param_groups]
        del prototype
        self._build = build
        self._names: dict[Tensor, str] = {}
        for group in groups:
            for param, name in zip(group["params"], group.get("param_names") or (), strict=False):
                self._names[param] = name
        self._model_numel = sum(p.numel() for g in groups for p in g["params"])
        tensors = sum(len(g["params"]) for g in groups)
        world = dist.get_world_size(process_group)
        if tensors < world:  # a rank without tensors (torch gives each rank one before two)
            raise UserError(
                f"accelerator.optimizer_sharding=zero1 gives each of {world} ranks whole "
                f"tensors, but the model has only {tensors} trainable tensors; set "
                "accelerator.optimizer_sharding=none."
            )
        dtypes = sorted({str(p.dtype).removeprefix("torch.") for g in groups for p in g["params"]})
        if len(dtypes) > 1:  # torch's own check, said as the setting to change
            raise UserError(
                "accelerator.optimizer_sharding=zero1 (torch's ZeroRedundancyOptimizer) needs "
                f"the trained parameters in one dtype, and this model's are {' and '.join(dtypes)}; "
                "set accelerator.optimizer_sharding=none."
            )
        super().__init__(
            groups,
            optimizer_class=self._local_optimizer,  # type: ignore[arg-type]
            process_group=process_group,
            parameters_as_bucket_view=parameters_as_bucket_view,
        )

    def _local_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """This rank's optimiser over its share of every group (each group's names cut to
        its tensors); LAMB learns that its global gradient norm spans every rank's share."""
        for group in groups:
            if "param_names" in group:
                group["param_names"] = [self._names[p] for p in group["params"]]
        local = self._build(groups)
        partition = getattr(local, "partition_norms_over", None)
        if partition is not None:
            partition(self.process_group, self._model_numel)
        return local

    @staticmethod
    def _sync_param_groups(
        src_param_groups: list[dict[Any, Any]], dst_param_groups: list[dict[Any, Any]]
    ) -> None:
        """torch's copy of every group setting (LR, LAMB's step count, ...) between the
        exposed groups and the local ones, except the parameter names: the exposed groups
        name every tensor, the local ones this rank's."""
        if len(src_param_groups) != len(dst_param_groups):
            raise AssertionError("ZeRO-1: the local and the exposed parameter groups differ")
        for src, dst in zip(src_param_groups, dst_param_groups, strict=True):
            for key, value in src.items():
                if key not in _OWN_KEYS:
                    dst[key] = value

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's load (this rank's tensors' state into the local optimiser, the settings
        into both), without the copy torch also keeps in the exposed optimiser."""
        super().load_state_dict(state_dict)
        self.state.clear()

    # the run's view of the optimiser: the local one's (omnibert.optim.nonfinite, logging);
    # an AttributeError where the local optimiser has none (hasattr is then False)
    @property
    def skip_nonfinite(self) -> bool:
        return bool(getattr(self.optim, "skip_nonfinite"))  # noqa: B009

    @skip_nonfinite.setter
    def skip_nonfinite(self, value: bool) -> None:
        setattr(self.optim, "skip_nonfinite", value)  # noqa: B010

    @property
    def last_step_skipped(self) -> bool:
        return bool(getattr(self.optim, "last_step_skipped"))  # noqa: B009

    @last_step_skipped.setter
    def last_step_skipped(self, value: bool) -> None:
        setattr(self.optim, "last_step_skipped", value)  # noqa: B010

    @property
    def last_grad_norm(self) -> Tensor | None:
        norm: Tensor | None = getattr(self.optim, "last_grad_norm")  # noqa: B009
        return norm
