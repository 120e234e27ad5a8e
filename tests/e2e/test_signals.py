"""SIGTERM and SIGINT, sent to real omnibert processes and to their process groups: every
app stops at its next safe point, prints one line and exits with 128 + the signal number;
training writes a checkpoint of the last completed step that resumes bitwise (a stop inside a
step of many micro-batches, and its deadline: tests/e2e/test_stop_in_time.py); loader and prepare
workers print no tracebacks; a second signal stops at once.

Each run is started in its own session (its own process group, so a signal to the group
never reaches pytest) and the test waits for what the run prints or writes, never for a
fixed time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from omnibert.apps.compose import compose

TESTS = Path(__file__).parents[1]
REFERENCE = TESTS / "fixtures" / "reference"
BIN = Path(sys.executable).parent
TIMEOUT = 240.0  # seconds to wait for a line or an exit on a loaded 2-core machine

#: a tiny run on generated data (experiment=smoke) that would train for a long time
TRAIN = [
    "experiment=smoke",
    "phase.max_steps=100000",
    "callbacks=default",  # progress lines (stdout is a pipe), no throughput
    "callbacks.throughput=null",
    "callbacks.progress_log.every_n_steps=1",
    "trainer.enable_progress_bar=true",
    "val_every_n_steps=null",
]


def _interruptible() -> None:
    """SIGINT back to its default in the child, as a terminal's foreground job has it: a parent
    that ignores SIGINT (pytest-xdist's workers do) would otherwise hand the app an ignored
    SIGINT, which omnibert rightly leaves alone, as shells do for background jobs."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Run:
    """A process in its own session whose output lines are read as they come."""

    def __init__(
        self, command: list[str], log: Path, cwd: Path, env: dict[str, str] | None = None
    ) -> None:
        env = {**os.environ, **(env or {})}
        env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{env.get('PYTHONPATH', '')}"
        self.log = log
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd, env=env,
            start_new_session=True, text=True, bufsize=1, preexec_fn=_interruptible,
        )  # fmt: skip
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.log, "w") as sink:
            for line in self.proc.stdout:
                sink.write(line)
                sink.flush()
                self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, pattern: str) -> re.Match[str]:
        """The first output line matching ``pattern`` (fails with the output so far when
        the process ends or ``TIMEOUT`` passes first)."""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=1.0)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if found := re.search(pattern, line):
                return found
        raise AssertionError(f"no line matching {pattern!r}:\n" + self.log.read_text())

    def finish(self) -> tuple[int, list[str]]:
        """Exit code and every output line."""
        code = self.proc.wait(timeout=TIMEOUT)
        while (line := self._queue.get(timeout=TIMEOUT)) is not None:
            self.lines.append(line)
        return code, self.lines

    def signal(self, signum: int, group: bool) -> None:
        if group:
            os.killpg(self.proc.pid, signum)
        else:
            self.proc.send_signal(signum)


