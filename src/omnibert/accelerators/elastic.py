"""torchrun's store across the starts of one group: keys of each start's own, and whether
the group has joined before (what ``ckpt_path=auto`` goes by on every node alike).

torchrun starts its group again with the same command when a worker fails
(``--max-restarts``) and when a node agent joins or leaves (another node's agent restarting
after its own worker failed counts as that). Its agents keep one store for the workers of
every start (``TORCHELASTIC_USE_AGENT_STORE=True``, torch's default unless
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``), and every worker of a start begins after every
worker of the start before has ended (each agent stops its workers before the next
rendezvous). omnibert needs two things from that store:

* **Keys of each start's own** for the process group (:func:`store_of_this_start`): the store
  still holds the failed start's keys (each rank's gloo address), and a rank that read one
  before its peer rewrote it would connect to a dead process (torch 2.13 no longer prefixes
  them per restart). The ranks cannot count starts to agree on a prefix: a worker stopped
  before it counted (an agent ends its workers whenever another node's restarts) leaves the
  counts one apart for good. Rank 0 names the start instead, and every other rank learns the
  name by a handshake under a nonce of its own, which no earlier start can have written.
* **Whether this start goes on from an earlier one** (:func:`joined_before`): the agents'
  restart count (``TORCHELASTIC_RESTART_COUNT``) is raised only on the node whose worker
  failed; an agent that restarts because another node's did keeps its count, so one node
  would resume and the other start fresh. Every rank marks the store once it is in the
  process group (:class:`MarkJoined`, a callback of every run, whatever the strategy;
  checkpoints come only after that), and every rank reads the mark in its plan, before it
  joins: all ranks of a later start find it, those of the first start none.
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import lightning.pytorch as pl

from omnibert.errors import LostRank

__all__ = [
    "JOINED",
    "MarkJoined",
    "agent_store",
    "joined_before",
    "mark_joined",
    "store_of_this_start",
]

#: the key the group sets in torchrun's store once its ranks have joined
JOINED = "omnibert/joined"
#: how long a plan waits to reach torchrun's store (it runs before the workers start)
CONNECT_TIMEOUT = timedelta(seconds=60)
#: how often a rank looks for its peer's answer during the handshake (seconds)
POLL_S = 0.05

#: how a line about a rank that did not join ends (as :mod:`omnibert.accelerators.ddp`'s)
_STOPS = "the run stops; resume with ckpt_path=last"
#: :func:`joined_before`'s answer per store (address, port, run id), read once per process
_JOINED_BEFORE: dict[tuple[str, str, str], bool] = {}


def agent_store(timeout: timedelta, environ: Mapping[str, str] | None = None) -> Any:
    """A client of torchrun's store for this group's workers, None where torchrun does not
    share its store with the workers (or this process was not started by torchrun)."""
    env = os.environ if environ is None else environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or "MASTER_PORT" not in env:
        return None
    import torch.distributed as dist

    return dist.TCPStore(
        env.get("MASTER_ADDR", "127.0.0.1"), int(env["MASTER_PORT"]), is_master=False,
        timeout=timeout,
    )  # fmt: skip


def joined_before(environ: Mapping[str, str] | None = None) -> bool | None:
    """Whether this group of torchrun's joined in an earlier start (:data:`JOINED` in its
    store), None outside torchrun's shared store. Read once per process, the first time it
    is asked (the plan, before this process joins), so a later phase of the same process
    gets the same answer."""
    env = os.environ if environ is None else environ
    key = (
        env.get("MASTER_ADDR", ""),
        env.get("MASTER_PORT", ""),
        env.get("TORCHELASTIC_RUN_ID", ""),
    )
    if key not in _JOINED_BEFORE:
        store = agent_store(CONNECT_TIMEOUT, env)
        if store is None:
            return None
        _JOINED_BEFORE[key] = bool(store.check([JOINED]))
    return _JOINED_BEFORE[key]


def mark_joined(store: Any) -> None:
    """Mark torchrun's store: this group has joined (:func:`joined_before`)."""
    store.set(JOINED, "1")


class MarkJoined(pl.Callback):
    """:func:`mark_joined` once this rank is in the process group (Lightning sets the
    callbacks up after the strategy has made the group, which takes every rank of this
    start, each past its plan); nothing outside torchrun's shared store."""

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        store = agent_store(CONNECT_TIMEOUT)
        if store is not None:
            mark_joined(store)


def store_of_this_start(store: Any, rank: int, world_size: int, timeout: timedelta) -> Any:
    """``store`` under a prefix of this start's own, the same on every rank of it.

    Rank 0 draws the start's name. Every other rank writes a fresh nonce under its rank
    (``hello``) and waits for the name under that nonce (``welcome``), then acknowledges it
    under the name (``ack``); rank 0 answers whatever nonce it finds under a rank until that
    rank acknowledges, so a nonce left by a rank of an earlier start costs an answer nobody
    reads. The keys a rank waits on are its own nonce's and this start's name's: nothing an
    earlier start wrote can answer them. Both sides look every :data:`POLL_S` instead of
    blocking in the store's ``wait``: a SIGTERM (torchrun ending this start because another
    node restarted) stops the process at once rather than after the wait, and a ``wait``
    that times out prints torch's warnings."""
    import torch.distributed as dist

    if rank == 0:
        name = secrets.token_hex(8)
        _welcome(store, name, world_size, timeout)
    else:
        nonce = secrets.token_hex(8)
        store.set(f"omnibert/hello/rank{rank}", nonce)
        deadline = time.monotonic() + timeout.total_seconds()
        while not store.check([f"omnibert/welcome/{nonce}"]):
            if time.monotonic() > deadline:
                raise LostRank(
                    f"rank 0 did not answer rank {rank} at this start of the group within "
                    f"{timeout.total_seconds():g} s; {_STOPS}"
                )
            time.sleep(POLL_S)
        name = store.get(f"omnibert/welcome/{nonce}").decode()
        store.set(f"omnibert/ack/{name}/rank{rank}", "1")
    return dist.PrefixStore(f"omnibert/start-{name}", store)


def _welcome(store: Any, name: str, world_size: int, timeout: timedelta) -> None:
    """Rank 0's side of :func:`store_of_this_start`: every other rank, in turns of
    :data:`POLL_S`."""
    deadline = time.monotonic() + timeout.total_seconds()
    answered: dict[int, set[bytes]] = {rank: set() for rank in range(1, world_size)}
    while answered:
        for rank in list(answered):
            if store.check([f"omnibert/ack/{name}/rank{rank}"]):
                del answered[rank]
            elif store.check([f"omnibert/hello/rank{rank}"]):
                nonce = store.get(f"omnibert/hello/rank{rank}")
                if nonce not in answered[rank]:
                    store.set(f"omnibert/welcome/{nonce.decode()}", name)
                    answered[rank].add(nonce)
        if answered and time.monotonic() > deadline:
            ranks = sorted(answered)
            named = ", ".join(str(rank) for rank in ranks[:8]) + (", ..." if ranks[8:] else "")
            raise LostRank(
                f"{len(ranks)} rank(s) ({named}) did not join this start of the group within "
                f"{timeout.total_seconds():g} s; {_STOPS}"
            )
        if answered:
            time.sleep(POLL_S)
