"""A chaos run: two-process training interrupted again and again ends bitwise where an
uninterrupted run ends, and holds no more host memory at its end than near its start
(issue 33, point 7; not in the test suite: it takes minutes).

The run is ``omnibert-train experiment=smoke`` (a 1-layer 32-wide BERT on generated rows,
seq 32) for ``--steps`` optimiser steps with Lightning's own two-process launch on the CPU
(``accelerator.devices=2``, gloo), global batch 8 = 2 micro-batches of 2 per rank (so a stop
can fall inside a step), a checkpoint every ``--every`` steps, dropout off unless ``--dropout``
is given (each rank draws its own dropout masks, and the checkpoint keeps every rank's RNG
states) and ``trainer.deterministic=true``.

A driver starts the run in its own session and follows rank 0's step lines. At ``--faults``
seeded random steps (within the first 70 % of the run, so the last segment is long enough to
measure; a seeded delay of up to 0.1 s after the step is reported lands the signal anywhere
in a step) it sends one of four faults: SIGTERM to a random rank, SIGTERM to the process group,
SIGKILL to a random rank, SIGKILL to the group. It waits until every process of the run has
ended (a run that prints nothing for ``--timeout-per-run`` seconds is killed and counted as
a hang: a rank waiting on a dead peer, until lost-rank detection ends it) and starts it again
with ``ckpt_path=last`` (from scratch when no checkpoint exists yet). At the end it compares
the final ``last.ckpt`` with an uninterrupted run of the same config (``torch.equal`` on every
weight and optimiser tensor) and compares host memory (RSS of both ranks) at step 100 and at
the last step, of the uninterrupted run and of the chaos run's last segment (from its 100th
step on). It prints the faults by kind, resumes, steps lost (trained again after a resume),
hangs, the seconds each stop took and the verdict: PASS only if the weights are bitwise
equal and both memory ratios are at most 1.05. The record goes to ``<results-dir>/chaos.json``.

    .venv/bin/python scripts/chaos.py --steps 1000 --faults 12 --seed 10 --results-dir docs/benchmarks

``--torchrun-restarts N``: the launcher's own recovery instead of the driver's. One
``torchrun --standalone --nproc_per_node 2 --max-restarts N omnibert-train ...`` runs the
whole time, without ``ckpt_path``; at each fault step the driver SIGKILLs a random worker
(found by its ``RANK``) and nothing else: torchrun starts the group again, each start resumes
this run's ``last.ckpt`` by itself (a launcher's restart makes ``ckpt_path`` ``auto``), and the
driver waits for that start's plan before the next fault. It ends, with exit 0, bitwise where
the uninterrupted run ends. Give ``N`` at least ``--faults``.

    .venv/bin/python scripts/chaos.py --steps 300 --faults 5 --seed 1 --torchrun-restarts 5
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import queue
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import benchplot
import psutil
import torch

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("SIGTERM rank", "SIGTERM group", "SIGKILL rank", "SIGKILL group")
STEP = re.compile(r"^omnibert-train: step (\d+)/")
#: the line a run ends with: a stop, its deadline, a second signal, a lost rank
STOP = re.compile(
    r"omnibert-train: (stopped by .*|did not .*|second .*|rank \d.*(lost|responding).*)$"
)
MEMORY_AT = 100  # steps into a segment where its memory is first sampled
#: the plan's line of a group torchrun started again (ckpt_path=auto, checkpoints.resuming)
RESTART = re.compile(r"TORCHELASTIC_RESTART_COUNT=(\d+)")


def config(steps: int, every: int, root: Path, dropout: float = 0.0) -> list[str]:
    return [
        "experiment=smoke", "data.num_workers=0", f"model.config.hidden_dropout_prob={dropout}",
        f"model.config.attention_probs_dropout_prob={dropout}", "phase.global_batch_size=8",
        "micro_batch_size=2", f"phase.max_steps={steps}", "val_every_n_steps=null",
        "callbacks=default", "callbacks.throughput=null", "callbacks.progress_log.every_n_steps=1",
        "trainer.enable_progress_bar=true", f"callbacks.checkpoint.every_n_train_steps={every}",
        "trainer.deterministic=true", "accelerator.devices=2", f"paths.output_root={root}",
    ]  # fmt: skip


@dataclass
class Fault:
    step: int  # injected once rank 0 reports this step (or a later one)
    kind: str
    rank: int  # for the "rank" kinds
    delay_s: float = 0.0  # after the step is reported: lands the signal anywhere in a step
    injected_at: int | None = None  # the last step rank 0 had reported
    reached: int | None = None  # the last step rank 0 reported before the run ended
    exit_code: int | None = None  # rank 0's (rank 1 is not the driver's child)
    seconds_to_end: float | None = None
    line: str | None = None  # the run's stop line, if any
    hang: bool = False
    resumed_from: int | None = None
    lost: int | None = None


def plan(steps: int, count: int, seed: int) -> list[Fault]:
    rng = random.Random(seed)
    at = sorted(rng.sample(range(10, max(11, int(steps * 0.7))), count))
    return [Fault(step, rng.choice(KINDS), rng.randrange(2), rng.uniform(0, 0.1)) for step in at]


def rss(pids: list[int]) -> int:
    """Resident memory of these processes and their descendants, in bytes."""
    total = 0
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                total += p.memory_info().rss
        except psutil.Error:
            continue
    return total


class Segment:
    """One launch of the two-process run, followed line by line."""

    def __init__(
        self, args: list[str], log: Path, stall_s: float, last_step: int, restarts: int = -1
    ) -> None:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
        command = [sys.executable, "-m", "omnibert.apps.train", *args]
        self.torchrun = restarts >= 0  # under torchrun, which restarts the group itself
        if self.torchrun:
            train = str(Path(sys.executable).parent / "omnibert-train")
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                       "--nproc_per_node", "2", "--max-restarts", str(restarts), train, *args]  # fmt: skip
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            env=env, cwd=log.parent, start_new_session=True,
        )  # fmt: skip
        self.log, self.stall_s, self.last_step = log, stall_s, last_step
        self.step = -1
        self.first: int | None = None  # the first step reported
        self.lines: list[str] = []
        self.last_output = time.monotonic()
        self.memory: dict[str, int] = {}
        self._steps: queue.Queue[int | None] = queue.Queue()
        self._ranks: list[int] = []
        self.attempt = 0  # the last start of the group torchrun made (its plan printed)
        self.resumed: dict[int, int] = {}  # the step each start resumed from
        threading.Thread(target=self._read, daemon=True).start()

    def ranks(self) -> list[int]:
        """Rank 0 (the launcher) and rank 1 (its child running the same module); under
        torchrun its workers, in the order of their ``RANK``."""
        if self.torchrun:
            try:
                workers = psutil.Process(self.proc.pid).children()
                by_rank = {int(w.environ().get("RANK", -1)): w.pid for w in workers}
            except psutil.Error:
                return []
            return [by_rank[r] for r in sorted(by_rank) if r >= 0]
        if len(self._ranks) < 2:
            try:
                children = psutil.Process(self.proc.pid).children()
                ranks = [c.pid for c in children if "omnibert.apps.train" in " ".join(c.cmdline())]
            except psutil.Error:
                ranks = []
            self._ranks = [self.proc.pid, *ranks[:1]]
        return self._ranks

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "w") as sink:
            for line in self.proc.stdout:
                sink.write(line)
                self.last_output = time.monotonic()
                line = line.rstrip("\n")
                self.lines.append(line)
                restart = RESTART.search(line)
                if restart and int(restart.group(1)) > self.attempt:
                    self.attempt = int(restart.group(1))
                    self._steps.put(-self.attempt)  # a new start: the steps that follow are its
                found = STEP.match(line)
                if found:
                    self.resumed.setdefault(self.attempt, int(found.group(1)) - 1)
                    self.step = int(found.group(1))
                    self.first = self.step if self.first is None else self.first
                    for name, due in (("early", self.step - self.first == MEMORY_AT - 1),
                                      ("end", self.step == self.last_step)):  # fmt: skip
                        if due:
                            self.memory[name] = rss(self.ranks())
                            self.memory[f"{name}_step"] = self.step
                    self._steps.put(self.step)
        self._steps.put(None)

    def wait_for_step(self, step: int, attempt: int = 0) -> bool:
        """Until rank 0 reports ``step`` or later in torchrun's start ``attempt`` or a later
        one (False: the run ended or stalled first)."""
        seen = 0
        while True:
            try:
                got = self._steps.get(timeout=1.0)
            except queue.Empty:
                if time.monotonic() - self.last_output > self.stall_s:
                    return False
                continue
            if got is None:
                return False
            if got < 0:
                seen = -got
            elif got >= step and seen >= attempt:
                return True

    def alive(self) -> list[int]:
        alive = []
        for pid in self.ranks():
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.Error:
                pass
        self.proc.poll()
        return alive

    def wait_end(self) -> bool:
        """Until every rank ended; False when the run stalled (then its group is killed)."""
        while self.alive():
            if time.monotonic() - self.last_output > self.stall_s:
                self.kill_group(signal.SIGKILL)
                while self.alive():
                    time.sleep(0.1)
                return False
            time.sleep(0.05)
        self.proc.wait()
        return True

    def kill_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signum)


def checkpoint_step(path: Path) -> int | None:
    if not path.is_file():
        return None
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])


def compare(want: Path, got: Path) -> tuple[int, int]:
    """(tensors compared, tensors that differ) over weights and optimiser state."""
    a = torch.load(want, map_location="cpu", weights_only=True)
    b = torch.load(got, map_location="cpu", weights_only=True)
    pairs = [(a["state_dict"][k], b["state_dict"].get(k)) for k in a["state_dict"]]
    for sa, sb in zip(a["optimizer_states"], b["optimizer_states"], strict=True):
        for key, state in sa["state"].items():
            pairs += [(v, sb["state"].get(key, {}).get(n)) for n, v in state.items()]
    tensors = [(x, y) for x, y in pairs if isinstance(x, torch.Tensor)]
    differ = sum(1 for x, y in tensors if not (isinstance(y, torch.Tensor) and torch.equal(x, y)))
    if a["global_step"] != b["global_step"]:
        differ += 1
    return len(tensors), differ


def run_chaos(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    faults = plan(args.steps, args.faults, args.seed)
    root = work / "chaos"
    last = root / "smoke" / "checkpoints" / "last.ckpt"
    segments: list[Segment] = []
    previous: Fault | None = None  # the fault that ended the last segment
    for fault in [*faults, None]:
        resumed_from = checkpoint_step(last) or 0
        if previous is not None and previous.reached is not None:
            previous.resumed_from = resumed_from
            previous.lost = max(0, previous.reached - resumed_from)
        n = len(segments)
        extra = ["ckpt_path=last"] if last.is_file() else []
        extra.append(f"hydra.run.dir={work / 'hydra' / f'segment-{n:02d}'}")
        segment = Segment([*config(args.steps, args.every, root, args.dropout), *extra],
                          work / f"segment-{n:02d}.log", args.timeout_per_run, args.steps)  # fmt: skip
        segments.append(segment)
        print(f"chaos: segment {n} from step {resumed_from}", flush=True)
        if fault is None:  # the last segment runs to the end
            if not segment.wait_end() or segment.proc.returncode != 0:
                raise SystemExit(f"chaos: the last segment failed; see {segment.log}")
            break
        if not segment.wait_for_step(fault.step):
            segment.wait_end()
            raise SystemExit(
                f"chaos: segment {n} ended before step {fault.step}; see {segment.log}"
            )
        inject(segment, fault)
        previous = fault
        print(f"chaos: {fault.kind}{_rank(fault)} at step {fault.injected_at}: ended after "
              f"{fault.seconds_to_end:.1f} s at step {fault.reached}, exit {fault.exit_code}"
              f"{' (hang: killed)' if fault.hang else ''}; {fault.line or 'no stop line'}",
              flush=True)  # fmt: skip
    return {"faults": faults, "segments": segments, "checkpoint": last}


def run_elastic(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """One torchrun group that restarts itself after each SIGKILL (module docstring)."""
    faults = [
        dataclasses.replace(f, kind="SIGKILL rank")
        for f in plan(args.steps, args.faults, args.seed)
    ]
    root = work / "chaos"
    run = [
        *config(args.steps, args.every, root, args.dropout),
        f"hydra.run.dir={work / 'hydra' / 'elastic'}",
    ]
    segment = Segment(
        run, work / "elastic.log", args.timeout_per_run, args.steps, args.torchrun_restarts
    )
    for index, fault in enumerate(faults):
        if not segment.wait_for_step(fault.step, attempt=index):
            segment.wait_end()
            raise SystemExit(f"chaos: the group ended before step {fault.step}; see {segment.log}")
        time.sleep(fault.delay_s)
        ranks = segment.ranks()
        fault.injected_at = fault.reached = segment.step
        with contextlib.suppress(ProcessLookupError, IndexError):
            os.kill(ranks[fault.rank], signal.SIGKILL)
        print(f"chaos: SIGKILL to rank {fault.rank} at step {fault.injected_at}", flush=True)
    ended = segment.wait_end()
    for index, fault in enumerate(faults):
        fault.resumed_from = segment.resumed.get(index + 1)
        if fault.resumed_from is not None and fault.reached is not None:
            fault.lost = max(0, fault.reached - fault.resumed_from)
    if not ended or segment.proc.returncode != 0:
        raise SystemExit(f"chaos: torchrun ended with {segment.proc.returncode}; see {segment.log}")
    print(f"chaos: torchrun started the group {segment.attempt} more times; exit 0", flush=True)
    last = root / "smoke" / "checkpoints" / "last.ckpt"
    return {"faults": faults, "segments": [segment], "checkpoint": last, "resumes": segment.attempt}


def _rank(fault: Fault) -> str:
    return f" {fault.rank}" if fault.kind.endswith("rank") else ""


def inject(segment: Segment, fault: Fault) -> None:
    ranks = segment.ranks()
    signum = signal.SIGTERM if fault.kind.startswith("SIGTERM") else signal.SIGKILL
    time.sleep(fault.delay_s)
    fault.injected_at = segment.step
    start = time.monotonic()
    if fault.kind.endswith("group"):
        segment.kill_group(signum)
    else:
        os.kill(ranks[min(fault.rank, len(ranks) - 1)], signum)
    fault.hang = not segment.wait_end()
    fault.seconds_to_end = time.monotonic() - start
    fault.exit_code, fault.reached = segment.proc.returncode, segment.step
    stops = [line for line in segment.lines if STOP.search(line)]
    fault.line = stops[-1].removeprefix("omnibert-train: ") if stops else None


def reference(args: argparse.Namespace, work: Path) -> Segment:
    root = work / "uninterrupted"
    segment = Segment([*config(args.steps, args.every, root, args.dropout), f"hydra.run.dir={work / 'hydra' / 'ref'}"],
                      work / "uninterrupted.log", args.timeout_per_run, args.steps)  # fmt: skip
    if not segment.wait_end() or segment.proc.returncode != 0:
        raise SystemExit(f"chaos: the uninterrupted run failed; see {segment.log}")
    return segment


def ratio(memory: dict[str, int]) -> float | None:
    if "early" not in memory or memory.get("end_step", 0) <= memory.get("early_step", 0):
        return None
    return memory["end"] / memory["early"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary one")
    parser.add_argument("--timeout-per-run", type=float, default=120.0,
                        help="seconds without output after which a run counts as hung")  # fmt: skip
    parser.add_argument("--torchrun-restarts", type=int, default=-1, metavar="N",
                        help="one torchrun group with --max-restarts N that restarts itself "
                             "after each SIGKILL (default: the driver restarts the run)")  # fmt: skip
    parser.add_argument("--dropout", type=float, default=0.0,
                        help="model.config's hidden and attention dropout (default 0)")  # fmt: skip
    benchplot.add_arguments(parser)
    args = parser.parse_args(argv)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="omnibert-chaos-"))
    if work.is_dir() and any(work.iterdir()):  # its runs would resume an earlier chaos run's
        parser.error(f"--workdir {work} is not empty; give an empty or new directory.")
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    print(
        f"chaos: {args.steps} steps, {args.faults} faults, seed {args.seed}, in {work}", flush=True
    )
    ref = reference(args, work)
    print(f"chaos: uninterrupted run done ({time.monotonic() - started:.0f} s)", flush=True)
    elastic = args.torchrun_restarts >= 0
    if elastic and args.torchrun_restarts < args.faults:
        parser.error(f"--torchrun-restarts {args.torchrun_restarts} is fewer than --faults "
                     f"{args.faults}: torchrun would give up; give at least {args.faults}.")  # fmt: skip
    chaos = run_elastic(args, work) if elastic else run_chaos(args, work)
    faults: list[Fault] = chaos["faults"]
    compared, differ = compare(work / "uninterrupted" / "smoke" / "checkpoints" / "last.ckpt",
                               chaos["checkpoint"])  # fmt: skip
    ratios = {"uninterrupted": ratio(ref.memory)}
    if not elastic:  # under torchrun the group's later starts are not measured
        ratios["last segment"] = ratio(chaos["segments"][-1].memory)
    by_kind = {kind: sum(1 for f in faults if f.kind == kind) for kind in KINDS}
    lost = sum(f.lost or 0 for f in faults)
    hangs = sum(1 for f in faults if f.hang)
    term = [
        f.seconds_to_end
        for f in faults
        if f.kind.startswith("SIGTERM") and not f.hang and f.seconds_to_end is not None
    ]
    memory_ok = all(r is not None and r <= 1.05 for r in ratios.values())
    verdict = "PASS" if differ == 0 and memory_ok else "FAIL"
    minutes = (time.monotonic() - started) / 60
    lines = [
        f"faults injected: {len(faults)} ({', '.join(f'{k} {v}' for k, v in by_kind.items())})",
        f"resumes: {chaos.get('resumes', len(chaos['segments']) - 1)}"
        + (" (torchrun's own restarts)" if elastic else ""),
        f"steps lost (trained again): {lost}",
        f"hangs (killed after {args.timeout_per_run:g} s without output): {hangs}",
        f"SIGTERM to the end of every rank: max {max(term, default=0):.1f} s, "
        f"mean {sum(term) / max(1, len(term)):.1f} s",
        f"final weights and optimiser state: {compared - differ}/{compared} tensors bitwise equal",
        "host memory, last step / step 100: " + ", ".join(
            f"{k} {'n/a' if r is None else f'{r:.3f}'}" for k, r in ratios.items()),
        f"verdict: {verdict} ({minutes:.1f} min)",
    ]  # fmt: skip
    for line in lines:
        print(f"chaos: {line}", flush=True)
    record(args, faults, chaos, ref, lines, verdict, compared, differ, ratios)
    return 0 if verdict == "PASS" else 1


def record(
    args: argparse.Namespace, faults: list[Fault], chaos: dict[str, Any], ref: Segment,
    lines: list[str], verdict: str, compared: int, differ: int, ratios: dict[str, Any],
) -> None:  # fmt: skip
    rows = [
        [str(i + 1), f.kind + _rank(f), str(f.injected_at), str(f.exit_code),
         f"{f.seconds_to_end:.1f}" if f.seconds_to_end is not None else "", "yes" if f.hang else "",
         str(f.resumed_from), str(f.lost), f.line or ""]
        for i, f in enumerate(faults)
    ]  # fmt: skip
    columns = ["#", "fault", "at step", "rank 0 exit", "s to end", "hang", "resumed from",
               "lost", "line"]  # fmt: skip
    memory = {"uninterrupted": ref.memory, "last segment": chaos["segments"][-1].memory}
    result = benchplot.Record(
        name="chaos",
        title=f"{args.steps} steps of 2-process training with {args.faults} faults",
        headline=f"chaos run: {verdict}; " + "; ".join(lines[:3]),
        tables=[
            benchplot.Table("", ["figure"], [[line] for line in lines]),
            benchplot.Table("Each fault", columns, rows),
        ],
        measurements={
            "steps": args.steps,
            "seed": args.seed,
            "every": args.every,
            "faults": [asdict(f) for f in faults],
            "tensors_compared": compared,
            "tensors_differing": differ,
            "memory_bytes": memory,
            "memory_ratios": ratios,
            "verdict": verdict,
        },
        notes=[
            "The uninterrupted run's memory is sampled at its step 100 and its last step; "
            "the last segment's at its 100th step after the resume and its last step."
        ],
    )
    benchplot.save(result, None, args.results_dir)


if __name__ == "__main__":
    sys.exit(main())
