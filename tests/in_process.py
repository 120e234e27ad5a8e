"""An app's ``main()`` run inside the test process: Hydra configures logging there (handlers
on the root logger that write to the streams of that moment, pytest's capture among them), so
:func:`logging_restored` puts the logging configuration back afterwards; left in place, a later
test's log record would be written to a closed capture stream ("--- Logging error ---")."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


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
