"""A run with no tuning flags against the best hand-tuned setting on the same machine.

For each command a new user types (``experiment=demo``, ``experiment=quickstart`` on the demo's
data, and the README's first command ``model=bert_tiny data=generated``), the throughput
(sequences/s) of the settings below.

Each run's rate is its whole real run's: the app's own steady sequences/s (from its first
logging point on) with the first step's excess time (compilation, warm-up) spread over the
sequences the command really trains (:data:`REAL_SEQUENCES`), so a setting that compiles
pays for it as it would in the real run. Settings:

* ``defaults``: the command as typed (threads, micro batch, precision, compile all automatic);
* ``before``: the defaults of the previous release: the loader workers subtracted from the
  threads, the largest micro batch that fits, fp32, eager (``--no-before`` skips it);
* a small grid of hand-tuned settings: ``accelerator.threads`` ∈ {1, usable CPUs} ×
  ``trainer.precision`` ∈ {fp32, bf16 where the CPU runs it natively} × ``micro_batch_size``
  ∈ the speed probe's candidates around its choice, eager; then the grid's best with
  ``accelerator.compile=true``.

The grid runs once per command (one run per setting) to find the best; then ``--rounds``
harness rounds (:mod:`benchharness`: the order of the settings rotates each round; a
round's region is a whole run, its rate the run's own, as above) time ``defaults`` against the grid's ``--top`` settings (one run per grid
point is noisy; the best of them by median is "best") and ``before`` on the quiet machine
and with ``--competitors`` busy processes beside it (``python -c "while True: pass"``, each of
2 threads' worth when ``--competitor-threads 2``). Prints per-round rates, medians and
defaults ÷ best; the goal is ≥ 0.95x quiet and loaded. The README's first command runs
``phase.global_batch_size=1024`` (a step of the real 65,536 would take minutes for every grid
point); the seconds a real step takes at the defaults' rate are printed from the measured rate.

    python scripts/bench_defaults.py --results-dir docs/benchmarks
    python scripts/bench_defaults.py --commands demo --rounds 2     # a quicker look
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

import benchplot
from benchharness import Region, Turn, device_sync, run_rounds

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "outputs" / "demo"

#: the command a user types, and what keeps a throughput run short (validation and
#: checkpoints off; a few steps; logging every step)
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "demo": (["experiment=demo"], ["phase.max_steps=40"]),
    "quickstart": (
        ["experiment=quickstart", f"data.train_path={DEMO / 'train'}",
         f"data.eval_path={DEMO / 'eval'}", f"data.vocab_file={DEMO / 'vocab.txt'}"],
        ["phase.max_steps=40"],
    ),
    # the README's 3 steps of 65,536 sequences as 192 steps of 1,024 (the same sequences, so
    # the run's projected length, which accelerator.compile=auto reads, is the real one),
    # stopped after 60 s of training by Lightning's max_time
    "readme": (
        ["model=bert_tiny", "data=generated"],
        ["phase.max_steps=192", "phase.global_batch_size=1024", "+trainer.max_time=00:00:01:00"],
    ),
}  # fmt: skip
#: the README command's real global batch (phase1): what one of its steps holds
README_GLOBAL = 65536
#: the sequences each command's real run trains (demo: 1,000 steps of 32; quickstart: 600 of
#: 32; the README's: 3 steps of 65,536): what a run's start-up cost (compilation) is spread over
REAL_SEQUENCES = {"demo": 32_000, "quickstart": 19_200, "readme": 3 * README_GLOBAL}
QUIET = ["val_every_n_steps=null", "logger=none", "callbacks.progress_bar=null",
         "callbacks.checkpoint=null", "trainer.enable_progress_bar=false",
         "trainer.enable_model_summary=false", "trainer.log_every_n_steps=1"]  # fmt: skip


def _env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "OMNIBERT_"))}
    env["PYTHONWARNINGS"] = "ignore"
    env["OMNIBERT_CACHE_DIR"] = str(cache)
    return env


def run_once(command: str, setting: list[str], work: Path, tag: str) -> dict[str, Any]:
    """One ``omnibert-train`` of ``command`` with ``setting``'s overrides: its rate and plan."""
    typed, short = COMMANDS[command]
    tag = "".join(c if c.isalnum() or c in "-_" else "_" for c in tag)  # a Hydra-safe name
    out = work / tag
    overrides = [*typed, *short, *QUIET, *setting, f"run_name=bench-{tag}",
                 f"paths.output_root={work / 'runs'}", f"hydra.run.dir={out}"]  # fmt: skip
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *overrides],
        cwd=ROOT, env=_env(work / "cache"), capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{command} {setting} failed:\n{result.stderr[-3000:]}")
    summary = json.loads((out / "summary.json").read_text())
    plan = summary["plan"]
    throughput = summary["throughput"]
    if "samples_per_sec" not in throughput:  # fewer than two logging points: whole-run rate
        raise SystemExit(
            f"{command} {setting}: the run logged fewer than two steps (its first step took "
            "the whole time limit); rerun on a less loaded machine"
        )
    steady = float(throughput["samples_per_sec"])
    # the first step's excess over the steady rate (compilation, warm-up), spread over the
    # command's real run: the rate that run would see from its first step to its last
    overhead = max(0.0, float(throughput["train_seconds"]) - throughput["samples"] / steady)
    real = REAL_SEQUENCES[command]
    return {
        "seq_per_s": real / (overhead + real / steady),
        "steady_seq_per_s": steady,
        "first_step_overhead_s": round(overhead, 2),
        "wall_s": round(time.perf_counter() - start, 1),
        "micro_batch": plan["batch"]["micro_batch_size"],
        "threads": plan.get("threads"),
        "precision": plan.get("precision"),
        "compile": (plan.get("kernels") or {}).get("compile"),
        "micro_batch_choice": plan.get("micro_batch_choice"),
        "micro_batch_probe": plan.get("micro_batch_probe"),
    }


