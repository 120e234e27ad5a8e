"""One rank of the sharded-LAMB checks, started by ``tests/e2e/test_lamb_sharded.py`` through
``torch.distributed.run`` (two CPU processes, gloo). Not collected by pytest (no ``test_``).

``--mode fsdp2``: the tiny BERT of ``test_model.py`` under ``torch.distributed.fsdp.fully_shard``
(one unit per BertLayer, the root holding embeddings and heads): every rank holds dim-0 shards
as DTensors, and :class:`omnibert.optim.Lamb` finds the group by itself.

``--mode fsdp1``: the same model under FSDP1 (``FullyShardedDataParallel``) as the GPU plugin's
``strategy: fsdp`` wraps it through Lightning's ``FSDPStrategy`` (one unit per BertLayer,
``use_orig_params=True``, ``FULL_SHARD``), on the CPU (``device_id=cpu``): each rank's
parameters are uneven flat slices of the units' sharded flat buffers, and the task's wiring
(:func:`omnibert.optim.sharding.attach_shard_group` on the wrapped module) hands LAMB the group.

``--mode flat``: the slices FSDP1 gives the optimiser, made by hand (uneven, some empty) with
the matching slice of the full gradient; the optimiser learns the group from
:meth:`Lamb.shard_norms_over`. Cheap enough to run the multi-tensor Triton kernel interpreted.

Both ranks see the same batch each step, so the averaged (FSDP) or sliced (flat) gradient is
the single-process one. Rank 0 writes the gathered parameters after ``--steps`` steps.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
import torch.distributed as dist
from test_model import model_of, unpacked_batch

from omnibert.accelerators.leaving import leave_together
from omnibert.optim import Lamb

LAMB = {"lr": 5e-2, "no_weight_decay": ["bias", "LayerNorm"], "max_grad_norm": 1.0}


def batches(steps: int) -> list[dict]:
    return [unpacked_batch(seed=10 + i) for i in range(steps)]


def slice_bounds(numel: int, rank: int, world: int) -> tuple[int, int]:
    """Uneven slices: rank 0 takes two thirds (tiny tensors leave rank 1 empty)."""
    cut = (2 * numel) // 3 if world == 2 else numel
    return (0, cut) if rank == 0 else (cut, numel)


def run_fsdp2(steps: int, impl: str, loss_scale: float) -> dict[str, torch.Tensor]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = model_of()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model.bert.encoder.layer:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = Lamb(model.named_parameters(), impl=impl, **LAMB)
    for batch in batches(steps):
        opt.zero_grad()
        (model(batch)["loss"] * loss_scale).backward()
        opt.step()
    return {n: p.full_tensor().detach() for n, p in model.named_parameters()}


def fsdp1_wrapped(model: torch.nn.Module, device: torch.device) -> Any:
    """``model`` wrapped as the GPU plugin's ``strategy: fsdp`` wraps it (one FSDP1 unit per
    BertLayer, ``use_orig_params=True``, FSDP1's default ``FULL_SHARD``) on ``device``."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from omnibert.models.bert import BertLayer

    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=ModuleWrapPolicy({BertLayer}),
        use_orig_params=True,
        device_id=device,
    )


def train_fsdp1(
    steps: int, impl: str, loss_scale: float, device: torch.device
) -> tuple[Any, Any, dict[str, torch.Tensor]]:
    """FSDP1 training with the task's wiring; returns the sharding strategy FSDP1 chose, the
    group :func:`attach_shard_group` found and the gathered parameters (names without FSDP1's
    wrapper prefix)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    from omnibert.optim.sharding import attach_shard_group

    model = model_of().to(device)
    wrapped = fsdp1_wrapped(model, device)
    opt = Lamb(model.named_parameters(), impl=impl, **LAMB)  # configure_optimizers' call
    group = attach_shard_group(opt, wrapped)
    assert opt.shard_group is group
    for batch in batches(steps):
        opt.zero_grad()
        (wrapped({k: v.to(device) for k, v in batch.items()})["loss"] * loss_scale).backward()
        opt.step()
    with FullyShardedDataParallel.summon_full_params(wrapped):
        params = {
            n.replace("_fsdp_wrapped_module.", ""): p.detach().cpu().clone()
            for n, p in model.named_parameters()
        }
    return wrapped.sharding_strategy, group, params


def run_fsdp1(steps: int, impl: str, loss_scale: float) -> dict[str, torch.Tensor]:
    from torch.distributed.fsdp import ShardingStrategy

    strategy, group, params = train_fsdp1(steps, impl, loss_scale, torch.device("cpu"))
    assert strategy == ShardingStrategy.FULL_SHARD, strategy
    assert group is not None and dist.get_world_size(group) == dist.get_world_size()
    return params


def run_flat(
    steps: int, impl: str, loss_scale: float, chunk: int = 1024
) -> dict[str, torch.Tensor]:
    rank, world = dist.get_rank(), dist.get_world_size()
    model = model_of()
    named = list(model.named_parameters())
    bounds = [slice_bounds(p.numel(), rank, world) for _, p in named]
    shards = [
        (n, torch.nn.Parameter(p.detach().reshape(-1)[a:b].clone()))
        for (n, p), (a, b) in zip(named, bounds, strict=True)
    ]
    opt = Lamb(shards, impl=impl, triton_chunk_size=chunk, **LAMB)  # few interpreted programs
    opt.shard_norms_over(dist.group.WORLD)
    for batch in batches(steps):
        model.zero_grad()
        (model(batch)["loss"] * loss_scale).backward()
        for (_, p), (_, s), (a, b) in zip(named, shards, bounds, strict=True):
            s.grad = p.grad.reshape(-1)[a:b].clone()  # type: ignore[union-attr]
        opt.step()
        with torch.no_grad():  # the updated slices back into whole tensors (a sum of zeros)
            for (_, p), (_, s), (a, b) in zip(named, shards, bounds, strict=True):
                whole = torch.zeros(p.numel())
                whole[a:b] = s.detach()
                dist.all_reduce(whole)
                p.copy_(whole.reshape(p.shape))
    return {n: p.detach() for n, p in named}


#: the cases one launch runs: (mode, impl, loss scale); 0.01 keeps the gradient norm below
#: the clipping threshold, 1.0 clips (the Triton case needs TRITON_INTERPRET=1 on CPU)
CASES = {
    "fsdp2-clipped": ("fsdp2", "foreach", 1.0),
    "fsdp1-clipped": ("fsdp1", "foreach", 1.0),
    "fsdp1-slices-unclipped": ("flat", "foreach", 0.01),
    "fsdp1-slices-triton-interpreted": ("flat", "triton", 1.0),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    for case, (mode, impl, loss_scale) in CASES.items():
        run = {"fsdp2": run_fsdp2, "fsdp1": run_fsdp1, "flat": run_flat}[mode]
        params = run(args.steps, impl, loss_scale)
        if dist.get_rank() == 0:
            torch.save(params, f"{args.out_dir}/{case}.pt")
    leave_together()  # see omnibert.accelerators.leaving


if __name__ == "__main__":
    main()
