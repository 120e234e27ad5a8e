"""LAMB's update per data-parallel rank at N = 1, 2, 4, ... ranks: unsharded (plain DDP: every
rank repeats the whole update) against ZeRO-1 (``accelerator.optimizer_sharding=zero1``: each
rank updates its share of the tensors, :mod:`omnibert.optim.zero1`).

``python scripts/bench_lamb.py --ranks 1 2 4`` runs this (``bench_lamb.py`` parses the
shared options and hands them here). For each N it starts N processes (gloo on the CPU; NCCL,
one GPU each, with ``--device cuda``), each holding BERT's parameter set (``--model``: base,
110M parameters in 206 tensors; large; tiny for tests) with the same parameters and
gradients on every rank, as DDP's all-reduce leaves them, and times per round:

* ``unsharded update``: ``Lamb.step()`` over every tensor, what each rank of a DDP run does,
  on rank 0 while the others wait (no other process competes for the cores);
* ``zero1 update``: each rank's own ``step()`` over its share, one rank at a time; the
  slowest rank is the figure (a step waits for it). Timed alone, the local optimiser's
  one-number all-reduce of the gradient norm is switched off (the others are waiting), so
  this is the update work itself;
* ``zero1 step``: the whole sharded step on every rank at once: the norm's all-reduce, the
  update and the broadcast of every rank's updated tensors (one bucket per rank); with more
  processes than cores (4 on a 2-core machine) it includes their competition for the cores;
* ``broadcast``: the parameter broadcast alone, every rank at once.

Each rank runs ``--threads`` threads (default 1). Medians over ``--rounds`` rounds of
``--steps`` steps; the first step of each optimiser (state allocation, compilation) is not
timed. The optimiser state per rank (bytes in the state after the first step, the largest
rank) is recorded beside. On a CPU the figures say what sharding buys in update work per
rank, not how fast a GPU runs. Results: ``--json`` (rewritten after every N) and the record
``lamb-ranks-<model>-<device>.json``/``.svg`` in ``--results-dir``.

Its rounds are its own loop, not ``benchharness.run_rounds``: each region is a collective
(every rank enters it at once, or one rank times while the others wait at a barrier) and its
figure is the slowest rank's, gathered after the region; the harness times one process.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import benchplot
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from omnibert.accelerators.leaving import leave_together
from omnibert.optim import Lamb

NO_DECAY = ["bias"]


def bert_parameters(model: str, device: torch.device) -> list[tuple[str, torch.nn.Parameter]]:
    """BERT's parameters (``bench_lamb.bert_shapes``) with gradients, the same on every rank."""
    from bench_lamb import bert_shapes  # lazy: bench_lamb imports this module for --ranks

    gen = torch.Generator(device=device).manual_seed(0)
    named = []
    for i, shape in enumerate(bert_shapes(model)):
        p = torch.nn.Parameter(torch.randn(shape, generator=gen, device=device) * 0.02)
        p.grad = torch.randn(shape, generator=gen, device=device) * 1e-3
        named.append((f"p{i}.{'bias' if p.dim() == 1 else 'weight'}", p))
    return named


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Any, steps: int, device: torch.device) -> float:
    """ms per call of ``fn`` over ``steps`` calls."""
    _sync(device)
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    _sync(device)
    return (time.perf_counter() - start) / steps * 1e3


