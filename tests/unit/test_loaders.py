"""The training loader without torchdata (the IPU environment's torch 2.0.1 has no
StatefulDataLoader): ``SamplerStateDataLoader`` keeps the position of the batches it handed
out, with and without worker processes, so a restored loader yields exactly the rest.
Lightning-level resume with the fallback forced: tests/unit/test_datamodule.py and
tests/e2e/test_train_resume.py (``no_torchdata``)."""

from __future__ import annotations

import itertools
import sys
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from omnibert import compat
from omnibert.data import loaders
from omnibert.data.loaders import SamplerStateDataLoader, build_loader, stateful_dataloader_class
from omnibert.data.packed_sampler import PackedBatchSampler
from omnibert.data.samplers import EvalBatchSampler, ResumableBatchSampler, SamplerStateError


class Rows(torch.utils.data.Dataset[int]):
    def __len__(self) -> int:
        return 1000

    def __getitem__(self, index: int) -> int:
        return index


def _collate(rows: list[Any]) -> tuple[Any, ...]:
    return tuple(tuple(r) if isinstance(r, list) else r for r in rows)


def _loader(sampler: Any, workers: int) -> SamplerStateDataLoader:
    return SamplerStateDataLoader(
        Rows(), batch_sampler=sampler, collate_fn=_collate, num_workers=workers,
        persistent_workers=workers > 0,
    )  # fmt: skip


def _sampler(**kwargs: Any) -> ResumableBatchSampler:
    return ResumableBatchSampler(60, 4, seed=5, **kwargs)


@pytest.fixture
def no_torchdata(monkeypatch):
    """torchdata's StatefulDataLoader cannot be imported (as under torch 2.0.1)."""
    monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_restored_loader_yields_exactly_the_batches_not_yet_handed_out(workers: int) -> None:
    reference = [list(b) for b in itertools.islice(itertools.chain(*([_sampler()] * 2)), 24)]
    loader = _loader(_sampler(), workers)
    stream = iter(loader)
    seen = [list(next(stream)) for _ in range(6)]  # workers have fetched ahead by now
    state = loader.state_dict()
    assert state["_index_sampler_state"]["position"] == 6  # not where the workers are
    rest = [list(b) for b in stream]  # the rest of epoch 0 ...
    rest += [list(b) for b in itertools.islice(loader, 9)]  # ... into epoch 1
    assert seen + rest == reference

    restored = _loader(_sampler(), workers)
    restored.load_state_dict(state)
    again = [list(b) for b in restored]
    again += [list(b) for b in itertools.islice(restored, 9)]
    assert again == rest


def test_state_before_and_at_the_end_of_an_epoch() -> None:
    loader = _loader(_sampler(), 0)
    assert loader.state_dict()["_index_sampler_state"]["position"] == 0  # never iterated
    epoch = [list(b) for b in loader]
    state = loader.state_dict()["_index_sampler_state"]
    assert (state["epoch"], state["position"]) == (0, len(epoch))
    restored = _loader(_sampler(), 0)
    restored.load_state_dict(loader.state_dict())
    assert [list(b) for b in restored] == [list(b) for b in loader]  # both continue in epoch 1


def test_a_dropped_iterator_whose_workers_fetched_a_whole_epoch_skips_nothing() -> None:
    """Lightning resuming at the end of an epoch creates an iterator, lets its workers
    prefetch and drops it; the batches drawn for it were never handed out."""
    sampler = _sampler(batches_per_epoch=3)  # 2 workers prefetch 4 batches: the whole epoch
    loader = _loader(sampler, 2)
    expected = [list(b) for b in _loader(_sampler(batches_per_epoch=3), 0)]
    iter(loader)  # prefetches, then dropped
    assert sampler.state_dict()["position"] == 3  # the sampler handed its epoch to the workers
    assert [list(b) for b in loader] == expected  # still epoch 0, from its start


