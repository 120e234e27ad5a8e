"""Two CPU processes under every launcher, and what happens when one of them is lost.

Real processes (``omnibert-train`` with ``accelerator.devices=2``, gloo): Lightning's own
launch, ``torchrun`` (``python -m torch.distributed.run``) and Open MPI's ``mpirun``. One
uninterrupted Lightning run is the reference (one per session); one chain of runs sharing a
checkpoint directory goes through every fault and ends bitwise equal to it:

1. Lightning: SIGTERM to the process group while both ranks hold at step 2: both stop at
   step 2 (exit 143), ``last.ckpt`` is step 2;
2. torchrun, resumed: rank 1 SIGKILLed after step 3's checkpoint: the survivor says so in
   one line, torchrun names the rank and exits 1; ``last.ckpt`` is step 3;
3. Lightning, resumed: rank 1 SIGKILLed after step 4: rank 0, its parent, names the rank, its
   pid and the signal in one line and exits 75 at once; ``last.ckpt`` is step 4, nothing
   half-written;
4. Lightning, resumed to the end: weights, optimiser state and schedule bitwise equal to the
   reference.

``mpirun -np 2`` trains to the reference's weights (skipped with the reason where Open MPI
is missing and cannot be installed); a rank that hangs ends the run after
``accelerator.timeout_s`` with one line; the reference trains to the weights of one process
with the same global batch. Every test waits for what the runs print, never for a fixed
time. The reference runs once per session, whichever xdist workers ask for it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from test_ddp import SMOKE
from test_signals import TIMEOUT, Run
from test_signals import started as started_in
from training_state import assert_same_training_state, load_state

from omnibert.apps.train import run_or_exit
from omnibert.compat import seed_everything
from omnibert.errors import EXIT_LOST_RANK
from omnibert.models import BertConfig, BertForPreTraining

BIN = Path(sys.executable).parent
STEPS = 6
assert SMOKE[-1].startswith("callbacks.checkpoint.every_n_train_steps=")
#: test_ddp's 6 smoke steps without dropout, a checkpoint after every step
ARGS = (*SMOKE[:-1], "callbacks.checkpoint.every_n_train_steps=1")
ENV = {"OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
LOST = r"; the run stops; resume with ckpt_path=last"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _launch(launcher: str) -> list[str]:
    """The command line before omnibert-train's own arguments."""
    if launcher == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                "--nproc_per_node", "2", "--max-restarts", "0"]  # fmt: skip
    if launcher == "mpirun":
        root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
        exported = [arg for key in (*ENV, "PYTHONPATH") for arg in ("-x", key)]
        return ["mpirun", *root, "-np", "2", "--oversubscribe", "--bind-to", "none",
                *exported, "-x", f"MASTER_PORT={_free_port()}"]  # fmt: skip
    return []


def _command(launcher: str, root: Path, name: str, *extra: str) -> list[str]:
    return [
        *_launch(launcher), str(BIN / "omnibert-train"), *ARGS, "accelerator.devices=2",
        f"paths.output_root={root}", f"hydra.run.dir={root / ('hydra-' + name)}", *extra,
    ]  # fmt: skip


@contextlib.contextmanager
def started(command: list[str], tmp_path: Path, name: str) -> Iterator[Run]:
    """test_signals' run, with the environment these runs need and a minute for a launcher to
    end its workers before SIGKILL."""
    with started_in(command, tmp_path, name, env=ENV, grace=60) as run:
        yield run


def _finish(command: list[str], tmp_path: Path, name: str) -> tuple[int, list[str]]:
    with started(command, tmp_path, name) as run:
        return run.finish()


def _last(root: Path) -> Path:
    return root / "smoke" / "checkpoints" / "last.ckpt"


def _no_traceback(lines: list[str]) -> None:
    text = "\n".join(line for line in lines if "torch.distributed" not in line)
    assert "Traceback" not in text and "Error" not in text, text


def _launcher_lines(lines: list[str]) -> list[str]:
    return sorted(line.split("launcher", 1)[1].strip() for line in lines if "  launcher  " in line)


