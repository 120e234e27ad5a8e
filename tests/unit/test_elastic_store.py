"""torchrun's store across the starts of one group (omnibert.accelerators.elastic), on a real
TCPStore served in this process, ranks as threads: every rank of a start agrees on its keys
whatever an earlier start left in the store, and every rank of a later start resumes
(``ckpt_path=auto``) whichever node's restart count says so. The real restarts are
tests/e2e/test_elastic.py's."""

from __future__ import annotations

import secrets
import threading
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from omnibert.accelerators.elastic import JOINED, MarkJoined, mark_joined, store_of_this_start
from omnibert.checkpoints.resuming import auto_resume_reason
from omnibert.errors import LostRank

WAIT = timedelta(seconds=60)
#: how long a rank looks for rank 0's key under its own prefix (a wrong prefix never has it)
LOOK = timedelta(seconds=20)


@pytest.fixture
def store() -> Any:
    """A store such as torchrun's agents keep for their workers."""
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def _client(store: Any) -> Any:
    return dist.TCPStore("127.0.0.1", store.port, is_master=False, timeout=WAIT)


class _Start:
    """One start of a group, each rank a thread with a client of its own: rank 0 writes a
    token under the prefix it got, every other rank reads it under its own prefix, which
    finds it only where the two prefixes are the same."""

    def __init__(self, store: Any, world_size: int) -> None:
        self.store, self.world_size = store, world_size
        self.tokens: dict[int, str] = {}
        self.errors: list[BaseException] = []
        self.threads: dict[int, threading.Thread] = {
            rank: threading.Thread(target=self._rank, args=(rank,)) for rank in range(world_size)
        }

    def _rank(self, rank: int) -> None:
        try:
            prefixed = store_of_this_start(_client(self.store), rank, self.world_size, WAIT)
            if rank == 0:
                prefixed.set("token", secrets.token_hex(8))
            prefixed.wait(["token"], LOOK)
            self.tokens[rank] = prefixed.get("token").decode()
        except BaseException as err:  # handed to the test
            self.errors.append(err)

    def start(self, *ranks: int) -> None:
        for rank in ranks:
            self.threads[rank].start()

    def tokens_seen(self) -> set[str]:
        for thread in self.threads.values():
            thread.join()
        assert not self.errors, self.errors
        assert sorted(self.tokens) == list(range(self.world_size))
        return set(self.tokens.values())


def test_the_ranks_of_a_start_agree_on_its_keys_whatever_an_earlier_start_left(store):
    # an earlier start that died half-way left rank 1's nonce; rank 0 answers it first, then
    # this start's rank 1 comes (counting starts per rank would now be one apart for good)
    store.set("omnibert/hello/rank1", "dead-nonce")
    start = _Start(store, 3)
    start.start(0, 2)
    store.wait(["omnibert/welcome/dead-nonce"], WAIT)  # rank 0 answered the dead nonce
    start.start(1)
    first = start.tokens_seen()
    assert len(first) == 1
    again = _Start(store, 3)  # the next start, all at once: keys of its own again
    again.start(0, 1, 2)
    second = again.tokens_seen()
    assert len(second) == 1 and second != first


def test_a_rank_that_never_comes_ends_the_start_in_one_line(store):
    with pytest.raises(LostRank) as missing:
        store_of_this_start(_client(store), 0, 3, timedelta(seconds=0.2))
    assert str(missing.value) == (
        "2 rank(s) (1, 2) did not join this start of the group within 0.2 s; the run stops; "
        "resume with ckpt_path=last"
    )
    with pytest.raises(LostRank) as unanswered:
        store_of_this_start(_client(store), 1, 2, timedelta(seconds=0.2))
    assert str(unanswered.value) == (
        "rank 0 did not answer rank 1 at this start of the group within 0.2 s; the run stops; "
        "resume with ckpt_path=last"
    )


def _torchrun(store: Any, run: str, count: int) -> dict[str, str]:
    """A torchrun worker's variables with the store shared (torch's default)."""
    return {
        "TORCHELASTIC_USE_AGENT_STORE": "True", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(store.port), "TORCHELASTIC_RUN_ID": f"{run}-{store.port}",
        "TORCHELASTIC_RESTART_COUNT": str(count), "RANK": "0", "WORLD_SIZE": "2",
    }  # fmt: skip


def test_every_node_resumes_once_the_group_has_joined_whatever_its_restart_count(store):
    # the first start: no node resumes, not even one whose agent counted a restart (its
    # worker failed before the group joined: nothing of this launch to resume)
    assert auto_resume_reason(None, _torchrun(store, "first", 0)) is None
    assert auto_resume_reason(None, _torchrun(store, "first-b", 1)) is None
    mark_joined(_client(store))
    # the next start: the node whose worker failed (count 1) and the node restarted by it (0)
    assert auto_resume_reason(None, _torchrun(store, "next", 1)) == (
        "torchrun restarted the group (TORCHELASTIC_RESTART_COUNT=1), so ckpt_path=auto"
    )
    assert auto_resume_reason(None, _torchrun(store, "next-b", 0)) == (
        "torchrun restarted the group after another node's restart "
        "(TORCHELASTIC_RESTART_COUNT=0 here), so ckpt_path=auto"
    )
    # read once per process, before it joins: its own group's mark does not change the
    # answer for a later phase
    assert auto_resume_reason(None, _torchrun(store, "first", 0)) is None
    # a ckpt_path the command sets is the command's
    assert auto_resume_reason("auto", _torchrun(store, "next", 0)) == "ckpt_path=auto"
    assert auto_resume_reason("last", _torchrun(store, "next", 1)) is None


def test_every_run_marks_the_store_once_its_rank_is_in_the_process_group(store, monkeypatch):
    """:class:`MarkJoined`, a callback of every run whatever its strategy, on one rank."""
    for key, value in _torchrun(store, "mark", 0).items():
        monkeypatch.setenv(key, value)
    MarkJoined().setup(None, None, "fit")  # type: ignore[arg-type]
    assert not store.check([JOINED])  # no process group yet: the plan's time
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", _client(store)), rank=0,
                            world_size=1)  # fmt: skip
    try:
        MarkJoined().setup(None, None, "fit")  # type: ignore[arg-type]
    finally:
        dist.destroy_process_group()
    assert store.check([JOINED])


def test_without_torchruns_shared_store_the_restart_counts_decide():
    assert auto_resume_reason(None, {"TORCHELASTIC_RESTART_COUNT": "2"}) == (
        "torchrun restarted the group (TORCHELASTIC_RESTART_COUNT=2), so ckpt_path=auto"
    )
    assert auto_resume_reason(None, {"TORCHELASTIC_RESTART_COUNT": "0"}) is None
    assert auto_resume_reason(None, {"SLURM_RESTART_COUNT": "1"}) == (
        "SLURM requeued the job (SLURM_RESTART_COUNT=1), so ckpt_path=auto"
    )
