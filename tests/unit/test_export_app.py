"""omnibert-export's checks: a checkpoint directory instead of a file, the vocab a checkpoint
was trained with (absolute path and sha256, so exports work from anywhere and notice a
changed file), and the exported files' permissions."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from test_hf_interop import lightning_checkpoint, random_model, write_vocab
from test_task import LAMB, MODEL

from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.checkpoints.reading import load_pretraining_checkpoint
from omnibert.convert.hf import ConversionError
from omnibert.tasks.pretraining import PretrainingTask
from omnibert.tokenization.vocab import sha256_file


def test_the_task_records_its_vocab_absolutely_with_its_sha256(tmp_path: Path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_vocab(tmp_path / "vocab.txt", 99)
    task = PretrainingTask(MODEL, LAMB, vocab_file="vocab.txt")
    assert task.hparams["vocab_file"] == str(tmp_path / "vocab.txt")
    assert task.hparams["vocab_sha256"] == sha256_file(tmp_path / "vocab.txt")


def _checkpoint(tmp_path: Path) -> tuple[Path, Path]:
    vocab = write_vocab(tmp_path / "vocab.txt", 99)
    ckpt = lightning_checkpoint(tmp_path / "last.ckpt", random_model(), vocab)
    import torch

    saved = torch.load(ckpt, weights_only=True)
    saved["hyper_parameters"]["vocab_sha256"] = sha256_file(vocab)
    torch.save(saved, ckpt)
    return ckpt, vocab


def test_export_checks_the_vocab_it_was_trained_with(tmp_path: Path, monkeypatch, capsys):
    ckpt, vocab = _checkpoint(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the recorded path is absolute
    export_app.run(compose("export", [f"ckpt={ckpt}", f"out={tmp_path / 'a'}"]))
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == vocab.read_bytes()
    original = vocab.read_text()
    vocab.write_text(original.replace("[tok7]", "[renamed]"))  # same size, other tokens
    with pytest.raises(ConversionError, match=r"vocab file .*vocab.txt changed since checkpoint"):
        export_app.run(compose("export", [f"ckpt={ckpt}", f"out={tmp_path / 'b'}"]))
    assert not (tmp_path / "b").exists()
    other = tmp_path / "other.txt"
    other.write_text(vocab.read_text())
    capsys.readouterr()
    cfg = compose("export", [f"ckpt={ckpt}", f"out={tmp_path / 'c'}", f"vocab_file={other}"])
    export_app.run(cfg)  # an explicit vocab_file is exported, with a note
    assert "is not the vocab checkpoint" in capsys.readouterr().err
    assert (tmp_path / "c" / "vocab.txt").read_text() == other.read_text()


def test_a_checkpoint_directory_names_the_files_to_pass(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    with pytest.raises(ConversionError, match=r"is a directory and holds no \.ckpt file"):
        load_pretraining_checkpoint(run)
    for name in ("step-2.ckpt", "last.ckpt"):
        (run / "checkpoints" / name).write_bytes(b"")
    with pytest.raises(ConversionError) as refused:
        load_pretraining_checkpoint(run / "checkpoints")
    checkpoints = run / "checkpoints"
    assert str(refused.value) == (
        f"ckpt={checkpoints} is a directory; pass one checkpoint file in it, e.g. "
        f"ckpt={checkpoints / 'last.ckpt'} (it holds last.ckpt, step-2.ckpt)."
    )
    with pytest.raises(ConversionError, match=r"e\.g\. ckpt=.*checkpoints/last\.ckpt \(it holds "):
        load_pretraining_checkpoint(run)  # a run directory: its checkpoints/


@pytest.mark.parametrize("umask", [0o022, 0o027], ids=["umask022", "umask027"])
def test_exported_files_all_follow_the_umask(tmp_path: Path, umask: int) -> None:
    ckpt, _ = _checkpoint(tmp_path)
    previous = os.umask(umask)
    try:
        export_app.run(compose("export", [f"ckpt={ckpt}", f"out={tmp_path / 'hf'}"]))
    finally:
        os.umask(previous)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "hf").iterdir()}
    written = ["model.safetensors", "config.json", "vocab.txt", "README.md"]  # + the model card
    assert modes == dict.fromkeys(written, 0o666 & ~umask)
