"""Training throughput on a CPU shared with another busy process, before and after omnibert
chose its threads and OpenMP wait policy (issue 16: ``make demo`` took 25 min instead of ~4
while another process used one of the two cores).

Each run is ``omnibert-train experiment=demo`` for ``--steps`` steps in a fresh process (the
OpenMP runtime reads its settings when it loads), on the demo's shapes: bert-tiny, seq 128,
20 masks, global batch 32, one loader worker, LAMB. The demo's data when ``make demo`` made
it (``outputs/demo``), else generated rows of the same shapes (``data=generated``, 8,192-token
vocab). Two settings:

* ``torch default``: as before this change, torch's own thread count
  (``accelerator.threads=<torch.get_num_threads()>``) and the OpenMP runtime's default wait
  policy (``accelerator.omp_wait_policy=null``, no ``OMP_*`` variables);
* ``omnibert``: the accelerator config's defaults (threads from the usable CPUs minus the
  loader worker, ``OMP_WAIT_POLICY=PASSIVE``).

(``--ablation`` adds ``threads only``: omnibert's thread count with the runtime's wait policy,
and ``passive only``: torch's thread count with ``OMP_WAIT_POLICY=PASSIVE``), each idle and
with one competing CPU-bound process (``python -c "while True: pass"``;
``--pin`` pins it to the last CPU of this process's affinity mask): each setting and state is
a peer of the harness's ``--rounds`` rounds (:mod:`benchharness`: their order rotates), a
region being one run, its rate the run's own. Prints sequences/s of each run (the app's own throughput, from its first
logging point on, so start-up is not counted), the median per cell and, per setting, loaded
÷ idle (a fair share of two cores with one competitor is 50 %).

    .venv/bin/python scripts/bench_shared_cpu.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchplot
import torch
from benchharness import Region, Turn, device_sync, run_rounds

ROOT = Path(__file__).resolve().parent.parent
DEMO = ROOT / "outputs" / "demo"
SETTINGS = ("torch default", "omnibert")
#: ``--ablation``: each half of the change alone
ABLATION = ("threads only", "passive only")


def _data_overrides() -> tuple[list[str], str]:
    if (DEMO / "train" / "metadata.json").is_file():
        return ["data.eval_path=null"], f"the demo's data ({DEMO / 'train'})"
    return (
        ["data=generated", "~data.train_path", "~data.eval_path", "~data.vocab_file",
         "data.vocab_size=8192", "data.num_train_samples=22000",
         "data.num_eval_samples=0", "data.num_workers=1"],
        "generated rows of the demo's shapes (outputs/demo absent)",
    )  # fmt: skip


def _env(setting: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "KMP_", "OMNIBERT_"))}
    env["PYTHONWARNINGS"] = "ignore"
    return env


def run_once(setting: str, steps: int, workdir: Path, tag: str) -> float:
    data, _ = _data_overrides()
    overrides = [
        "experiment=demo",
        *data,
        f"phase.max_steps={steps}",
        "val_every_n_steps=null",
        "logger=none",
        "callbacks.progress_bar=null",
        "callbacks.checkpoint=null",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=5",
        "trainer.precision=32-true",
        f"run_name=bench-{tag}",
        f"paths.output_root={workdir}",
        f"hydra.run.dir={workdir / tag}",
    ]
    if setting in ("torch default", "passive only"):
        overrides.append(f"accelerator.threads={torch.get_num_threads()}")
    if setting in ("torch default", "threads only"):
        overrides.append("accelerator.omp_wait_policy=null")
    result = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *overrides],
        cwd=ROOT, env=_env(setting), capture_output=True, text=True,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"{setting} run failed:\n{result.stderr[-3000:]}")
    summary = json.loads((workdir / tag / "summary.json").read_text())
    return float(summary["throughput"]["samples_per_sec"])


def competitor(pin: bool) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    if pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(proc.pid, {max(os.sched_getaffinity(0))})
    return proc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pin", action="store_true", help="pin the competitor to one CPU")
    parser.add_argument("--ablation", action="store_true", help="also each half alone")
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    settings = SETTINGS + (ABLATION if args.ablation else ())
    from omnibert.threads import usable_cpus

    _, source = _data_overrides()
    cpus, how = usable_cpus()
    print(f"bench_shared_cpu: {args.steps} steps of the demo (bert-tiny, seq 128, batch 32), "
          f"{source}; this process may use {cpus} CPUs ({how}); torch default threads "
          f"{torch.get_num_threads()}; competitor {'pinned' if args.pin else 'not pinned'}",
          flush=True)  # fmt: skip
    cells = [(setting, loaded) for loaded in (False, True) for setting in settings]

    def cell(setting: str, loaded: bool, workdir: Path) -> Any:
        def region(turn: Turn) -> float:
            proc = competitor(args.pin) if loaded else None
            try:
                tag = f"r{turn.index}-{'loaded' if loaded else 'idle'}-{setting.replace(' ', '_')}"
                return run_once(setting, args.steps, workdir, tag)
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()

        return region

    def ran(region: Region) -> None:
        setting, loaded = cells[names.index(region.peer)]
        state = "1 competitor" if loaded else "idle"
        print(f"  round {region.turn.index + 1}  {setting:<13}  {state:<12}  "
              f"{region.value:7.1f} seq/s", flush=True)  # fmt: skip

    names = [f"{s} {'loaded' if loaded else 'idle'}" for s, loaded in cells]
    with tempfile.TemporaryDirectory() as tmp:
        peers = {name: cell(*c, Path(tmp)) for name, c in zip(names, cells, strict=True)}
        rounds = run_rounds(peers, rounds=args.rounds, sync=device_sync("cpu"), after_region=ran)
    results = {c: rounds.values(name) for name, c in zip(names, cells, strict=True)}
    rows = []
    for setting in settings:
        idle = statistics.median(results[(setting, False)])
        loaded = statistics.median(results[(setting, True)])
        print(f"{setting:<13}  idle {idle:7.1f} seq/s  with 1 competitor {loaded:7.1f} seq/s  "
              f"loaded/idle {loaded / idle:6.1%}  (median of {args.rounds})")  # fmt: skip
        per_round = " / ".join(f"{v:.1f}" for v in results[(setting, True)])
        rows.append([setting, f"{idle:.1f}", f"{loaded:.1f}", f"{loaded / idle:.1%}", per_round])
    ours = statistics.median(results[("omnibert", True)])
    before = statistics.median(results[("torch default", True)])
    headline = f"with 1 competitor: omnibert {ours / before:.2f}x torch default"
    print(headline)
    fig = benchplot.bars(
        f"demo training steps, {cpus} CPUs, competitor {'pinned' if args.pin else 'not pinned'}",
        "sequences/s (median of rounds)",
        list(settings),
        {
            "idle": [statistics.median(results[(s, False)]) for s in settings],
            "with 1 competitor": [statistics.median(results[(s, True)]) for s in settings],
        },
    )
    record = benchplot.Record(
        name="shared_cpu",
        title="Training on a CPU shared with a busy process: torch's defaults against omnibert's "
        "threads and OpenMP wait policy",
        headline=headline,
        tables=[
            benchplot.Table(
                f"{args.steps} steps of the demo (bert-tiny, seq 128, batch 32), {source}; "
                f"{cpus} usable CPUs ({how}); torch default threads {torch.get_num_threads()}",
                [
                    "setting",
                    "idle seq/s",
                    "with 1 competitor seq/s",
                    "loaded/idle",
                    "with 1 competitor, per round",
                ],
                rows,
            )
        ],
        measurements={
            f"{setting} {'loaded' if loaded else 'idle'}": values
            for (setting, loaded), values in results.items()
        },
    )
    benchplot.save(record, fig, args.results_dir)


if __name__ == "__main__":
    main()
