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
solver `nnls`, `api` (`pack_histogram`), `assign` (`pack_lengths`).
"""

from omnibert.data.packing.api import ALGORITHMS, pack_histogram
from omnibert.data.packing.assign import PackAssignment, assign_packs, pack_lengths
from omnibert.data.packing.plan import PackPlan, Strategy

__all__ = [
    "ALGORITHMS",
    "PackAssignment",
    "PackPlan",
    "Strategy",
    "assign_packs",
    "pack_histogram",
    "pack_lengths",
]
