"""Real omnibert-train processes whose checkpoint writes really fail, by the kernel: the file
size limit lowered under the running process (``prlimit``: a write past it fails with EFBIG;
Python ignores SIGXFSZ) and, where this machine lets the test mount one, a tmpfs too small for
the run's checkpoints (ENOSPC). ``on_write_error=stop`` ends the run in one line with exit
code 74 and a resumable ``last.ckpt``; ``skip`` warns, goes on and writes the next one; the
plan warned before compute, and ``keep_last=1`` fits where 3 did not.

Each run is held at known steps (tests/faults.PauseAt) while the test changes the limit, so
nothing depends on timing."""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_signals import _checkpoints, _no_traceback, _train, started

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.checkpoints.writing import TMP_MARKER

resource = pytest.importorskip("resource")
if not hasattr(resource, "prlimit"):
    pytest.skip("resource.prlimit (Linux) is needed to lower a running process's file size limit",
                allow_module_level=True)  # fmt: skip

STEPS = ["phase.max_steps=6", "callbacks.checkpoint.every_n_train_steps=2"]


def _paused(folder: Path, *steps: int) -> list[str]:
    return [
        "+callbacks.pause._target_=faults.PauseAt", f"+callbacks.pause.steps=[{','.join(map(str, steps))}]",
        f"+callbacks.pause.folder={folder}",
    ]  # fmt: skip


def _go(folder: Path, step: int) -> None:
    (folder / f"go-{step}").touch()


def _limit(pid: int, size: int | None) -> None:
    """The soft file size limit of process ``pid`` (None: as high as its hard limit)."""
    _, hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)
    resource.prlimit(pid, resource.RLIMIT_FSIZE, (hard if size is None else size, hard))


def _step(path: Path) -> int:
    return int(torch.load(path, weights_only=True)["global_step"])


def _no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if TMP_MARKER in p.name]


