"""A loader worker killed under a real omnibert-train (SIGKILL, as the out-of-memory killer
sends it; ``data.num_workers=2``): one line naming the worker (the training loader's, its
index and pid), the signal and the likely cause, and the checkpoint to resume from; exit code
71, no traceback; ``ckpt_path=last`` resumes and finishes. And torch's other wordings of a
worker's death read the same way."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import pytest
import torch
from test_signals import _checkpoints, _no_traceback, _train, started

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.data.loader_workers import note_worker, worker_death

STEPS = ["phase.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2", "data.num_workers=2"]

if not Path("/proc/self/stat").is_file():
    pytest.skip("the loader workers are found through /proc (Linux)", allow_module_level=True)


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def _alive(pid: int) -> bool:
    """Running (not gone, not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _forked_children(pid: int) -> list[int]:
    """The children of ``pid`` that run its command line (forked loader workers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == pid and _cmdline(int(entry.name)) == _cmdline(pid):
                found.append(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return sorted(found)


def test_a_killed_loader_worker_stops_the_run_in_one_line_and_it_resumes(tmp_path: Path) -> None:
    pause = [
        "+callbacks.pause._target_=faults.PauseAt", "+callbacks.pause.steps=[3]",
        f"+callbacks.pause.folder={tmp_path}",
    ]  # fmt: skip
    with started(_train(tmp_path, *STEPS, *pause), tmp_path, "train") as run:
        run.wait_for(r"PauseAt: paused at step 3")  # step 2's checkpoint is on disk
        workers = _forked_children(run.proc.pid)
        assert len(workers) == 2, workers
        victim = workers[-1]
        os.kill(victim, signal.SIGKILL)  # the run stays paused: torch's SIGCHLD handler ends it
        code, lines = run.finish()
    assert code == 71, "\n".join(lines)
    folder = _checkpoints(tmp_path)
    found = re.fullmatch(
        rf"omnibert-train: error: training loader worker ([01]) \(pid {victim}\) was killed "
        r"by SIGKILL: usually the out-of-memory killer \(see dmesg or the job's memory limit\); "
        r"lower data.num_workers or the micro batch, or raise the memory limit; "
        rf"{folder}/last\.ckpt holds step 2: resume with ckpt_path=last \(the steps after 2 are "
        r"trained again\)",
        lines[-1],
    )
    assert found, lines[-1]
    _no_traceback(lines)
    assert not any(_alive(pid) for pid in workers)
    resume = ["experiment=smoke", *STEPS, f"paths.output_root={tmp_path / 'runs'}"]
    summary = run_or_exit(compose("pretrain", [*resume, "ckpt_path=last"]), None)
    assert summary["steps"] == 6
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 6


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ("DataLoader worker (pid 4242) is killed by signal: Bus error. ",
         "evaluation loader worker 1 (pid 4242) was killed by SIGBUS: usually shared memory "
         "(/dev/shm) too small for the batches"),
        ("DataLoader worker (pid 4242) exited unexpectedly with exit code 3. Details are lost "
         "due to multiprocessing. Rerunning with num_workers=0 may give better error trace.",
         "evaluation loader worker 1 (pid 4242) exited with exit code 3; run again with "
         "data.num_workers=0 to see its error"),
        ("DataLoader worker (pid(s) 4242, 77) exited unexpectedly",
         "evaluation loader worker 1 (pid 4242), a loader worker (pid 77) ended without a word, "
         "usually killed by the out-of-memory killer"),
        ("CUDA error: out of memory", None),
    ],
)  # fmt: skip
def test_every_wording_of_a_dead_worker_is_read(message, expected):
    """A worker noted its index and pid (as its ``worker_init_fn`` does in the worker);
    torch's message may come wrapped in another error."""
    note_worker(4242, 1, "evaluation")
    try:
        raise RuntimeError(message)
    except RuntimeError as inner:
        wrapped = RuntimeError("teardown failed")
        wrapped.__context__ = inner
    said = worker_death(wrapped)
    assert said == expected if expected is None else said.startswith(expected), said


def test_a_killed_worker_ends_omnibert_eval_in_one_line(
    tiny_pretraining_run, monkeypatch, capsys
) -> None:
    """In process: the evaluation loader's worker 1 SIGKILLs itself once it has noted itself
    (the noting is the app's own ``worker_init_fn``), as the out-of-memory killer would."""
    from omnibert.apps import eval as eval_app
    from omnibert.data import loader_workers

    noted = loader_workers._init

    def note_then_die(loader: int, worker_id: int) -> None:
        noted(loader, worker_id)
        if worker_id == 1:
            os.kill(os.getpid(), signal.SIGKILL)

    monkeypatch.setattr(loader_workers, "_init", note_then_die)
    root, ckpt = tiny_pretraining_run["root"], tiny_pretraining_run["ckpt"]
    # one row per batch: batch 1 is worker 1's, so the loader waits for the dead worker (with
    # one batch, worker 0 alone could end the evaluation before the death is seen)
    cfg = compose("eval", [f"ckpt={ckpt}", f"data.eval_path={root / 'eval'}", "data.num_workers=2",
                           "eval_micro_batch_size=1"])  # fmt: skip
    with pytest.raises(SystemExit) as exited:
        eval_app.run_or_exit(cfg, None)
    assert exited.value.code == 71
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert re.fullmatch(
        # torch reports the death by the signal (its SIGCHLD handler) or, when its status check
        # sees it first, as a worker that exited unexpectedly: both name worker 1
        r"omnibert-eval: error: evaluation loader worker 1 \(pid \d+\) (was killed by SIGKILL: "
        r"usually|ended without a word, usually killed by) the out-of-memory killer \(see dmesg or "
        r"the job's memory limit\); lower "
        r"data.num_workers or the micro batch, or raise the memory limit; the evaluation did not "
        r"finish and wrote no report: run the same command again",
        err[0],
    ), err