def test_the_packed_sampler_resumes_through_the_loader_too() -> None:
    rng = torch.Generator().manual_seed(0)
    lengths = torch.randint(8, 64, (200,), generator=rng).tolist()

    def packed() -> PackedBatchSampler:
        return PackedBatchSampler(
            lengths, [3] * 200, 4, max_sequence_length=64, max_sequences_per_pack=3,
            max_predictions_per_pack=9, buffer_size=50, algorithm="bfd", seed=1,
        )  # fmt: skip

    loader = _loader(packed(), 2)
    stream = iter(loader)
    for _ in range(5):
        next(stream)
    state = loader.state_dict()
    rest = list(stream)
    restored = _loader(packed(), 2)
    restored.load_state_dict(state)
    assert list(restored) == rest and rest


@pytest.mark.skipif(stateful_dataloader_class() is None, reason="torchdata is not installed")
@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_state_resumes_in_the_fallback(workers: int) -> None:
    """A checkpoint written where torchdata exists resumes where it does not."""
    stateful = stateful_dataloader_class()
    assert stateful is not None
    loader = stateful(Rows(), batch_sampler=_sampler(), collate_fn=_collate,
                      num_workers=workers)  # fmt: skip
    stream = iter(loader)
    for _ in range(4):
        next(stream)
    state = loader.state_dict()
    rest = [list(b) for b in stream]
    restored = _loader(_sampler(), 0)
    restored.load_state_dict(state)
    assert [list(b) for b in restored] == rest


def test_a_foreign_loader_state_is_refused_with_one_sentence() -> None:
    with pytest.raises(SamplerStateError, match=r"holds no batch sampler position .*'_num_yiel"):
        _loader(_sampler(), 0).load_state_dict({"_num_yielded": 3})
    with pytest.raises(SamplerStateError, match=r"seed=5 \(now 6\)"):  # the sampler's own check
        _loader(ResumableBatchSampler(60, 4, seed=6), 0).load_state_dict(
            _loader(_sampler(), 0).state_dict()
        )


def test_build_loader_falls_back_only_where_torchdata_is_missing(no_torchdata) -> None:
    train = build_loader(Rows(), _collate, _sampler(), num_workers=0, seed=1)
    assert type(train) is SamplerStateDataLoader and train.batch_sampler.seed == 5
    evaluation = build_loader(Rows(), _collate, EvalBatchSampler(10, 4), num_workers=0, seed=1)
    assert type(evaluation) is DataLoader


@pytest.mark.skipif(stateful_dataloader_class() is None, reason="torchdata is not installed")
def test_build_loader_uses_torchdata_where_it_is_installed_under_lightning_2_5(monkeypatch):
    if compat.lightning_resumes_after_batch_end():
        train = build_loader(Rows(), _collate, _sampler(), num_workers=0, seed=1)
        assert type(train).__name__ == "StatefulDataLoader"
    # Lightning < 2.5 drops an iterator when it resumes at an epoch end (module docstring)
    monkeypatch.setattr(loaders, "lightning_resumes_after_batch_end", lambda: False)
    train = build_loader(Rows(), _collate, _sampler(), num_workers=0, seed=1)
    assert type(train) is SamplerStateDataLoader


def test_fine_tunings_loader_saves_its_position_and_ends_its_epoch_where_lightning_does() -> None:
    """omnibert-finetune's training loader is the stateful one over its torch-order sampler: a
    loader restored from another's state yields exactly the rest of the epoch (short last batch
    included); ``limit_train_batches`` ends the sampler's epoch where Lightning ends its own."""
    from types import SimpleNamespace

    from omnibert.data.finetuning import FineTuneDataModule, lightning_epoch_cap

    def module() -> FineTuneDataModule:
        return FineTuneDataModule({"idx": torch.arange(10)}, 3, seed=7)

    loader = module().train_dataloader()
    assert type(loader) is stateful_dataloader_class()
    whole = [b["idx"].tolist() for b in loader]
    assert [len(b) for b in whole] == [3, 3, 3, 1]
    stream = iter(loader)
    next(stream), next(stream)
    restored = module().train_dataloader()
    restored.load_state_dict(loader.state_dict())
    assert [b["idx"].tolist() for b in restored] == [  # the rest of epoch 1
        b["idx"].tolist() for b in itertools.islice(stream, 2)
    ]
    for limit, cap in ((2, 2), (0.5, 2), (1.0, None), (20, None), (0.01, None)):
        assert lightning_epoch_cap(SimpleNamespace(limit_train_batches=limit), 4) == cap, limit
