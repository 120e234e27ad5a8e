"""One base class for every problem a user can fix, and how the apps report it.

Every check that runs before compute (bad config keys, missing or corrupt files, a vocab or
sequence length that does not match the data, impossible batch arithmetic, a missing vendor
SDK) raises a :class:`UserError` subclass whose message is one sentence naming the key or
file and the fix. The apps catch :class:`UserError` alone (:func:`exit_on`): it becomes one
line on stderr and exit code 2; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager


class UserError(ValueError):
    """A problem the user can fix: the message names the key or file and the fix."""


@contextmanager
def exit_on(app: str) -> Iterator[None]:
    """Turn a :class:`UserError` raised inside the block into ``<app>: error: <message>`` on
    stderr and exit code 2."""
    try:
        yield
    except UserError as err:
        print(f"{app}: error: {err}", file=sys.stderr)
        sys.exit(2)
