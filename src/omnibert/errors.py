"""One base class for every problem a user can fix, and how the apps report it.

Every check that runs before compute (bad config keys, missing or corrupt files, a vocab or
sequence length that does not match the data, impossible batch arithmetic, a missing vendor
SDK) raises a :class:`UserError` subclass whose message is one sentence naming the key or
file and the fix. The apps catch :class:`UserError` alone (:func:`exit_on`): it becomes one
line on stderr and exit code 2; anything else is a bug and keeps its traceback. The same
block handles SIGTERM and SIGINT (:mod:`omnibert.stopping`): a stopped run prints one line,
``<app>: stopped by SIGTERM at step 137; resume with ckpt_path=last``, and exits with 128 +
the signal number.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from omnibert.stopping import Stopped, handle_stop_signals


class UserError(ValueError):
    """A problem the user can fix: the message names the key or file and the fix.

    Raised in a DataLoader worker process, it reaches the training process re-created by
    torch with the worker's whole traceback as its message; the original sentence is
    recovered from that text, so the apps still print one line.
    """

    def __init__(self, message: object = "", *args: object) -> None:
        super().__init__(_unwrap_worker_message(type(self), message), *args)


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


@contextmanager
def exit_on(app: str) -> Iterator[None]:
    """Turn a :class:`UserError` raised inside the block into ``<app>: error: <message>`` on
    stderr and exit code 2, and a stop by SIGTERM or SIGINT (handled inside the block) into
    ``<app>: stopped by ...`` and exit code 128 + the signal number."""
    with handle_stop_signals(app):
        try:
            yield
        except UserError as err:
            print(f"{app}: error: {err}", file=sys.stderr)
            sys.exit(2)
        except Stopped as stop:
            # one write: the ranks of a multi-process run share stderr, and print() writes the
            # newline apart, so two ranks' lines would run into one
            sys.stderr.write(f"{app}: {stop.message}\n")
            sys.stderr.flush()
            sys.exit(stop.exit_code)