@contextlib.contextmanager
def started(
    command: list[str], tmp_path: Path, name: str, env: dict[str, str] | None = None,
    grace: float = 0.0,
) -> Iterator[Run]:  # fmt: skip
    """A run in its own session; afterwards nothing of it is left: SIGKILL to its group, after
    SIGTERM and ``grace`` seconds for a launcher to end its workers (torchrun's workers have
    sessions of their own: SIGTERM to torchrun ends them) when ``grace`` is given."""
    run = Run(command, tmp_path / f"{name}.log", tmp_path, env=env)
    try:
        yield run
    finally:
        if run.proc.poll() is None:
            if grace:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(run.proc.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    run.proc.wait(timeout=grace)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(run.proc.pid, signal.SIGKILL)
            run.proc.wait()


def _train(tmp_path: Path, *extra: str) -> list[str]:
    return [
        str(BIN / "omnibert-train"), *TRAIN, f"paths.output_root={tmp_path / 'runs'}",
        f"hydra.run.dir={tmp_path / 'hydra'}", *extra,
    ]  # fmt: skip


#: the stop line of a run of experiment=smoke (2 micro-batches a step): at the end of a step,
#: or inside one, whose micro-batch is dropped and the step before it kept
STOP_LINE = (
    r"omnibert-train: stopped by SIGTERM (at step (?P<step>\d+)|in step \d+ \(micro-batch 1 of "
    r"2; the partial step is dropped; the checkpoint is of step (?P<kept>\d+)\)); resume with "
    r"ckpt_path=last"
)


def _checkpoints(tmp_path: Path) -> Path:
    return tmp_path / "runs" / "smoke" / "checkpoints"


def _no_traceback(lines: list[str]) -> None:
    text = "\n".join(lines)
    assert "Traceback" not in text and "Error:" not in text, text


@pytest.mark.parametrize(
    ("signum", "group", "after_checkpoint", "workers"),
    [
        (signal.SIGTERM, False, True, 0),
        (signal.SIGTERM, True, False, 1),
        (signal.SIGINT, True, True, 1),
        (signal.SIGINT, False, False, 0),
    ],
    ids=["TERM-process-after-ckpt", "TERM-group-before-ckpt", "INT-group-after-ckpt",
         "INT-process-before-ckpt"],
)  # fmt: skip
def test_training_stops_at_the_step_with_a_checkpoint(
    tmp_path: Path, signum: int, group: bool, after_checkpoint: bool, workers: int
) -> None:
    every = 2 if after_checkpoint else 100000
    command = _train(
        tmp_path, f"callbacks.checkpoint.every_n_train_steps={every}",
        f"data.num_workers={workers}",
    )  # fmt: skip
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"omnibert-train: step 3/")  # past the first periodic checkpoint (step 2)
        periodic = sorted(p.name for p in _checkpoints(tmp_path).glob("step-*.ckpt"))
        assert bool(periodic) == after_checkpoint, periodic
        run.signal(signum, group)
        code, lines = run.finish()
    name = signal.Signals(signum).name
    assert code == 128 + signum, "\n".join(lines)
    stop = [line for line in lines if "stopped by" in line]
    assert len(stop) == 1 and stop[0] == lines[-1], "\n".join(lines)
    found = re.fullmatch(STOP_LINE.replace("SIGTERM", name), stop[0])
    assert found, stop[0]
    step = int(found.group("step") or found.group("kept"))
    _no_traceback(lines)
    assert not any("graceful shutdown" in line for line in lines)  # Lightning's own message
    last = torch.load(_checkpoints(tmp_path) / "last.ckpt", weights_only=True, mmap=True)
    assert last["global_step"] == step
    assert (_checkpoints(tmp_path) / f"step-{step:08d}.ckpt").is_file()


def test_a_run_stopped_by_sigterm_resumes_bitwise(tmp_path: Path) -> None:
    """The checkpoint written at the stop step, resumed to the end, gives the weights of an
    uninterrupted run (the interrupted one sleeps after each batch, which changes no maths,
    so that the signal surely comes before its end)."""
    from omnibert.apps.train import run_or_exit

    steps = [*TRAIN[:1], "phase.max_steps=30"]
    slow = ["+callbacks.slow._target_=faults.SlowUntilResumed", "+callbacks.slow.seconds=0.25"]
    with started([*_train(tmp_path), *steps, *slow], tmp_path, "train") as run:
        run.wait_for(r"omnibert-train: step 2/30")
        run.signal(signal.SIGTERM, group=False)
        code, lines = run.finish()
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    found = re.fullmatch(STOP_LINE, lines[-1])
    assert found and int(found.group("step") or found.group("kept")) < 30, lines[-1]
    resume = [*steps, f"paths.output_root={tmp_path / 'runs'}", "ckpt_path=last"]
    run_or_exit(compose("pretrain", resume), None)
    run_or_exit(compose("pretrain", [*steps, f"paths.output_root={tmp_path / 'fresh'}"]), None)
    resumed = torch.load(_checkpoints(tmp_path) / "last.ckpt", weights_only=True)
    fresh = torch.load(
        tmp_path / "fresh" / "smoke" / "checkpoints" / "last.ckpt", weights_only=True
    )
    assert resumed["global_step"] == fresh["global_step"] == 30
    for key, value in fresh["state_dict"].items():
        assert torch.equal(resumed["state_dict"][key], value), key


def test_a_second_signal_stops_at_once(tmp_path: Path) -> None:
    command = _train(
        tmp_path, "+callbacks.hold._target_=faults.HoldWhenStopping", "trainer.stop_within_s=600"
    )
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"omnibert-train: step 2/")
        run.signal(signal.SIGINT, group=True)
        run.wait_for(r"HoldWhenStopping: holding the step")  # the step now lasts 120 s
        run.signal(signal.SIGINT, group=True)
        code, lines = run.finish()
    assert code == 128 + signal.SIGINT, "\n".join(lines)
    assert lines[-1] == "omnibert-train: second SIGINT: stopping at once.", "\n".join(lines)
    assert any("SIGINT received: stopping at the next micro-batch boundary" in line
               for line in lines)  # fmt: skip
    _no_traceback(lines)


