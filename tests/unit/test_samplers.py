"""ResumableBatchSampler / EvalBatchSampler: determinism, rank shares, exact resume."""

from __future__ import annotations

import itertools

import pytest

from omnibert.data.samplers import EvalBatchSampler, ResumableBatchSampler, SamplerStateError


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
def test_resume_at_every_point_gives_exactly_the_next_batch(replicas: int) -> None:
    def make(rank: int) -> ResumableBatchSampler:
        return ResumableBatchSampler(50, 4, seed=5, num_replicas=replicas, rank=rank)

    for rank in range(replicas):
        full = list(itertools.chain.from_iterable(epochs(make(rank), 3)))
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


def test_eval_sampler_covers_each_row_once_with_equal_batch_counts() -> None:
    samplers = [EvalBatchSampler(23, 4, num_replicas=3, rank=r) for r in range(3)]
    batches = [list(s) for s in samplers]
    assert [len(b) for b in batches] == [2, 2, 2]
    rows = [i for per_rank in batches for batch in per_rank for i in batch]
    assert rows == list(range(23))
    assert list(EvalBatchSampler(2, 4, num_replicas=3, rank=2)) == [[]]
