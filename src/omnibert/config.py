"""Where the Hydra configuration lives and small helpers shared by the Hydra apps."""

from __future__ import annotations

from pathlib import Path

#: The repository's ``conf/`` directory (the project is installed editable by ``make install``).
CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

if not (CONF_DIR / "prepare.yaml").is_file():  # pragma: no cover - packaging error
    raise ImportError(
        f"omnibert's Hydra configs were not found at {CONF_DIR}; install the project from its "
        "repository with `make install` (pip install -e .)."
    )