@pytest.fixture(scope="session")
def reference(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """``last.ckpt`` of an uninterrupted two-process run (Lightning's launcher), made once
    per test session: the xdist workers share it through their common base directory."""
    shared = tmp_path_factory.getbasetemp()
    if worker_id != "master":  # xdist: pytest-<n>/popen-gw<i>: pytest-<n> is this session's
        shared = shared.parent
    tmp = shared / "ranks-reference"
    with FileLock(str(shared / "ranks-reference.lock")):
        if not (tmp / "done").is_file():
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir()
            code, lines = _finish(_command("lightning", tmp, "ref"), tmp, "reference")
            assert code == 0, "\n".join(lines)
            assert any("distributed_backend=gloo" in line for line in lines), "\n".join(lines)
            assert _launcher_lines(lines) == [  # rank 0's report: one voice
                "lightning: world size 2, rank 0 (local rank 0 of 2); this process starts "
                "the other 1 of this node",
            ]
            (tmp / "done").touch()
    return _last(tmp)


def test_two_cpu_processes_train_to_the_weights_of_one(reference, tmp_path, compose_config):
    """One process: micro-batches of 4, accumulated twice (each loss halved, gradients
    summed). Two processes: one micro-batch of 4 each, gradients all-reduced (summed by gloo)
    and divided by 2. Same 8 rows per step (test_ddp's sharding test), same seed and init, so
    the same maths: halving is exact in floating point, and what may differ is the order of
    the sums (DDP's gradient buckets, the different micro-batch split in the matmuls' row
    blocks): a few ulp per step. Measured: at most 1.2e-7 after 6 steps. The tolerance (atol
    1e-6, rtol 1e-5) is four orders of magnitude below how far training moved the weights,
    so a wrong sharding (duplicated rows) or a sum instead of a mean would fail it.
    """
    one = tmp_path / "one"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_or_exit(compose_config(*ARGS, f"paths.output_root={one}"), one / "out")
    finally:
        torch.set_num_threads(threads)
    want = load_state(next(one.glob("**/checkpoints")) / "last.ckpt")
    got = load_state(reference)
    assert want["global_step"] == got["global_step"] == STEPS
    want, got = want["state_dict"], got["state_dict"]
    assert want.keys() == got.keys()
    for name, tensor in want.items():
        torch.testing.assert_close(got[name], tensor, atol=1e-6, rtol=1e-5, msg=name)
    # the tolerance is far below how much training moved the weights from their init
    cfg = compose_config(*ARGS)
    seed_everything(cfg.seed)
    init = BertForPreTraining(BertConfig(**{**cfg.model.config, "vocab_size": 128}))
    moved = max((want[f"model.{k}"] - v).abs().max().item() for k, v in init.state_dict().items())
    assert moved > 1e-2


def test_signals_and_lost_ranks_under_each_launcher_resume_bitwise(
    reference: Path, tmp_path: Path
) -> None:
    root = tmp_path / "runs"
    # 1. SIGTERM to the group: every rank stops at the same step, with its checkpoint
    hold = ["+callbacks.hold._target_=faults.HoldUntilSignalled", "+callbacks.hold.step=2"]
    with started(_command("lightning", root, "1", *hold), tmp_path, "1-sigterm") as run:
        run.wait_for(r"HoldUntilSignalled: rank [01] holds at step 2")
        run.wait_for(r"HoldUntilSignalled: rank [01] holds at step 2")
        run.signal(signal.SIGTERM, group=True)
        code, lines = run.finish()
    assert code == 128 + signal.SIGTERM, "\n".join(lines)
    stops = [line for line in lines if "stopped by" in line]
    want = "omnibert-train: stopped by SIGTERM at step 2; resume with ckpt_path=last"
    assert stops == [want], "\n".join(lines)  # rank 0's: one voice
    assert load_state(_last(root))["global_step"] == 2
    _no_traceback(lines)

    # 2. torchrun, resumed; rank 1 SIGKILLed: the survivor says it in one line
    kill = ["ckpt_path=last", "+callbacks.kill._target_=faults.KillAtStep"]
    command = _command("torchrun", root, "2", *kill, "+callbacks.kill.step=3",
                       "+callbacks.kill.rank=1")  # fmt: skip
    code, lines = _finish(command, tmp_path, "2-torchrun-kill")
    assert code == 1, "\n".join(lines)  # torchrun's own code for a failed worker
    assert _launcher_lines(lines) == ["torchrun: world size 2, rank 0 (local rank 0 of 2)"]
    ours = [line for line in lines if line.startswith("omnibert-train: rank")]
    assert len(ours) == 1, "\n".join(lines)
    assert re.fullmatch(
        r"omnibert-train: rank 1 was lost: rank 0's connection to it closed \(.+\)" + LOST,
        ours[0],
    ), ours[0]
    assert any(re.search(r"rank\s*: 1 \(local_rank: 1\)", line) for line in lines)
    assert any("Signal 9 (SIGKILL)" in line for line in lines), "\n".join(lines)
    assert load_state(_last(root))["global_step"] == 3

    # 3. Lightning's launcher, resumed; rank 1 SIGKILLed: rank 0, its parent, names it
    command = _command("lightning", root, "3", *kill, "+callbacks.kill.step=4",
                       "+callbacks.kill.rank=1")  # fmt: skip
    code, lines = _finish(command, tmp_path, "3-lightning-kill")
    assert code == EXIT_LOST_RANK, "\n".join(lines)
    killed = next(re.search(r"pid (\d+)", line) for line in lines if "KillAtStep" in line)
    assert killed is not None
    ours = [line for line in lines if line.startswith("omnibert-train: rank")]
    assert ours == [
        f"omnibert-train: rank 1 (pid {killed.group(1)}) was lost: killed by SIGKILL{LOST}"
    ], "\n".join(lines)
    _no_traceback(lines)
    checkpoints = _last(root).parent
    assert load_state(_last(root))["global_step"] == 4
    assert not [p.name for p in checkpoints.iterdir() if ".tmp-" in p.name]

    # 4. resumed to the end: bitwise the uninterrupted run
    code, lines = _finish(_command("lightning", root, "4", "ckpt_path=last"), tmp_path, "4")
    assert code == 0, "\n".join(lines)
    assert_same_training_state(load_state(reference), load_state(_last(root)), STEPS)


@pytest.fixture(scope="session")
def mpirun() -> str:
    """Open MPI's mpirun: found, or installed from Debian's openmpi-bin where we are root and
    apt works; otherwise the test is skipped with the reason."""
    found = shutil.which("mpirun")
    if found is None and os.geteuid() == 0 and shutil.which("apt-get"):
        for step in (["apt-get", "update"], ["apt-get", "install", "-y", "openmpi-bin"]):
            done = subprocess.run(step, capture_output=True, text=True, timeout=900,
                                  env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})  # fmt: skip
            if done.returncode != 0:
                pytest.skip(f"Open MPI is not installed and {' '.join(step)} failed: "
                            f"{done.stderr.strip().splitlines()[-1:]}")  # fmt: skip
        found = shutil.which("mpirun")
    if found is None:
        pytest.skip("Open MPI's mpirun is not installed (apt-get install openmpi-bin, as root)")
    version = subprocess.run([found, "--version"], capture_output=True, text=True).stdout
    if "Open MPI" not in version:
        pytest.skip(f"{found} is not Open MPI's mpirun: {version.strip()[:80]}")
    return found


