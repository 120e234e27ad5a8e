"""Packing algorithms on the BERT Wikipedia length histogram against the published figures.

Prints, per algorithm: efficiency (real tokens / pack tokens), speed-up (sequences / packs),
the median runtime over `--repeats` runs after one warm-up (the warm-up loads or compiles
the numba solver; its time is printed too), the figures Krell et al. publish for the same
histogram (arXiv 2107.02027; graphcore/examples packedBERT README, stored in the fixture's
``published_results_on_this_histogram``) and the ratio published runtime / ours.
Published runtimes were measured on another machine; the peer measured here, in the same
run, is NNLSHP's least-squares step solved by ``scipy.optimize.nnls`` (the paper's solver),
printed when scipy is installed.

    python scripts/bench_packing.py
    python scripts/bench_packing.py --repeats 3 --no-scipy --no-depth4
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from omnibert.packing import PackPlan, pack_histogram, pack_lengths
from omnibert.packing.nnlshp import SHORT_LENGTH, SHORT_LENGTH_WEIGHT, exact_fill_strategies

FIXTURE = Path(__file__).resolve().parents[1] / "tests/fixtures/wikipedia_seqlen_histogram_512.json"

# (label, algorithm, max_sequences_per_pack, options, published key prefix or None)
RUNS: list[tuple[str, str, int, dict[str, Any], str | None]] = [
    ("SPFHP", "spfhp", 12, {}, "SPFHP_max12"),
    ("LPFHP", "lpfhp", 12, {}, "LPFHP_max12"),
    ("NNLSHP depth 3", "nnlshp", 3, {}, "NNLSHP_depth3"),
    ("NNLSHP d3, paper residual", "nnlshp", 3, {"residual": "single"}, "NNLSHP_depth3"),
    ("FFD (baseline)", "ffd", 12, {}, None),
    ("LPFHP max 16", "lpfhp", 16, {}, None),
    ("LPFHP unlimited", "lpfhp", 512, {}, None),
    ("NNLSHP d3, max 12", "nnlshp", 12, {}, None),
]
DEPTH4 = ("NNLSHP depth 4", "nnlshp", 4, {"depth": 4}, None)


def timed(run: tuple[str, str, int, dict[str, Any], str | None], counts: Any, repeats: int):
    _, algorithm, limit, options, _ = run
    start = time.perf_counter()
    plan = pack_histogram(counts, 512, limit, algorithm, **options)
    first = time.perf_counter() - start
    times = [plan.runtime_s]
    for _ in range(repeats - 1):
        times.append(pack_histogram(counts, 512, limit, algorithm, **options).runtime_s)
    return plan, first, statistics.median(times)


def scipy_nnls_seconds(counts: Any) -> float | None:
    """The paper's least-squares step (dense matrix, scipy.optimize.nnls) on this histogram."""
    try:
        from scipy.optimize import nnls
    except ImportError:
        return None
    strategies = exact_fill_strategies(512, 3)
    matrix = np.zeros((512, len(strategies)))
    for column, strategy in enumerate(strategies):
        for length in strategy[strategy > 0]:
            matrix[length - 1, column] += 1
    weights = np.ones(512)
    weights[:SHORT_LENGTH] = SHORT_LENGTH_WEIGHT
    start = time.perf_counter()
    nnls(weights[:, None] * matrix, weights * np.asarray(counts, dtype=np.float64))
    return time.perf_counter() - start


