"""SIGTERM and SIGINT: every app stops at its next safe point and says where it stopped.

``kill <pid>`` (schedulers, ``docker stop``, Kubernetes, systemd) sends SIGTERM, Ctrl-C
SIGINT. While an app runs (:func:`handle_stop_signals`, entered by
:func:`omnibert.errors.exit_on`), the first of either signal is noted and:

* inside a safe-point section (:func:`at_safe_points`: the training loop, whose callback
  :class:`omnibert.callbacks.stop.StopAtSafePoint` looks at :func:`pending` after each
  micro-batch), the work goes on to the next safe point, which then raises
  :class:`Stopped` itself (training writes its checkpoint first). A section may bound that
  wait (``within_s``, ``trainer.stop_within_s`` for training): a watchdog thread, woken by
  the signal, ends the process with exit code ``128 + signal number`` and one line of the
  section's (``late``) when the process has not ended by then (a micro-batch or a checkpoint
  write longer than the bound); whatever a killed writer left is a temporary file, never a
  torn checkpoint. A Python thread needs the interpreter lock, so a C call that holds it
  (rare: torch releases it) delays the watchdog until it returns;
* anywhere else (checks, setup, a final validation, data preparation), :class:`Stopped`
  is raised at once, like ``KeyboardInterrupt`` but for both signals and never swallowed
  by an ``except Exception``.

``exit_on`` turns :class:`Stopped` into one line, ``<app>: stopped by SIGTERM at step 137;
resume with ckpt_path=last``, and exit code ``128 + signal number`` (143, 130), what shells
and schedulers expect of a process stopped by a signal. A second signal stops the process
at once (``os._exit``, same exit code): what is on disk stays as the last safe point left it
(checkpoints and prepared parts are written atomically).

A signal whose handler someone else installed before the app started is left to them:
submitit installs its own SIGTERM handler in a SLURM job (it bypasses SIGTERM and requeues
on its own signal, :mod:`omnibert.callbacks.requeue`), and a process started with SIGTERM
ignored keeps ignoring it. Lightning's SLURM requeue listens to SIGUSR1, which is not
touched. Loader workers ignore SIGINT, and SIGTERM while their parent handles it
(:func:`ignore_in_worker`: a byte of memory shared with the forked workers says so), so a
signal to the whole process group (or to every process of a SLURM job or a systemd unit)
stops the run at its step instead of killing a worker under it; outside a run, a parent
ending its workers with SIGTERM (``multiprocessing`` at exit) still ends them.
``omnibert-prepare``'s workers ignore SIGINT and die quietly of SIGTERM
(:func:`omnibert.prepare.workers.die_with_parent`).

One voice (:mod:`omnibert.errors`, which tells this module the process's rank): in a run of
several processes only rank 0 acknowledges a signal; another rank's line that ends its own
process at once (a second signal, the deadline) names its rank first (``rank 1: ...``).

Standard library only: the apps enter it before torch is imported.
"""

from __future__ import annotations

import mmap
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any

