"""What a refused run leaves on disk: nothing it wrote itself (issue 23, point 8), and never a
change to a directory omnibert did not write, ``overwrite=true`` or not (point 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import PrepareError, prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
SMALL = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("overwrite", [False, True])
def test_overwrite_never_replaces_files_omnibert_did_not_write(
    overwrite: bool, tmp_path: Path, bert_vocab_file: Path
) -> None:
    text = [str(REFERENCE / "tiny_docs.txt")]
    # the user's own Arrow file under the name omnibert-prepare gives its first shard
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "data-00000-00000.arrow").write_bytes(b"the user's own data")
    # a Hugging Face save_to_disk directory: the names of datasets' files, none of our records
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("data-00000-of-00001.arrow", "state.json", "dataset_info.json"):
        (hf / name).write_text(f"{name} of another tool")
    for directory in (mine, hf):
        before = _tree(directory)
        with pytest.raises(PrepareError, match=r"not written by omnibert-prepare.*overwrite=true"):
            prepare(text, bert_vocab_file, directory, SMALL, overwrite=overwrite, progress=False)
        assert _tree(directory) == before


def test_overwrite_removes_only_what_the_metadata_lists(
    tmp_path: Path, bert_vocab_file: Path
) -> None:
    out = tmp_path / "out"
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, SMALL, progress=False)
    listed = {r["filename"] for r in json.loads((out / "metadata.json").read_text())["files"]}
    assert listed == {"data-00000-00000.arrow"}
    # a file of the user's beside ours: other settings with overwrite=true are refused
    (out / "notes.md").write_text("mine")
    other = InstanceSettings(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=1)
    before = _tree(out)
    with pytest.raises(PrepareError, match=r"holds 'notes.md', not written by omnibert-prepare"):
        prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, other, overwrite=True)
    assert _tree(out) == before
    # ... while the same data is still recognised and left as it is
    again = prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, SMALL)
    assert again.already_complete and _tree(out) == before
    (out / "notes.md").unlink()
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, other, overwrite=True,
            progress=False)  # fmt: skip
    assert json.loads((out / "metadata.json").read_text())["settings"]["max_seq_length"] == 48


def _console(app: str, argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    exe = Path(sys.executable).with_name(app)
    return subprocess.run([str(exe), *argv], capture_output=True, text=True, check=False, cwd=cwd)


def test_a_refused_prepare_leaves_no_directory(tmp_path: Path, bert_vocab_file: Path) -> None:
    """Refused after its worker read the (empty) input: no output_dir, no ``.parts/``, no
    Hydra ``outputs/prepare/<time>/``."""
    (tmp_path / "empty.txt").write_text("")
    done = _console(
        "omnibert-prepare",
        ["input_files=[empty.txt]", f"vocab_file={bert_vocab_file}", "output_dir=data/train",
         "progress=false"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .startswith("omnibert-prepare: error: no input file gives any instance")
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.txt"]


def test_a_refused_fine_tune_leaves_no_run_directory(tmp_path: Path) -> None:
    """Refused by the app (Hydra had already made ``<run>/hydra/<time>/``): nothing stays."""
    (tmp_path / "init").mkdir()
    done = _console(
        "omnibert-finetune",
        ["task=mrpc", "data.train_file=missing.tsv", "model.init_from=init",
         "paths.output_root=runs"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("omnibert-finetune: error: data.train_file=missing.tsv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["init"]