def test_finetune_of_two_processes_stops_in_one_line_and_speaks_with_one_voice(
    tiny_hf: Path, tmp_path: Path
) -> None:
    """Two processes (Lightning's launcher, gloo), SIGTERM to the group while they train: the
    stop line once, last; rank 0 alone prints the plan, the progress and the signal's
    acknowledgement (one voice), rank 1 prints nothing (Lightning's lines on its behalf
    neither), and nothing writes a summary."""
    from finetune_data import mrpc_file

    command = [
        str(BIN / "omnibert-finetune"), "task=mrpc",
        f"data.train_file={mrpc_file(tmp_path / 'train.tsv', 64, seed=1)}",
        f"model.init_from={tiny_hf}", "task.epochs=1000", "task.batch_size=8",
        "task.max_seq_length=32", f"paths.output_root={tmp_path / 'ft'}", "logger=none",
        f"hydra.run.dir={tmp_path / 'hydra'}", "accelerator.devices=2",
        "callbacks.progress_log.every_n_steps=1",
    ]  # fmt: skip
    env = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    with started(command, tmp_path, "finetune", env=env) as run:
        run.wait_for(r"omnibert-finetune: step 2/")  # both ranks train
        run.signal(signal.SIGTERM, group=True)
        code, lines = run.finish()
    text = "\n".join(lines)
    assert code == 128 + signal.SIGTERM, text
    stops = [line for line in lines if "stopped by" in line]
    assert len(stops) == 1 and stops[0] == lines[-1], text
    assert re.fullmatch(
        r"omnibert-finetune: stopped by SIGTERM (at step \d+|in step \d+ \(micro-batch 1 of 2; the "
        r"partial step is dropped; the checkpoint is of step \d+\)); resume with ckpt_path=last",
        lines[-1],
    ), text
    for first in ("omnibert-finetune: mrpc from", "omnibert-finetune: kernels: ",
                  "omnibert-finetune: new (freshly initialised) keys", "omnibert-finetune: step 1/",
                  "omnibert-finetune: SIGTERM received: stopping"):  # fmt: skip
        assert sum(line.startswith(first) for line in lines) == 1, (first, text)
    assert not [line for line in lines if line.startswith("rank 1:") or "RANK: 1" in line], text
    _no_traceback(lines)
    assert not list((tmp_path / "ft").rglob("summary.json"))


def test_prepare_stops_and_keeps_its_finished_parts(bert_vocab_file: Path, tmp_path: Path) -> None:
    from omnibert.prepare.instances import InstanceSettings
    from omnibert.prepare.pipeline import prepare
    from omnibert.prepare.shards import PARTS_DIR, read_part_record

    small = tmp_path / "a-small.txt"
    small.write_text((REFERENCE / "single_doc.txt").read_text(encoding="utf-8"))
    text = (REFERENCE / "wiki_like.txt").read_text(encoding="utf-8")
    inputs = [small]
    for i in range(4):
        inputs.append(tmp_path / f"big-{i}.txt")
        inputs[-1].write_text(text * 8, encoding="utf-8")
    out = tmp_path / "out"
    command = [
        str(BIN / "omnibert-prepare"), f"input_files=[{','.join(map(str, inputs))}]",
        f"vocab_file={bert_vocab_file}", f"output_dir={out}", "num_workers=2",
        "dupe_factor=10", "progress=false", f"hydra.run.dir={tmp_path / 'hydra'}",
    ]  # fmt: skip
    with started(command, tmp_path, "prepare") as run:
        deadline = time.monotonic() + TIMEOUT
        while read_part_record(out, 0) is None and run.proc.poll() is None:
            assert time.monotonic() < deadline, run.log.read_text()
            time.sleep(0.05)
        run.signal(signal.SIGTERM, group=True)
        code, lines = run.finish()
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    assert re.fullmatch(
        r"omnibert-prepare: stopped by SIGTERM with [1-4] of 5 input files done; the finished "
        r"ones are kept; run the same command again to go on",
        lines[-1],
    ), "\n".join(lines)
    _no_traceback(lines)
    assert not (out / "metadata.json").exists()
    assert not list((out / PARTS_DIR).glob("*.tmp-*"))  # the unfinished parts are gone
    # the same work again goes on from the finished parts
    summary = prepare(
        [str(p) for p in inputs], bert_vocab_file, out, InstanceSettings(dupe_factor=10),
        num_workers=2, progress=False,
    )  # fmt: skip
    assert summary.resumed_files >= 1
