"""How a step of ``scripts/gpu_check.py`` runs: a step's commands (:class:`Step`,
:class:`Command`), the check's state and its one deadline (:class:`Check`, a
:class:`benchharness.Deadline`), and :func:`run_step`: the commands at once, each until the
step's cap or the deadline, their output into the step's log. Standard library only."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchharness import Deadline

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = ROOT / "scripts"
#: kept back from the deadline for the summary
RESERVE_S = 5.0
#: a step is skipped when less than this is left
MIN_STEP_S = 15.0


@dataclass
class Command:
    label: str
    argv: list[str]
    #: a JUnit report this command writes (test steps)
    junit: Path | None = None


@dataclass
class Step:
    name: str
    cap_s: float
    commands: Callable[[Check], list[Command]]
    #: run after the commands, with their exit codes; returns findings for the summary
    collect: Callable[[Check, list[int]], dict[str, Any]] | None = None


@dataclass
class Check:
    out: Path
    work: Path
    bundle: Path
    target: Path
    rehearse: bool
    deadline_s: float
    #: ``bench_gpu.py --cases`` instead of the lease's own order
    bench_gpu_cases: str | None = None
    #: pytest-xdist workers per GPU test file (0: one process per file)
    test_workers: int = 0
    #: ``focus`` (:data:`FOCUS_TESTS`) or ``all`` (every file with gpu-marked tests)
    tests: str = "focus"
    #: the cap of the step whose commands are being built (their own deadlines stay inside)
    step_cap_s: float = float("inf")
    start: float = field(default_factory=time.monotonic)
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        #: the one deadline every step's cap and every benchmark's own deadline stay inside
        self.deadline = Deadline(self.deadline_s, start=self.start)

    def left(self) -> float:
        left = self.deadline.left()
        assert left is not None  # the check always has a deadline
        return left

    @property
    def python(self) -> str:
        return sys.executable


def run_step(check: Check, step: Step) -> dict[str, Any]:
    """Run a step's commands at once, each until the step's cap or the deadline."""
    left = check.left() - RESERVE_S
    entry: dict[str, Any] = {"step": step.name, "cap_s": step.cap_s}
    if left < MIN_STEP_S:
        return {**entry, "status": "skipped", "seconds": 0.0,
                "detail": f"{left:.0f} s left before the deadline"}  # fmt: skip
    timeout = min(step.cap_s, left)
    check.step_cap_s = timeout
    commands = step.commands(check)
    log_path = check.work / f"{step.name}.log"
    start = time.monotonic()
    with log_path.open("w") as log:
        procs = []
        for command in commands:
            part = check.work / f"{step.name}-{command.label}.log"
            handle = part.open("w")
            proc = subprocess.Popen(command.argv, cwd=ROOT, env=check.env, stdout=handle,
                                    stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
            procs.append((command, proc, handle, part))
        codes, timed_out = [], []
        for command, proc, handle, part in procs:
            try:
                codes.append(proc.wait(timeout=max(timeout - (time.monotonic() - start), 1)))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                codes.append(proc.wait())
                timed_out.append(command.label)
            handle.close()
            log.write(f"===== {step.name} / {command.label}: {' '.join(command.argv)}\n")
            log.write(part.read_text(errors="replace"))
            log.write(f"===== exit {codes[-1]}\n")
    seconds = time.monotonic() - start
    status = "timeout" if timed_out else ("ok" if all(c == 0 for c in codes) else "failed")
    entry.update(status=status, seconds=round(seconds, 1), exit_codes=codes)
    if timed_out:
        entry["timed_out"] = timed_out
    if step.collect is not None:
        try:
            entry["findings"] = step.collect(check, codes)
        except Exception as err:  # a broken report is a finding, not a stop
            entry["findings"] = {"error": repr(err)}
    return entry
