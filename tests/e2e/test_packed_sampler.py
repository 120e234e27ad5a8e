"""Packed samplers: determinism, ranks, the pack stream, exact resume (also end to end
through omnibert-train with a loader worker), offline pack indexes in the data module."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.data.packed_sampler import PackedBatchSampler, PackIndexBatchSampler
from omnibert.data.samplers import SamplerStateError

RNG = np.random.default_rng(11)
LENGTHS = RNG.integers(4, 65, 700)
MASKS = np.minimum(10, np.maximum(1, np.rint(LENGTHS * 0.15))).astype(np.int64)


def sampler(**kwargs) -> PackedBatchSampler:
    settings = {
        "max_sequence_length": 64,
        "max_sequences_per_pack": 3,
        "max_predictions_per_pack": 12,
        "buffer_size": 128,
        "algorithm": "nnlshp",
        "seed": 3,
    }
    settings.update(kwargs)
    return PackedBatchSampler(LENGTHS, MASKS, settings.pop("batch_size", 4), **settings)


def test_each_data_epoch_packs_every_row_once_within_the_limits() -> None:
    s = sampler()
    for epoch in (0, 1):
        packs = [p for w in range(s.windows_per_epoch) for p in s.window(epoch, w)]
        rows = sorted(i for p in packs for i in p)
        assert rows == list(range(LENGTHS.size))
        assert max(len(p) for p in packs) <= 3
        assert max(LENGTHS[p].sum() for p in packs) <= 64
        assert max(MASKS[p].sum() for p in packs) <= 12
    assert s.window(0, 0) != s.window(1, 0)  # a new shuffle per data epoch
    assert 1.5 < s.sequences_per_pack < 3.0


def test_ranks_split_each_global_batch_and_run_equally_long() -> None:
    whole = sampler(batch_size=8)
    ranks = [sampler(num_replicas=2, rank=r) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == len(whole)
    for mine, theirs, both in zip(*ranks, whole, strict=True):
        assert mine + theirs == both  # rank r takes the r-th share of the same 8 packs
        assert not set(i for p in mine for i in p) & set(i for p in theirs for i in p)


def test_the_same_seed_gives_the_same_batches_and_another_seed_others() -> None:
    assert list(sampler()) == list(sampler())
    assert list(sampler()) != list(sampler(seed=4))


def test_the_stream_continues_across_data_epochs_without_dropping_packs() -> None:
    s = sampler(batches_per_epoch=40)  # longer than one data epoch (~ 100 packs / 4)
    batches = list(s)
    stream = [p for w in range(s.windows_per_epoch) for p in s.window(0, w)]
    stream += [p for w in range(s.windows_per_epoch) for p in s.window(1, w)]
    assert [p for b in batches for p in b] == stream[: 40 * 4]


def test_a_saved_state_resumes_exactly_mid_epoch_and_across_epochs() -> None:
    s = sampler(batches_per_epoch=30)
    it = iter(s)
    for _ in range(17):
        next(it)
    state = s.state_dict()
    rest = list(it)
    s.set_epoch(1)
    rest += list(iter(s))  # the next Lightning epoch (crosses a data epoch)
    resumed = sampler(batches_per_epoch=30)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # survives a checkpoint
    again = list(iter(resumed))
    resumed.set_epoch(1)
    again += list(iter(resumed))
    assert again == rest


def test_an_iterator_dropped_after_prefetch_skips_nothing() -> None:
    s = sampler()
    first = iter(s)
    prefetched = [next(first), next(first)]
    assert list(iter(s))[:2] == prefetched  # a new iterator of the same epoch starts over


def test_a_state_from_other_settings_is_refused() -> None:
    state = sampler().state_dict()
    with pytest.raises(SamplerStateError, match=r"buffer_size=128 \(now 256\)"):
        sampler(buffer_size=256).load_state_dict(state)


def test_pack_index_sampler_yields_the_rows_of_each_pack() -> None:
    packs = np.array([[0, 5, -1], [1, -1, -1], [2, 3, 4], [6, 7, -1]], dtype=np.int32)
    s = PackIndexBatchSampler(packs, 2, seed=1, num_replicas=2, rank=1)
    batches = list(s)
    assert len(batches) == 1 and len(batches[0]) == 2
    flat = [i for p in batches[0] for i in p]
    assert -1 not in flat and all(isinstance(i, int) for i in flat)
    assert all(p in ([0, 5], [1], [2, 3, 4], [6, 7]) for p in batches[0])


# ------------------------------------------------------------------ end to end, resume

SHORT = {"counts": [0] * 7 + [1] * 25}  # lengths 8..32 at seq 32: about 1.5 per row
PACKED = (
    "experiment=smoke",
    "data.num_train_samples=120",
    "data.packing=online",
    "data.pack.buffer_size=40",
    "phase.max_steps=8",
    "callbacks.checkpoint.every_n_train_steps=1",
    "callbacks.checkpoint.keep_last=null",
)


def _run(root: Path, *overrides: str) -> dict:
    (root / "hist.json").write_text(json.dumps(SHORT))
    cfg = compose(
        "pretrain",
        [
            *PACKED,
            f"data.length_histogram={root / 'hist.json'}",
            f"paths.output_root={root}",
            "accelerator.threads=1",  # the automatic choice depends on data.num_workers
            *overrides,
        ],
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_or_exit(cfg, root / "out")
    finally:
        torch.set_num_threads(threads)


def test_packed_training_resumes_bitwise_with_a_loader_worker(tmp_path: Path) -> None:
    throughput = "+callbacks.throughput={_target_:omnibert.callbacks.PretrainingThroughput}"
    straight = _run(tmp_path, "run_name=straight", "data.num_workers=1", throughput)
    packing = straight["plan"]["data"]["packing"]
    assert packing["mode"] == "online" and packing["sequences_per_row"] > 1.4
    assert packing["efficiency"] > packing["efficiency_unpacked"] + 0.3
    batch = straight["plan"]["batch"]
    assert batch["global_batch_size"] == 8 and batch["rows_per_step"] < 8
    # the logged real sequences per step: what the packed rows held, more than the rows
    assert straight["throughput"]["sequences_per_step"] > batch["rows_per_step"]
    assert straight["throughput"]["samples_per_sec"] < straight["throughput"]["sequences_per_sec"]
    ckpts = tmp_path / "straight" / "checkpoints"
    want = torch.load(ckpts / "last.ckpt", weights_only=True)
    for step in (3, 5):
        root = tmp_path / f"resumed{step}"
        root.mkdir()
        ckpt = ckpts / f"step-{step:08d}.ckpt"
        _run(root, "run_name=resumed", "data.num_workers=1", f"ckpt_path={ckpt}")
        got = torch.load(root / "resumed" / "checkpoints" / "last.ckpt", weights_only=True)
        assert got["global_step"] == want["global_step"] == 8
        for name, tensor in want["state_dict"].items():
            assert torch.equal(got["state_dict"][name], tensor), (step, name)


def test_samplers_sharing_pack_counts_pack_the_first_epoch_once(monkeypatch) -> None:
    import omnibert.data.packed_sampler as module

    calls = []
    real = module.pack_window
    monkeypatch.setattr(module, "pack_window", lambda *a, **k: calls.append(1) or real(*a, **k))
    counts: dict[int, int] = {}
    first = sampler(batch_size=1, pack_counts=counts).packs_in_epoch(0)
    windows = len(calls)
    assert windows == sampler().windows_per_epoch and counts == {0: first}
    assert len(sampler(pack_counts=counts)) == first // 4  # another batch size: no repacking
    assert len(calls) == windows
