"""Every rank's random streams: drawn apart, saved and restored per rank.

Dropout draws from the process's global generators (torch's, CUDA's; numpy's and Python's
``random`` for anything else). Every rank is seeded with the run's ``seed`` (the same initial
weights), so :func:`seed_rank_streams` moves ranks 1 … N-1 to streams of their own when
training starts (``seed + rank``, as NVIDIA's PyTorch BERT seeds each process with ``seed +
local_rank``): each rank draws its own dropout masks, and rank 0, like a single process,
keeps the run's own stream.

A checkpoint is written by rank 0 only, so :func:`states_of_every_rank` gathers every rank's
states into it (one ``all_gather_object`` of a few kilobytes per rank and checkpoint, on
every rank: Lightning builds the checkpoint on all of them) under :data:`RANKS_KEY`, a list
by global rank (written when there are several), beside rank 0's under :data:`RNG_KEY` (what
omnibert wrote before, and all a single process needs). A resumed
rank takes its own (:func:`states_for_rank`); a checkpoint without them (written before, or by
a run of another world size, which the sampler check refuses anyway) gives every rank rank
0's, as before, and the plan says so (:func:`missing_ranks_note`).

The data order needs no random state: the samplers draw it from ``(seed, epoch)`` and the
checkpoint keeps their position; a loader worker's seed comes from torch's generator.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = [
    "RANKS_KEY",
    "RNG_KEY",
    "collect_rng_states",
    "missing_ranks_note",
    "restore_rng_states",
    "seed_rank_streams",
    "states_for_rank",
    "states_of_every_rank",
]

#: rank 0's states (every checkpoint omnibert wrote has them)
RNG_KEY = "omnibert_rng_states"
#: every rank's states, a list by global rank
RANKS_KEY = "omnibert_rng_states_per_rank"


def collect_rng_states() -> dict[str, Any]:
    """Global RNG states as tensors, ints and strings only (``weights_only`` loadable)."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    version, py_state, py_gauss = random.getstate()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "python": {"version": version, "state": list(py_state), "gauss": py_gauss},
    }
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: Mapping[str, Any]) -> None:
    """Inverse of :func:`collect_rng_states`."""
    torch.set_rng_state(states["torch"])
    np_state = states["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["gauss"],
        )
    )
    py = states["python"]
    random.setstate((py["version"], tuple(py["state"]), py["gauss"]))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _world() -> int:
    dist = torch.distributed
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def seed_rank_streams(seed: int, rank: int) -> None:
    """Ranks other than 0 move to streams of their own (``seed + rank``; module docstring)."""
    if rank == 0:
        return
    own = seed + rank
    torch.manual_seed(own)  # CUDA's generators too
    np.random.seed(own % 2**32)
    random.seed(own)


def states_of_every_rank(states: dict[str, Any]) -> list[dict[str, Any]]:
    """This rank's ``states`` and every other rank's, by global rank (a collective when
    there are several ranks: every rank calls it)."""
    world = _world()
    if world == 1:
        return [states]
    gathered: list[Any] = [None] * world
    torch.distributed.all_gather_object(gathered, states)  # pickled: tensors stay on the CPU
    return gathered


def states_for_rank(checkpoint: Mapping[str, Any], rank: int) -> Mapping[str, Any] | None:
    """The states ``rank`` resumes with: its own, or rank 0's from a checkpoint without them."""
    ranks = checkpoint.get(RANKS_KEY)
    if isinstance(ranks, list) and rank < len(ranks):
        return ranks[rank]
    return checkpoint.get(RNG_KEY)


def missing_ranks_note(checkpoint: Mapping[str, Any], world_size: int) -> str | None:
    """The plan's line for a multi-rank resume from a checkpoint with rank 0's states only."""
    ranks = checkpoint.get(RANKS_KEY)
    have = len(ranks) if isinstance(ranks, list) else 1
    if world_size <= have or RNG_KEY not in checkpoint:
        return None
    if world_size - have == 1:
        others = f"rank {have} goes on from rank 0's states, so it draws"
    else:
        others = f"ranks {have}-{world_size - 1} go on from rank 0's states, so they draw"
    return (
        "RNG states: the checkpoint holds rank 0's only (written before omnibert saved every "
        f"rank's); {others} rank 0's dropout masks"
    )
