"""A restarted run's time to its first step: cold (an empty compile cache) against warm (the
cache an earlier start of the same run left in its run directory), on a CPU.

Every run is ``omnibert-train`` in a process of its own with ``accelerator.compile=true``
(torch.compile's Inductor), as a launcher starts a rank: BERT-tiny (L2-H128) on generated
data at sequence length 128, one optimiser step of 32 sequences, no validation, logger or
checkpoint, and no cache variable in its environment, so the run keeps its compiled code in
``<run dir>/compile_cache`` (:mod:`omnibert.run.pipeline.compile_cache`). ``--smoke``: the
smoke experiment's one-layer model instead, for the test. Two peers, in :mod:`benchharness` rounds (their
order alternates):

* ``cold``: a new run directory, so an empty cache: the run compiles its step;
* ``warm``: the same command again in the run directory of the latest cold run, as a restarted
  rank (torchrun ``--max-restarts``, a requeued job) starts it: the cache holds the step.

A round's region is the whole process; the figure is the **time to the first step**: from
starting the process to the end of its first optimiser step (a callback,
``scripts/first_step_clock.py``, stamps it and reads torch's cache counters there, which say
whether the step's graphs came from the cache). Each run's plan line ``compile cache ...
warm|cold`` is recorded beside. Results: ``compile-restart-cpu.json`` in ``--results-dir``.

    python scripts/bench_compile_restart.py --results-dir docs/benchmarks
    python scripts/bench_compile_restart.py --smoke --results-dir /tmp/r   # the test's run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).resolve().parent
ROOT = SCRIPTS.parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import benchplot  # noqa: E402
from benchharness import Turn, apply_presets, run_rounds  # noqa: E402

NAME = "compile-restart-cpu"
#: what keeps each run to its compile and one step: no validation, logger or checkpoint
QUIET = ["phase.max_steps=1", "val_every_n_steps=null", "data.num_eval_samples=0",
         "logger=none", "callbacks.progress_bar=null", "callbacks.checkpoint=null",
         "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
         "accelerator.compile=true"]  # fmt: skip
#: the measured command: BERT-tiny (L2-H128) at sequence length 128, one step of 32
FULL = ["model=bert_tiny", "data=generated", "phase.max_seq_length=128",
        "phase.max_predictions_per_seq=20", "phase.global_batch_size=32", "micro_batch_size=16"]  # fmt: skip
#: the test's: the smoke experiment's one-layer, 32-wide model in fp32 without dropout, its
#: kernels compiled as one C++ file per graph in scalar code (one compiler call per graph:
#: the cache is read and written alike, the cold compile takes a fraction of the time)
SMOKE = ["experiment=smoke", "phase.global_batch_size=4", "micro_batch_size=4",
         "trainer.precision=32-true", "model.config.hidden_dropout_prob=0",
         "model.config.attention_probs_dropout_prob=0",
         "+accelerator.compile_options.options={cpp_wrapper:true,cpp.vec_isa_ok:false}"]  # fmt: skip
#: variables that would choose another compile cache for the runs, or other threads
DROPPED_ENV = ("TORCHINDUCTOR_", "TRITON_CACHE_DIR", "OMNIBERT_", "OMP_", "KMP_")


def child_env() -> dict[str, str]:
    """This environment without what would choose the run's cache or threads for it; the
    scripts folder on the path (for ``first_step_clock``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED_ENV)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS), env.get("PYTHONPATH")]))
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_once(command: list[str], run_name: str, work: Path, tag: str) -> dict[str, Any]:
    """One ``omnibert-train`` process of ``command`` in run ``run_name`` under ``work``: its
    time to the first step, whole time, cache counters and the plan's compile cache line."""
    out = work / "hydra" / tag
    stamp = work / f"first-step-{tag}.json"
    overrides = [*command, *QUIET, f"run_name={run_name}", f"paths.output_root={work / 'runs'}",
                 f"hydra.run.dir={out}",
                 "+callbacks.first_step._target_=first_step_clock.FirstStepClock",
                 f"+callbacks.first_step.path={stamp}"]  # fmt: skip
    started = time.time()
    proc = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *overrides],
        cwd=work, env=child_env(), capture_output=True, text=True,
    )  # fmt: skip
    ended = time.time()
    if proc.returncode != 0:
        raise SystemExit(
            f"{tag}: omnibert-train failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
        )
    first = json.loads(stamp.read_text())
    plan = json.loads((out / "plan.json").read_text())
    return {
        "torch": first["torch"],
        "time_to_first_step_s": round(first["time"] - started, 2),
        "process_s": round(ended - started, 2),
        "counters": first["counters"],
        "compile_cache": plan["compile_cache"],
        "cache_dir": str(work / "runs" / run_name / "compile_cache"),
    }


