"""Each log message once.

Lightning gives its ``lightning`` logger a console handler of its own (``INFO: ...``) and
lets its records propagate to the root logger, where Hydra's console and job-log handlers
print them again: every Lightning line (and the model summary) appeared twice.
:func:`single_lightning_output` drops Lightning's own console handler when the root logger
has handlers (an app under Hydra), so each line is printed once on the console, in Hydra's
format, and kept in the job's log file.

Progress in a log file: :class:`LineProgress` (``omnibert-prepare``'s files and pack index
steps) prints lines where tqdm would redraw a bar; the Lightning apps use
:class:`omnibert.callbacks.progress.ProgressLog`.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from datetime import timedelta
from typing import Any, TextIO

__all__ = ["LineProgress", "progress_bar", "single_lightning_output"]


def single_lightning_output() -> None:
    """Drop the ``lightning`` logger's own console handler when the root logger prints."""
    import lightning  # noqa: F401  (adds the handler on import)

    if not logging.getLogger().handlers:
        return  # no Hydra (a script or a test): Lightning's handler is the only output
    logger = logging.getLogger("lightning")
    for handler in list(logger.handlers):
        if type(handler) is logging.StreamHandler:
            logger.removeHandler(handler)


class LineProgress:
    """tqdm's ``update`` / ``set_postfix`` / ``close`` as plain lines, for stdout that is
    not a terminal (a carriage-return bar in a log file is one unreadable line): a line at
    the start, after each ``update`` that comes ``every_seconds`` after the previous line
    (the first ``first_seconds`` after the start), at the end, and, while nothing updates
    (one long input file), a line at those times from a background thread, so a log shows
    the run is alive within ``first_seconds``.

        omnibert-prepare: 3/10 files (30%)  instances=12,345  tokens=1,580,160  elapsed 0:00:41
    """

    def __init__(
        self,
        total: int,
        desc: str,
        unit: str,
        every_seconds: float = 30.0,
        first_seconds: float = 10.0,
        stream: TextIO | None = None,
    ) -> None:
        self.total, self.desc, self.unit = total, desc, unit
        self.every_seconds, self.first_seconds = every_seconds, first_seconds
        self.n = 0
        self._stream = stream
        self._postfix: dict[str, Any] = {}
        self._start = self._last = time.monotonic()
        self._lines = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._print("started")
        self._thread = threading.Thread(target=self._heartbeat, daemon=True)
        self._thread.start()

    def _wait(self) -> float:
        return self.first_seconds if self._lines <= 1 else self.every_seconds

    def _print(self, note: str = "") -> None:
        percent = f" ({self.n / self.total:.0%})" if self.total else ""
        parts = [f"{self.desc}: {self.n}/{self.total} {self.unit}s{percent}"]
        parts += [f"{k}={v}" for k, v in self._postfix.items()]
        parts.append(f"elapsed {timedelta(seconds=int(time.monotonic() - self._start))}")
        if note:
            parts.append(note)
        print("  ".join(parts), file=self._stream or sys.stdout, flush=True)
        self._last, self._lines = time.monotonic(), self._lines + 1

    def _heartbeat(self) -> None:
        while not self._closed.wait(max(0.05, self._last + self._wait() - time.monotonic())):
            with self._lock:
                if time.monotonic() - self._last >= self._wait():
                    self._print("working")

    def update(self, n: int = 1) -> None:
        with self._lock:
            self.n += n
            if time.monotonic() - self._last >= self._wait():
                self._print()

    def set_postfix(self, **values: Any) -> None:
        with self._lock:
            self._postfix = values

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        self._thread.join()
        with self._lock:
            self._print("done" if self.n >= self.total else "stopped")


def progress_bar(
    total: int, desc: str, unit: str, enabled: bool, is_tty: bool | None = None
) -> Any:
    """A tqdm bar on a terminal, :class:`LineProgress` lines otherwise (None: stdout's)."""
    tty = sys.stdout.isatty() if is_tty is None else is_tty
    if enabled and not tty:
        return LineProgress(total, desc, unit)
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, desc=desc, disable=not enabled)
