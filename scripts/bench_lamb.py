"""LAMB step time on BERT's parameter set against torch-optimizer and the memory floor.

Runs every implementation on the same parameters and gradients (BERT-base: 110M parameters in
206 tensors; ``--model large``: 335M in 398), in alternating rounds (the order rotates each
round, so drift in machine load hits all of them alike), and prints the median ms/step, the
speed-up over ``torch_optimizer.Lamb`` measured in the same run, and the ratio to the
memory-bandwidth floor: the bytes a LAMB step must move per fp32 parameter over the copy
bandwidth (``dst.copy_(src)``, counting the read and the write). On CUDA it is measured as the
GPU check's probe measures it (:func:`copy_bandwidth`: CUDA events around 20 back-to-back
copies of 1 GiB after 3 warm-ups, the mean), once before the rounds and between them, the best
kept; ``--bandwidth-from PROBE_JSON`` takes the probe's figure of the same lease instead
(``scripts/gpu_check.py`` passes it), so the floor is the one the rest of the lease's records
are read against. On a CPU: the best of 20 single copies, timed with ``perf_counter``.

The floor is 44 B/param: the global gradient norm reads g (4), since the clip factor must be
known before the moments; the moments read g, p, m, v and write m, v (24); the trust ratio
needs whole-tensor norms of the update, so the update is applied in a second pass that reads
m, v (or a stored update written and read: the same 8) and reads and writes p (8). The
multi-tensor Triton kernel moves exactly that; apex's accounting with a separate norm pass
(52 B) is printed too. The rounds are the harness's (:mod:`benchharness`): each
implementation's ``--steps`` steps timed between two device synchronisations, the order
rotating each round; the first step (state allocation, compilation) is the warm-up pass,
reported, not counted.

    python scripts/bench_lamb.py                       # CPU, all threads
    python scripts/bench_lamb.py --threads 1 --rounds 5
    python scripts/bench_lamb.py --device cuda         # adds the multi-tensor Triton kernel
    python scripts/bench_lamb.py --device cuda --model large
    python scripts/bench_lamb.py --lease               # the same, 3 rounds x 5 steps: ~30 s
    python scripts/bench_lamb.py --smoke               # CPU, tiny set, seconds (no compile)
    python scripts/bench_lamb.py --ranks 1 2 4         # per rank: unsharded vs ZeRO-1, N ranks

An implementation that fails (the Triton kernel not compiling, torch-optimizer not installed:
the ``bench`` extra) is recorded with its error, printed, and left out; the others run. The
results (``--json``, default ``outputs/bench_lamb/bench_lamb-<time>.json``) are rewritten
atomically after every stage (bandwidth, each first step, each round), so a timeout keeps what
ran (a SIGTERM marks them interrupted); the record (``lamb.json``/``lamb.svg`` in ``--results-dir``) is written at the end.
``--model tiny`` (2 layers of 64: 2M parameters, mostly the embedding) is for tests.
Parameters and gradients are drawn on the device (BERT-large's on the host take seconds).
On a GPU the run takes seconds after the imports and the Triton compile (the measured steps
are in docs/lamb.md's records). Goal on a GPU: the Triton kernel within 1.3x of the floor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchplot
import torch
from benchharness import Region, ResultsFile, Rounds, Turn, apply_presets, device_sync, run_rounds

from omnibert.optim import Lamb

BYTES_PER_PARAM = 44  # the floor (module docstring)
APEX_BYTES_PER_PARAM = 52  # with a separate pass for the norms
MODELS = {"base": (768, 3072, 12), "large": (1024, 4096, 24), "tiny": (64, 256, 2)}
PEER = "torch-optimizer"
#: ``--lease``: the GPU figure that matters (BERT-large), a little more steps than the default
LEASE = {"device": "cuda", "model": "large", "rounds": 3, "steps": 5}
#: ``--smoke``: seconds on the CPU
SMOKE = {"device": "cpu", "model": "tiny", "rounds": 2, "steps": 2}
#: what no flag and no preset sets
DEFAULTS = {"device": "cpu", "model": "base", "rounds": 3, "steps": 3}


def bert_shapes(model: str = "base", vocab: int = 30528) -> list[tuple[int, ...]]:
    """Parameter shapes of BERT for pretraining (MLM head decoder tied to the embeddings)."""
    hidden, ffn, layers = MODELS[model]
    h = hidden
    shapes = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(h, h), (h,)] * 4 + [(h,), (h,), (ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,)]
    shapes += [(h, h), (h,), (h, h), (h,), (h,), (h,), (vocab,), (2, h), (2,)]
    return shapes


def copy_bandwidth(device: torch.device, numel: int = 1 << 28, repeats: int = 20) -> float:
    """``dst.copy_(src)`` bandwidth in bytes/s (counting the read and the write). CUDA: CUDA
    events around ``repeats`` back-to-back copies after 3 warm-ups, the mean (how
    ``scripts/gpu_probe.py`` measures it); elsewhere the best of ``repeats`` single copies."""
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    if device.type == "cuda":
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize(device)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(repeats):
            dst.copy_(src)
        end.record()
        torch.cuda.synchronize(device)
        return 2 * 4 * numel * repeats / (begin.elapsed_time(end) / 1e3)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * 4 * numel / best


def probe_bandwidth(path: str) -> float:
    """The copy bandwidth (bytes/s) in a ``scripts/gpu_probe.py`` JSON (its ``ceilings``)."""
    probe = json.loads(Path(path).read_text())
    ceilings = probe.get("ceilings") or {}
    detail = ceilings.get("detail") if ceilings.get("status") == "ok" else None
    if not isinstance(detail, dict) or "copy_GBps_read_plus_write" not in detail:
        raise SystemExit(
            f"bench_lamb: --bandwidth-from {path} holds no measured copy bandwidth (its "
            f"'ceilings' check: {ceilings.get('status', 'missing')}); run without the flag"
        )
    return float(detail["copy_GBps_read_plus_write"]) * 1e9


def make_stepper(params: list[torch.nn.Parameter], impl: str) -> Callable[[], None]:
    """One implementation's ``step`` over ``params`` (their own optimiser state)."""
    if impl == PEER:
        import torch_optimizer  # the bench extra; ImportError: recorded as this one's failure

        peer: Callable[[], None] = torch_optimizer.Lamb(params, lr=1e-3, weight_decay=0.01).step
        return peer
    named = [(f"p{i}.{'bias' if p.dim() == 1 else 'weight'}", p) for i, p in enumerate(params)]
    return Lamb(named, lr=1e-3, no_weight_decay=["bias"], impl=impl).step


