"""omnibert-prepare end to end: shards, metadata, parallel workers, resume, refusals."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pytest

from omnibert.data import schema
from omnibert.prepare import shards
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import PrepareError, prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
SETTINGS_128 = InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)


def reference_rows(name: str) -> list[dict]:
    with gzip.open(REFERENCE / f"{name}.jsonl.gz", "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


@pytest.fixture
def inputs(tmp_path: Path) -> list[Path]:
    """Two input files: the wiki-like fixture and the one-document fixture."""
    paths = []
    for name in ("wiki_like.txt", "single_doc.txt"):
        paths.append(tmp_path / name)
        shutil.copyfile(REFERENCE / name, paths[-1])
    return paths


def test_two_workers_write_reference_rows_in_input_order(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    settings = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3)
    summary = prepare(
        [str(p) for p in reversed(inputs)],
        bert_vocab_file,
        out,
        settings,
        num_workers=2,
        progress=False,
    )
    single = reference_rows("single-doc-64")
    dataset = datasets.load_from_disk(str(out))
    assert list(dataset.column_names) == list(schema.COLUMNS)
    # the first input file's rows come first, each file's rows in the reference's order
    assert dataset[: len(single)] == {k: [r[k] for r in single] for k in schema.COLUMNS}
    assert summary.files == 2 and summary.instances == len(dataset)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["counts"]["instances"] == len(dataset)
    assert meta["settings"]["max_seq_length"] == 64
    assert meta["vocab"]["size"] == 30522 and len(meta["vocab"]["sha256"]) == 64
    assert [Path(i["input_file"]).name for i in meta["inputs"]] == [
        "single_doc.txt",
        "wiki_like.txt",
    ]
    assert all(len(i["sha256"]) == 64 for i in meta["inputs"])
    hist = meta["sequence_length_histogram"]
    assert len(hist) == 65 and sum(hist) == len(dataset)
    lengths = [len(x) for x in dataset["input_ids"]]
    assert hist == [lengths.count(n) for n in range(65)]
    assert meta["counts"]["tokens"] == sum(lengths)
    assert not (out / shards.PARTS_DIR).exists()
    assert dataset.features["input_ids"].feature.dtype == "uint16"


def test_rows_match_reference_through_the_shards(bert_vocab_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare([str(REFERENCE / "wiki_like.txt")], bert_vocab_file, out, SETTINGS_128, progress=False)
    expected = reference_rows("wiki-128")
    dataset = datasets.load_from_disk(str(out))
    assert dataset.to_list() == expected


def test_eval_samples_keeps_the_first_rows(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "eval"
    prepare([str(inputs[0])], bert_vocab_file, out, SETTINGS_128, eval_samples=50, progress=False)
    dataset = datasets.load_from_disk(str(out))
    assert dataset.to_list() == reference_rows("wiki-128")[:50]
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["counts"]["instances"] == 50 and sum(meta["sequence_length_histogram"]) == 50
    assert meta["counts"]["instances_created"] == 213


def test_rerun_is_a_no_op_and_other_settings_are_refused(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    prepare([str(inputs[1])], bert_vocab_file, out, SETTINGS_128, progress=False)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    again = prepare([str(inputs[1])], bert_vocab_file, out, SETTINGS_128, progress=False)
    assert again.already_complete
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before
    other = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    with pytest.raises(
        PrepareError,
        match=r"already holds data prepared from other inputs or settings \(max_seq_length=128 "
        r"there, 64 now\); choose another output_dir or pass overwrite=true",
    ):
        prepare([str(inputs[1])], bert_vocab_file, out, other, progress=False)
    # which input file differs, old vs new
    with pytest.raises(PrepareError, match=r"\(input_files names 2 files, the data there was made"):
        prepare([str(inputs[1]), str(inputs[0])], bert_vocab_file, out, SETTINGS_128)
    with pytest.raises(PrepareError, match=r"\(input file 1, .*wiki_like.txt, is not .*single_doc"):
        prepare([str(inputs[0])], bert_vocab_file, out, SETTINGS_128)
    changed = Path(str(inputs[1]) + ".copy")
    shutil.copyfile(inputs[1], changed)
    inputs[1].write_text(inputs[1].read_text() + "\nA new document.\n")
    with pytest.raises(
        PrepareError, match=r"\(input file 1, .*single_doc.txt, changed since there"
    ):
        prepare([str(inputs[1])], bert_vocab_file, out, SETTINGS_128)
    shutil.copyfile(changed, inputs[1])
    other_vocab = Path(str(changed) + ".vocab.txt")
    other_vocab.write_text(bert_vocab_file.read_text(encoding="utf-8") + "extra\n", "utf-8")
    with pytest.raises(
        PrepareError, match=r"\(vocab_file .*vocab.txt \(sha256 \w{12}\) is not the"
    ):
        prepare([str(inputs[1])], other_vocab, out, SETTINGS_128)
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before  # nothing lost
    prepare([str(inputs[1])], bert_vocab_file, out, other, overwrite=True, progress=False)
    assert json.loads((out / "metadata.json").read_text())["settings"]["max_seq_length"] == 64


def test_crash_resumes_finished_files_only(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    broken = tmp_path / "broken.txt"
    broken.write_bytes(b"fine line\n\xff\xfe not utf-8\n")
    with pytest.raises(PrepareError, match=r"broken.txt.*not valid UTF-8"):
        prepare([str(inputs[0]), str(broken)], bert_vocab_file, out, SETTINGS_128, progress=False)
    # the finished part survives, nothing looks complete
    assert not (out / "metadata.json").exists()
    assert (out / shards.PARTS_DIR / "part-00000" / shards.PART_FILE).is_file()
    # a half-written part from a killed worker is never taken for a finished one
    (out / shards.PARTS_DIR / "part-00001.tmp-999").mkdir()
    broken.write_text(
        "now it is fine.\nsecond sentence here.\n\nanother document.\n", encoding="utf-8"
    )
    summary = prepare(
        [str(inputs[0]), str(broken)], bert_vocab_file, out, SETTINGS_128, progress=False
    )
    assert summary.resumed_files == 1
    dataset = datasets.load_from_disk(str(out))
    expected = reference_rows("wiki-128")
    assert dataset.select(range(len(expected))).to_list() == expected


def test_bad_inputs_stop_before_any_work(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    with pytest.raises(PrepareError, match=r"missing.txt.*does not exist"):
        prepare([str(inputs[0]), str(tmp_path / "missing.txt")], bert_vocab_file, out, SETTINGS_128)
    with pytest.raises(PrepareError, match="matches no file"):
        prepare(str(tmp_path / "nothing-*.txt"), bert_vocab_file, out, SETTINGS_128)
    with pytest.raises(PrepareError, match="max_predictions_per_seq"):
        prepare([str(inputs[0])], bert_vocab_file, out, InstanceSettings(max_predictions_per_seq=5))
    bad_vocab = tmp_path / "vocab.txt"
    bad_vocab.write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab.txt.*lacks the special tokens"):
        prepare([str(inputs[0])], bad_vocab, out, SETTINGS_128)
    assert not out.exists()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.md").write_text("mine")
    with pytest.raises(PrepareError, match="not written by omnibert-prepare"):
        prepare([str(inputs[0])], bert_vocab_file, foreign, SETTINGS_128)
    assert (foreign / "notes.md").read_text() == "mine"


def test_cli_runs_and_reports_missing_keys(
    inputs: list[Path], bert_vocab_file: Path, tmp_path: Path
) -> None:
    exe = Path(sys.executable).with_name("omnibert-prepare")
    out = tmp_path / "cli-out"
    done = subprocess.run(
        [
            str(exe),
            f"input_files=[{inputs[1]}]",
            f"vocab_file={bert_vocab_file}",
            f"output_dir={out}",
            "max_seq_length=64",
            "max_predictions_per_seq=10",
            "dupe_factor=3",
            "progress=false",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "prepared" in done.stdout and "tokens/s" in done.stdout
    assert datasets.load_from_disk(str(out)).to_list() == reference_rows("single-doc-64")
    missing = subprocess.run(
        [str(exe), f"vocab_file={bert_vocab_file}", f"hydra.run.dir={tmp_path / 'hydra2'}"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert missing.returncode == 2
    assert (
        missing.stderr.strip()
        .splitlines()[-1]
        .startswith("omnibert-prepare: error: input_files, output_dir must be set")
    )


def test_app_trains_a_vocab_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], compose_config
) -> None:
    from omnibert.apps.prepare import run
    from omnibert.tokenization.vocab import Vocab

    vocab = tmp_path / "vocab.txt"
    cfg = compose_config(
        f"input_files=[{REFERENCE / 'wiki_like.txt'},{REFERENCE / 'tiny_docs.txt'}]",
        f"vocab_file={vocab}",
        f"output_dir={tmp_path / 'out'}",
        "train_vocab.enabled=true",
        "train_vocab.vocab_size=600",
        "dupe_factor=1",
        "progress=false",
        app="prepare",
    )
    run(cfg)
    trained = Vocab.from_file(vocab)
    assert 300 < trained.size <= 600
    dataset = datasets.load_from_disk(str(tmp_path / "out"))
    assert len(dataset) > 50
    assert max(max(ids) for ids in dataset["input_ids"]) < trained.size
    assert "prepared" in capsys.readouterr().out


def test_app_reads_wikiextractor_output(
    bert_vocab_file: Path, tmp_path: Path, compose_config
) -> None:
    from omnibert.apps.prepare import run
    from omnibert.prepare.wikipedia import document_sentences, iter_documents

    wiki = Path(__file__).parents[1] / "fixtures" / "wiki" / "extracted" / "AA" / "wiki_00"
    cfg = compose_config(
        f"input_files=[{wiki}]",
        "input_format=wikiextractor",
        f"vocab_file={bert_vocab_file}",
        f"output_dir={tmp_path / 'wiki'}",
        "max_seq_length=64",
        "max_predictions_per_seq=10",
        "dupe_factor=2",
        "progress=false",
        app="prepare",
    )
    run(cfg)
    # the same instances as the text route on the documents' sentences
    text = tmp_path / "wiki.txt"
    docs = [document_sentences(d) for d in iter_documents(wiki)]
    text.write_text("\n\n".join("\n".join(d) for d in docs if d) + "\n", encoding="utf-8")
    settings = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    prepare([str(text)], bert_vocab_file, tmp_path / "text", settings, progress=False)
    from_wiki = datasets.load_from_disk(str(tmp_path / "wiki")).to_list()
    assert from_wiki and from_wiki == datasets.load_from_disk(str(tmp_path / "text")).to_list()


@pytest.mark.parametrize("eval_samples", [None, 5])
def test_files_without_documents_are_skipped_and_counted(
    inputs: list[Path],
    bert_vocab_file: Path,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    eval_samples: int | None,
) -> None:
    # the reference (tests/fixtures: create_training_instances) makes no instance from them
    empty, nul = tmp_path / "empty.txt", tmp_path / "nul.txt"
    empty.write_bytes(b"")
    nul.write_bytes(b"\0\0\n\0\n\n")
    files = [str(empty), str(inputs[1]), str(nul)]
    out = tmp_path / "out"
    with caplog.at_level("WARNING", logger="omnibert.prepare"):
        summary = prepare(
            files, bert_vocab_file, out, SETTINGS_128, eval_samples=eval_samples, progress=False
        )
    warned = [r.getMessage() for r in caplog.records if r.name == "omnibert.prepare"]
    assert any("empty.txt" in m for m in warned) and any("nul.txt" in m for m in warned)
    assert [p.input_file for p in summary.skipped] == [str(empty), str(nul)]
    assert "2 skipped" in summary.render() and "skipped " + str(nul) in summary.render()
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["counts"]["skipped_files"] == 2 and meta["counts"]["files"] == 3
    assert [bool(i.get("skipped")) for i in meta["inputs"]] == [True, False, True]
    alone = tmp_path / "alone"
    prepare(
        [str(inputs[1])],
        bert_vocab_file,
        alone,
        SETTINGS_128,
        eval_samples=eval_samples,
        progress=False,
    )
    rows = datasets.load_from_disk(str(out)).to_list()
    assert rows and rows == datasets.load_from_disk(str(alone)).to_list()


def test_only_empty_files_are_refused(bert_vocab_file: Path, tmp_path: Path) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(PrepareError, match=r"no input file gives any instance \(.*empty.txt"):
        prepare([str(empty)], bert_vocab_file, tmp_path / "out", SETTINGS_128, progress=False)
    assert not (tmp_path / "out" / "metadata.json").exists()


def test_shortfalls_are_said_and_recorded(
    inputs: list[Path],
    bert_vocab_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    compose_config,
) -> None:
    from omnibert.apps.prepare import run
    from omnibert.tokenization.vocab import Vocab

    # an eval set asked for more rows than its text gives
    out = tmp_path / "eval"
    summary = prepare(
        [str(inputs[1])], bert_vocab_file, out, SETTINGS_128, eval_samples=1000, progress=False
    )
    rows = summary.instances
    assert 0 < rows < 1000
    note = f"eval_samples=1,000 asked, {rows:,} kept: the input files give only {rows:,} instances"
    assert f"note: {note}" in summary.render()
    meta = json.loads((out / "metadata.json").read_text())
    assert (
        meta["shortfalls"]
        == [
            {
                "key": "eval_samples",
                "requested": 1000,
                "produced": rows,
                "message": meta["shortfalls"][0]["message"],
            }
        ]
        and note in meta["shortfalls"][0]["message"]
    )
    # a trained vocab smaller than asked
    vocab = tmp_path / "vocab.txt"
    overrides = [f"input_files=[{REFERENCE / 'tiny_docs.txt'}]", f"vocab_file={vocab}"]
    overrides += [f"output_dir={tmp_path / 'data'}", "train_vocab.enabled=true"]
    run(
        compose_config(
            *overrides,
            "train_vocab.vocab_size=5000",
            "dupe_factor=1",
            "progress=false",
            app="prepare",
        )
    )
    size = Vocab.from_file(vocab).size
    assert size < 5000
    printed = capsys.readouterr().out
    assert (
        f"note: train_vocab.vocab_size=5,000 asked, {size:,} tokens trained: no further pair"
        in (printed)
    )
    meta = json.loads((tmp_path / "data" / "metadata.json").read_text())
    assert [(s["key"], s["requested"], s["produced"]) for s in meta["shortfalls"]] == [
        ("train_vocab.vocab_size", 5000, size)
    ]
    # nothing said when everything asked was produced
    full = prepare(
        [str(inputs[1])],
        bert_vocab_file,
        tmp_path / "full",
        SETTINGS_128,
        eval_samples=5,
        progress=False,
    )
    assert full.shortfalls == [] and "note:" not in full.render()
