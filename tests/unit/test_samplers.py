"""ResumableBatchSampler / TorchOrderBatchSampler / EvalBatchSampler: determinism, rank
shares, exact resume; fine-tuning's sampler gives the order of torch's own samplers."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from omnibert.data.samplers import (
    EvalBatchSampler,
    ResumableBatchSampler,
    SamplerStateError,
    TorchOrderBatchSampler,
)


def epochs(sampler: ResumableBatchSampler, count: int) -> list[list[list[int]]]:
    return [list(sampler) for _ in range(count)]


def test_same_seed_same_order_other_seed_or_epoch_other_order() -> None:
    a = epochs(ResumableBatchSampler(100, 8, seed=3), 2)
    assert a == epochs(ResumableBatchSampler(100, 8, seed=3), 2)
    assert a[0] != a[1]  # a new permutation each epoch, without set_epoch
    assert a[0] != list(ResumableBatchSampler(100, 8, seed=4))
    assert list(ResumableBatchSampler(10, 5, shuffle=False)) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]


@pytest.mark.parametrize(("n", "replicas", "batch"), [(103, 4, 5), (64, 2, 8), (9, 3, 1)])
def test_ranks_get_equal_disjoint_shares_of_each_epoch(n: int, replicas: int, batch: int) -> None:
    samplers = [
        ResumableBatchSampler(n, batch, seed=1, num_replicas=replicas, rank=r)
        for r in range(replicas)
    ]
    per_rank = n // replicas
    for _ in range(2):
        shares = [list(itertools.chain.from_iterable(s)) for s in samplers]
        assert {len(list(s)) for s in samplers} == {per_rank // batch}  # next epoch; same length
        assert all(len(s) == per_rank // batch for s in samplers)
        flat = [i for share in shares for i in share]
        assert len(flat) == len(set(flat)) == (per_rank // batch) * batch * replicas
        assert all(0 <= i < n for i in flat)


def test_drop_last_false_yields_the_short_batch() -> None:
    sampler = ResumableBatchSampler(10, 4, drop_last=False, shuffle=False)
    assert list(sampler) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]] and len(sampler) == 3


def test_batches_per_epoch_caps_each_epoch_of_the_same_permutation() -> None:
    full = epochs(ResumableBatchSampler(40, 4, seed=2), 2)
    capped = ResumableBatchSampler(40, 4, seed=2, batches_per_epoch=3)
    assert len(capped) == 3 and epochs(capped, 2) == [full[0][:3], full[1][:3]]


def test_set_epoch_jumps_and_keeps_a_resumed_position() -> None:
    reference = ResumableBatchSampler(40, 4, seed=9)
    first, second = list(reference), list(reference)
    jumped = ResumableBatchSampler(40, 4, seed=9)
    jumped.set_epoch(1)
    assert list(jumped) == second
    partial = ResumableBatchSampler(40, 4, seed=9)
    it = iter(partial)
    next(it), next(it)
    resumed = ResumableBatchSampler(40, 4, seed=9)
    resumed.load_state_dict(partial.state_dict())
    resumed.set_epoch(0)  # same epoch: Lightning calls this on resume; keep the position
    assert list(resumed) == first[2:]
    # an iterator dropped after its workers prefetched (Lightning re-creates the loader's
    # iterator on a restart) does not move where the next iterator begins
    assert list(partial) == first
    assert list(partial) == second


@pytest.mark.parametrize("replicas", [1, 3])
@pytest.mark.parametrize("kind", [ResumableBatchSampler, TorchOrderBatchSampler])
def test_resume_at_every_point_gives_exactly_the_next_batch(kind: type, replicas: int) -> None:
    """Every position, across epoch boundaries; a state fits every rank (Lightning hands rank
    0's loader state to all): epoch and position are shared, the rank's split is its own."""

    def make(rank: int) -> ResumableBatchSampler:
        sampler: ResumableBatchSampler = kind(50, 4, seed=5, num_replicas=replicas, rank=rank)
        return sampler

    full_of = [list(itertools.chain.from_iterable(epochs(make(r), 3))) for r in range(replicas)]
    for rank in range(replicas):
        full = full_of[rank]
        per_epoch = len(make(rank))
        for k in range(len(full)):  # every point, across both epoch boundaries
            sampler = make(rank)
            stream = itertools.chain.from_iterable(iter(sampler) for _ in range(3))
            for _ in range(k):
                next(stream)
            state = sampler.state_dict()
            assert state["epoch"] == k // per_epoch - (k % per_epoch == 0 and k > 0)
            restored = make(rank)
            restored.load_state_dict(state)
            rest = list(itertools.chain.from_iterable(iter(restored) for _ in range(4)))
            assert rest[: len(full) - k] == full[k:], f"rank {rank}, resumed after {k} batches"
            last = make(replicas - 1)  # rank 0's state on another rank: that rank's own rest
            last.load_state_dict({**state, "rank": 0})
            assert next(iter(last), None) == (full_of[replicas - 1] + [None])[k], (rank, k)


def test_mismatched_state_is_refused() -> None:
    state = ResumableBatchSampler(50, 4, seed=5).state_dict()
    for kwargs, word in [
        ({"num_samples": 51}, "num_samples=50"),
        ({"batch_size": 8}, "batch_size=4"),
        ({"num_replicas": 2}, "num_replicas=1"),
        ({"seed": 6}, "seed=5"),
    ]:
        args = {"num_samples": 50, "batch_size": 4, "seed": 5} | kwargs
        n, b = args.pop("num_samples"), args.pop("batch_size")
        with pytest.raises(SamplerStateError, match=rf"saved with {word} .*resume with the same"):
            ResumableBatchSampler(n, b, **args).load_state_dict(state)


def torch_batches(sampler: torch.utils.data.Sampler, batch: int) -> list[list[int]]:
    """One pass of a plain DataLoader over ``sampler`` (what fine-tuning used before)."""
    rows = torch.arange(1000)
    return [b.tolist() for b in DataLoader(rows, batch_size=batch, sampler=sampler)]


@pytest.mark.parametrize(("n", "batch"), [(10, 3), (12, 3), (1, 4)])
def test_one_process_order_is_random_samplers(n: int, batch: int) -> None:
    """Three epochs of one seeded ``RandomSampler`` (one generator drawing on)."""
    generator = torch.Generator().manual_seed(7)
    reference = RandomSampler(range(n), generator=generator)
    want = [torch_batches(reference, batch) for _ in range(3)]
    got = epochs(TorchOrderBatchSampler(n, batch, seed=7), 3)
    assert got == want and len(TorchOrderBatchSampler(n, batch, seed=7)) == len(want[0])
    assert got[0] != got[1] or n == 1
    jumped = TorchOrderBatchSampler(n, batch, seed=7)  # epoch 2 without epochs 0 and 1
    jumped.set_epoch(2)
    assert list(jumped) == want[2]


@pytest.mark.parametrize(("n", "replicas", "batch"), [(10, 3, 2), (12, 2, 3), (2, 5, 1)])
def test_ranks_order_is_distributed_samplers(n: int, replicas: int, batch: int) -> None:
    """Each rank's batches of epochs 0..2 are ``DistributedSampler``'s with ``set_epoch``:
    padded with the start of the permutation, the same batch count on every rank."""
    for rank in range(replicas):
        reference = DistributedSampler(range(n), num_replicas=replicas, rank=rank, seed=7)
        want = []
        for epoch in range(3):
            reference.set_epoch(epoch)
            want.append(torch_batches(reference, batch))
        sampler = TorchOrderBatchSampler(n, batch, seed=7, num_replicas=replicas, rank=rank)
        assert epochs(sampler, 3) == want, rank
        assert len(sampler) == len(want[0]) == -(-n // (replicas * batch))


def test_torch_order_refuses_another_runs_state_naming_finetunings_keys() -> None:
    state = TorchOrderBatchSampler(50, 4, seed=5, num_replicas=2).state_dict()
    with pytest.raises(SamplerStateError, match=r"saved with num_replicas=2 \(now 1\), .*resume "
                       r"with the same data, micro_batch_size \(task.batch_size / devices when "
                       r"null\), accelerator.devices and seed, or start a fresh run\.$"):  # fmt: skip
        TorchOrderBatchSampler(50, 4, seed=5).load_state_dict(state)


def test_eval_sampler_covers_each_row_once_with_equal_batch_counts() -> None:
    samplers = [EvalBatchSampler(23, 4, num_replicas=3, rank=r) for r in range(3)]
    batches = [list(s) for s in samplers]
    assert [len(b) for b in batches] == [2, 2, 2]
    rows = [i for per_rank in batches for batch in per_rank for i in batch]
    assert rows == list(range(23))
    assert list(EvalBatchSampler(2, 4, num_replicas=3, rank=2)) == [[]]
