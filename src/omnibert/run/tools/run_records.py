"""What an ``omnibert-train`` run recorded about a checkpoint it wrote, found from the
checkpoint alone: the ``summary.json`` of the invocation that ended at that checkpoint's step
(its validation metrics, the precision it validated in, the batch plan and the data), for the
model card of an export and the precision ``omnibert-eval`` matches.

A run keeps its checkpoints in ``<run>/checkpoints/`` and each invocation's ``summary.json``
in ``<run>/hydra/<timestamp>/`` (``conf/paths``). A summary belongs to a checkpoint when it
names the checkpoint's directory (``checkpoint_dir``) and ended at the checkpoint's step
(``steps``): a checkpoint of an earlier step (or a run stopped before its summary) has none,
and nothing is taken from another step's summary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["RunSummary", "read_summary", "run_summary"]


@dataclass(frozen=True)
class RunSummary:
    """A run's ``summary.json`` (``path``) and its contents."""

    path: Path
    values: dict[str, Any]

    @property
    def plan(self) -> dict[str, Any]:
        plan = self.values.get("plan")
        return plan if isinstance(plan, dict) else {}

    @property
    def validation(self) -> dict[str, Any]:
        found = self.values.get("validation")
        return found if isinstance(found, dict) else {}

    @property
    def precision(self) -> str | None:
        """The precision the run trained and validated in (its plan's)."""
        value = self.plan.get("precision")
        return str(value) if value else None


def read_summary(path: Path) -> dict[str, Any] | None:
    """A summary file's contents; None when absent or not a JSON object."""
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return values if isinstance(values, dict) else None


def run_summary(checkpoint: str | Path, step: int | None) -> RunSummary | None:
    """The newest ``summary.json`` of the run that wrote ``checkpoint`` at ``step`` (module
    docstring), or None."""
    ckpt = Path(checkpoint).resolve()
    folder = ckpt.parent
    candidates = sorted(
        folder.parent.glob("hydra/*/summary.json"), key=lambda p: p.stat().st_mtime, reverse=True
    )
    for path in candidates:
        values = read_summary(path)
        if values is None or not values.get("checkpoint_dir"):
            continue
        if Path(str(values["checkpoint_dir"])).resolve() != folder:
            continue
        if step is None or values.get("steps") != step:
            continue
        return RunSummary(path, values)
    return None