def _alone(
    rank: int, world: int, fn: Any, steps: int, device: torch.device, turns: int
) -> list[float]:
    """``fn`` timed on ranks ``0 .. turns-1``, one at a time while the others wait; their ms
    per call."""
    mine = 0.0
    for turn in range(turns):
        dist.barrier()
        if turn == rank:
            mine = _timed(fn, steps, device)
    times: list[Any] = [None] * world
    dist.all_gather_object(times, mine)
    return [float(t) for t in times[:turns]]


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(
        v.numel() * v.element_size()
        for state in optimizer.state.values()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def rank_main(rank: int, world: int, settings: dict[str, Any], rendezvous: str, out: str) -> None:
    """One rank: times its updates (module docstring); rank 0 writes ``out`` (JSON)."""
    from omnibert.optim.zero1 import Zero1Optimizer

    device = torch.device(settings["device"])
    if device.type == "cuda":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    torch.set_num_threads(settings["threads"])
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=rendezvous, rank=rank, world_size=world)
    steps, impl = settings["steps"], settings["impl"]
    make = functools.partial(Lamb, lr=1e-3, no_weight_decay=NO_DECAY, impl=impl)
    named = bert_parameters(settings["model"], device)
    # the unsharded update is every rank's: rank 0 holds and times it
    plain = make(named) if rank == 0 else None
    zero = Zero1Optimizer(make, named)  # each rank's tensors become views of one bucket
    if plain is not None:
        plain.step()  # first steps: state allocation, compilation
    zero.step()
    local = zero.optim
    record: dict[str, list[Any]] = {"unsharded": [], "zero1_update": [], "zero1_step": []}
    record["broadcast"] = []
    for _ in range(settings["rounds"]):
        run_plain = plain.step if plain is not None else None
        record["unsharded"].append(_alone(rank, world, run_plain, steps, device, 1)[0])
        local.partition_group = None  # alone: no all-reduce with ranks that are waiting
        record["zero1_update"].append(_alone(rank, world, local.step, steps, device, world))
        local.partition_group = zero.process_group
        dist.barrier()
        step_ms: list[Any] = [None] * world
        dist.all_gather_object(step_ms, _timed(zero.step, steps, device))
        record["zero1_step"].append(max(step_ms))
        dist.barrier()
        sync_ms: list[Any] = [None] * world
        dist.all_gather_object(sync_ms, _timed(zero._sync_params, steps, device))
        record["broadcast"].append(max(sync_ms))
    shares: list[Any] = [None] * world
    numel = sum(p.numel() for g in local.param_groups for p in g["params"])
    dist.all_gather_object(shares, (numel, _state_bytes(local)))
    if rank == 0:
        record["elements_per_rank"] = [s[0] for s in shares]
        record["state_bytes_per_rank"] = [s[1] for s in shares]
        record["unsharded_state_bytes"] = [_state_bytes(plain)] if plain is not None else []
        record["impl"] = [local.resolve_impl()]
        Path(out).write_text(json.dumps(record))
    leave_together()  # once rank 0 has written; see omnibert.accelerators.leaving


