"""Damaged Arrow files: omnibert-prepare records, verifies and regenerates them; training
refuses them with the command that repairs them, and a bad row names its shard."""

from __future__ import annotations

import gc
import json
import shlex
import shutil
from pathlib import Path

import datasets
import pytest
from faults import damage_masked_positions, overwrite_bytes, truncate
from torch.utils.data import DataLoader

from omnibert.apps.compose import compose
from omnibert.data.collate import CollateError, PretrainingCollator
from omnibert.data.integrity import crc32c_file
from omnibert.data.sources import ArrowSource, DataConfigError, RowSpec
from omnibert.prepare import shards
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
SETTINGS = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
SPEC = RowSpec(max_seq_length=64, max_predictions_per_seq=10)


@pytest.fixture
def inputs(tmp_path: Path) -> list[str]:
    paths = []
    for name in ("single_doc.txt", "wiki_like.txt"):
        shutil.copyfile(REFERENCE / name, tmp_path / name)
        paths.append(str(tmp_path / name))
    return paths


def _prepare(inputs: list[str], vocab: Path, out: Path, **kwargs):
    return prepare(inputs, vocab, out, SETTINGS, max_shard_size=20_000, progress=False, **kwargs)


def _snapshot(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


def test_metadata_records_every_arrow_file(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    _prepare(inputs, bert_vocab_file, out)
    meta = json.loads((out / "metadata.json").read_text())
    state = json.loads((out / "state.json").read_text())
    files = meta["files"]
    assert [f["filename"] for f in files] == [e["filename"] for e in state["_data_files"]]
    assert len(files) >= 3  # the second input spans several files
    for record in files:
        path = out / record["filename"]
        assert record["bytes"] == path.stat().st_size
        assert record["crc32c"] == crc32c_file(path)
        assert record["inputs"] == [int(record["filename"][5:10])]
    assert sum(f["rows"] for f in files) == meta["counts"]["instances"]
    assert meta["settings"]["max_shard_size"] == 20_000
    assert all(Path(i["input_file"]).is_absolute() for i in meta["inputs"])


@pytest.mark.parametrize("damage", [truncate, overwrite_bytes])
def test_rerun_regenerates_only_the_damaged_input_bit_identically(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path, damage
) -> None:
    out = tmp_path / "out"
    _prepare(inputs, bert_vocab_file, out)
    before = _snapshot(out)
    damage(out / "data-00001-00001.arrow")
    # even overwrite=true used to say "already holds this data; nothing to do"
    summary = _prepare(inputs, bert_vocab_file, out, overwrite=True)
    assert summary.repaired == ["data-00001-00001.arrow"]
    assert [p.index for p in summary.parts] == [1]  # only the affected input file ran
    assert "repaired" in summary.render()
    assert _snapshot(out) == before  # bit-identical, metadata.json included
    assert not (out / shards.PARTS_DIR).exists()
    assert _prepare(inputs, bert_vocab_file, out).already_complete


def test_an_eval_set_is_repaired_from_the_inputs_it_keeps(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    _prepare(inputs, bert_vocab_file, out, eval_samples=30)
    before = _snapshot(out)
    meta = json.loads((out / "metadata.json").read_text())
    assert [f["inputs"] for f in meta["files"]] == [[0, 1]]  # 7 rows of input 0 do not suffice
    overwrite_bytes(out / "data-00000-00000.arrow")
    summary = _prepare(inputs, bert_vocab_file, out, eval_samples=30)
    assert summary.repaired == ["data-00000-00000.arrow"]
    assert _snapshot(out) == before


def test_a_damaged_part_is_redone_on_resume(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"fine line\n\xff not utf-8\n")
    with pytest.raises(Exception, match="not valid UTF-8"):
        _prepare([inputs[1], str(broken)], bert_vocab_file, out)
    part = out / shards.PARTS_DIR / "part-00000"
    arrow = next(part.glob("*.arrow"))
    overwrite_bytes(arrow)
    broken.write_text("now it is fine.\nsecond sentence.\n", encoding="utf-8")
    summary = _prepare([inputs[1], str(broken)], bert_vocab_file, out)
    assert summary.resumed_files == 0  # the damaged part was not taken as finished
    fresh = tmp_path / "fresh"
    _prepare([inputs[1], str(broken)], bert_vocab_file, fresh)
    assert datasets.load_from_disk(str(out)).to_list() == (
        datasets.load_from_disk(str(fresh)).to_list()
    )


def _source(path: Path, **kwargs) -> ArrowSource:
    source = ArrowSource(str(path), **kwargs)
    source.check(SPEC)
    return source


def test_training_refuses_a_damaged_shard_with_the_command_that_repairs_it(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path, monkeypatch
) -> None:
    from omnibert.apps.prepare import run

    data = tmp_path / "data"
    _prepare(inputs, bert_vocab_file, data)
    before = _snapshot(data)
    overwrite_bytes(data / "data-00001-00000.arrow")
    _source(data, verify_checksums=False)  # same size and rows: passes the cheap checks
    with pytest.raises(DataConfigError) as refused:
        _source(data)  # data.verify_checksums=auto: a small set's CRC-32C is checked at start
    message = str(refused.value)
    assert "data-00001-00000.arrow has CRC-32C" in message and "\n" not in message
    # the command ends the message: copied as it is, it runs
    command = shlex.split(message.split("repair it with: ", 1)[1])
    assert command[0] == "omnibert-prepare"
    truncate(data / "data-00000-00000.arrow")
    with pytest.raises(DataConfigError, match=r"data-00000-00000.arrow has [\d,]+ bytes instead"):
        _source(data)
    # the command works from any directory and regenerates exactly the damaged files
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    run(compose("prepare", [*command[1:], "progress=false"]))
    assert _snapshot(data) == before
    _source(data, verify_checksums=True)


def test_a_bad_row_names_its_shard_and_row_from_a_loader_worker(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path
) -> None:
    data = tmp_path / "data"
    _prepare(inputs, bert_vocab_file, data)
    damage_masked_positions(data / "data-00001-00000.arrow")
    source = _source(data, verify_checksums=False)  # sizes and row counts are unchanged
    rows = source.rows("train")
    first_of_file = json.loads((data / "metadata.json").read_text())["files"][0]["rows"]
    loader = DataLoader(
        rows,
        batch_sampler=[[first_of_file + 2]],
        collate_fn=PretrainingCollator(64, 10),
        num_workers=1,
    )
    with pytest.raises(CollateError) as caught:
        next(iter(loader))
    message = str(caught.value)
    assert "\n" not in message
    assert f"row {first_of_file + 2} of the dataset (row 2 of {data}/data-00001-00000.arrow)" in (
        message
    )
    assert "masks position 60000" in message
    assert "repair it with: omnibert-prepare " in message
    assert message.startswith("in DataLoader worker process 0: row ")


def test_training_on_a_bad_row_exits_with_one_line(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path, capsys
) -> None:
    from omnibert.apps.train import run_or_exit

    data = tmp_path / "data"
    _prepare(inputs, bert_vocab_file, data)
    for arrow in data.glob("*.arrow"):
        damage_masked_positions(arrow)
    cfg = compose(
        "pretrain",
        [
            "data=arrow",
            f"data.train_path={data}",
            "data.eval_path=null",
            "data.num_workers=1",  # the error happens in a loader worker process
            "data.verify_checksums=false",  # else refused at start: the CRC-32C changed
            "model=bert_tiny",
            "phase.max_seq_length=64",
            "phase.max_predictions_per_seq=10",
            "phase.global_batch_size=8",
            "phase.max_steps=2",
            "micro_batch_size=4",
            "logger=none",
            "callbacks=minimal",
            "trainer.enable_progress_bar=false",
            f"paths.output_root={tmp_path / 'runs'}",
        ],
    )
    with pytest.raises(SystemExit) as exited:
        run_or_exit(cfg, tmp_path / "run")
    assert exited.value.code == 2
    del exited  # its traceback holds the failed loader: shut its worker down here, not at exit
    gc.collect()
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and errors[0] == stderr.strip().splitlines()[-1], stderr
    assert errors[0].startswith("omnibert-train: error: in DataLoader worker process 0: row ")
    assert errors[0].endswith("max_shard_size=20000")  # the repair command, copyable
    assert "masks position 60000" in errors[0] and f"of {data}/data-000" in errors[0]
    assert "repair it with: omnibert-prepare " in errors[0]


def test_the_repair_command_keeps_a_glob_a_glob(
    inputs: list[str], bert_vocab_file: Path, tmp_path: Path, monkeypatch
) -> None:
    from omnibert.apps.prepare import run
    from omnibert.data.integrity import repair_command

    monkeypatch.chdir(tmp_path)
    prepare("*.txt", bert_vocab_file, "data", SETTINGS, max_shard_size=20_000, progress=False)
    meta = json.loads((tmp_path / "data" / "metadata.json").read_text())
    assert meta["input_files"] == [str(tmp_path / "*.txt")]
    command = repair_command(meta, tmp_path / "data")
    assert f'input_files=["{tmp_path}/*.txt"]' in command and "single_doc" not in command
    before = _snapshot(tmp_path / "data")
    truncate(tmp_path / "data" / "data-00000-00000.arrow")
    monkeypatch.chdir(tmp_path.parent)
    run(compose("prepare", [*shlex.split(command)[1:], "progress=false"]))
    assert _snapshot(tmp_path / "data") == before
