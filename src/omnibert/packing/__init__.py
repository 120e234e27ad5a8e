"""Sequence packing without cross-contamination (Krell et al., arXiv 2107.02027).

Several short sequences share one row of `max_sequence_length` tokens; the model keeps them
apart with `sequence_ids` (block-diagonal attention, per-sequence positions), so packing
changes the number of rows, never the maths. This package decides *which* sequences share
a row:

* `pack_histogram(counts, max_sequence_length, max_sequences_per_pack, algorithm)` works
  on the length histogram and returns a `PackPlan` (pack contents × how many packs);
  algorithms: ``"lpfhp"``, ``"spfhp"``, ``"nnlshp"``, ``"ffd"`` (see `api`).
* `pack_lengths(lengths, ...)` / `assign_packs(lengths, plan, seed=...)` turn a plan into
  concrete packs of sequence indices (`PackAssignment`), deterministic for a seed.

Modules: `plan` (PackPlan, input checks), `greedy` (SPFHP, LPFHP), `ffd`, `nnlshp` and its
solver `nnls`, `api` (`pack_histogram`), `assign` (`pack_lengths`), `online` (window packers
for online packing), `budget` (masked-position budgets). The names below are imported on
first use, so importing `omnibert.packing.plan` (the training side's settings checks) never
compiles or imports numba.
"""

from __future__ import annotations

import importlib
from typing import Any

_WHERE = {
    "ALGORITHMS": "api",
    "pack_histogram": "api",
    "PackAssignment": "assign",
    "assign_packs": "assign",
    "pack_lengths": "assign",
    "PackPlan": "plan",
    "Strategy": "plan",
    "WINDOW_ALGORITHMS": "plan",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'omnibert.packing' has no attribute {name!r}")
    return getattr(importlib.import_module(f"omnibert.packing.{_WHERE[name]}"), name)
