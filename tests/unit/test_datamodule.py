"""PretrainingDataModule on real omnibert-prepare output: checks, formats, loaders, and exact
mid-epoch resume through Lightning's checkpointing; generated rows' determinism."""

from __future__ import annotations

import hashlib
import itertools
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import datasets
import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from omnibert.checkpoints.resuming import CompletedBatchProgress
from omnibert.data.collate import BATCH_KEYS
from omnibert.data.converted import ConvertedSource
from omnibert.data.datamodule import (
    DataConfigError,
    PretrainingDataModule,
    lightning_epoch_batches,
)
from omnibert.data.generated import GeneratedSource
from omnibert.data.sources import ArrowSource
from omnibert.formats.hdf5 import write_hdf5
from omnibert.formats.tfrecord import write_tfrecord
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
SEQ, PREDS = 32, 5


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> dict[str, Path]:
    """Small real prepare output: train (226 rows), eval (25 rows), eval with whole-word masking."""
    root = tmp_path_factory.mktemp("data")
    settings = InstanceSettings(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=1)
    prepare([str(REFERENCE / "wiki_like.txt")], bert_vocab_file, root / "train", settings,
            progress=False)  # fmt: skip
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, root / "eval", settings,
            progress=False)  # fmt: skip
    wwm = InstanceSettings(max_seq_length=SEQ, max_predictions_per_seq=PREDS, dupe_factor=1,
                           do_whole_word_mask=True)  # fmt: skip
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, root / "eval_wwm", wwm,
            progress=False)  # fmt: skip
    return {"train": root / "train", "eval": root / "eval", "eval_wwm": root / "eval_wwm",
            "root": root, "vocab": bert_vocab_file}  # fmt: skip


def module(data: dict[str, Path], **overrides: Any) -> PretrainingDataModule:
    kwargs: dict[str, Any] = {
        "train_path": str(data["train"]),
        "eval_path": str(data["eval"]),
        "max_seq_length": SEQ,
        "max_predictions_per_seq": PREDS,
        "micro_batch_size": 8,
        "num_workers": 0,
        "seed": 7,
    }
    kwargs.update(overrides)
    fmt = kwargs.pop("format", "arrow")
    if fmt == "arrow":
        return PretrainingDataModule(source=ArrowSource, **kwargs)
    return PretrainingDataModule(source=ConvertedSource, format=fmt, **kwargs)


def fingerprint(batch: dict[str, torch.Tensor]) -> str:
    blob = b"".join(batch[k].numpy().tobytes() for k in BATCH_KEYS)
    return hashlib.sha1(blob).hexdigest()[:16]


# ---------------------------------------------------------------------- check()


def test_check_accepts_matching_data_and_reports_facts(data: dict[str, Path]) -> None:
    dm = module(data, vocab_file=str(data["vocab"]))
    dm.check()
    assert dm.num_train_samples == len(datasets.load_from_disk(str(data["train"]))) == 226
    assert dm.num_eval_samples == 25
    assert dm.vocab_size == 30522
    facts = dm.describe()
    assert facts["train_samples"] == 226 and facts["train_batches_per_epoch"] == 226 // 8
    json.dumps(facts)  # plain data


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"train_path": None}, r"data\.train_path is not set"),
        ({"train_path": "/nonexistent/train"}, r"data\.train_path=/nonexistent/train does not exist"),
        ({"eval_path": "/nonexistent/eval"}, r"data\.eval_path=/nonexistent/eval does not exist"),
        ({"max_seq_length": 64}, r"prepared with max_seq_length=32 but phase\.max_seq_length"),
        ({"max_predictions_per_seq": 20},
         r"max_predictions_per_seq=5 but phase\.max_predictions_per_seq .* is 20"),
        ({"format": "parquet"}, r"data\.format='parquet' is not one of"),
        ({"micro_batch_size": 300}, r"micro_batch_size=300 is larger than the 226 training rows"),
        ({"eval_samples": 26}, r"data\.eval_samples=26 but .* holds only 25 rows"),
        ({"vocab_file": "/nonexistent/vocab.txt"}, r"data\.vocab_file: .*does not exist"),
    ],
)  # fmt: skip
def test_check_refuses_bad_configuration(
    data: dict[str, Path], overrides: dict[str, Any], expected: str
) -> None:
    with pytest.raises(DataConfigError, match=expected):
        module(data, **overrides).check()