def row(label: str, plan: PackPlan, first: float, median: float, published: dict, key: str | None):
    eff = f"{plan.efficiency:.6f}"
    spd = f"{plan.speedup:.5f}"
    pub_eff = pub_spd = pub_t = ratio = "-"
    if key is not None:
        algorithm = key.split("_")[0]
        pub_eff = f"{published[key + '_efficiency']:.6f}"
        pub_spd = f"{published[key + '_speedup']:.5f}"
        pub_time = published[f"{algorithm}_runtime_s"]
        pub_t = f"{pub_time:.3f}"
        ratio = f"{pub_time / median:.0f}x"
    print(
        f"{label:28s} {plan.max_sequences_per_pack:>4d} {eff:>9s} {pub_eff:>9s} {spd:>8s} "
        f"{pub_spd:>8s} {median:>9.4f} {pub_t:>8s} {ratio:>7s} {first:>8.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--histogram", type=Path, default=FIXTURE)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-scipy", action="store_true", help="skip the scipy NNLS peer")
    parser.add_argument("--no-depth4", action="store_true", help="skip NNLSHP at depth 4")
    parser.add_argument("--no-lengths", action="store_true", help="skip pack_lengths timing")
    parser.add_argument(
        "--online-sample",
        type=int,
        default=262144,
        help="sequences drawn from the histogram for the online-packing table (0: skip)",
    )
    args = parser.parse_args()

    data = json.loads(args.histogram.read_text())
    counts = data["counts"]
    published = data.get("published_results_on_this_histogram", {})
    lengths = np.arange(1, len(counts) + 1)
    total = int(np.sum(counts))
    bound = total * 512 / float(np.dot(lengths, counts))
    print(f"{args.histogram.name}: {total} sequences, max speed-up {bound:.4f}")
    print(
        f"{'algorithm':28s} {'max':>4s} {'eff':>9s} {'pub eff':>9s} {'speedup':>8s} "
        f"{'pub spd':>8s} {'time s':>9s} {'pub s':>8s} {'pub/us':>7s} {'1st s':>8s}"
    )
    runs = RUNS + ([] if args.no_depth4 else [DEPTH4])
    for run in runs:
        repeats = 1 if run is DEPTH4 else args.repeats
        plan, first, median = timed(run, counts, repeats)
        plan.check(counts)
        row(run[0], plan, first, median, published, run[4])
    print("time s: median pack_histogram runtime_s after a warm-up; 1st s: first call, which")
    print("loads (or, on a fresh checkout, compiles) the numba NNLS solver.")

    if not args.no_scipy:
        seconds = scipy_nnls_seconds(counts)
        if seconds is None:
            print("scipy not installed: no same-machine NNLS peer")
        else:
            ours = timed(RUNS[2], counts, args.repeats)[2]
            print(
                f"peer, same run: scipy.optimize.nnls alone takes {seconds:.2f} s on the depth-3 "
                f"matrix; our whole NNLSHP takes {ours:.3f} s ({seconds / ours:.0f}x faster)"
            )

    if not args.no_lengths:
        sequence_lengths = np.repeat(lengths, counts)
        start = time.perf_counter()
        packs = pack_lengths(sequence_lengths, 512, 12, "lpfhp", seed=0)
        seconds = time.perf_counter() - start
        print(
            f"pack_lengths (lpfhp, max 12, seed 0) on all {total} sequences: {len(packs)} packs "
            f"in {seconds:.2f} s"
        )

    if args.online_sample:
        online_table(np.repeat(lengths, counts), args.online_sample)


def online_table(population: Any, size: int) -> None:
    """Online packing (data.packing=online): efficiency of packing windows of a shuffled
    stream, per window (buffer) size and algorithm, at K=3 and P=80 (seq 512, 76 masks)."""
    from omnibert.packing.online import pack_window

    rng = np.random.default_rng(0)
    stream = rng.choice(population, size)
    masks = np.minimum(76, np.maximum(1, np.rint(stream * 0.15))).astype(np.int64)
    print(
        f"\nonline packing, K=3, P=80: {size} sequences drawn from the histogram (unpacked "
        f"efficiency {stream.sum() / (stream.size * 512):.4f})"
    )
    print(f"{'algorithm':<10}{'buffer':>8}{'efficiency':>12}{'seq/row':>9}{'us/seq':>9}")
    for algorithm in ("bfd", "nnlshp"):
        for buffer in (1024, 4096, 16384, 65536):
            pack_window(stream[:buffer], masks[:buffer], 512, 3, 80, algorithm, seed=0)  # warm
            start, rows = time.perf_counter(), 0
            for at in range(0, size, buffer):
                window = slice(at, at + buffer)
                offsets = pack_window(stream[window], masks[window], 512, 3, 80, algorithm, 0)[0]
                rows += offsets.size - 1
            seconds = time.perf_counter() - start
            print(
                f"{algorithm:<10}{buffer:>8}{stream.sum() / (rows * 512):>12.4f}"
                f"{size / rows:>9.3f}{seconds / size * 1e6:>9.1f}"
            )


if __name__ == "__main__":
    main()
