"""One rank of the ZeRO-1 checks, started by ``tests/e2e/test_lamb_zero1.py`` through
``torch.distributed.run`` (4 CPU processes, gloo). Not collected by pytest (no ``test_``).

Every case runs over the 4 ranks, then over 2 (ranks 0 and 1 as a process group of their
own while ranks 2 and 3 wait: one launch for both sizes).

Each case trains two copies of the tiny BERT of ``test_model.py`` side by side on every rank,
as DDP does: each rank its own batch, the gradients averaged over the ranks (an all-reduce,
what DDP's buckets do). One copy steps an unsharded optimiser (every rank updates every
tensor); the other :class:`omnibert.optim.zero1.Zero1Optimizer` over the same optimiser config
(each rank its share of the tensors, then the parameters broadcast). After every step the
worker records the largest per-tensor distance of the sharded parameters from the unsharded
ones (``‖p_zero1 - p‖ / ‖p‖``) and whether they are bitwise equal. (The distance of the
updates is no measure: the attention's key biases have a gradient that is 0 up to rounding,
so their update is rounding noise of the order of an ulp of the bias.)

The ``checkpoint`` part (the clipped LAMB case, after its steps): the sharded optimiser's
consolidated ``state_dict`` against the unsharded optimiser's (same groups and names, same
state keys, values within 1e-6); a fresh sharded optimiser that loads it continues bitwise
like the one that never stopped; an unsharded LAMB loads it and a sharded one loads the
unsharded ``state_dict``, and both continue within 1e-6 of the unsharded run.

Rank 0 writes ``<out-dir>/zero1.json``: ``{"4": {case: ...}, "2": {case: ...}}``.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
from typing import Any

import torch
import torch.distributed as dist
from test_model import model_of, unpacked_batch

from omnibert.accelerators.leaving import leave_together
from omnibert.optim import AdamW, Lamb
from omnibert.optim.nonfinite import guard, skipped
from omnibert.optim.zero1 import Zero1Optimizer
from omnibert.optim.zero1_plan import elements_per_rank

NO_DECAY = ["bias", "LayerNorm"]
LAMB = {"lr": 5e-2, "no_weight_decay": NO_DECAY, "max_grad_norm": 1.0}
#: case: (optimiser, its settings, loss scale, steps); 0.01 keeps the gradient norm below
#: the clipping threshold, 1.0 clips; lamb-mlperf is optimizer=lamb_mlperf's rules (no
#: clipping in the optimiser, the trust ratio by name); the Triton case needs
#: TRITON_INTERPRET=1 and runs one step on 2 ranks (interpreted programs take seconds)
CASES: dict[str, tuple[Any, dict[str, Any], float, int]] = {
    "lamb-clipped": (Lamb, {**LAMB, "impl": "foreach"}, 1.0, 3),
    "lamb-unclipped": (Lamb, {**LAMB, "impl": "foreach"}, 0.01, 3),
    "lamb-mlperf": (
        Lamb,
        {**LAMB, "max_grad_norm": None, "exclude_from_layer_adaptation": NO_DECAY},
        1.0,
        3,
    ),
    "lamb-triton-interpreted": (
        Lamb,
        {**LAMB, "impl": "triton", "triton_chunk_size": 4096},
        1.0,
        1,
    ),
    "adamw": (AdamW, {"lr": 1e-2, "no_weight_decay": NO_DECAY}, 1.0, 3),
}
#: the control: lamb-clipped with each rank's gradient norm its own tensors' only (the
#: partition's all-reduce switched off), which the tolerance must catch
LOCAL_NORM = "lamb-clipped-local-norm-control"
CASES[LOCAL_NORM] = CASES["lamb-clipped"]
#: a step whose gradient holds a NaN (in a tensor that one rank owns) is skipped by every
#: rank, as the unsharded optimiser skips it (omnibert.optim.nonfinite)
NONFINITE = "lamb-nonfinite-skipped"
CASES[NONFINITE] = CASES["lamb-clipped"]
#: AdamW's update is elementwise (nothing to sum over ranks): 2 ranks show it
TWO_RANKS_ONLY = ("lamb-triton-interpreted", LOCAL_NORM, NONFINITE, "adamw")
MORE = 2  # steps after the checkpoint
#: the process group of the ranks training together (all 4, or a pair)
GROUP: Any = None


def step(
    model: torch.nn.Module, optimizer: Any, batch: dict, scale: float, poison: bool = False
) -> None:
    """One data-parallel step: this rank's batch, the gradients averaged over the ranks;
    ``poison``: the last rank's gradient of the last tensor holds a NaN before the average."""
    optimizer.zero_grad()
    (model(batch)["loss"] * scale).backward()
    world = dist.get_world_size(GROUP)
    grads = [p.grad for p in model.parameters()]
    if poison and dist.get_rank(GROUP) == world - 1:
        grads[-1].view(-1)[0] = float("nan")  # type: ignore[union-attr]
    for grad in grads:
        dist.all_reduce(grad, group=GROUP)  # type: ignore[arg-type]
        grad.div_(world)  # type: ignore[union-attr]
    optimizer.step()