def test_mpirun_trains_to_the_weights_of_lightnings_launch(
    mpirun: str, reference: Path, tmp_path: Path
) -> None:
    code, lines = _finish(_command("mpirun", tmp_path, "mpi"), tmp_path, "mpirun")
    assert code == 0, "\n".join(lines)
    assert _launcher_lines(lines) == ["mpirun (Open MPI): world size 2, rank 0 (local rank 0 of 2)"]
    assert_same_training_state(load_state(reference), load_state(_last(tmp_path)), STEPS)


def test_a_rank_that_hangs_ends_the_run_after_timeout_s(tmp_path: Path) -> None:
    """Rank 1 blocks for good after step 2 (its socket stays open, so nothing closes): rank 0
    waits accelerator.timeout_s in its next collective, then ends the run in one line and
    kills the hung rank. Before that, rank 1's first step starts 15 s late, longer than
    timeout_s, as a cold compile beside a peer's warm cache: the first steps' collectives
    wait for it (the compile allowance), so the run goes on to step 2. (The ranks' start
    waits at least 10 minutes: a loaded machine may start them far apart.)"""
    hang = ["accelerator.timeout_s=10", "+callbacks.hang._target_=faults.HangAtStep",
            "+callbacks.hang.step=2", "+callbacks.hang.rank=1",
            "+callbacks.slow._target_=faults.SlowFirstStep", "+callbacks.slow.seconds=15",
            "+callbacks.slow.rank=1"]  # fmt: skip
    with started(_command("lightning", tmp_path, "hang", *hang), tmp_path, "hang") as run:
        run.wait_for(r"SlowFirstStep: rank 1 compiles for 15 s")
        pid = int(run.wait_for(r"HangAtStep: rank 1 \(pid (\d+)\) hangs at step 2").group(1))
        code, lines = run.finish()
    assert code == EXIT_LOST_RANK, "\n".join(lines)
    ours = [line for line in lines if line.startswith("omnibert-train: rank")]
    assert ours == [
        "omnibert-train: rank 1 stopped responding (no collective for 10 s, "
        f"accelerator.timeout_s){LOST}"
    ], "\n".join(lines)
    _no_traceback(lines)
    assert load_state(_last(tmp_path))["global_step"] == 2
    _wait_gone(pid)


def _wait_gone(pid: int) -> None:
    """Until ``pid`` is gone or a zombie (killed; its new parent may not reap it)."""
    import time

    deadline = time.monotonic() + TIMEOUT
    status = Path(f"/proc/{pid}/status")
    while time.monotonic() < deadline:
        try:
            if "\nState:\tZ" in status.read_text():
                return
        except FileNotFoundError:
            return
        time.sleep(0.1)
    raise AssertionError(f"the hung rank (pid {pid}) is still running")
