"""omnibert-prepare's worker processes never outlive the run: SIGKILL the run while its
workers are busy and every worker is gone soon after (they used to finish their file and
then wait forever for the next job)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of a process, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[1] == pid:
            found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")  # a zombie has exited


def _signal_disposition(pid: int, signum: int) -> str:
    """What ``pid`` does with ``signum``, from the kernel's masks in /proc/<pid>/status:
    "ignored", "caught" (a handler: Python's, which a forked worker inherits from the run) or
    "default"."""
    masks = dict(
        line.split(":\t", 1)
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith(("SigIgn", "SigCgt"))
    )
    bit = 1 << (signum - 1)
    if int(masks["SigIgn"], 16) & bit:
        return "ignored"
    return "caught" if int(masks["SigCgt"], 16) & bit else "default"


def _wait_for(predicate, timeout: float = 120.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return predicate()


@contextlib.contextmanager
def _busy_with_two_workers(
    command: list[str], log: Path
) -> Iterator[tuple[subprocess.Popen, set[int]]]:
    """Start ``command`` (output to ``log``) and wait until it runs two worker processes;
    yields the run and the workers' pids. Whatever still runs at the end is killed, so a
    failed test never leaves a process behind."""
    with open(log, "wb") as sink:
        run = subprocess.Popen(command, stdout=sink, stderr=sink)
    workers: set[int] = set()

    def two_workers() -> bool:
        workers.update(_children(run.pid))
        return len(workers) >= 2 or run.poll() is not None

    try:
        assert _wait_for(two_workers) and run.poll() is None, log.read_text()
        yield run, workers
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def _inputs(tmp_path: Path) -> list[Path]:
    """Enough work that a run is still busy when it is killed."""
    text = (REFERENCE / "wiki_like.txt").read_text(encoding="utf-8")
    inputs = []
    for i in range(6):
        inputs.append(tmp_path / f"part-{i}.txt")
        inputs[-1].write_text(text * 8, encoding="utf-8")
    return inputs


def test_workers_die_with_a_killed_run(bert_vocab_file: Path, tmp_path: Path) -> None:
    inputs = _inputs(tmp_path)
    script = (
        "import sys\n"
        "from omnibert.prepare.instances import InstanceSettings\n"
        "from omnibert.prepare.pipeline import prepare\n"
        "prepare(sys.argv[3:], sys.argv[1], sys.argv[2], InstanceSettings(dupe_factor=10),\n"
        "        num_workers=2, progress=False)\n"
    )
    log = tmp_path / "run.log"
    command = [sys.executable, "-c", script, str(bert_vocab_file), str(tmp_path / "out")]
    with _busy_with_two_workers([*command, *map(str, inputs)], log) as (run, workers):
        os.kill(run.pid, signal.SIGKILL)  # while its workers are busy
        assert run.wait() == -signal.SIGKILL
        assert _wait_for(lambda: not any(_alive(pid) for pid in workers)), [
            (pid, _stat(pid)) for pid in workers if _alive(pid)
        ]
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_a_worker_killed_from_outside_stops_the_run_in_one_line(
    bert_vocab_file: Path, tmp_path: Path
) -> None:
    inputs = _inputs(tmp_path)
    log = tmp_path / "run.log"
    exe = Path(sys.executable).with_name("omnibert-prepare")
    command = [
        str(exe),
        f"input_files=[{','.join(map(str, inputs))}]",
        f"vocab_file={bert_vocab_file}",
        f"output_dir={tmp_path / 'out'}",
        "num_workers=2",
        "progress=false",
        f"hydra.run.dir={tmp_path / 'hydra'}",
    ]
    with _busy_with_two_workers(command, log) as (run, workers):
        # once a worker's initializer has run (SIGINT ignored is its last change), SIGTERM
        # must be the default: what lets the broken pool end the other worker at once
        for pid in workers:
            assert _wait_for(lambda p=pid: _signal_disposition(p, signal.SIGINT) == "ignored")
            assert _signal_disposition(pid, signal.SIGTERM) == "default", pid
        os.kill(min(workers), signal.SIGKILL)  # as the out-of-memory killer would
        assert run.wait(timeout=120) == 2, log.read_text()
        assert _wait_for(lambda: not any(_alive(pid) for pid in workers))
    last = log.read_text().strip().splitlines()[-1]
    assert last.startswith("omnibert-prepare: error: a worker process died while working on ")
    assert "lower num_workers" in last
