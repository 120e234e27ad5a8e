"""Time to a held-out masked-LM accuracy on a CPU: omnibert in fp32 against bf16 autocast (and
torch.compile), what ``trainer.precision=auto`` and ``accelerator.compile=auto`` decide from.

Each variant is the real ``omnibert-train`` of :mod:`bench_time_to_accuracy` (the same demo rows,
initial weights, LAMB recipe, 32 sequences a step, MLPerf mode's evaluation cadence and stop), on
the same machine, in the harness's rounds (:mod:`benchharness`: two variants alternate, more
rotate). A round's region is a whole run; the figure is the run's own time to the target
(its evaluations' clock), not the region's seconds. The time to the target counts
everything the run does after its start (compilation included), so a variant only wins where it
pays over the whole run. Variants:

* ``fp32``: ``trainer.precision=32-true``, eager;
* ``bf16``: ``trainer.precision=bf16-mixed`` (autocast), eager;
* ``fp32+compile`` / ``bf16+compile``: the same with ``accelerator.compile=true``.

    python scripts/bench_cpu_precision.py --model tiny,small --rounds 3
    python scripts/bench_cpu_precision.py --model tiny --variants fp32,fp32+compile

On a CPU without native bf16 (AVX512-BF16/AMX) bf16 is emulated and very slow; the script says so.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

import benchplot
import torch
from bench_time_to_accuracy import SIZES, initial_weights, median_round, recipe, run_omnibert
from benchharness import Region, Turn, device_sync, run_rounds

from omnibert.accelerators.cpu_bf16 import cpu_bf16_support

VARIANTS = {
    "fp32": ("fp32", ()),
    "bf16": ("bf16", ()),
    "fp32+compile": ("fp32", ("accelerator.compile=true",)),
    "bf16+compile": ("bf16", ("accelerator.compile=true",)),
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="outputs/demo", help="make demo's output directory")
    p.add_argument("--model", default="tiny,small", help=f"sizes: {', '.join(SIZES)}")
    p.add_argument("--variants", default="fp32,bf16", help=f"of {', '.join(VARIANTS)}")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="sequences a step")
    p.add_argument("--eval-every", type=int, default=1600, help="training sequences")
    p.add_argument("--max-steps", type=int, help="override every size's step budget")
    p.add_argument("--target", type=float, help="override every size's target accuracy")
    p.add_argument("--seed", type=int, default=1234)
    benchplot.add_arguments(p)
    args = p.parse_args(argv)
    args.sizes = [s.strip() for s in args.model.split(",") if s.strip()]
    args.variant_names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for value, known, flag in ((args.sizes, SIZES, "--model"), (args.variant_names, VARIANTS,
                               "--variants")):  # fmt: skip
        unknown = [v for v in value if v not in known]
        if unknown:
            p.error(f"{flag} {','.join(unknown)}: choose from {', '.join(known)}")
    # what bench_time_to_accuracy.run_omnibert reads
    args.batch_unit, args.lr, args.warmup = "sequences", None, None
    return args


def time_variants(
    args: argparse.Namespace, name: str, size: Any, init: Path, work: Path
) -> dict[str, list[dict[str, Any]]]:
    """Each variant's runs of ``name`` to its target, in ``--rounds`` harness rounds."""

    def variant(label: str) -> Any:
        def region(turn: Turn) -> dict[str, Any]:
            precision, extra = VARIANTS[label]
            args.precision = precision
            return run_omnibert(args, size, init, work, f"{name}-{label}-{turn.index}", extra)

        return region

    def ran(region: Region) -> None:
        res = region.value
        got = "missed" if res["seconds"] is None else f"{res['seconds']:.1f} s"
        print(f"  [{region.turn.index}] {region.peer:13s} {got} to {size.target}, "
              f"{res['steps']} steps", flush=True)  # fmt: skip

    rounds = run_rounds({v: variant(v) for v in args.variant_names}, rounds=args.rounds,
                        sync=device_sync("cpu"), after_region=ran)  # fmt: skip
    return {v: rounds.values(v) for v in args.variant_names}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    data = Path(args.data)
    if not (data / "train").exists():
        raise SystemExit(f"{data / 'train'} is missing: run `make demo` first (or --data).")
    support = cpu_bf16_support()
    print(f"bf16 on this CPU: {'native' if support.native else 'EMULATED'} ({support.reason})")
    report: dict[str, Any] = {
        "threads": args.threads,
        "batch": args.batch,
        "eval_every": args.eval_every,
        "bf16": support.to_dict(),
        "variants": args.variant_names,
        "sizes": [],
    }
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.sizes:
            size = recipe(args, name)
            init = initial_weights(size, args.seed, work, data / "vocab.txt")
            print(f"bert-{name}: target {size.target}, at most {size.max_steps} steps", flush=True)
            runs = time_variants(args, name, size, init, work)
            result: dict[str, Any] = {"size": name, "variants": {}}
            for variant, results in runs.items():
                times = [x["seconds"] for x in results]
                reached = [t for t in times if t is not None]
                result["variants"][variant] = {
                    "rounds": results,
                    "reached": len(reached),
                    "median_seconds": statistics.median(reached)
                    if len(reached) == len(times)
                    else None,
                    "median_steps": statistics.median(x["steps"] for x in results),
                }
            base = result["variants"][args.variant_names[0]]["median_seconds"]
            cells = [f"bert-{name}"]
            for variant in args.variant_names:
                seconds = result["variants"][variant]["median_seconds"]
                ratio = (base / seconds) if base and seconds else None
                result["variants"][variant]["speedup"] = ratio
                cells.append(
                    "missed"
                    if seconds is None
                    else f"{seconds:.1f} s ({ratio:.2f}x)"
                    if ratio
                    else f"{seconds:.1f} s"
                )
            rows.append(cells)
            print("  " + " | ".join(cells), flush=True)
            report["sizes"].append(result)
    fig = None
    if report["sizes"]:
        fig, axes = benchplot.figure(len(report["sizes"]))
        for ax, size_result in zip(axes, report["sizes"], strict=True):
            series = {}
            for variant, side in size_result["variants"].items():
                curve = median_round(side)["curve"]
                series[variant] = ([p[0] for p in curve], [p[3] for p in curve])
            benchplot.draw_curves(
                ax, f"bert-{size_result['size']}", "seconds", "held-out MLM accuracy", series,
                target=SIZES[size_result["size"]].target,
            )  # fmt: skip
    first = args.variant_names[0]
    headline = "; ".join(
        f"bert-{s['size']}: "
        + ", ".join(
            f"{v} {d['speedup']:.2f}x"
            for v, d in s["variants"].items()
            if v != first and d["speedup"]
        )
        for s in report["sizes"]
    )
    record = benchplot.Record(
        name="cpu_precision",
        title=f"Time to a held-out masked-LM accuracy on a CPU: variants against {first}",
        headline=f"speed-up to the target against {first} (medians): {headline}",
        command=benchplot.command_line(None if argv is None else [__file__, *argv]),
        tables=[
            benchplot.Table(
                f"{args.batch} sequences a step, {args.threads} threads, bf16 "
                f"{'native' if support.native else 'emulated'}; seconds to the target (median) "
                f"and speed-up against {first}",
                ["model", *args.variant_names],
                rows,
            )
        ],
        measurements=report,
    )
    benchplot.save(record, fig, args.results_dir)
    return report


if __name__ == "__main__":
    main()