def competitors(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.kill()
        proc.wait()


def grid(defaults: dict[str, Any], cpus: int, bf16: bool) -> list[tuple[str, list[str]]]:
    """The hand-tuned settings around what the defaults chose."""
    probe = (defaults.get("micro_batch_probe") or {}).get("rates") or []
    sizes = [int(s) for s, _ in probe] or [defaults["micro_batch"]]
    chosen = defaults["micro_batch"]
    i = sizes.index(chosen) if chosen in sizes else 0
    micro = sorted({sizes[j] for j in (i - 1, i, i + 1) if 0 <= j < len(sizes)})
    precisions = ["32-true", "bf16-mixed"] if bf16 else ["32-true"]
    threads = sorted({1, cpus})
    out = []
    for t in threads:
        for p in precisions:
            for m in micro:
                name = f"threads {t}, {'bf16' if p.startswith('bf16') else 'fp32'}, micro {m}"
                out.append((name, [f"accelerator.threads={t}", f"trainer.precision={p}",
                                   f"micro_batch_size={m}", "accelerator.compile=false"]))  # fmt: skip
    return out


def before(command: str, cpus: int) -> list[str]:
    """The previous release's defaults: threads = CPUs - loader workers, the largest micro
    batch that fits (no probe), fp32, eager."""
    workers = {"demo": 1, "quickstart": 1, "readme": 2}[command]
    return [f"accelerator.threads={max(1, cpus - workers)}", "micro_batch_probe=false",
            "trainer.precision=32-true", "accelerator.compile=false"]  # fmt: skip


def figure_of(report: dict[str, Any]) -> Any:
    """Bars of the defaults, the best hand-tuned setting and the previous defaults (medians,
    seq/s) per command and machine state, from a report's rates."""
    groups, series = [], {"defaults": [], "best": [], "previous defaults": []}
    for command, result in report["commands"].items():
        for state, by in result["rates"].items():
            if not by:
                continue
            med = {k: statistics.median(v) for k, v in by.items()}
            groups.append(f"{command} {state}")
            series["defaults"].append(med["defaults"])
            series["best"].append(med[result[f"{state}_best"]])
            series["previous defaults"].append(med.get("before"))
    return benchplot.bars("defaults against the best hand-tuned setting", "sequences/s",
                          groups, series, ratio_of=("defaults", "best"))  # fmt: skip


def replot(path: Path) -> None:
    """Draw the figure of a record written without one (``--replot``) from its measurements."""
    record = benchplot.load(path)
    benchplot.save(record, figure_of(record.measurements), path.parent)


def time_settings(
    args: argparse.Namespace, command: str, contenders: dict[str, list[str]], state: str,
    work: Path,
) -> dict[str, list[float]]:  # fmt: skip
    """Each setting's rate (seq/s) in ``--rounds`` harness rounds, the machine ``quiet`` or
    ``loaded`` (``--competitors`` busy processes beside each run)."""

    def setting(name: str) -> Any:
        def region(turn: Turn) -> float:
            procs = competitors(args.competitors) if state == "loaded" else []
            try:
                tag = f"{command}-{state}-{name}-{turn.index}"
                return float(run_once(command, contenders[name], work, tag)["seq_per_s"])
            finally:
                stop(procs)

        return region

    def ran(region: Region) -> None:
        print(f"  {state:<6} [{region.turn.index}] {region.peer:<32} {region.value:8.1f} seq/s",
              flush=True)  # fmt: skip

    rounds = run_rounds({name: setting(name) for name in contenders}, rounds=args.rounds,
                        sync=device_sync("cpu"), after_region=ran)  # fmt: skip
    return {name: rounds.values(name) for name in contenders}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commands", default="demo,quickstart,readme")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--competitors", type=int, default=1, help="busy processes when loaded")
    p.add_argument("--no-before", action="store_true")
    p.add_argument("--no-loaded", action="store_true")
    p.add_argument("--top", type=int, default=3, help="grid settings timed in the rounds")
    p.add_argument("--name", default="defaults", help="the record's name")
    p.add_argument("--only", action="append", default=[],
                   help="a grid point by name (e.g. 'threads 2, bf16, micro 256, compile'): "
                   "no grid, the named points go to the rounds (repeatable)")  # fmt: skip
    benchplot.add_arguments(p)
    p.add_argument("--replot", type=Path, help="only draw the figure of this record")
    args = p.parse_args(argv)
    if args.replot is not None:
        replot(args.replot)
        return {}
    from omnibert.accelerators.cpu_bf16 import cpu_bf16_support
    from omnibert.threads import usable_cpus

    cpus, how = usable_cpus()
    support = cpu_bf16_support()
    commands = [c.strip() for c in args.commands.split(",") if c.strip()]
    if any(c in ("demo", "quickstart") for c in commands) and not (DEMO / "train").exists():
        raise SystemExit(f"{DEMO / 'train'} is missing: run `make demo` first.")
    print(f"bench_defaults: {cpus} usable CPUs ({how}); bf16 "
          f"{'native' if support.native else 'emulated'}", flush=True)  # fmt: skip
    report: dict[str, Any] = {"cpus": cpus, "bf16_native": support.native, "commands": {}}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for command in commands:
            first = run_once(command, [], work, f"{command}-defaults-probe")
            print(f"{command}: defaults chose micro {first['micro_batch']}, {first['threads']}, "
                  f"{first['precision']}, compile {first['compile']}: "
                  f"{first['seq_per_s']:.1f} seq/s", flush=True)  # fmt: skip
            found: dict[str, float] = {}
            settings = dict(grid(first, cpus, support.native))
            for name in args.only:  # grid points named: no grid, these go to the rounds
                base = name.removesuffix(", compile")
                settings[name] = [*settings[base][:-1], f"accelerator.compile={name != base}"]
                found[name] = 0.0
            for name, overrides in settings.items() if not args.only else ():
                res = run_once(command, overrides, work, f"{command}-grid-{len(found)}")
                found[name] = res["seq_per_s"]
                print(f"  grid  {name:<32} {res['seq_per_s']:8.1f} seq/s", flush=True)
            if not args.only:
                eager = max(found, key=lambda k: found[k])
                compiled = [*settings[eager][:-1], "accelerator.compile=true"]
                settings[f"{eager}, compile"] = compiled
                res = run_once(command, compiled, work, f"{command}-grid-c")
                found[f"{eager}, compile"] = res["seq_per_s"]
                print(f"  grid  {eager + ', compile':<32} {res['seq_per_s']:8.1f} seq/s",
                      flush=True)  # fmt: skip
            # one run per grid point is noisy: the top three go on to the alternating rounds,
            # and the best of them by median is "best"
            top = sorted(found, key=lambda k: found[k], reverse=True)[: args.top]
            contenders = {"defaults": [], **{name: settings[name] for name in top}}
            # the README command's previous default (1,024 rows a micro-batch, ~35 s each on 2
            # cores) would take minutes a round: it is left out there
            if not args.no_before and command != "readme":
                contenders["before"] = before(command, cpus)
            rates: dict[str, dict[str, list[float]]] = {"quiet": {}, "loaded": {}}
            for state in ("quiet",) if args.no_loaded else ("quiet", "loaded"):
                rates[state] = time_settings(args, command, contenders, state, work)
            result: dict[str, Any] = {"defaults_chose": first, "grid": found, "rates": rates}
            for state, by in rates.items():
                if not by:
                    continue
                med = {k: statistics.median(v) for k, v in by.items()}
                best_name = max(top, key=lambda k: med[k])
                med["best"] = med[best_name]
                result[f"{state}_best"] = best_name
                ratio = med["defaults"] / med["best"]
                result[f"{state}_ratio"] = ratio
                cells = [command, state, f"{med['defaults']:.1f}",
                         f"{med['best']:.1f} ({best_name})", f"{ratio:.2f}x",
                         f"{med['before']:.1f}" if "before" in med else "—"]  # fmt: skip
                rows.append(cells)
                print(f"  {command} {state}: defaults {med['defaults']:.1f}, best "
                      f"({best_name}) {med['best']:.1f} seq/s: {ratio:.2f}x", flush=True)  # fmt: skip
            if command == "readme":
                quiet = statistics.median(rates["quiet"]["defaults"])
                result["seconds_per_real_step"] = README_GLOBAL / quiet
                print(f"  a real step of {README_GLOBAL:,} sequences at the defaults' rate: "
                      f"{README_GLOBAL / quiet / 60:.1f} min", flush=True)  # fmt: skip
            report["commands"][command] = result
    headline = ", ".join(
        f"{c} {r.get('quiet_ratio', 0):.2f}x quiet"
        + (f" / {r['loaded_ratio']:.2f}x loaded" if "loaded_ratio" in r else "")
        for c, r in report["commands"].items()
    )
    record = benchplot.Record(
        name=args.name,
        title="A run with no tuning flags against the best hand-tuned setting (seq/s)",
        headline=f"defaults ÷ best hand-tuned (medians): {headline}",
        command=benchplot.command_line(None if argv is None else [__file__, *argv]),
        tables=[benchplot.Table(
            f"{cpus} usable CPUs, bf16 {'native' if support.native else 'emulated'}; "
            f"loaded = {args.competitors} busy process(es) beside it; {args.rounds} rounds",
            ["command", "machine", "defaults seq/s", "best seq/s", "defaults ÷ best",
             "previous defaults seq/s"], rows)],
        measurements=report,
    )  # fmt: skip
    benchplot.save(record, figure_of(report), args.results_dir)
    return report


if __name__ == "__main__":
    main()