def make_steppers(
    params: list[torch.nn.Parameter], impls: list[str], errors: dict[str, str] | None = None
) -> dict[str, Callable[[], None]]:
    """The steppers that could be built; the others' errors go to ``errors``."""
    steppers: dict[str, Callable[[], None]] = {}
    for impl in impls:
        try:
            steppers[impl] = make_stepper(params, impl)
        except Exception as err:  # recorded: the other implementations still run
            message = failure(impl, "building it", err)
            if errors is not None:
                errors[impl] = message
    return steppers


def failure(name: str, when: str, err: BaseException) -> str:
    """Print and return one implementation's failure (the benchmark goes on without it)."""
    message = f"{type(err).__name__}: {err}"
    if isinstance(err, ImportError) and name == PEER:
        message += " (pip install -e '.[bench]')"
    print(f"  {name}: FAILED {when}: {message}", flush=True)
    print("    " + traceback.format_exc().strip().replace("\n", "\n    ")[-3000:], flush=True)
    return f"{when}: {message}"


def summarise(
    times: dict[str, list[float]], bandwidth: float, numel: int
) -> tuple[float, float, dict[str, dict[str, Any]]]:
    """The floors (ms/step at ``bandwidth``) and per implementation: median and min ms/step,
    the ratio to the 44 B and 52 B floors and the speed-up over the peer."""
    floor_ms = BYTES_PER_PARAM * numel / bandwidth * 1e3
    apex_ms = APEX_BYTES_PER_PARAM * numel / bandwidth * 1e3
    peer = statistics.median(times[PEER]) if times.get(PEER) else None
    rows = {}
    for name, ts in times.items():
        if not ts:
            continue
        med = statistics.median(ts)
        rows[name] = {
            "ms_per_step": med,
            "min_ms": min(ts),
            "x_floor": med / floor_ms,
            "x_apex_floor": med / apex_ms,
            "speedup_vs_torch_optimizer": peer / med if peer else None,
        }
    return floor_ms, apex_ms, rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default=None, help="cpu (default), cuda, ...")
    ap.add_argument("--model", choices=sorted(MODELS), default=None, help="default base")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3")
    ap.add_argument("--steps", type=int, default=None,
                    help="timed steps per round and implementation (default 3)")  # fmt: skip
    ap.add_argument("--impls", nargs="*", default=None)
    ap.add_argument("--lease", action="store_true",
                    help="the GPU-lease setting: cuda, BERT-large, 3 rounds x 5 steps")  # fmt: skip
    ap.add_argument("--smoke", action="store_true",
                    help="CPU, tiny set, 2 rounds x 2 steps, seconds")  # fmt: skip
    ap.add_argument("--json", default=None,
                    help="results, rewritten after every stage (module docstring)")  # fmt: skip
    ap.add_argument("--bandwidth-from", default=None, metavar="PROBE_JSON",
                    help="the floor at this gpu_probe.py JSON's copy bandwidth")  # fmt: skip
    ap.add_argument("--ranks", type=int, nargs="+", default=None, metavar="N",
                    help="per data-parallel rank at each N: unsharded against ZeRO-1 "
                    "(scripts/bench_lamb_ranks.py; --impls: its one LAMB impl)")  # fmt: skip
    benchplot.add_arguments(ap)
    args = ap.parse_args(argv)
    # explicit flags, then --smoke, then --lease, then the defaults
    apply_presets(args, SMOKE if args.smoke else None, LEASE if args.lease else None, DEFAULTS)
    if args.ranks:  # the per-rank mode lives in its own module
        import bench_lamb_ranks

        return bench_lamb_ranks.run(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    impls = args.impls or (
        ["triton", "foreach", "reference", PEER]
        if device.type == "cuda"
        else ["foreach", "reference", PEER]
        if args.smoke  # the compiled one's inductor compile takes longer than the rest
        else ["compiled", "foreach", "reference", PEER]
    )
    copy_numel = 8_000_000 if args.smoke else (1 << 28 if device.type == "cuda" else 64_000_000)
    given = probe_bandwidth(args.bandwidth_from) if args.bandwidth_from else None
    path = Path(args.json or f"outputs/bench_lamb/bench_lamb-{time.strftime('%Y%m%d-%H%M%S')}.json")
    file = ResultsFile(path, {
        "status": "running",
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "model": args.model,
        "threads": torch.get_num_threads(),
        "rounds": args.rounds,
        "steps": args.steps,
        "impls": impls,
        "floor_bytes_per_param": BYTES_PER_PARAM,
        "apex_floor_bytes_per_param": APEX_BYTES_PER_PARAM,
        "errors": {},
        "first_step_seconds": {},
        "ms_per_step": {},
    }, name="bench_lamb")  # fmt: skip
    with file.interruptible():
        file.save()
        return run(args, device, impls, copy_numel, given, file)


def run(
    args: argparse.Namespace,
    device: torch.device,
    impls: list[str],
    copy_numel: int,
    given: float | None,
    file: ResultsFile,
) -> dict[str, Any]:
    """The parameters, the bandwidth, each implementation's first step, the rounds, then the
    printed table and the record."""
    results, path = file.data, file.path
    # parameters and gradients made on the device (BERT-large's on the host take seconds)
    gen = torch.Generator(device=device).manual_seed(0)
    params = []
    for shape in bert_shapes(args.model):
        p = torch.nn.Parameter(torch.randn(shape, generator=gen, device=device) * 0.02)
        p.grad = torch.randn(shape, generator=gen, device=device) * 1e-3
        params.append(p)
    numel = sum(p.numel() for p in params)
    print(
        f"device {device}, threads {torch.get_num_threads()}, {len(params)} tensors, "
        f"{numel / 1e6:.1f}M parameters; results in {path}",
        flush=True,
    )
    bandwidths = [copy_bandwidth(device, numel=copy_numel)]
    results.update(parameters=numel, tensors=len(params), copy_bandwidths_bytes_per_s=bandwidths)
    how = "CUDA events, mean of 20 copies" if device.type == "cuda" else "best of 20 copies"
    source = (
        f"gpu_probe ({args.bandwidth_from}: CUDA events, 1 GiB copies, mean of 20)"
        if given
        else f"measured here ({how} of {copy_numel * 4 / 2**30:.2f} GiB, best of the rounds)"
    )
    results["floor_bandwidth_source"] = source
    file.save()

    errors: dict[str, str] = results["errors"]
    steppers = make_steppers(params, impls, errors)
    times: dict[str, list[float]] = results["ms_per_step"]

    def steps(step: Callable[[], None]) -> Callable[[Turn], None]:
        def region(turn: Turn) -> None:  # the first step alone, then --steps a round
            for _ in range(1 if turn.warmup else args.steps):
                step()

        return region

    def first_step(region: Region) -> None:  # allocation, compilation
        if region.turn.warmup:
            results["first_step_seconds"][region.peer] = region.seconds
            print(f"  first step {region.peer:16s} {region.seconds:8.2f} s (allocation/"
                  "compilation)", flush=True)  # fmt: skip
            file.save()

    def failed(name: str, turn: Turn, err: Exception) -> str:  # recorded; the others go on
        when = "in its first step" if turn.warmup else f"in round {turn.index + 1}"
        errors[name] = failure(name, when, err)
        file.save()
        return errors[name]

    def between_rounds(index: int) -> None:  # the bandwidth between rounds, the best kept
        bandwidths.append(copy_bandwidth(device, numel=copy_numel))

    def after_round(index: int, rounds: Rounds) -> None:
        ran = [n for n in steppers if rounds.seconds(n) or n not in rounds.errors]
        times.update({n: [s / args.steps * 1e3 for s in rounds.seconds(n)] for n in ran})
        floor_ms, _, summary = summarise(times, given or max(bandwidths), numel)
        results.update(copy_bandwidth_bytes_per_s=given or max(bandwidths), floor_ms=floor_ms,
                       summary=summary)  # fmt: skip
        file.save()

    run_rounds({name: steps(step) for name, step in steppers.items()},
                        rounds=args.rounds, warmup=1, sync=device_sync(device),
                        before_round=between_rounds, after_round=after_round,
                        after_region=first_step, on_error=failed)  # fmt: skip
    bandwidth = given or max(bandwidths)
    floor_ms, apex_ms, summary = summarise(times, bandwidth, numel)
    spread = ", ".join(f"{b / 1e9:.1f}" for b in bandwidths)
    print(
        f"\nfloor bandwidth {bandwidth / 1e9:.1f} GB/s: {source}; measured here per round: {spread}"
    )
    print(
        f"floor: {BYTES_PER_PARAM} B/param x {numel / 1e6:.1f}M / bandwidth = {floor_ms:.2f} "
        f"ms/step ({APEX_BYTES_PER_PARAM} B/param with a separate norm pass: {apex_ms:.2f} ms)"
    )
    print(
        f"\n{'implementation':16s} {'ms/step':>9s} {'min':>9s} {'vs torch-optimizer':>19s}"
        f" {'x floor':>8s} {'x 52 B':>7s}"
    )
    rows = []
    for name, s in summary.items():
        speed = s["speedup_vs_torch_optimizer"]
        speedup = f"{speed:.2f}x faster" if speed else "n/a"
        print(
            f"{name:16s} {s['ms_per_step']:9.2f} {s['min_ms']:9.2f} {speedup:>19s} "
            f"{s['x_floor']:8.2f} {s['x_apex_floor']:7.2f}"
        )
        rows.append(
            [
                name,
                f"{s['ms_per_step']:.2f}",
                f"{s['min_ms']:.2f}",
                speedup,
                f"{s['x_floor']:.2f}",
                f"{s['x_apex_floor']:.2f}",
            ]
        )
    for name, message in errors.items():
        print(f"{name:16s} FAILED {message}")
        rows.append([name, "failed", "", "", "", ""])
    results.update(
        status="done", copy_bandwidth_bytes_per_s=bandwidth, floor_ms=floor_ms, summary=summary
    )
    file.save()
    print(f"\nresults in {path}", flush=True)
    save_results(args, device, numel, bandwidth, floor_ms, times, errors, rows, source)
    return results


def save_results(args, device, numel, bandwidth, floor_ms, times, errors, rows, source) -> None:
    """lamb.json + lamb.svg: ms/step per implementation next to torch-optimizer and the floor."""
    medians = {name: statistics.median(ts) for name, ts in times.items() if ts}
    peer = medians.get(PEER)
    ours = min(((m, n) for n, m in medians.items() if n != PEER), default=None)
    if ours is None:
        headline = "no omnibert LAMB implementation ran"
    else:
        headline = f"fastest omnibert LAMB ({ours[1]}) {ours[0]:.0f} ms/step"
        if peer:
            headline += (
                f": {peer / ours[0]:.2f}x faster than torch-optimizer's Lamb ({peer:.0f} ms)"
            )
        headline += f", {ours[0] / floor_ms:.2f}x the memory-bandwidth floor ({floor_ms:.0f} ms)"
    if errors:
        headline += f"; failed: {', '.join(errors)}"
    fig, (ax,) = benchplot.figure(1, width=6.5)
    names = list(medians)
    benchplot.draw_bars(
        ax,
        f"LAMB step, BERT-{args.model} ({numel / 1e6:.0f}M parameters), {device.type}",
        "ms per step (median of rounds)",
        names,
        {"ms/step": [medians[n] for n in names]},
    )
    ax.axhline(floor_ms, color="black", linestyle="--", linewidth=1, label="bandwidth floor")
    ax.legend(frameon=False, fontsize=8)
    record = benchplot.Record(
        name="lamb" if args.model != "tiny" else "lamb-tiny",
        title="LAMB implementations against torch-optimizer and the memory-bandwidth floor",
        headline=headline,
        tables=[
            benchplot.Table(
                f"{args.rounds} rounds x {args.steps} steps, {torch.get_num_threads()} threads, "
                f"copy bandwidth {bandwidth / 1e9:.1f} GB/s ({source}), floor {BYTES_PER_PARAM} B/param "
                f"= {floor_ms:.0f} ms",
                [
                    "implementation",
                    "ms/step (median)",
                    "min",
                    "vs torch-optimizer",
                    "x floor",
                    f"x {APEX_BYTES_PER_PARAM} B",
                ],
                rows,
            )
        ],
        measurements={
            "ms_per_step": times,
            "copy_bandwidth_bytes_per_s": bandwidth,
            "floor_bandwidth_source": source,
            "floor_ms": floor_ms,
            "parameters": numel,
            "threads": torch.get_num_threads(),
            "device": str(device),
            "model": args.model,
            "floor_bytes_per_param": BYTES_PER_PARAM,
            "errors": errors,
        },
    )
    benchplot.save(record, fig, args.results_dir)


if __name__ == "__main__":
    main()
