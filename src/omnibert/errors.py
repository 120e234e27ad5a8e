"""One base class for every problem a user can fix, and how the apps report it.

Every check that runs before compute (bad config keys, missing or corrupt files, a vocab or
sequence length that does not match the data, impossible batch arithmetic, a missing vendor
SDK) raises a :class:`UserError` subclass whose message is one sentence naming the key or
file and the fix. The apps catch :class:`UserError` alone (:func:`exit_on`): it becomes one
line on stderr and exit code 2; anything else is a bug and keeps its traceback. The same
block handles SIGTERM and SIGINT (:mod:`omnibert.stopping`): a stopped run prints one line,
``<app>: stopped by SIGTERM at step 137; resume with ckpt_path=last``, and exits with 128 +
the signal number. A run that fails during compute for a reason the user can act on
(:class:`RunFailed`: gradients that stay non-finite, ...) prints one line too, with its own
exit code. A multi-process run that loses one of its ranks (killed, crashed, or silent past
``accelerator.timeout_s``) raises :class:`LostRank`: one line naming the rank, exit code
:data:`EXIT_LOST_RANK`.

One voice: in a run of several processes rank 0 speaks for the run (its plan, progress,
summary, stop line and files: :func:`is_rank_zero`); another rank prints only its own
errors, each line prefixed ``rank <k>: `` (:func:`say`), and its log records below ERROR and
its Python warnings are dropped (:func:`quiet_other_ranks`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omnibert.stopping import Stopped, app_name, handle_stop_signals

#: the exit code of a run that lost a rank: sysexits.h's EX_TEMPFAIL ("try again later"),
#: what it is: the same command with ckpt_path=last goes on from the last checkpoint
EXIT_LOST_RANK = 75

_REPORTED = threading.Lock()
#: this process's global rank once the launch is known (:func:`set_process_rank`)
_RANK: int | None = None
#: the launchers' variables for a process's global rank: torchrun's, Open MPI's, SLURM's
#: (srun), then Lightning's own launch (the children it starts on its node)
_RANK_VARIABLES = ("RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "LOCAL_RANK")


def set_process_rank(rank: int | None) -> None:
    """This process's global rank as the run's launch decided it (``None``: read it from the
    launcher's variables again)."""
    global _RANK
    _RANK = rank


def process_rank() -> int:
    """This process's global rank: :func:`set_process_rank`'s, else the first of the
    launchers' variables set (0 for a single process)."""
    if _RANK is not None:
        return _RANK
    for key in _RANK_VARIABLES:
        value = os.environ.get(key, "").strip()
        if value.isdigit():
            return int(value)
    return 0


def is_rank_zero() -> bool:
    """Whether this process speaks for the run (rank 0, or the only process)."""
    return process_rank() == 0


class _ErrorsOnly(logging.Filter):
    """Another rank's records: ERROR and above, prefixed with the rank."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.prefix = f"rank {rank}: "

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return False
        if not str(record.msg).startswith(self.prefix):
            record.msg = self.prefix + str(record.msg)
        return True


def quiet_other_ranks() -> None:
    """On a rank other than 0: the root logger's handlers (Hydra's console and job log) pass
    its errors only, and Python warnings are not shown (rank 0 shows the same ones)."""
    rank = process_rank()
    if rank == 0:
        return
    warnings.filterwarnings("ignore")
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, _ErrorsOnly) for f in handler.filters):
            handler.addFilter(_ErrorsOnly(rank))


class UserError(ValueError):
    """A problem the user can fix: the message names the key or file and the fix.

    Raised in a DataLoader worker process, it reaches the training process re-created by
    torch with the worker's whole traceback as its message; the original sentence is
    recovered from that text, so the apps still print one line.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(_unwrap_worker_message(type(self), message), *args)


class ConversionError(UserError):
    """A checkpoint that cannot be read into (or written from) the model as asked (defined
    here, without torch, so that the apps refuse a path before they import the model code;
    :mod:`omnibert.convert` raises it)."""


class RunFailed(Exception):
    """A run that cannot go on, for a reason the user can act on, found during compute: the
    message is one sentence naming what happened, what is on disk and the fix; the app
    exits with :attr:`exit_code` (documented in docs/faults.md) and no traceback."""

    exit_code = 1


def _unwrap_worker_message(cls: type, message: object) -> object:
    """The sentence of a :class:`UserError` that ``torch.utils.data`` re-raised from a
    loader worker as ``Caught <Error> in DataLoader worker process N.\nOriginal Traceback
    ...\n<module>.<Error>: <sentence>`` (``torch._utils.ExceptionWrapper.reraise``)."""
    if not isinstance(message, str) or not message.startswith(f"Caught {cls.__name__} "):
        return message
    where = message.split("\n", 1)[0].removeprefix(f"Caught {cls.__name__} ").rstrip(".")
    marker = f"{cls.__module__}.{cls.__qualname__}: "
    at = message.rfind("\n" + marker)
    if "\nOriginal Traceback" not in message or at < 0:
        return message
    sentence = message[at + 1 + len(marker) :].strip().split("\n", 1)[0]
    return f"{where}: {sentence}"  # first: a command ending the sentence stays last


class LostRank(Exception):
    """Another process of a multi-process run died or stopped answering; the message names
    it (``rank 1 (pid 4242) was lost: killed by SIGKILL; ...``)."""

    exit_code = EXIT_LOST_RANK


def report_once(line: str) -> bool:
    """Print ``line`` on stderr unless this process already reported a lost rank (the thread
    watching Lightning's child processes and the main thread may both see the loss); whether
    it printed."""
    if not _REPORTED.acquire(blocking=False):
        return False
    say(line)
    return True


def say(line: str) -> None:
    """``line`` on stderr in one write: the ranks of a multi-process run share the terminal,
    and ``print`` writes the text and its newline apart, so two ranks' lines could merge. A
    rank other than 0 names itself first (``rank 1: ...``)."""
    rank = process_rank()
    sys.stderr.write((f"rank {rank}: " if rank else "") + line + "\n")
    sys.stderr.flush()


def report_lost_rank(message: str) -> bool:
    """:func:`report_once` of ``<app>: <message>`` (from a thread that is not the app's)."""
    return report_once(f"{app_name()}: {message}")


@contextmanager
def exit_on(app: str) -> Iterator[None]:
    """Turn a :class:`UserError` raised inside the block into ``<app>: error: <message>`` on
    stderr and exit code 2, a :class:`RunFailed` into the same line and its own code, a
    stop by SIGTERM or SIGINT (handled inside the block) into ``<app>: stopped by ...`` and
    exit code 128 + the signal number, and a :class:`LostRank` into ``<app>: <message>`` and
    exit code :data:`EXIT_LOST_RANK`."""
    with handle_stop_signals(app, process_rank):
        try:
            yield
        except UserError as err:
            say(f"{app}: error: {err}")
            sys.exit(2)
        except RunFailed as failed:
            say(f"{app}: error: {failed}")
            sys.exit(failed.exit_code)
        except Stopped as stop:  # every rank stops at the same step: rank 0 says it
            if is_rank_zero():
                say(f"{app}: {stop.message}")
            sys.exit(stop.exit_code)
        except LostRank as lost:
            report_once(f"{app}: {lost}")
            sys.exit(lost.exit_code)


def yes_no(value: Any, key: str, error: type[UserError] = UserError) -> bool:
    """A yes/no key: a bool, or what an environment variable gives for one (``true``/``false``,
    ``1``/``0``, ``yes``/``no``, ``on``/``off``); anything else is ``error``'s one sentence."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise error(f"{key}={value!r} is not true or false; set {key}=true or {key}=false.")
