"""LAMB step time on BERT's parameter set against torch-optimizer and the memory floor.

Runs every implementation on the same parameters and gradients (BERT-base: 110M parameters in
206 tensors; ``--model large``: 335M in 398), in alternating rounds (the order rotates each
round, so drift in machine load hits all of them alike), and prints the median ms/step, the
speed-up over ``torch_optimizer.Lamb`` measured in the same run, and the ratio to the
memory-bandwidth floor: the bytes a LAMB step must move per fp32 parameter over the copy
bandwidth measured here (``dst.copy_(src)``, best of several, between rounds).

The floor is 44 B/param: the global gradient norm reads g (4), since the clip factor must be
known before the moments; the moments read g, p, m, v and write m, v (24); the trust ratio
needs whole-tensor norms of the update, so the update is applied in a second pass that reads
m, v (or a stored update written and read: the same 8) and reads and writes p (8). The
multi-tensor Triton kernel moves exactly that; apex's accounting with a separate norm pass
(52 B) is printed too. Every timed region starts and ends with a device synchronisation.

    python scripts/bench_lamb.py                       # CPU, all threads
    python scripts/bench_lamb.py --threads 1 --rounds 5
    python scripts/bench_lamb.py --device cuda         # adds the multi-tensor Triton kernel
    python scripts/bench_lamb.py --device cuda --model large

Needs the ``bench`` extra (torch-optimizer) for the peer; without it the peer is skipped.
Goal on a GPU: the Triton kernel within 1.3x of the floor.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import benchplot
import torch

from omnibert.optim import Lamb

BYTES_PER_PARAM = 44  # the floor (module docstring)
APEX_BYTES_PER_PARAM = 52  # with a separate pass for the norms
MODELS = {"base": (768, 3072, 12), "large": (1024, 4096, 24)}


def bert_shapes(model: str = "base", vocab: int = 30528) -> list[tuple[int, ...]]:
    """Parameter shapes of BERT for pretraining (MLM head decoder tied to the embeddings)."""
    hidden, ffn, layers = MODELS[model]
    h = hidden
    shapes = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(layers):
        shapes += [(h, h), (h,)] * 4 + [(h,), (h,), (ffn, h), (ffn,), (h, ffn), (h,), (h,), (h,)]
    shapes += [(h, h), (h,), (h, h), (h,), (h,), (h,), (vocab,), (2, h), (2,)]
    return shapes


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (timings must not stop before the kernels do)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def copy_bandwidth(device: torch.device, numel: int = 64_000_000, repeats: int = 20) -> float:
    """Best-of-N ``dst.copy_(src)`` bandwidth in bytes/s (counting the read and the write)."""
    src = torch.ones(numel, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = float("inf")
    for _ in range(repeats):
        sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        sync(device)
        best = min(best, time.perf_counter() - t)
    return 2 * 4 * numel / best


def make_steppers(params, impls: list[str]) -> dict[str, Callable[[], None]]:
    named = [(f"p{i}.{'bias' if p.dim() == 1 else 'weight'}", p) for i, p in enumerate(params)]
    steppers: dict[str, Callable[[], None]] = {}
    for impl in impls:
        if impl == "torch-optimizer":
            try:
                import torch_optimizer
            except ImportError:
                print("torch-optimizer is not installed (pip install -e '.[bench]'): peer skipped")
                continue
            peer = torch_optimizer.Lamb(params, lr=1e-3, weight_decay=0.01)
            steppers[impl] = peer.step
        else:
            opt = Lamb(named, lr=1e-3, no_weight_decay=["bias"], impl=impl)
            steppers[impl] = opt.step
    return steppers


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", choices=sorted(MODELS), default="base")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per round and implementation")
    ap.add_argument("--impls", nargs="*", default=None)
    benchplot.add_arguments(ap)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    impls = args.impls or (
        ["triton", "foreach", "reference", "torch-optimizer"]
        if device.type == "cuda"
        else ["compiled", "foreach", "reference", "torch-optimizer"]
    )
    gen = torch.Generator().manual_seed(0)
    params = []
    for shape in bert_shapes(args.model):
        p = torch.nn.Parameter((torch.randn(shape, generator=gen) * 0.02).to(device))
        p.grad = (torch.randn(shape, generator=gen) * 1e-3).to(device)
        params.append(p)
    numel = sum(p.numel() for p in params)
    print(
        f"device {device}, threads {torch.get_num_threads()}, {len(params)} tensors, {numel / 1e6:.1f}M parameters"
    )
    bandwidths = [copy_bandwidth(device)]

    steppers = make_steppers(params, impls)
    for name, step in steppers.items():  # first step: state allocation, compilation
        sync(device)
        t = time.perf_counter()
        step()
        sync(device)
        print(f"  first step {name:16s} {time.perf_counter() - t:8.2f} s (allocation/compilation)")
    times: dict[str, list[float]] = {name: [] for name in steppers}
    order = list(steppers)
    for r in range(args.rounds):
        bandwidths.append(copy_bandwidth(device))  # measured between rounds, best one kept
        for name in order[r % len(order) :] + order[: r % len(order)]:
            sync(device)
            t = time.perf_counter()
            for _ in range(args.steps):
                steppers[name]()
            sync(device)
            times[name].append((time.perf_counter() - t) / args.steps * 1e3)
    bandwidth = max(bandwidths)
    floor_ms = BYTES_PER_PARAM * numel / bandwidth * 1e3
    apex_ms = APEX_BYTES_PER_PARAM * numel / bandwidth * 1e3
    spread = ", ".join(f"{b / 1e9:.1f}" for b in bandwidths)
    print(f"\ncopy bandwidth {bandwidth / 1e9:.1f} GB/s (best of per-round measurements: {spread})")
    print(
        f"floor: {BYTES_PER_PARAM} B/param x {numel / 1e6:.1f}M / bandwidth = {floor_ms:.2f} "
        f"ms/step ({APEX_BYTES_PER_PARAM} B/param with a separate norm pass: {apex_ms:.2f} ms)"
    )
    peer = statistics.median(times["torch-optimizer"]) if "torch-optimizer" in times else None
    print(
        f"\n{'implementation':16s} {'ms/step':>9s} {'min':>9s} {'vs torch-optimizer':>19s}"
        f" {'x floor':>8s} {'x 52 B':>7s}"
    )
    rows = []
    for name, ts in times.items():
        med = statistics.median(ts)
        speedup = f"{peer / med:.2f}x faster" if peer else "n/a"
        print(
            f"{name:16s} {med:9.2f} {min(ts):9.2f} {speedup:>19s} {med / floor_ms:8.2f}"
            f" {med / apex_ms:7.2f}"
        )
        rows.append(
            [
                name,
                f"{med:.2f}",
                f"{min(ts):.2f}",
                speedup,
                f"{med / floor_ms:.2f}",
                f"{med / apex_ms:.2f}",
            ]
        )
    save_results(args, device, numel, bandwidth, floor_ms, times, peer, rows)


def save_results(args, device, numel, bandwidth, floor_ms, times, peer, rows) -> None:
    """lamb.json + lamb.svg: ms/step per implementation next to torch-optimizer and the floor."""
    medians = {name: statistics.median(ts) for name, ts in times.items()}
    ours = min((m, n) for n, m in medians.items() if n != "torch-optimizer")
    headline = f"fastest omnibert LAMB ({ours[1]}) {ours[0]:.0f} ms/step"
    if peer:
        headline += f": {peer / ours[0]:.2f}x faster than torch-optimizer's Lamb ({peer:.0f} ms)"
    headline += f", {ours[0] / floor_ms:.2f}x the memory-bandwidth floor ({floor_ms:.0f} ms)"
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
        name="lamb",
        title="LAMB implementations against torch-optimizer and the memory-bandwidth floor",
        headline=headline,
        tables=[
            benchplot.Table(
                f"{args.rounds} rounds x {args.steps} steps, {torch.get_num_threads()} threads, "
                f"copy bandwidth {bandwidth / 1e9:.1f} GB/s, floor {BYTES_PER_PARAM} B/param "
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
            "floor_ms": floor_ms,
            "parameters": numel,
            "threads": torch.get_num_threads(),
            "device": str(device),
            "model": args.model,
            "floor_bytes_per_param": BYTES_PER_PARAM,
        },
    )
    benchplot.save(record, fig, args.results_dir)


if __name__ == "__main__":
    main()
