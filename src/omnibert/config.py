"""Where the Hydra configuration lives and small helpers shared by the Hydra apps."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

#: The repository's ``conf/`` directory (the project is installed editable by ``make install``).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

if not (CONF_DIR / "prepare.yaml").is_file():  # pragma: no cover - packaging error
    raise ImportError(
        f"omnibert's Hydra configs were not found at {CONF_DIR}; install the project from its "
        "repository with `make install` (pip install -e .)."
    )


@contextmanager
def exit_on(app: str, *errors: type[BaseException]) -> Iterator[None]:
    """Turn the app's user errors (bad config or input, raised before compute) into one line
    on stderr, ``<app>: error: ...``, and exit code 2."""
    try:
        yield
    except errors as err:
        print(f"{app}: error: {err}", file=sys.stderr)
        sys.exit(2)