__all__ = [
    "SIGNALS",
    "Stopped",
    "app_name",
    "at_safe_points",
    "check",
    "deadline",
    "handle_stop_signals",
    "ignore_in_worker",
    "pending",
    "set_context",
]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(BaseException):
    """The run was stopped by ``signum``; ``where`` (`` at step 137``) and ``hint``
    (``resume with ckpt_path=last``) complete the line the app prints."""

    def __init__(self, signum: int, where: str = "", hint: str = "") -> None:
        self.signum = int(signum)
        self.where = where
        self.hint = hint
        super().__init__(self.message)

    @property
    def message(self) -> str:
        text = f"stopped by {signal.Signals(self.signum).name}{self.where}"
        return f"{text}; {self.hint}" if self.hint else text

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    """The one handler of this process (module docstring)."""

    def __init__(self) -> None:
        self.app = "omnibert"
        self.pid = -1
        self.depth = 0  # nested handle_stop_signals blocks
        self.safe_points = 0  # nested at_safe_points blocks
        self.signum: int | None = None
        self.context = ""  # where a stop outside a safe point leaves the run
        self.safe_point = "the next safe point"  # what the innermost section waits for
        self.previous: dict[int, Any] = {}
        self.watchdog: _Watchdog | None = None  # the innermost bounded section's
        self.rank: Callable[[], int] = lambda: 0  # this process's rank (handle_stop_signals)

    def say(self, line: str) -> None:
        """``line`` on stderr, named by the rank on a rank other than 0."""
        rank = self.rank()
        _say((f"rank {rank}: " if rank else "") + line + "\n")

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:  # a forked child before it set its own handlers
            return
        name = signal.Signals(signum).name
        if self.signum is not None:  # the second signal: stop now
            self.say(f"{self.app}: second {name}: stopping at once.")
            os._exit(128 + signum)
        self.signum = signum
        if self.safe_points:
            if self.watchdog is not None:
                self.watchdog.start(signum)
            if self.rank() == 0:  # every rank stops at the same place: rank 0 says so
                _say(
                    f"{self.app}: {name} received: stopping at {self.safe_point} (send it "
                    "again to stop at once).\n"
                )
            return
        raise Stopped(signum, self.context)


class _Watchdog:
    """A thread that, once :meth:`start`'ed by a stop, ends the process ``within_s`` seconds
    later unless :meth:`cancel` (the section ended normally, or the app printed its stop line)
    came first: it writes ``<app>: <late()>`` and calls ``os._exit(128 + signum)``. The thread
    starts with its section and waits on an event, so the signal handler only sets that event
    (starting a thread from a handler could deadlock on the interpreter's thread locks)."""

    def __init__(self, app: str, within_s: float, late: Callable[[], str] | None) -> None:
        self.app, self.within_s, self.late = app, float(within_s), late
        self.signum: int | None = None
        self._woken = threading.Event()
        self._cancelled = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="omnibert-stop-deadline",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def start(self, signum: int) -> None:
        """Start the countdown (once; a later call changes nothing)."""
        if self.signum is None:
            self.signum = signum
            self._woken.set()

    @property
    def running(self) -> bool:
        return self.signum is not None and not self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()
        self._woken.set()

    def _watch(self) -> None:
        self._woken.wait()
        if self._cancelled.wait(self.within_s) or self.signum is None:
            return
        try:
            line = self.late() if self.late is not None else ""
        except Exception as err:  # the process ends anyway: say why the line is missing
            line = f"(no stop line: {type(err).__name__}: {err})"
        line = line or f"did not stop within {self.within_s:g} s; stopping at once"
        _STATE.say(f"{self.app}: {line}")
        os._exit(128 + self.signum)


_STATE = _State()

#: one byte of anonymous shared memory, inherited by forked loader workers: 1 while this
#: process handles SIGTERM itself (:func:`handle_stop_signals`)
_HANDLING = mmap.mmap(-1, 1)


def _say(text: str) -> None:
    """Write from a signal handler: ``os.write`` is safe where ``print`` may re-enter."""
    with suppress(OSError):
        os.write(2, text.encode())


def _ours(handler: Any) -> bool:
    return handler is _STATE.handle or getattr(handler, "__self__", None) is _STATE


def _free(signum: int, handler: Any) -> bool:
    """Whether nobody else handles ``signum`` (Python's defaults), so the app may."""
    if signum == signal.SIGINT:
        return handler is signal.default_int_handler
    return handler in (signal.SIG_DFL, None)


@contextmanager
def handle_stop_signals(app: str, rank: Callable[[], int] | None = None) -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT stop ``app`` as the module docstring says;
    ``rank`` gives this process's rank when a line is printed (None: 0)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread can set handlers (a job run by a thread pool)
        return
    state = _STATE
    outer = state.depth == 0
    if outer:
        state.app, state.pid, state.signum, state.context = app, os.getpid(), None, ""
        state.rank = rank or (lambda: 0)
        for signum in SIGNALS:
            current = signal.getsignal(signum)
            if _free(signum, current):
                state.previous[signum] = current
                signal.signal(signum, state.handle)
        _HANDLING[0] = int(signal.SIGTERM in state.previous)
    state.depth += 1
    try:
        yield
    finally:
        state.depth -= 1
        if outer:
            if state.watchdog is not None:  # the app said how it stopped: no deadline left
                state.watchdog.cancel()
                state.watchdog = None
            _HANDLING[0] = 0
            for number, handler in state.previous.items():
                if _ours(signal.getsignal(number)):
                    signal.signal(number, handler)
            state.previous.clear()