def measure(args: argparse.Namespace, work: Path) -> tuple[dict[str, list[dict]], Any]:
    """The harness's rounds of ``cold`` and ``warm`` (module docstring)."""
    command = SMOKE if args.smoke else FULL
    runs: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    latest: list[str] = []  # the run name of the latest cold run

    def cold(turn: Turn) -> dict[str, Any]:
        name = f"cold-{turn.tag}"
        latest[:] = [name]
        result = run_once(command, name, work, f"cold-{turn.tag}")
        runs["cold"].append(result)
        print(f"  cold {turn.tag}: first step after {result['time_to_first_step_s']:.1f} s",
              flush=True)  # fmt: skip
        return result

    def warm(turn: Turn) -> dict[str, Any]:
        if not latest:  # the first round runs cold first: order_of_round(["cold", "warm"], 0)
            raise RuntimeError("warm needs a cold run before it")
        result = run_once(command, latest[0], work, f"warm-{turn.tag}")
        runs["warm"].append(result)
        print(f"  warm {turn.tag}: first step after {result['time_to_first_step_s']:.1f} s",
              flush=True)  # fmt: skip
        return result

    rounds = run_rounds({"cold": cold, "warm": warm}, rounds=args.rounds, sync=None)
    return runs, rounds


def figure_of(measurements: dict[str, Any]) -> Any:
    """Bars per round: the warm start's and the cold start's time to the first step, with
    cold ÷ warm above each round."""
    runs = measurements["runs"]
    rounds = min(len(runs["cold"]), len(runs["warm"]))
    series = {
        "warm (restart, the run's cache)": [r["time_to_first_step_s"] for r in runs["warm"]],
        "cold (first start, empty cache)": [r["time_to_first_step_s"] for r in runs["cold"]],
    }
    warm, cold = series
    return benchplot.bars(
        "time to the first step, omnibert-train with accelerator.compile=true",
        "seconds from process start",
        [f"round {i}" for i in range(rounds)],
        {name: values[:rounds] for name, values in series.items()},
        ratio_of=(cold, warm),
    )


def replot(path: Path) -> None:
    """Draw the figure of a record written without one (``--replot``) from its measurements."""
    record = benchplot.load(path)
    benchplot.save(record, figure_of(record.measurements), path.parent)


def save_record(args: argparse.Namespace, runs: dict[str, list[dict]]) -> dict[str, Any]:
    """The record: medians, the ratio, every run."""
    medians = {
        peer: statistics.median(r["time_to_first_step_s"] for r in results)
        for peer, results in runs.items()
    }
    ratio = medians["cold"] / medians["warm"]
    model = "the smoke model (L1-H32)" if args.smoke else "BERT-tiny (L2-H128)"
    headline = (
        f"{model} compiled on a CPU: a restart's first step after {medians['warm']:.1f} s "
        f"with the run's compile cache against {medians['cold']:.1f} s cold ({ratio:.1f}x "
        f"sooner; medians of {len(runs['cold'])} round(s))"
    )
    rows = [
        [peer, f"{i}", f"{r['time_to_first_step_s']:.1f}", f"{r['process_s']:.1f}",
         f"{r['counters']['inductor']['fxgraph_cache_hit']} / "
         f"{r['counters']['inductor']['fxgraph_cache_miss']}",
         r["compile_cache"].rsplit("; ", 1)[-1].split(":")[0].rstrip(")")]
        for peer, results in runs.items() for i, r in enumerate(results)
    ]  # fmt: skip
    table = benchplot.Table(
        "each run: a process of its own, one optimiser step",
        ["start", "round", "time to first step (s)", "whole process (s)",
         "compiled graphs from the cache / compiled", "plan's compile cache"],
        rows,
    )  # fmt: skip
    record = benchplot.Record(
        name=NAME,
        title="time to the first step of a restarted run, cold and warm compile cache",
        headline=headline,
        tables=[table],
        measurements={
            "median_time_to_first_step_s": medians,
            "cold_over_warm": round(ratio, 2),
            "runs": runs,
            "command": ["omnibert-train", *(SMOKE if args.smoke else FULL), *QUIET],
            "smoke": bool(args.smoke),
            "rounds": args.rounds,
        },
        notes=[
            "Time to first step: from starting the process to the end of its first optimiser "
            "step (imports, the plan, building the model and the Trainer, compiling or "
            "loading the compiled step, the step). The cold run compiles into "
            "<run dir>/compile_cache; the warm one is the same command started again, as a "
            "launcher restarts a rank, and loads the step from there."
        ],
        machine={**benchplot.machine(), "torch": runs["cold"][0]["torch"]},
    )
    benchplot.save(record, figure_of(record.measurements), args.results_dir)
    return record.measurements


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=None, help="cold/warm rounds (3)")
    parser.add_argument("--smoke", action="store_true", help="the smallest model, one round")
    parser.add_argument("--work", type=Path, default=None, help="run folders (a temporary one)")
    parser.add_argument("--replot", type=Path, help="only draw the figure of this record")
    benchplot.add_arguments(parser)
    args = parser.parse_args(argv)
    if args.replot is not None:
        replot(args.replot)
        return {}
    apply_presets(args, {"rounds": 1} if args.smoke else None, {"rounds": 3})
    with tempfile.TemporaryDirectory(prefix="bench-compile-restart-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        runs, rounds = measure(args, work)
        if rounds.errors:
            raise SystemExit(f"bench_compile_restart: {rounds.errors}")
        measured = save_record(args, runs)
    medians = measured["median_time_to_first_step_s"]
    print(
        f"time to first step: cold {medians['cold']:.1f} s, warm {medians['warm']:.1f} s "
        f"({measured['cold_over_warm']:.2f}x)",
        flush=True,
    )
    return measured


if __name__ == "__main__":
    main()