def batch_of(step_index: int) -> dict:
    return unpacked_batch(seed=1000 * step_index + dist.get_rank(GROUP))


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def distance(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """The largest per-tensor ``‖got - want‖ / ‖want‖``."""
    return max(float((got[n] - w).norm() / w.norm().clamp(min=1e-30)) for n, w in want.items())


def bitwise(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(got[n], w) for n, w in want.items())


def run_case(name: str) -> dict[str, Any]:
    cls, settings, scale, steps = CASES[name]
    make = functools.partial(cls, **settings)
    plain_model, zero_model = model_of(), model_of()
    plain = make(plain_model.named_parameters())
    zero = Zero1Optimizer(make, zero_model.named_parameters(), process_group=GROUP)
    if name == LOCAL_NORM:
        zero.optim.partition_group = None  # the bug the control stands for
    if name == NONFINITE:  # what the NonFiniteSteps callback does to the run's optimiser
        guard(plain)
        guard(zero)
    out: dict[str, Any] = {"param": [], "bitwise": [], "skipped": []}
    for i in range(steps):
        poison = name == NONFINITE and i == 1
        step(plain_model, plain, batch_of(i), scale, poison)
        before = params(zero_model)
        step(zero_model, zero, batch_of(i), scale, poison)
        got, want = params(zero_model), params(plain_model)
        out["param"].append(distance(got, want))
        out["bitwise"].append(bitwise(got, want))
        if name == NONFINITE:  # every rank skipped the poisoned step, and only that one
            flags: list[Any] = [None] * dist.get_world_size(GROUP)
            dist.all_gather_object(flags, (skipped(zero), bitwise(got, before)), group=GROUP)
            out["skipped"].append(flags)
    local = sum(p.numel() for g in zero.optim.param_groups for p in g["params"])
    gathered: list[Any] = [None] * dist.get_world_size(GROUP)
    dist.all_gather_object(gathered, local, group=GROUP)
    out["elements_per_rank"] = gathered
    sizes = [[p.numel() for p in g["params"]] for g in plain.param_groups]
    out["predicted_elements_per_rank"] = elements_per_rank(sizes, len(gathered))
    if name == "lamb-clipped":
        out["checkpoint"] = checkpoint(make, plain_model, plain, zero_model, zero, scale, steps)
    return out


def fresh_copy(model: torch.nn.Module) -> torch.nn.Module:
    twin = model_of()
    twin.load_state_dict(model.state_dict())
    return twin


def own_state_in(consolidated: dict[str, Any], zero: Zero1Optimizer) -> bool:
    """Whether every rank finds its own tensors' state, bitwise, in the consolidated one."""
    index = {
        name: i
        for group in consolidated["param_groups"]
        for name, i in zip(group["param_names"], group["params"], strict=True)
    }
    mine = all(
        torch.equal(value, consolidated["state"][index[name]][key])
        for group in zero.optim.param_groups
        for name, p in zip(group["param_names"], group["params"], strict=True)
        for key, value in zero.optim.state[p].items()
    )
    flag = torch.tensor([0 if mine else 1])
    dist.all_reduce(flag, group=GROUP)
    return int(flag) == 0


def checkpoint(make, plain_model, plain, zero_model, zero, scale, steps) -> dict[str, Any]:
    """The module docstring's checkpoint part."""
    zero.consolidate_state_dict(to=0)  # what Lightning does on every rank when it saves
    saved = [zero.state_dict() if dist.get_rank(GROUP) == 0 else None]
    dist.broadcast_object_list(saved, group=GROUP, group_src=0)  # the file rank 0 wrote
    consolidated, unsharded = saved[0], plain.state_dict()
    report: dict[str, Any] = {
        "groups_equal": consolidated["param_groups"] == unsharded["param_groups"],
        "state_keys_equal": consolidated["state"].keys() == unsharded["state"].keys()
        and all(
            consolidated["state"][i].keys() == unsharded["state"][i].keys()
            for i in unsharded["state"]
        ),
        "state_is_the_ranks": own_state_in(consolidated, zero),
    }
    # a fresh sharded optimiser from the consolidated checkpoint, another from the unsharded
    # one, an unsharded one from the consolidated one; each beside the run that never stopped
    resumed_model = fresh_copy(zero_model)
    resumed = Zero1Optimizer(make, resumed_model.named_parameters(), process_group=GROUP)
    resumed.load_state_dict(copy.deepcopy(consolidated))
    crossed_model = fresh_copy(plain_model)
    crossed = Zero1Optimizer(make, crossed_model.named_parameters(), process_group=GROUP)
    crossed.load_state_dict(copy.deepcopy(unsharded))
    back_model = fresh_copy(zero_model)
    back = make(back_model.named_parameters())
    back.load_state_dict(copy.deepcopy(consolidated))
    for i in range(steps, steps + MORE):
        for model, optimizer in (
            (zero_model, zero), (plain_model, plain), (resumed_model, resumed),
            (crossed_model, crossed), (back_model, back),
        ):  # fmt: skip
            step(model, optimizer, batch_of(i), scale)
    want = params(plain_model)
    report["resumed_bitwise"] = bitwise(params(resumed_model), params(zero_model))
    report["sharded_from_unsharded_distance"] = distance(params(crossed_model), want)
    report["unsharded_from_sharded_distance"] = distance(params(back_model), want)
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out-dir", required=True)
    args = ap.parse_args()
    global GROUP
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if dist.get_world_size() != 4:
        raise SystemExit("lamb_zero1_worker.py runs on 4 ranks (--nproc-per-node=4)")
    results: dict[str, Any] = {}
    GROUP = dist.group.WORLD
    results["4"] = {n: run_case(n) for n in CASES if n not in TWO_RANKS_ONLY}
    GROUP = dist.new_group([0, 1])  # every rank takes part in making it
    if rank < 2:
        results["2"] = {n: run_case(n) for n in CASES}
    if rank == 0:
        with open(f"{args.out_dir}/zero1.json", "w") as f:
            json.dump(results, f, indent=1)
    leave_together()  # see omnibert.accelerators.leaving


if __name__ == "__main__":
    main()