def test_check_refuses_directory_without_metadata(data: dict[str, Path], tmp_path: Path) -> None:
    partial = tmp_path / "partial"
    shutil.copytree(data["train"], partial)
    (partial / "metadata.json").unlink()
    with pytest.raises(DataConfigError, match=r"data\.train_path=.*partial is not an omnibert"):
        module(data, train_path=str(partial)).check()
    broken = tmp_path / "broken"
    shutil.copytree(data["train"], broken)
    for arrow in broken.glob("*.arrow"):
        arrow.write_bytes(b"not arrow")
    with pytest.raises(
        DataConfigError,
        match=r"data\.train_path=.*broken: data-00000-00000.arrow has 9 bytes instead of [\d,]+, "
        r"so the data is damaged; repair it with: omnibert-prepare ",
    ):
        module(data, train_path=str(broken)).check()
    # data written before omnibert-prepare recorded its files: the load itself fails
    meta = json.loads((broken / "metadata.json").read_text())
    del meta["files"]
    (broken / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(DataConfigError, match=r"data\.train_path=.*broken: the Arrow shards"):
        module(data, train_path=str(broken)).check()


def test_check_refuses_other_vocab_and_mismatched_eval(
    data: dict[str, Path], tmp_path: Path
) -> None:
    other_vocab = tmp_path / "vocab.txt"
    other_vocab.write_text(data["vocab"].read_text(encoding="utf-8") + "extra\n", encoding="utf-8")
    with pytest.raises(DataConfigError, match=r"data\.vocab_file=.*is not the vocab data\.train"):
        module(data, vocab_file=str(other_vocab)).check()
    with pytest.raises(
        DataConfigError, match=r"data\.eval_path=.*eval_wwm was prepared with do_whole_word_mask"
    ):
        module(data, eval_path=str(data["eval_wwm"])).check()


# ---------------------------------------------------------------------- loaders


@pytest.mark.parametrize("workers", [0, 2])
def test_train_loader_covers_the_epoch_and_leaves_global_rng_alone(
    data: dict[str, Path], workers: int
) -> None:
    dm = module(data, num_workers=workers)
    dm.setup("fit")
    loader = dm.train_dataloader()
    assert loader.persistent_workers == (workers > 0)
    before = torch.get_rng_state()
    batches = list(loader)
    assert torch.equal(torch.get_rng_state(), before)
    assert len(batches) == len(loader) == 226 // 8
    for batch in batches:
        assert list(batch) == list(BATCH_KEYS)
        assert batch["input_ids"].shape == (8, SEQ) and batch["input_ids"].dtype == torch.int64
        assert batch["masked_lm_weights"].dtype == torch.float32
    rows = datasets.load_from_disk(str(data["train"]))["input_ids"]
    seen = sorted(tuple(row[row != 0].tolist()) for b in batches for row in b["input_ids"])
    all_rows = sorted(tuple(r) for r in rows)
    assert len(seen) == 224 and all(row in all_rows for row in seen)  # drop_last: 2 left
    second = list(loader)  # the next epoch is another permutation
    assert [fingerprint(b) for b in second] != [fingerprint(b) for b in batches]


class FakeTrainer:
    def __init__(self, limit: int | float, accumulate: int, rank: int = 0, world: int = 1) -> None:
        self.limit_train_batches, self.accumulate_grad_batches = limit, accumulate
        self.global_rank, self.world_size = rank, world


def test_setup_takes_rank_and_world_size_from_the_trainer(data: dict[str, Path]) -> None:
    shares = []
    for rank in range(2):
        dm = module(data)
        dm.trainer = FakeTrainer(1.0, 2, rank=rank, world=2)  # type: ignore[assignment]
        dm.setup("fit")
        assert (dm.rank, dm.world_size) == (rank, 2)
        loader = dm.train_dataloader()
        assert len(loader) == 226 // 2 // 8 // 2 * 2  # whole accumulation groups
        shares.append({tuple(row.tolist()) for b in loader for row in b["input_ids"]})
    assert not shares[0] & shares[1]
    with pytest.raises(DataConfigError, match="micro_batch_size=120 is larger than the 113"):
        dm = module(data, micro_batch_size=120)
        dm.trainer = FakeTrainer(1.0, 1, rank=0, world=2)  # type: ignore[assignment]
        dm.setup("fit")


def test_sampler_epoch_matches_lightnings_epoch() -> None:
    assert lightning_epoch_batches(FakeTrainer(1.0, 4), 30) == 28  # whole global batches
    assert lightning_epoch_batches(FakeTrainer(10, 4), 30) == 8
    assert lightning_epoch_batches(FakeTrainer(0.5, 1), 30) == 30  # Lightning scales floats
    assert lightning_epoch_batches(None, 30) is None
    with pytest.raises(DataConfigError, match="3 micro batches per epoch, fewer than the 4"):
        lightning_epoch_batches(FakeTrainer(1.0, 4), 3)


def test_val_loader_shards_the_eval_set_exactly_across_ranks(data: dict[str, Path]) -> None:
    seen = []
    counts = []
    for rank in range(3):
        dm = module(data, eval_micro_batch_size=4, eval_samples=23)
        dm.trainer = None
        dm.rank, dm.world_size = rank, 3
        dm.check()
        batches = list(dm.val_dataloader())
        counts.append(len(batches))
        for b in batches:
            assert b["input_ids"].shape == (4, SEQ)
            real = b["nsp_weights"][:, 0] > 0
            assert (b["masked_lm_weights"][~real] == 0).all() and (b["input_ids"][~real] == 0).all()
            seen.extend(row[row != 0].tolist() for row in b["input_ids"][real])
    assert counts == [2, 2, 2]  # 8/8/7 rows: every rank runs the same number of batches
    rows = datasets.load_from_disk(str(data["eval"]))["input_ids"][:23]
    assert seen == [list(r) for r in rows]


@pytest.mark.parametrize("fmt", ["tfrecord", "hdf5"])
def test_tfrecord_and_hdf5_give_the_same_batches_as_arrow(
    data: dict[str, Path], tmp_path: Path, fmt: str
) -> None:
    records = datasets.load_from_disk(str(data["train"])).to_list()
    src = tmp_path / fmt
    src.mkdir()
    write = write_tfrecord if fmt == "tfrecord" else write_hdf5
    suffix = ".tfrecord" if fmt == "tfrecord" else ".hdf5"
    write(src / f"part-0{suffix}", records[:100], SEQ, PREDS)
    write(src / f"part-1{suffix}", records[100:], SEQ, PREDS)
    cache = tmp_path / "cache"
    dm = module(data, train_path=str(src), format=fmt, cache_dir=str(cache),
                vocab_file=str(data["vocab"]), eval_path=None)  # fmt: skip
    dm.check()
    assert dm.num_train_samples == 226 and dm.vocab_size == 30522
    dm.setup("fit")
    reference = module(data, eval_path=None)
    reference.setup("fit")
    ours = [fingerprint(b) for b in dm.train_dataloader()]
    assert ours == [fingerprint(b) for b in reference.train_dataloader()]
    cached = [p for p in cache.iterdir() if p.is_dir()]
    assert len(cached) == 1 and (cached[0] / "metadata.json").is_file()
    again = module(data, train_path=str(src), format=fmt, cache_dir=str(cache), eval_path=None)
    again.check()  # the cache is found: no conversion, rows known before setup
    assert again.source.splits["train"].metadata is not None
    with pytest.raises(DataConfigError, match=r"prepared with max_seq_length=32 but phase\."):
        module(data, train_path=str(src), format=fmt, max_seq_length=64, eval_path=None).check()


def test_corrupt_tfrecord_is_named_and_leaves_no_cache(
    data: dict[str, Path], tmp_path: Path
) -> None:
    records = datasets.load_from_disk(str(data["train"])).to_list()
    path = tmp_path / "bad.tfrecord"
    write_tfrecord(path, records[:50], SEQ, PREDS)
    raw = bytearray(path.read_bytes())
    raw[-40] ^= 0xFF  # inside the last record's data: its CRC no longer matches
    path.write_bytes(bytes(raw))
    cache = tmp_path / "cache"
    dm = module(data, train_path=str(path), format="tfrecord", cache_dir=str(cache),
                eval_path=None)  # fmt: skip
    dm.check()  # the first record is fine
    with pytest.raises(DataConfigError, match=r"data\.train_path: .*bad\.tfrecord: the data CRC"):
        dm.setup("fit")
    assert not [p for p in cache.iterdir() if p.is_dir()]
    with pytest.raises(DataConfigError, match=r"data\.train_path=.*train holds no \*\.tfrecord"):
        module(data, format="tfrecord", eval_path=None).check()


# ---------------------------------------------------------------------- Lightning resume


class Recorder(pl.LightningModule):
    """Records (global_step, fingerprint) of every batch it trains on."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.seen: list[tuple[int, str]] = []
        self.loader = ""

    def on_train_start(self) -> None:
        self.loader = type(self.trainer.train_dataloader).__name__

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        self.seen.append((self.global_step, fingerprint(batch)))
        x = batch["masked_lm_weights"].sum(dim=1, keepdim=True)
        return self.layer(x).pow(2).mean()

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        assert batch["input_ids"].shape[0] == 8

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def fit(
    data: dict[str, Path], root: Path, workers: int, accumulate: int, max_steps: int,
    ckpt: Path | None = None, save: bool = False, limit: int | None = None,
) -> list[tuple[int, str]]:  # fmt: skip
    model = Recorder()
    callbacks: list[pl.Callback] = [CompletedBatchProgress()]  # Lightning < 2.5 (IPU env)
    if save:
        callbacks.append(ModelCheckpoint(dirpath=root / "ckpt", filename="{step}",
                                         every_n_train_steps=1, save_top_k=-1))  # fmt: skip
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=max_steps, accumulate_grad_batches=accumulate,
        callbacks=callbacks, logger=False, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=save, default_root_dir=root, use_distributed_sampler=False,
        limit_train_batches=limit,
    )  # fmt: skip
    dm = module(data, micro_batch_size=32, eval_micro_batch_size=8, num_workers=workers)
    trainer.fit(model, datamodule=dm, ckpt_path=str(ckpt) if ckpt else None)
    if sys.modules.get("torchdata.stateful_dataloader", "") is None:  # torchdata blocked
        assert model.loader == "SamplerStateDataLoader"
    return model.seen


@pytest.mark.parametrize(
    ("workers", "accumulate", "limit", "torchdata"),
    [
        (0, 1, None, True),
        (0, 2, None, True),
        (2, 2, None, True),
        (2, 2, 4, True),
        # the IPU environment's loader (no torchdata): omnibert.data.loaders
        (0, 2, None, False),
        (2, 2, 4, False),
    ],
)
def test_lightning_resume_continues_with_the_next_batch(
    data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int,
    accumulate: int, limit: int | None, torchdata: bool,
) -> None:  # fmt: skip
    if not torchdata:
        monkeypatch.setitem(sys.modules, "torchdata.stateful_dataloader", None)
    per_epoch = 7 // accumulate * accumulate if limit is None else limit  # whole global batches
    steps_per_epoch = per_epoch // accumulate
    max_steps = 2 * steps_per_epoch + 2  # into the third epoch
    full = fit(data, tmp_path, workers, accumulate, max_steps, save=True, limit=limit)
    assert len(full) == (max_steps * accumulate)
    epochs = [full[e * per_epoch : (e + 1) * per_epoch] for e in range(2)]
    assert all(len(set(epoch)) == per_epoch for epoch in epochs)
    # mid-epoch, the last step of epoch 0 and a mid-epoch step of epoch 1
    for step in (2, steps_per_epoch, steps_per_epoch + 2):
        resumed = fit(data, tmp_path / f"from{step}", workers, accumulate, max_steps,
                      ckpt=tmp_path / "ckpt" / f"step={step}.ckpt", limit=limit)  # fmt: skip
        assert resumed == [seen for seen in full if seen[0] >= step], f"resumed from step {step}"


# ---------------------------------------------------------------------- generated data


def generated(**overrides: Any) -> PretrainingDataModule:
    kwargs: dict[str, Any] = {"max_seq_length": 64, "max_predictions_per_seq": 10,
                              "micro_batch_size": 16, "num_train_samples": 512,
                              "num_eval_samples": 40, "seed": 3}  # fmt: skip
    kwargs.update(overrides)
    dm = PretrainingDataModule(source=GeneratedSource, **kwargs)
    dm.setup("fit")
    return dm


def test_generated_rows_are_deterministic_and_batch_independent() -> None:
    first = [fingerprint(b) for b in itertools.islice(generated().train_dataloader(), 5)]
    assert first == [fingerprint(b) for b in itertools.islice(generated().train_dataloader(), 5)]
    assert first != [
        fingerprint(b) for b in itertools.islice(generated(seed=4).train_dataloader(), 5)
    ]
    rows = generated().source.rows("train")
    alone = rows.__getitems__([17]).table.to_pylist()
    assert rows.__getitems__([3, 17, 9]).table.to_pylist()[1] == alone[0] == rows[17]
    assert rows[17] != generated().source.rows("eval")[17]


def test_generated_batches_look_like_bert_data() -> None:
    dm = generated(vocab_size=30522)
    batches = list(dm.train_dataloader())
    assert len(batches) == 32
    ids = torch.cat([b["input_ids"] for b in batches])
    assert all(list(b) == list(BATCH_KEYS) for b in batches)
    assert ids.dtype == torch.int64 and ids.shape == (512, 64) and int(ids.max()) < 30522
    seq = torch.cat([b["sequence_ids"] for b in batches])
    lengths = seq.sum(dim=1)
    assert (lengths >= 5).all() and 0.8 < (lengths == 64).float().mean() < 0.97
    rows = torch.arange(512)
    assert (ids[:, 0] == 101).all() and (ids[rows, lengths - 1] == 102).all()
    assert ((ids == 102).sum(dim=1) == 2).all()  # random replacements never draw specials
    segments = torch.cat([b["segment_ids"] for b in batches])
    assert (segments.diff(dim=1) >= 0)[seq[:, 1:] > 0].all()  # 0s then 1s
    assert (segments[rows, lengths - 1] == 1).all()
    positions = torch.cat([b["masked_lm_positions"] for b in batches])
    weights = torch.cat([b["masked_lm_weights"] for b in batches])
    counts = weights.sum(dim=1).long()
    assert torch.equal(counts, torch.clamp(torch.round(lengths * 0.15).long().clamp(min=1), max=10))
    real = weights > 0
    assert (positions.diff(dim=1) > 0)[real[:, 1:]].all()  # ascending
    at = torch.gather(ids, 1, positions)[real]
    assert 0.7 < (at == 103).float().mean() < 0.9  # ~80% [MASK]
    assert (positions[real] > 0).all() and (
        positions[real] < lengths[:, None].expand_as(positions)[real] - 1
    ).all()
    labels = torch.cat([b["nsp_labels"] for b in batches])
    assert 0.35 < labels.float().mean() < 0.65
    assert dm.vocab_size == 30522 and dm.describe()["train_batches_per_epoch"] == 32
    evals = list(dm.val_dataloader())
    assert len(evals) == 3 and evals[-1]["nsp_weights"].sum() == 8


def test_generated_loader_resumes_exactly() -> None:
    loader = generated().train_dataloader()
    stream = iter(loader)
    for _ in range(7):
        next(stream)
    state = loader.state_dict()
    expected = [fingerprint(b) for b in stream]  # the rest of epoch 0 ...
    expected += [fingerprint(b) for b in itertools.islice(loader, 5)]  # ... into epoch 1
    restored = generated().train_dataloader()
    restored.load_state_dict(state)
    got = [fingerprint(b) for b in restored]
    assert len(got) == 32 - 7
    got += [fingerprint(b) for b in itertools.islice(restored, 5)]
    assert got == expected


def test_generated_check_names_the_key() -> None:
    with pytest.raises(DataConfigError, match=r"micro_batch_size=600 is larger than the 512"):
        generated(micro_batch_size=600)
    with pytest.raises(DataConfigError, match=r"phase\.max_seq_length=4 must be at least 5"):
        generated(max_seq_length=4, max_predictions_per_seq=2)
