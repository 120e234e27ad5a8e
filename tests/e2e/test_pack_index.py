"""Offline pack index (`omnibert-prepare ... pack.enabled=true`): every row exactly once, packs
fit S/K/P, seeded determinism, recorded statistics, atomic replace rules, load validation,
the mask-budget split, the app paths, and an untouched token data directory."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest

from omnibert.data.pack_index import PackIndexError, load_pack_index, row_lengths
from omnibert.packing.budget import split_over_budget
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pack_index import build_pack_index
from omnibert.prepare.pipeline import prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
S, P_SEQ = 64, 10


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    """Real omnibert-prepare output (seq 64, 10 masks): a few hundred rows of varied length."""
    out = tmp_path_factory.mktemp("prepared") / "train"
    settings = InstanceSettings(max_seq_length=S, max_predictions_per_seq=P_SEQ, dupe_factor=2)
    inputs = [str(REFERENCE / "wiki_like.txt"), str(REFERENCE / "tiny_docs.txt")]
    prepare(inputs, bert_vocab_file, out, settings, progress=False)
    return out


@pytest.fixture
def data_dir(prepared: Path, tmp_path: Path) -> Path:
    """A private copy of the prepared data, free to get indices written into it."""
    return Path(shutil.copytree(prepared, tmp_path / "train"))


def metadata(path: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads((path / "metadata.json").read_text())
    return meta


def load(path: Path, name: str = "lpfhp-k3", k: int = 3) -> Any:
    meta = metadata(path)
    return load_pack_index(
        path,
        name,
        rows=meta["counts"]["instances"],
        fingerprint=meta["fingerprint"],
        max_sequence_length=meta["settings"]["max_seq_length"],
        max_sequences_per_pack=k,
    )


def file_hashes(root: Path, skip: str | None = None) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and (skip is None or p.relative_to(root).parts[0] != skip)
    }


def synthetic(path: Path, lengths: list[int], masks: list[int], size: int) -> Path:
    """A minimal omnibert-pretraining directory (datasets Arrow + metadata.json)."""
    rows = {
        "input_ids": [[5] * n for n in lengths],
        "segment_ids": [[0] * n for n in lengths],
        "masked_lm_positions": [list(range(1, m + 1)) for m in masks],
        "masked_lm_ids": [[7] * m for m in masks],
        "next_sentence_label": [0] * len(lengths),
    }
    datasets.Dataset.from_dict(rows).save_to_disk(str(path))
    meta = {
        "format": "omnibert-pretraining",
        "fingerprint": "synthetic0000000",
        "settings": {"max_seq_length": size, "max_predictions_per_seq": max(masks)},
        "counts": {"instances": len(lengths), "masked": sum(masks)},
        "sequence_length_histogram": np.bincount(lengths, minlength=size + 1).tolist(),
    }
    (path / "metadata.json").write_text(json.dumps(meta))
    return path


@pytest.mark.parametrize(("algorithm", "k"), [("lpfhp", 3), ("nnlshp", 2)])
def test_index_holds_every_row_once_in_packs_that_fit_and_records_true_statistics(
    data_dir: Path, algorithm: str, k: int
) -> None:
    before = file_hashes(data_dir)
    index = build_pack_index(data_dir, algorithm=algorithm, max_sequences_per_pack=k, seed=7)
    dataset = datasets.load_from_disk(str(data_dir))
    lengths = [len(ids) for ids in dataset["input_ids"]]
    masks = [len(pos) for pos in dataset["masked_lm_positions"]]
    stored = np.load(data_dir / "packs" / f"{algorithm}-k{k}" / "packs.npy")
    assert stored.dtype == np.int32 and stored.shape == (len(stored), k)
    assert np.array_equal(stored, index.packs)
    packs = [[int(r) for r in row if r >= 0] for row in stored]
    for row, members in zip(stored.tolist(), packs, strict=True):
        assert row == members + [-1] * (k - len(members))  # -1 only in trailing slots
        assert 1 <= len(members) <= k
        assert sum(lengths[r] for r in members) <= S
        assert [lengths[r] for r in members] == sorted((lengths[r] for r in members), reverse=True)
    assert sorted(r for members in packs for r in members) == list(range(len(lengths)))
    assert len(packs) < len(lengths)  # packing did pack something
    # every number in packing.json recomputed by hand
    info = json.loads((data_dir / "packs" / f"{algorithm}-k{k}" / "packing.json").read_text())
    assert info == {**index.info, "command": info["command"]}
    meta = metadata(data_dir)
    tokens = sum(lengths)
    assert info["format"] == "omnibert-pack-index" and info["format_version"] == 1
    assert info["data_fingerprint"] == meta["fingerprint"] and info["rows"] == len(lengths)
    assert (info["algorithm"], info["seed"], info["max_sequences_per_pack"]) == (algorithm, 7, k)
    assert info["max_sequence_length"] == S and info["num_packs"] == len(packs)
    assert info["max_predictions_per_pack"] == max(sum(masks[r] for r in m) for m in packs)
    assert info["sequences_per_pack"] == pytest.approx(len(lengths) / len(packs))
    assert info["speedup"] == pytest.approx(len(lengths) / len(packs))
    assert info["efficiency"] == pytest.approx(tokens / (len(packs) * S))
    assert info["efficiency_unpacked"] == pytest.approx(tokens / (len(lengths) * S))
    assert info["efficiency"] > info["efficiency_unpacked"]
    sizes = [len(m) for m in packs]
    assert info["packs_by_size"] == {str(n): sizes.count(n) for n in sorted(set(sizes))}
    # the token data is untouched: only packs/ is new
    assert file_hashes(data_dir, skip="packs") == before
    assert [p.name for p in (data_dir / "packs").iterdir()] == [f"{algorithm}-k{k}"]


def test_same_seed_gives_the_same_packs_and_another_seed_another_order(data_dir: Path) -> None:
    first = build_pack_index(data_dir, seed=3, name="a", progress=False).packs
    again = build_pack_index(data_dir, seed=3, name="b", progress=False).packs
    other = build_pack_index(data_dir, seed=4, name="c", progress=False).packs
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_existing_index_is_kept_reused_or_replaced_only_on_request(data_dir: Path) -> None:
    build_pack_index(data_dir, seed=1, progress=False)
    packs_dir = data_dir / "packs"
    original = file_hashes(packs_dir)
    # same data and settings: nothing to do, the files stay as they are
    assert build_pack_index(data_dir, seed=1, progress=False).info["reused"] is True
    assert file_hashes(packs_dir) == original
    with pytest.raises(PackIndexError, match=r"lpfhp-k3 already holds .* pack.overwrite=true"):
        build_pack_index(data_dir, seed=2, progress=False)
    assert file_hashes(packs_dir) == original
    replaced = build_pack_index(data_dir, seed=2, overwrite=True, progress=False)
    assert np.array_equal(load(data_dir).packs, replaced.packs)
    assert load(data_dir).info["seed"] == 2
    assert sorted(p.name for p in packs_dir.iterdir()) == ["lpfhp-k3"]  # no temp dirs left


def test_load_refuses_wrong_k_other_data_and_corrupt_arrays(data_dir: Path) -> None:
    build_pack_index(data_dir, progress=False)
    meta = metadata(data_dir)
    index_dir = data_dir / "packs" / "lpfhp-k3"
    with pytest.raises(PackIndexError) as wrong_k:
        load(data_dir, k=2)
    assert str(wrong_k.value) == (
        f"{index_dir / 'packing.json'} was built for max_sequences_per_pack=3 but "
        "data.pack.max_sequences_per_pack is 2; set it to 3 or run omnibert-prepare "
        f"output_dir={data_dir} pack.enabled=true pack.max_sequences_per_pack=2."
    )
    rows = meta["counts"]["instances"]
    kwargs = {"rows": rows, "max_sequence_length": S, "max_sequences_per_pack": 3}
    with pytest.raises(PackIndexError, match=r"built for other data .*pack\.overwrite=true"):
        load_pack_index(data_dir, "lpfhp-k3", fingerprint="0123456789abcdef", **kwargs)
    with pytest.raises(PackIndexError, match="holds no pack index"):
        load_pack_index(data_dir, "ffd-k3", fingerprint=meta["fingerprint"], **kwargs)
    good = np.load(index_dir / "packs.npy")
    assert load(data_dir).packs.tolist() == good.tolist()
    twice = good.copy()
    twice[0, 0] = twice[1, 0]
    hole = good.copy()
    pair = int(np.flatnonzero((good >= 0).sum(axis=1) == 2)[0])
    hole[pair] = [hole[pair, 0], -1, hole[pair, 1]]  # a gap between two rows
    outside = good.copy()
    outside[0, 0] = rows
    corrupt = {
        "listed twice": twice,
        "a -1 before a row number": hole,
        "outside": outside,
        "not int32/int64": good.astype(np.float32),
        "shape": good[:-1],
    }
    for problem, array in corrupt.items():
        np.save(index_dir / "packs.npy", array)
        with pytest.raises(PackIndexError, match=f"packs.npy is corrupt .*{problem}"):
            load(data_dir)
    (index_dir / "packs.npy").write_bytes(b"\x93NUMPY garbage")
    with pytest.raises(PackIndexError, match=r"packs.npy cannot be read .*pack.overwrite=true\.$"):
        load(data_dir)


def test_split_moves_the_shortest_sequences_of_an_over_budget_pack_into_new_packs() -> None:
    packs = np.array([[0, 1, 2], [3, -1, -1], [4, 5, -1]], dtype=np.int32)
    masks = np.array([5, 4, 3, 9, 2, 2], dtype=np.int64)
    split = split_over_budget(packs, masks, budget=9)
    assert split.dtype == np.int32
    assert split.tolist() == [[0, 1, -1], [2, -1, -1], [3, -1, -1], [4, 5, -1]]
    assert split_over_budget(packs, masks, budget=12) is packs


def test_mask_budget_splits_packs_and_records_the_stats_after_the_split(tmp_path: Path) -> None:
    lengths = [8, 4, 4] * 6 + [12, 2] * 3
    masks = [3, 3, 3] * 6 + [2, 1] * 3
    data = synthetic(tmp_path / "syn", lengths, masks, size=16)
    free = build_pack_index(data, name="free", progress=False)
    assert free.info["max_predictions_per_pack"] == 9  # (8, 4, 4) packs: 3 + 3 + 3 masks
    budget = build_pack_index(data, max_predictions_per_pack=6, name="p6", progress=False)
    packs = [[int(r) for r in row if r >= 0] for row in budget.packs]
    assert sorted(r for m in packs for r in m) == list(range(len(lengths)))
    assert all(sum(masks[r] for r in m) <= 6 and sum(lengths[r] for r in m) <= 16 for m in packs)
    # expected: each unbudgeted pack, in order, cut by next fit over its longest-first rows
    expected: list[list[int]] = []
    for row in free.packs.tolist():
        pieces = [[row[0]]]
        for r in row[1:]:
            if r < 0:
                break
            if sum(masks[i] for i in pieces[-1]) + masks[r] > 6:
                pieces.append([])
            pieces[-1].append(r)
        expected.extend(pieces)
    assert packs == expected and len(packs) > free.info["num_packs"]
    info = budget.info
    assert info["num_packs"] == len(packs)
    assert info["packs_added_by_mask_budget"] == len(packs) - free.info["num_packs"]
    assert info["mask_budget"] == 6
    assert info["max_predictions_per_pack"] == 6
    assert info["efficiency"] == pytest.approx(sum(lengths) / (len(packs) * 16))
    sizes = [len(m) for m in packs]
    assert info["packs_by_size"] == {str(n): sizes.count(n) for n in sorted(set(sizes))}
    assert load(data, "p6").packs.tolist() == budget.packs.tolist()
    with pytest.raises(PackIndexError, match="below the 3 masked positions of a single row"):
        build_pack_index(data, max_predictions_per_pack=2, name="p2", progress=False)


def test_changed_data_and_bad_settings_are_refused_before_writing(tmp_path: Path) -> None:
    data = synthetic(tmp_path / "syn", [5, 6, 7], [1, 1, 1], size=16)
    meta = json.loads((data / "metadata.json").read_text())
    meta["sequence_length_histogram"][5] += 1
    (data / "metadata.json").write_text(json.dumps(meta))
    with pytest.raises(PackIndexError, match=r"do not match its metadata\.json"):
        build_pack_index(data, progress=False)
    for bad, match in (
        ({"max_sequences_per_pack": 0}, "pack.max_sequences_per_pack=0 must be a positive"),
        ({"algorithm": "best"}, "pack.algorithm='best' is not one of"),
        ({"options": {"depth": 2}}, r"pack.options \['depth'\] are not options of"),
        ({"name": "../x"}, "pack.name='../x' must be a plain directory name"),
    ):
        with pytest.raises(PackIndexError, match=match):
            build_pack_index(data, progress=False, **bad)
    with pytest.raises(PackIndexError, match=r"has no metadata\.json"):
        build_pack_index(tmp_path / "nothing", progress=False)
    assert not (data / "packs").exists()


def test_row_lengths_reads_offsets_in_row_order(tmp_path: Path) -> None:
    data = synthetic(tmp_path / "syn", [3, 9, 4, 7], [1, 2, 0, 3], size=16)
    dataset = datasets.load_from_disk(str(data))
    tokens, masked = row_lengths(dataset)
    assert tokens.tolist() == [3, 9, 4, 7] and masked.tolist() == [1, 2, 0, 3]
    tokens, masked = row_lengths(dataset.select([3, 0, 2]))
    assert tokens.tolist() == [7, 3, 4] and masked.tolist() == [3, 1, 0]
    table = pa.concat_tables([dataset.data.table.slice(1, 2), dataset.data.table.slice(0, 1)])
    assert row_lengths(table)[0].tolist() == [9, 4, 3]


def test_app_packs_an_existing_output_dir_without_touching_its_data(
    data_dir: Path, capsys: pytest.CaptureFixture[str], compose_config
) -> None:
    from omnibert.apps.prepare import run

    before = file_hashes(data_dir)
    cfg = compose_config(
        f"output_dir={data_dir}", "pack.enabled=true", "progress=false", app="prepare"
    )
    run(cfg)
    out = capsys.readouterr().out
    info = load(data_dir, f"{cfg.pack.algorithm}-k3").info
    assert info["seed"] == cfg.random_seed == 12345
    assert f"into {info['num_packs']:,} packs" in out and "sequences/pack" in out
    assert f"{info['efficiency_unpacked']:.1%} -> {info['efficiency']:.1%}" in out
    assert f"need {info['max_predictions_per_pack']} masked positions" in out
    assert file_hashes(data_dir, skip="packs") == before


def test_app_prepares_and_packs_in_one_run(
    bert_vocab_file: Path, tmp_path: Path, compose_config
) -> None:
    from omnibert.apps.prepare import run

    out = tmp_path / "out"
    cfg = compose_config(
        f"input_files=[{REFERENCE / 'tiny_docs.txt'}]",
        f"vocab_file={bert_vocab_file}",
        f"output_dir={out}",
        "max_seq_length=48",
        "dupe_factor=1",
        "progress=false",
        "pack.enabled=true",
        "pack.algorithm=ffd",
        "pack.max_sequences_per_pack=2",
        app="prepare",
    )
    run(cfg)
    index = load(out, "ffd-k2", k=2)
    assert index.info["rows"] == len(datasets.load_from_disk(str(out))) > 0
    assert index.info["max_sequence_length"] == 48


def test_cli_exits_2_with_one_line_on_a_dir_without_metadata(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("omnibert-prepare")
    done = subprocess.run(
        [
            str(exe),
            f"output_dir={tmp_path / 'missing'}",
            "pack.enabled=true",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"omnibert-prepare: error: {tmp_path / 'missing'} has no metadata.json, so it is not a "
        "finished omnibert-prepare output directory; run omnibert-prepare into it first or fix "
        "output_dir."
    ]


# ------------------------------------------------------------------ data.packing=offline


def _module(data_dir: Path, packing: str, **pack: Any) -> Any:
    from omnibert.data.datamodule import PretrainingDataModule
    from omnibert.data.sources import ArrowSource

    return PretrainingDataModule(
        source=ArrowSource,
        train_path=str(data_dir),
        eval_path=None,
        max_seq_length=S,
        max_predictions_per_seq=P_SEQ,
        micro_batch_size=4,
        num_workers=0,
        packing=packing,
        pack=pack,
    )


def test_offline_packing_serves_every_row_once_per_pass_in_packed_batches(data_dir: Path) -> None:
    import torch

    index = build_pack_index(data_dir, algorithm="nnlshp", max_sequences_per_pack=3, progress=False)
    module = _module(data_dir, "offline")
    module.check()
    assert module.num_train_rows == index.info["num_packs"] < module.num_train_samples
    assert module.predictions_per_pack == max(P_SEQ, index.info["max_predictions_per_pack"])
    report = module.describe()["packing"]
    assert report["efficiency"] == pytest.approx(index.info["efficiency"], abs=1e-4)
    loader = module.train_dataloader()
    seen = 0
    for batch in loader:
        assert batch["input_ids"].shape == (4, S) and batch["nsp_weights"].shape == (4, 3)
        assert batch["masked_lm_ids"].shape[1] == module.predictions_per_pack
        seen += int(batch["nsp_weights"].sum())
        # every real sequence's [CLS] opens a run of its own sequence id
        rows, slots = torch.nonzero(batch["nsp_weights"], as_tuple=True)
        cls = batch["nsp_positions"][rows, slots]
        assert torch.equal(batch["sequence_ids"][rows, cls], slots + 1)
        assert torch.equal(batch["position_ids"][rows, cls], torch.zeros_like(cls))
    packs_used = (index.info["num_packs"] // 4) * 4
    assert seen == int((index.packs[:packs_used] >= 0).sum())  # drop_last: whole batches


def test_offline_packing_without_an_index_names_the_command(data_dir: Path) -> None:
    from omnibert.data.datamodule import DataConfigError

    with pytest.raises(
        DataConfigError, match=r"data.packing=offline: .*omnibert-prepare output_dir="
    ):
        _module(data_dir, "offline").check()


def test_online_packing_reads_lengths_from_the_shards(data_dir: Path) -> None:
    module = _module(data_dir, "online", buffer_size=64, algorithm="bfd")
    module.check()
    lengths, masks = module.source.row_lengths()
    assert lengths.size == module.num_train_samples and (masks <= P_SEQ).all()
    batch = next(iter(module.train_dataloader()))
    assert batch["nsp_weights"].sum() > 4  # 4 rows hold more than 4 sequences
    assert module.sequences_per_row > 1.05  # seq-64 rows are mostly full already