def handles(signum: int) -> bool:
    """Whether this module handles ``signum`` in this process now."""
    return signum in _STATE.previous and _STATE.pid == os.getpid()


def install(signum: int) -> Any:
    """Put this module's handler back on ``signum`` (Lightning's ``Trainer`` sets its own
    SIGTERM handler while it fits, which ends the run with exit code 0); returns the one it
    replaced."""
    return signal.signal(signum, _STATE.handle)


@contextmanager
def at_safe_points(
    what: str = "the next micro-batch boundary",
    within_s: float | None = None,
    late: Callable[[], str] | None = None,
) -> Iterator[None]:
    """Within the block a signal is only noted (and acknowledged: stopping at ``what``); the
    code checks :func:`pending` at its safe points and raises :class:`Stopped` there. With
    ``within_s``, a stop must end the process within that many seconds of the signal (or of
    :func:`deadline`): otherwise ``<app>: <late()>`` and exit code 128 + the signal number
    (module docstring). The deadline outlives the block when a stop is under way (the
    :class:`Stopped` it raised still has to reach the app's line) and ends with the app's
    :func:`handle_stop_signals` block."""
    state = _STATE
    outer_what, outer_watchdog = state.safe_point, state.watchdog
    state.safe_points += 1
    state.safe_point = what
    watchdog = None
    if within_s is not None and state.depth and state.pid == os.getpid():
        watchdog = state.watchdog = _Watchdog(state.app, within_s, late)
    try:
        yield
    finally:
        state.safe_points -= 1
        state.safe_point = outer_what
        if watchdog is not None:
            if watchdog.running:  # a stop is under way: its deadline holds until the app ends
                state.watchdog = watchdog
            else:
                watchdog.cancel()
                state.watchdog = outer_watchdog


def deadline(signum: int) -> None:
    """Start the bounded section's deadline for a stop this process learned of from another
    one (a signal to one rank of several): every rank then ends in bounded time. Not a signal
    of this process's own: a real one arriving later is still its first."""
    if _STATE.watchdog is not None and _STATE.pid == os.getpid():
        _STATE.watchdog.start(signum)


def app_name() -> str:
    """The app whose run this process is (``omnibert`` outside one): for lines printed from
    other threads."""
    return _STATE.app


def pending() -> int | None:
    """The signal that asked this process to stop, or None."""
    return _STATE.signum if _STATE.pid == os.getpid() else None


def check() -> None:
    """Raise :class:`Stopped` when a signal arrived inside a safe-point section that ended
    without reaching a safe point (e.g. during the last validation of a fit)."""
    signum = pending()
    if signum is not None:
        raise Stopped(signum, _STATE.context)


def set_context(text: str) -> None:
    """What a stop outside a safe point means from now on, appended to ``stopped by
    SIGTERM`` (e.g. `` before training started; nothing to resume``)."""
    _STATE.context = text


def ignore_in_worker(*_: Any) -> None:
    """A loader worker ignores SIGINT, and SIGTERM while its parent handles SIGTERM: a signal
    sent to the whole process group (a terminal's Ctrl-C, ``timeout``, ``kill -- -PGID``,
    SLURM or systemd signalling every process) reaches the parent, which stops at its safe
    point and ends its workers; they never print their own tracebacks. A SIGTERM while the
    parent does not handle it (a parent ending its workers at exit) ends the worker as
    before. Usable as a ``worker_init_fn`` (it takes and ignores the worker id)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _worker_sigterm)


def _worker_sigterm(signum: int, frame: FrameType | None) -> None:
    if _HANDLING[0]:  # the run stops at its safe point and then ends this worker
        return
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