def measure(world: int, settings: dict[str, Any]) -> dict[str, Any]:
    """The record of ``world`` ranks (module docstring), from ``world`` new processes."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "ranks.json")
        rendezvous = f"file://{os.path.join(tmp, 'rendezvous')}"
        mp.start_processes(
            rank_main,
            args=(world, settings, rendezvous, out),
            nprocs=world,
            join=True,
            start_method="spawn",
        )
        result: dict[str, Any] = json.loads(Path(out).read_text())
    return result


def summary(world: int, raw: dict[str, Any]) -> dict[str, Any]:
    """Medians over rounds (the zero1 update: the slowest rank's in each round)."""
    unsharded = statistics.median(raw["unsharded"])
    update = statistics.median(max(r) for r in raw["zero1_update"])
    return {
        "ranks": world,
        "unsharded_update_ms": unsharded,
        "zero1_update_ms": update,
        "update_speedup": unsharded / update,
        "zero1_step_ms": statistics.median(raw["zero1_step"]),
        "broadcast_ms": statistics.median(raw["broadcast"]),
        "max_elements_per_rank": max(raw["elements_per_rank"]),
        "max_state_bytes_per_rank": max(raw["state_bytes_per_rank"]),
        "unsharded_state_bytes": raw["unsharded_state_bytes"][0],
        "impl": raw["impl"][0],
    }


def _write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """``bench_lamb.py --ranks ...``: every N of ``args.ranks``, printed, in ``args.json``
    after each, and the record at the end."""
    settings = {
        "device": args.device,
        "model": args.model,
        "threads": args.threads or 1,
        "rounds": args.rounds,
        "steps": args.steps,
        "impl": args.impls[0] if args.impls else "auto",
    }
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = Path(args.json or f"outputs/bench_lamb/bench_lamb_ranks-{stamp}.json")
    results: dict[str, Any] = {"status": "running", **settings, "ranks": {}, "raw": {}}
    _write(path, results)
    for world in args.ranks:
        threads = settings["threads"]
        print(f"{world} rank(s): {world} process(es), {threads} thread(s) each", flush=True)
        raw = measure(world, settings)
        results["raw"][str(world)] = raw
        results["ranks"][str(world)] = row = summary(world, raw)
        print(
            f"  unsharded update {row['unsharded_update_ms']:.1f} ms, zero1 update "
            f"{row['zero1_update_ms']:.1f} ms (slowest rank; {row['update_speedup']:.2f}x), "
            f"zero1 step {row['zero1_step_ms']:.1f} ms (broadcast {row['broadcast_ms']:.1f})",
            flush=True,
        )
        _write(path, results)
    results["status"] = "done"
    _write(path, results)
    save_record(args, settings, results)
    return results


def save_record(args: argparse.Namespace, settings: dict[str, Any], results: dict) -> None:
    """``lamb-ranks-<model>-<device>``: the table per N and the bars of the two updates."""
    rows = list(results["ranks"].values())
    device = torch.device(settings["device"]).type
    widest = rows[-1]
    headline = (
        f"BERT-{settings['model']} LAMB on {device}, {widest['ranks']} ranks: the update per "
        f"rank {widest['zero1_update_ms']:.0f} ms sharded against {widest['unsharded_update_ms']:.0f}"
        f" ms unsharded ({widest['update_speedup']:.2f}x less work), the state per rank "
        f"{widest['max_state_bytes_per_rank'] / 2**20:.0f} MiB against "
        f"{widest['unsharded_state_bytes'] / 2**20:.0f} MiB; the whole sharded step "
        f"{widest['zero1_step_ms']:.0f} ms, of which {widest['broadcast_ms']:.0f} ms is the "
        "parameter broadcast"
    )
    columns = [
        "ranks",
        "unsharded update (ms)",
        "zero1 update, slowest rank (ms)",
        "less work per rank",
        "zero1 step, all ranks at once (ms)",
        "of which broadcast (ms)",
        "state per rank (MiB)",
        "unsharded state (MiB)",
    ]
    cells = [
        [
            str(r["ranks"]),
            f"{r['unsharded_update_ms']:.1f}",
            f"{r['zero1_update_ms']:.1f}",
            f"{r['update_speedup']:.2f}x",
            f"{r['zero1_step_ms']:.1f}",
            f"{r['broadcast_ms']:.1f}",
            f"{r['max_state_bytes_per_rank'] / 2**20:.1f}",
            f"{r['unsharded_state_bytes'] / 2**20:.1f}",
        ]
        for r in rows
    ]
    table = benchplot.Table(
        f"medians of {settings['rounds']} rounds x {settings['steps']} steps, "
        f"{settings['threads']} thread(s) per rank, LAMB impl {widest['impl']}",
        columns,
        cells,
    )
    fig, (ax,) = benchplot.figure(1, width=6.5)
    benchplot.draw_bars(
        ax,
        f"LAMB update per rank, BERT-{settings['model']}, {device}",
        "ms per step (median)",
        [f"N={r['ranks']}" for r in rows],
        {
            "zero1 (slowest rank)": [r["zero1_update_ms"] for r in rows],
            "unsharded": [r["unsharded_update_ms"] for r in rows],
        },
        ratio_of=("unsharded", "zero1 (slowest rank)"),
    )
    notes = [
        "The update is timed on one rank at a time (the others wait), so it is the work one "
        "rank does; the zero1 step runs every rank at once and adds the gradient norm's "
        "all-reduce and the parameter broadcast."
    ]
    if device == "cpu":
        notes.append(
            "A CPU measurement: it says what sharding saves in update work per rank, not how "
            "fast a GPU runs the update; with more ranks than cores the ranks' whole steps "
            "compete for the cores."
        )
    record = benchplot.Record(
        name=f"lamb-ranks-{settings['model']}-{device}",
        title="LAMB per data-parallel rank, unsharded against ZeRO-1",
        headline=headline,
        tables=[table],
        measurements={"ranks": results["ranks"], "raw": results["raw"], **settings},
        notes=notes,
    )
    benchplot.save(record, fig, args.results_dir)
