"""Loader worker processes that die under a run: which one, of what, and what to do.

torch notices a dead worker in the training process (its ``SIGCHLD`` handler, or a check when
no batch comes) and raises ``RuntimeError: DataLoader worker (pid 4242) is killed by signal:
Killed.`` wherever the main thread is. :func:`worker_death` reads that (and torch's other
wordings) into one sentence: the loader and the worker's index (each worker notes its pid and
index in a table of shared memory its parent reads: :func:`init_worker`), the pid, the signal
and its likely cause (``SIGKILL``: usually the out-of-memory killer), and
:class:`LoaderWorkerDied` ends the run with it (exit code 71, ``EX_OSERR`` of sysexits.h).
The run resumes from its last periodic checkpoint (``ckpt_path=last``): the steps after it are
trained again, exactly as they would have been (the failure can come in the middle of a step,
whose data position and RNG state are not a checkpoint's).

Standard library only (the table is made when the loader module is imported, before any
worker is forked).
"""

from __future__ import annotations

import functools
import mmap
import os
import re
import signal
import struct
from collections.abc import Callable

from omnibert.errors import RunFailed
from omnibert.stopping import ignore_in_worker

__all__ = ["LoaderWorkerDied", "init_worker", "note_worker", "worker_death"]

#: slots of (pid, worker index, loader) in :data:`_TABLE`, chosen by pid
_SLOTS = 1024
_SLOT = struct.Struct("<iii")
_TABLE = mmap.mmap(-1, _SLOTS * _SLOT.size)
_LOADERS = ("training", "evaluation")

#: torch's wordings (torch/utils/data/_utils/signal_handling.py, dataloader.py)
_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: (.+?)\.? *$", re.M)
_EXITED = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_VANISHED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")

#: the likely cause of a worker's death by each signal, and what to do
_CAUSES = {
    "SIGKILL": "usually the out-of-memory killer (see dmesg or the job's memory limit); lower "
    "data.num_workers or the micro batch, or raise the memory limit",
    "SIGBUS": "usually shared memory (/dev/shm) too small for the batches, as in a container "
    "(docker run --shm-size); make it larger or lower data.num_workers",
    "SIGSEGV": "a crash in native code; run again with data.num_workers=0 to see where",
    "SIGTERM": "something outside the run ended it",
}


class LoaderWorkerDied(RunFailed):
    """A loader worker process died under the run; the message says which, of what, and how
    to resume (module docstring). Exit code 71 (``EX_OSERR``)."""

    exit_code = 71


def init_worker(loader: str) -> Callable[[int], None]:
    """The ``worker_init_fn`` of ``loader``'s workers (``training`` or ``evaluation``): they
    ignore the stop signals as their parent handles them (:func:`omnibert.stopping.ignore_in_worker`)
    and note their pid and index for :func:`worker_death`."""
    return functools.partial(_init, _LOADERS.index(loader))


def _init(loader: int, worker_id: int) -> None:
    ignore_in_worker()
    note_worker(os.getpid(), worker_id, _LOADERS[loader])


def note_worker(pid: int, index: int, loader: str) -> None:
    """Note in the shared table that process ``pid`` is ``loader``'s worker ``index``."""
    _SLOT.pack_into(_TABLE, (pid % _SLOTS) * _SLOT.size, pid, index, _LOADERS.index(loader))


def _describe(pid: int) -> str:
    noted, index, loader = _SLOT.unpack_from(_TABLE, (pid % _SLOTS) * _SLOT.size)
    if noted != pid or not 0 <= loader < len(_LOADERS):
        return f"a loader worker (pid {pid})"
    return f"{_LOADERS[loader]} loader worker {index} (pid {pid})"


def _signal_name(text: str) -> str | None:
    """``Killed`` (what ``strsignal`` says) -> ``SIGKILL``."""
    for number in signal.Signals:
        if signal.strsignal(number) == text or number.name == text:
            return number.name
    return None


def worker_death(error: BaseException) -> str | None:
    """The first part of the sentence for a loader worker's death that ``error`` or an
    exception it was raised from or while handling reports (the most telling one: torch's
    "exited unexpectedly" is often raised from the ``SIGCHLD`` handler's "killed by signal"),
    ``None`` when none does."""
    texts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, RuntimeError):
            texts.append(str(current))
        current = current.__cause__ or current.__context__
    for text in texts:
        if found := _KILLED.search(text):
            name = _signal_name(found.group(2).strip()) or found.group(2).strip()
            cause = _CAUSES.get(name, "")
            return f"{_describe(int(found.group(1)))} was killed by {name}" + (
                f": {cause}" if cause else ""
            )
    for text in texts:
        if found := _EXITED.search(text):
            return (
                f"{_describe(int(found.group(1)))} exited with exit code {found.group(2)}; run "
                "again with data.num_workers=0 to see its error"
            )
    for text in texts:
        if found := _VANISHED.search(text):
            pids = [int(p) for p in found.group(1).replace(" ", "").split(",") if p]
            who = ", ".join(_describe(p) for p in pids)
            return (
                f"{who} ended without a word, usually killed by the out-of-memory killer (see "
                "dmesg or the job's memory limit); lower data.num_workers or the micro batch, "
                "or raise the memory limit"
            )
    return None