def test_a_write_past_the_file_size_limit_stops_the_run_and_it_resumes(tmp_path):
    """The limit drops under a running process after its checkpoint of step 2: the write of
    step 4 fails (EFBIG), the run stops in one line with exit code 74, ``last.ckpt`` of step 2
    still loads and ``ckpt_path=last`` finishes the run from it."""
    folder = _checkpoints(tmp_path)
    with started(_train(tmp_path, *STEPS, *_paused(tmp_path, 3)), tmp_path, "train") as run:
        run.wait_for(r"PauseAt: paused at step 3")
        _limit(run.proc.pid, (folder / "last.ckpt").stat().st_size // 2)
        _go(tmp_path, 3)
        code, lines = run.finish()
    assert code == 74, "\n".join(lines)
    assert re.fullmatch(
        rf"omnibert-train: error: could not write the checkpoint {folder}/step-00000004\.ckpt: "
        r"File too large \(EFBIG\); it needs about [\d.]+ KiB and [\d.]+ [KMGT]iB are free on "
        rf"that file system at step 4, so the run stops; {folder}/last\.ckpt \(step 2\) is "
        r"intact: raise the file size limit of the job \(ulimit -f\) above the checkpoint's "
        r"size, and resume with ckpt_path=last",
        lines[-1],
    ), lines[-1]
    _no_traceback(lines)
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step-00000002.ckpt"]
    assert _step(folder / "last.ckpt") == 2  # torch.load(weights_only=True): intact
    resume = ["experiment=smoke", *STEPS, f"paths.output_root={tmp_path / 'runs'}"]
    summary = run_or_exit(compose("pretrain", [*resume, "ckpt_path=last"]), None)
    assert summary["steps"] == 6 and _step(folder / "last.ckpt") == 6
    _no_temporaries(folder)


def test_skip_goes_on_and_writes_the_next_checkpoint(tmp_path):
    folder = _checkpoints(tmp_path)
    skip = "callbacks.checkpoint.on_write_error=skip"
    command = _train(tmp_path, *STEPS, skip, *_paused(tmp_path, 3, 5))
    with started(command, tmp_path, "train") as run:
        run.wait_for(r"PauseAt: paused at step 3")
        _limit(run.proc.pid, (folder / "last.ckpt").stat().st_size // 2)
        _go(tmp_path, 3)
        warning = run.wait_for(r"could not write the checkpoint .*")
        run.wait_for(r"PauseAt: paused at step 5")
        _limit(run.proc.pid, None)
        _go(tmp_path, 5)
        code, lines = run.finish()
    assert code == 0, "\n".join(lines)
    assert f"could not write the checkpoint {folder}/step-00000004.ckpt: File too large " \
        "(EFBIG)" in warning.group(0)  # fmt: skip
    assert warning.group(0).endswith(
        "at step 4; training goes on and tries again at step 6 (callbacks.checkpoint."
        f"on_write_error=skip); {folder}/last.ckpt (step 2) is intact"
    ), warning.group(0)
    assert sum("could not write" in line for line in lines) == 1, "\n".join(lines)
    _no_traceback(lines)
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["last.ckpt", "step-00000002.ckpt", "step-00000006.ckpt"], names
    assert _step(folder / "last.ckpt") == 6


@contextlib.contextmanager
def _tmpfs(where: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``where``; skips the test where mounting is not
    permitted (not root, no CAP_SYS_ADMIN, no mount command)."""
    where.mkdir()
    try:
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
    except FileNotFoundError:
        pytest.skip("no mount command here: a small tmpfs cannot be made")
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs is not permitted here: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_full_disk_stops_the_run_and_keep_last_1_fits(tmp_path):
    """A tmpfs of 3.5 checkpoints: with keep_last=3 the plan warns (5 at once), the write of
    last.ckpt at step 4 fails with ENOSPC (step 2, its last.ckpt and step 4 fill it): one
    line, exit code 74, step 4's file removed again, last.ckpt of step 2 intact. Resumed with
    keep_last=1 (at most 3 at once) the run ends in the same space."""
    from omnibert.checkpoints.space import checkpoint_bytes
    from omnibert.config import TrainConfig

    config = TrainConfig.of(compose("pretrain", ["experiment=smoke"]))
    each = checkpoint_bytes(config.model.bert(128).to_dict(), "32-true", config.optimizer)
    with _tmpfs(tmp_path / "disk", each * 7 // 2) as disk:
        folder = disk / "checkpoints"
        steps = ["phase.max_steps=8", "callbacks.checkpoint.every_n_train_steps=2"]
        where = [*steps, f"paths.checkpoint_dir={folder}"]
        with started(_train(tmp_path, *where), tmp_path, "full") as run:
            code, lines = run.finish()
        assert code == 74, "\n".join(lines)
        warned = [line for line in lines if line.startswith("omnibert-train: warning: ")]
        assert len(warned) == 1 and "set callbacks.checkpoint.keep_last=1 or free space" in \
            warned[0], "\n".join(lines)  # fmt: skip
        assert lines[-1].startswith(
            f"omnibert-train: error: could not write the checkpoint {folder}/last.ckpt: No space "
            "left on device (ENOSPC); it needs about "
        ), lines[-1]
        assert lines[-1].endswith(
            "at step 4 (step-00000004.ckpt, written just before, is removed again), so the run "
            f"stops; {folder}/last.ckpt (step 2) is intact: free space there (or lower callbacks."
            "checkpoint.keep_last, or set paths.checkpoint_dir to a file system with room), and "
            "resume with ckpt_path=last"
        ), lines[-1]
        _no_traceback(lines)
        assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step-00000002.ckpt"]
        assert _step(folder / "last.ckpt") == 2
        resume = [*where, "callbacks.checkpoint.keep_last=1", "ckpt_path=last"]
        with started(_train(tmp_path, *resume), tmp_path, "resumed") as run:
            code, lines = run.finish()
        assert code == 0, "\n".join(lines)
        assert not any("warning" in line for line in lines), "\n".join(lines)
        assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt", "step-00000008.ckpt"]
        assert _step(folder / "last.ckpt") == 8
