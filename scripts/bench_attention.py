"""Unpadding on the CPU: ``omnibert-train`` unpacked with ``model.config.attention=varlen``
against the padded path (``math`` with attention dropout, as ``auto`` chose before varlen
existed; ``--peer sdpa`` for the other one), same data, model, steps and seed.

Each round (the harness's, :mod:`benchharness`) runs one ``omnibert-train`` process per
backend, alternating which goes first, on generated rows: at seq 128 like Google's generator (90 % full rows), at seq 512 with the
Wikipedia sequence-length histogram (about 50 % padding). The rate is not the round's seconds but the training callback's
steady-state step time (from its first logging point on, so start-up is excluded), and the
process's CPU seconds (start-up included; steadier than wall time on a shared machine). Prints
each round, the medians and the median of the per-round ratios peer/varlen (> 1: varlen is
faster), and writes a record per sequence length (``attention-seq<S>.json`` and ``.svg``: rows/s
per round as bars, the ratios) to ``--results-dir``. The run directories go to a temporary
folder.

    python scripts/bench_attention.py                                  # bert_small, 2 rounds
    python scripts/bench_attention.py --model bert_base --steps 6 --rounds 3
    python scripts/bench_attention.py --seq 512 --histogram /path/to/histogram.json
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchplot
from benchharness import Rounds, Turn, device_sync, run_rounds

#: the Wikipedia seq-512 length histogram (Graphcore's, as the packing benchmarks use)
HISTOGRAM = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/wikipedia_seqlen_histogram_512.json"
)
MASKS = {128: 20, 512: 76}


def train(
    backend: str, seq: int, args: argparse.Namespace, root: Path, histogram: Path | None
) -> dict[str, float]:
    """One omnibert-train run; its throughput summary."""
    name = f"{backend}-{seq}-{len(list(root.iterdir()))}"
    overrides = [
        f"model={args.model}",
        f"model.config.attention={backend}",
        "data=generated",
        "data.num_workers=0",
        "data.num_eval_samples=0",
        f"data.num_train_samples={args.steps * args.batch * 4}",
        f"phase.max_seq_length={seq}",
        f"phase.max_predictions_per_seq={MASKS.get(seq, max(1, round(seq * 0.15)))}",
        f"phase.global_batch_size={args.batch}",
        f"micro_batch_size={args.batch}",
        f"phase.max_steps={args.steps}",
        "logger=none",
        "trainer.enable_progress_bar=false",
        "trainer.log_every_n_steps=1",
        f"run_name={name}",
        f"paths.output_root={root}",
        "seed=7",
    ]
    if histogram is not None:
        overrides.append(f"data.length_histogram={histogram}")
    command = [sys.executable, "-m", "omnibert.apps.train", *overrides]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"omnibert-train failed ({' '.join(command)}):\n{done.stderr[-3000:]}")
    summaries = sorted(root.glob(f"{name}/**/summary.json"))
    if not summaries:
        sys.exit(f"no summary.json for {name} under {root}:\n{done.stdout[-2000:]}")
    speed: dict[str, float] = json.loads(summaries[0].read_text())["throughput"]
    # the whole process's CPU seconds (start-up included): steadier than wall time when
    # other work shares the cores
    speed["cpu_seconds"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="bert_small", help="a conf/model config name")
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=8, help="rows per step")
    parser.add_argument("--steps", type=int, default=4, help="steps per run (the first is warm-up)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--peer", default="math", choices=["math", "sdpa"])
    parser.add_argument(
        "--histogram",
        type=Path,
        default=HISTOGRAM,
        help="a length histogram JSON, used at seq > 128",
    )
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    print(
        f"omnibert-train {args.model}, {args.batch} rows per step, {args.steps} steps, "
        f"varlen against {args.peer}, fp32, attention dropout 0.1"
    )
    with tempfile.TemporaryDirectory(prefix="bench_attention_") as tmp:
        for seq in args.seq:
            measure(args, seq, Path(tmp) / f"seq{seq}")


def measure(args: argparse.Namespace, seq: int, root: Path) -> None:
    """``--rounds`` harness rounds of both backends at ``seq`` (a run folder per pass under
    ``root``), printed, and the record of the sequence length."""
    histogram = args.histogram.resolve() if seq > 128 else None

    def backend(name: str) -> Any:
        def region(turn: Turn) -> dict[str, float]:
            (root / turn.tag).mkdir(parents=True, exist_ok=True)
            return train(name, seq, args, root / turn.tag, histogram)

        return region

    def report(index: int, rounds: Rounds) -> None:
        speeds = {r.peer: r.value for r in rounds.regions if r.turn.index == index}
        print(
            f"  seq {seq} round {index}: "
            + ", ".join(
                f"{b} {speeds[b]['step_time']:.2f} s/step ({speeds[b]['cpu_seconds']:.1f} "
                "CPU s per process)"
                for b in rounds.orders[index]
            )
            + f", ratio {speeds[args.peer]['step_time'] / speeds['varlen']['step_time']:.3f}"
            + f", CPU {speeds[args.peer]['cpu_seconds'] / speeds['varlen']['cpu_seconds']:.3f}"
            + f" (padding {speeds['varlen']['padding_fraction']:.2f})"
        )

    rounds = run_rounds({b: backend(b) for b in (args.peer, "varlen")}, rounds=args.rounds,
                        sync=device_sync("cpu"), after_round=report)  # fmt: skip
    peer, ours = rounds.values(args.peer), rounds.values("varlen")
    times = {args.peer: [v["step_time"] for v in peer],
             "varlen": [v["step_time"] for v in ours]}  # fmt: skip
    ratios = [p["step_time"] / o["step_time"] for p, o in zip(peer, ours, strict=True)]
    cpu_ratios = [p["cpu_seconds"] / o["cpu_seconds"] for p, o in zip(peer, ours, strict=True)]
    padding = ours[-1]["padding_fraction"]
    benchplot.save_throughput(
        args.results_dir,
        f"attention-seq{seq}",
        "Unpadding on the CPU: omnibert-train with model.config.attention=varlen against "
        f"the padded {args.peer} path",
        f"{args.model}, seq {seq}, {args.batch} unpacked rows a step, fp32, attention "
        f"dropout 0.1, padding {padding:.2f}",
        {
            "varlen": [args.batch / t for t in times["varlen"]],
            args.peer: [args.batch / t for t in times[args.peer]],
        },
        ratios,
        extra={"step_seconds": times, "cpu_second_ratios": cpu_ratios},
        unit="rows/s",
        peer=args.peer,
        ours="varlen",
    )
    print(
        f"seq {seq}: median {args.peer} {statistics.median(times[args.peer]):.2f} s/step, "
        f"varlen {statistics.median(times['varlen']):.2f} s/step; {args.peer}/varlen "
        f"{statistics.median(ratios):.3f} (median of per-round ratios; process CPU seconds "
        f"{statistics.median(cpu_ratios):.3f})"
    )


if __name__ == "__main__":
    main()
