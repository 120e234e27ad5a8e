"""An app's ``main()`` run inside the test process: Hydra configures logging there (handlers
on the root logger that write to the streams of that moment, pytest's capture among them), so
:func:`logging_restored` puts the logging configuration back afterwards; left in place, a later
test's log record would be written to a closed capture stream ("--- Logging error ---")."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def logging_restored() -> Iterator[None]:
    """Every logger's handlers, level, propagation and disabled flag as they were."""
    loggers = [logging.getLogger(), *(
        logger for logger in logging.Logger.manager.loggerDict.values()
        if isinstance(logger, logging.Logger)
    )]  # fmt: skip
    saved = [(lg, list(lg.handlers), lg.level, lg.propagate, lg.disabled) for lg in loggers]
    try:
        yield
    finally:
        for logger in logging.Logger.manager.loggerDict.values():
            if isinstance(logger, logging.Logger) and logger not in loggers:
                logger.handlers.clear()  # created inside: no handler of that run survives
        for logger, handlers, level, propagate, disabled in saved:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled


def train_main_sweep(monkeypatch: Any, cwd: Path, argv: list[str]) -> None:
    """``omnibert-train -m <argv>`` through its ``main()`` in this process, from ``cwd``, as the
    console script's subprocess ran it: the app's OpenMP wait policy, one thread
    (``accelerator.threads=null`` reads it), the sweep's record of its keys gone afterwards,
    torch's thread count and the logging configuration put back."""
    import torch

    from omnibert.apps import train
    from omnibert.run.launching.sweeps import SWEPT_KEYS_ENV

    monkeypatch.chdir(cwd)
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # the app's default, left as it was
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv(SWEPT_KEYS_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", ["omnibert-train", "-m", *argv])
    threads = torch.get_num_threads()
    try:
        with logging_restored():
            train.main()
    finally:
        torch.set_num_threads(threads)
