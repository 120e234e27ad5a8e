"""Modern against classic at equal wall time on this CPU: held-out masked-LM accuracy after the
same minutes of ``omnibert-train`` (bert-mini against modern_mini by default).

Each model runs the real ``omnibert-train`` of :mod:`bench_time_to_accuracy` (the demo rows,
online packing, LAMB with linear warmup and decay, 32 sequences a step, MLPerf mode's
evaluation on the whole held-out set) from a seeded initial model, with a step budget sized to
the minutes: a short probe run measures the model's rate (training plus its evaluations), the
budget is the minutes times that rate, and the learning-rate schedule spans that budget (its
warmup the recipe's share of it), so each model finishes its own full schedule in about the
same time. No target stops a run (it is set out of reach); each run is evaluated ten times, at
equal fractions of its budget, the last within 1 % of its last step. BERT sizes train masked-LM plus
next-sentence prediction (their recipe), the modern ones masked-LM only (theirs); the held-out
figure compared is masked-LM accuracy for both. The record is ``equal_time.json`` / ``.svg``
(accuracy against minutes).

Its loop is its own, not the harness's rounds (:mod:`benchharness`): each model trains once,
one after the other, on a budget sized from its own probe, and the figure is the accuracy
those minutes reach, not a rate timed against a peer in alternating rounds; a second round
would double a run of many minutes to refine nothing it reports.

    make demo   # the demo corpus
    python scripts/bench_equal_time.py --minutes 15                    # bert-mini vs modern_mini
    python scripts/bench_equal_time.py --models tiny,modern_tiny --minutes 2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

import benchplot
import torch
from bench_time_to_accuracy import (
    MODERN_SIZES,
    SIZES,
    initial_weights,
    label,
    require_demo_data,
    run_omnibert,
)

from omnibert.accelerators.cpu_bf16 import bench_precision

#: evaluations per run (the last at the last step)
EVALUATIONS = 10
#: a target no run reaches, so the step budget ends each run
UNREACHABLE = 0.999
#: evaluations fall every this share of 1/EVALUATIONS of the budget's sequences (at the
#: probe's sequences a step: packed steps hold about, not exactly, the batch), so the last
#: one still falls before the end
CADENCE = 0.99


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="outputs/demo", help="make demo's output directory")
    p.add_argument("--models", default="mini,modern_mini",
                   help=f"sizes, comma separated: {', '.join([*SIZES, *MODERN_SIZES])}")  # fmt: skip
    p.add_argument("--minutes", type=float, default=15.0, help="wall time each model trains")
    p.add_argument("--probe-steps", type=int, default=60,
                   help="steps of the probe run that measures each model's rate")  # fmt: skip
    p.add_argument("--batch", type=int, default=32, help="sequences a step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", choices=("32", "fp32", "bf16", "auto"), default="32")
    p.add_argument("--seed", type=int, default=1234)
    benchplot.add_arguments(p)
    args = p.parse_args(argv)
    args.sizes = [s.strip() for s in args.models.split(",") if s.strip()]
    known = {**SIZES, **MODERN_SIZES}
    unknown = [s for s in args.sizes if s not in known]
    if unknown or not args.sizes:
        p.error(f"--models {args.models!r}: choose from {', '.join(known)}")
    if args.minutes <= 0 or args.probe_steps < 4:
        p.error("--minutes must be positive and --probe-steps at least 4")
    args.precision = "fp32" if args.precision == "32" else args.precision
    # what run_omnibert reads beyond these: sequences a step, its evaluation cadence
    args.batch_unit, args.eval_every = "sequences", args.batch
    return args


def budget_steps(rate: float, evaluation: float, start: float, minutes: float, batch: int) -> int:
    """Steps of ``batch`` sequences that ``minutes`` hold at ``rate`` sequences/s besides the
    run's start-up (``start`` s) and its :data:`EVALUATIONS` evaluations of ``evaluation`` s
    each, rounded down to a multiple of :data:`EVALUATIONS`."""
    training = minutes * 60 - start - EVALUATIONS * evaluation
    steps = int(training * rate / batch) // EVALUATIONS * EVALUATIONS
    return max(steps, EVALUATIONS)


def evaluation_seconds(mlperf_log: Path) -> list[float]:
    """Each evaluation's duration, from the compliance log's ``eval_start`` / ``eval_stop``."""
    times: dict[str, list[float]] = {"eval_start": [], "eval_stop": []}
    for line in mlperf_log.read_text().splitlines():
        if ":::MLLOG" in line:
            entry = json.loads(line.split(":::MLLOG", 1)[1])
            if entry.get("key") in times:
                times[entry["key"]].append(entry["time_ms"] / 1000)
    return [
        stop - start for start, stop in zip(times["eval_start"], times["eval_stop"], strict=False)
    ]


def probe_rate(curve: list[tuple[float, int, int, float]], evaluation: float) -> float:
    """Training sequences/s between the probe's last two evaluations (the first step's
    start-up is before them), the evaluation between them taken out."""
    if len(curve) < 2:
        raise SystemExit(f"bench_equal_time: the probe evaluated fewer than twice: {curve}")
    (s0, n0, _, _), (s1, n1, _, _) = curve[-2], curve[-1]
    if s1 - s0 <= evaluation or n1 <= n0:
        raise SystemExit(f"bench_equal_time: the probe's evaluations are not apart: {curve}")
    return (n1 - n0) / (s1 - s0 - evaluation)


def run_model(args: argparse.Namespace, name: str, work: Path) -> dict[str, Any]:
    size = {**SIZES, **MODERN_SIZES}[name]
    vocab = Path(args.data) / "vocab.txt"
    init = initial_weights(size, args.seed, work, vocab)
    share = size.warmup / size.max_steps
    half = args.probe_steps // 2
    # one step past two evaluations' worth: packed steps hold about, not exactly, --batch
    # sequences, and steps a little short of it would leave the second evaluation unreached
    probe_size = dataclasses.replace(size, max_steps=2 * half + 1,
                                     warmup=max(1, round(share * 2 * half)), target=UNREACHABLE)  # fmt: skip
    probe_args = argparse.Namespace(
        **{**vars(args), "eval_every": int(CADENCE * half * args.batch)}
    )
    probe = run_omnibert(probe_args, probe_size, init, work, f"{name}-probe")
    evaluation = max(evaluation_seconds(work / f"{name}-probe-out" / "mlperf.log"))
    rate = probe_rate(probe["curve"], evaluation)
    # the first evaluation's time, less its evaluation and its steps at the steady rate
    first_seconds, first_samples = probe["curve"][0][0], probe["curve"][0][1]
    start = max(first_seconds - evaluation - first_samples / rate, 0.0)
    steps = budget_steps(rate, evaluation, start, args.minutes, args.batch)
    print(f"bench_equal_time: {label(name)}: the probe trained {rate:.1f} sequences/s, "
          f"evaluated in {evaluation:.1f} s, started in {start:.1f} s -> {steps} steps for "
          f"{args.minutes:g} min", flush=True)  # fmt: skip
    recipe = dataclasses.replace(size, max_steps=steps, warmup=max(1, round(share * steps)),
                                 target=UNREACHABLE)  # fmt: skip
    every = int(CADENCE * steps * probe["sequences_per_step"] / EVALUATIONS)
    run_args = argparse.Namespace(**{**vars(args), "eval_every": every})
    result = run_omnibert(run_args, recipe, init, work, name)
    curve = result["curve"]
    final_seconds, _, final_step, final_accuracy = curve[-1]
    print(f"bench_equal_time: {label(name)}: held-out MLM accuracy {final_accuracy:.4f} after "
          f"{final_step} steps, {final_seconds / 60:.1f} min", flush=True)  # fmt: skip
    return {
        "model": name,
        "recipe": dataclasses.asdict(recipe),
        "probe_sequences_per_sec": rate,
        "probe_evaluation_seconds": evaluation,
        "probe_start_seconds": start,
        "steps": final_step,
        "sequences": curve[-1][1],
        "minutes": final_seconds / 60,
        "accuracy": final_accuracy,
        "sequences_per_step": result["sequences_per_step"],
        "curve": curve,
    }


def save_record(
    args: argparse.Namespace, runs: list[dict[str, Any]], report: dict[str, Any]
) -> None:
    rows = [
        [label(r["model"]), f"{r['steps']:,}", f"{r['sequences']:,}", f"{r['minutes']:.1f}",
         f"{r['accuracy']:.4f}"]
        for r in runs
    ]  # fmt: skip
    best = max(runs, key=lambda r: r["accuracy"])
    series = {label(r["model"]): ([p[0] / 60 for p in r["curve"]], [p[3] for p in r["curve"]])
              for r in runs}  # fmt: skip
    title = f"Held-out masked-LM accuracy after {args.minutes:g} minutes of training"
    fig = benchplot.curves(title, "minutes", "held-out MLM accuracy", series)
    record = benchplot.Record(
        name="equal_time",
        title=title,
        headline="; ".join(f"{row[0]} {row[4]}" for row in rows)
        + f" (best: {label(best['model'])})",
        command=benchplot.command_line(),
        machine=benchplot.machine(),
        tables=[
            benchplot.Table(
                f"{args.batch} sequences a step, {args.precision}, {args.threads} threads, "
                "each model's full schedule sized to the minutes",
                ["model", "steps", "sequences", "minutes", "held-out MLM accuracy"],
                rows,
            )
        ],
        measurements=report,
    )
    benchplot.save(record, fig, args.results_dir)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    require_demo_data(Path(args.data))
    args.precision, why = bench_precision(args.precision)
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench_equal_time-") as tmp:
        for name in args.sizes:
            runs.append(run_model(args, name, Path(tmp)))
    report = {"command": benchplot.command_line(), "minutes": args.minutes,
              "precision": args.precision, "precision_why": why, "threads": args.threads,
              "batch": args.batch, "runs": runs}  # fmt: skip
    print(json.dumps({r["model"]: round(r["accuracy"], 4) for r in runs}))
    save_record(args, runs, report)
    return report


if __name__ == "__main__":
    main()
