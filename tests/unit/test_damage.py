"""Damaged data and damaged checkpoints are named as such, with the way out.

* Random bytes written at random offsets (seeded) of an Arrow shard, sizes unchanged: train
  and eval refuse the data before any compute with one sentence naming the file and the
  ``omnibert-prepare`` command that repairs it (``data.verify_checksums=auto``).
* A row whose ids are out of range (checksums off): the batch range check stops the run
  with the shard file, the row and the repair command, where the model used to die in
  ``torch.embedding`` with ``IndexError``.
* A truncated ``last.ckpt`` given to export, eval or a resume is called damaged and the
  intact ``step-*.ckpt`` beside it is named; fine-tuning names the key the user typed.
"""

from __future__ import annotations

import gc
import random
import shutil
from pathlib import Path

import pytest
from faults import damage_column, damage_random_bytes, truncate

from omnibert.apps.compose import compose
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.config.tools import EvalConfig
from omnibert.errors import UserError
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
SHAPE = ["phase.max_seq_length=64", "phase.max_predictions_per_seq=10"]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory, bert_vocab_file: Path) -> tuple[Path, Path]:
    """A train and an eval set from the reference texts (several Arrow files)."""
    tmp = tmp_path_factory.mktemp("data")
    inputs = []
    for name in ("single_doc.txt", "wiki_like.txt"):
        shutil.copyfile(REFERENCE / name, tmp / name)
        inputs.append(str(tmp / name))
    settings = InstanceSettings(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=2)
    for split, extra in (("train", {}), ("eval", {"eval_samples": 30})):
        prepare(
            inputs, bert_vocab_file, tmp / split, settings, max_shard_size=20_000,
            progress=False, **extra,
        )  # fmt: skip
    return tmp / "train", tmp / "eval"


@pytest.fixture
def data(prepared: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the prepared sets this test may damage (omnibert-prepare's metadata names
    its output directory: the repair command must name the copy)."""
    copies = []
    for source in prepared:
        copy = tmp_path / source.name
        shutil.copytree(source, copy)
        copies.append(copy)
    return copies[0], copies[1]


def _train_cfg(train: Path, tmp_path: Path, *extra: str):
    return compose(
        "pretrain",
        [
            "data=arrow", f"data.train_path={train}", "data.eval_path=null",
            "data.num_workers=0", "model=bert_tiny", *SHAPE, "phase.global_batch_size=8",
            "phase.max_steps=2", "micro_batch_size=4", "logger=none", "callbacks=minimal",
            "trainer.enable_progress_bar=false", f"paths.output_root={tmp_path / 'runs'}",
            *extra,
        ],
    )  # fmt: skip


def _one_error_line(capsys, app: str) -> str:
    gc.collect()  # a failed loader's workers shut down here, not at exit
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith(f"{app}: error: ")]
    assert len(lines) == 1 and lines[0] == stderr.strip().splitlines()[-1], stderr
    return lines[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_bytes_in_a_train_shard_are_refused_before_compute(
    data: tuple[Path, Path], tmp_path: Path, capsys, seed: int
) -> None:
    from omnibert.apps.train import run_or_exit

    train = data[0]
    shard = random.Random(seed).choice(sorted(train.glob("*.arrow")))
    before = shard.stat().st_size
    damage_random_bytes(shard, seed)
    assert shard.stat().st_size == before  # the start-up size check alone cannot see it
    with pytest.raises(SystemExit) as exited:
        run_or_exit(_train_cfg(train, tmp_path), tmp_path / "run")
    assert exited.value.code == 2
    line = _one_error_line(capsys, "omnibert-train")
    assert f"data.train_path={train}: {shard.name} " in line
    assert "so the data is damaged; repair it with: omnibert-prepare " in line
    assert f"output_dir={train}" in line
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.ckpt"))


@pytest.mark.parametrize("seed", [4, 5])
def test_random_bytes_in_an_eval_shard_are_refused_before_compute(
    data: tuple[Path, Path], tmp_path: Path, capsys, bert_vocab_file: Path, seed: int
) -> None:
    from omnibert.apps.eval import run_or_exit
    from omnibert.convert import export_hf
    from omnibert.models import BertConfig, BertForPreTraining

    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    export_hf(BertForPreTraining(config), tmp_path / "hf", bert_vocab_file)
    evaluation = data[1]
    shard = next(evaluation.glob("*.arrow"))
    damage_random_bytes(shard, seed)
    cfg = compose("eval", [f"ckpt={tmp_path / 'hf'}", f"data.eval_path={evaluation}"])
    with pytest.raises(SystemExit) as exited:
        run_or_exit(cfg, tmp_path / "run")
    assert exited.value.code == 2
    line = _one_error_line(capsys, "omnibert-eval")
    assert f"data.eval_path={evaluation}: {shard.name} " in line
    assert "repair it with: omnibert-prepare " in line
    assert not (tmp_path / "run" / "eval.json").exists()


@pytest.mark.parametrize(
    ("column", "value", "what"),
    [
        ("input_ids", 60000, "input_ids value 60000, outside 0..30521"),
        ("segment_ids", 7, "segment_ids value 7, outside 0..1"),
        ("masked_lm_ids", 31000, "masked_lm_ids value 31000, outside 0..30521"),
    ],
)
def test_an_out_of_range_id_names_the_shard_row_and_repair(
    data: tuple[Path, Path], tmp_path: Path, capsys, column: str, value: int, what: str
) -> None:
    """Checksums off: the batch range check stops the run before the model sees the row (it
    used to die in torch.embedding with IndexError, or train on the wrong embedding row)."""
    from omnibert.apps.train import run_or_exit

    train = data[0]
    for shard in train.glob("*.arrow"):
        damage_column(shard, column, value)
    cfg = _train_cfg(train, tmp_path, "data.verify_checksums=false")
    with pytest.raises(SystemExit) as exited:
        run_or_exit(cfg, tmp_path / "run")
    assert exited.value.code == 2
    line = _one_error_line(capsys, "omnibert-train")
    assert what in line
    assert "of the dataset (row " in line and f" of {train}/data-000" in line
    assert "the data is corrupt, repair it with: omnibert-prepare " in line
    assert line.endswith("max_shard_size=20000")  # the command ends the line: copyable


# ------------------------------------------------------------------ damaged checkpoints


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The checkpoint directory of a finished smoke run: step-2, -4, -6 and last.ckpt."""
    from omnibert.apps.train import run_or_exit

    root = tmp_path_factory.mktemp("trained")
    run_or_exit(compose("pretrain", ["experiment=smoke", f"paths.output_root={root}"]), None)
    folder = root / "smoke" / "checkpoints"
    assert (folder / "step-00000006.ckpt").is_file() and (folder / "last.ckpt").is_file()
    return folder


@pytest.fixture
def damaged_last(trained: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "smoke" / "checkpoints"
    shutil.copytree(trained, folder)
    truncate(folder / "last.ckpt", keep=0.6)  # an interrupted copy
    return folder


def _damaged_message(message: str, key: str, folder: Path) -> None:
    assert f"{key}={folder / 'last.ckpt'} is damaged: a torch checkpoint of " in message
    assert "cut short or overwritten" in message
    assert "written by omnibert-train" not in message  # what it used to say
    assert "\n" not in message and "If you are seeing" not in message  # torch's advice cut
    assert message.endswith(
        f"the checkpoint step-00000006.ckpt beside it is intact: pass "
        f"{key}={folder / 'step-00000006.ckpt'}"
    ), message


def test_export_of_a_damaged_last_ckpt_names_the_intact_one(
    damaged_last: Path, tmp_path: Path
) -> None:
    from omnibert.apps.export import run

    with pytest.raises(UserError) as refused:
        run(compose("export", [f"ckpt={damaged_last / 'last.ckpt'}", f"out={tmp_path / 'hf'}"]))
    _damaged_message(str(refused.value), "ckpt", damaged_last)
    from omnibert.checkpoints.reading import model_from_pretraining_checkpoint

    model_from_pretraining_checkpoint(damaged_last / "step-00000006.ckpt")  # the one named loads


def test_eval_of_a_damaged_last_ckpt_names_the_intact_one(damaged_last: Path) -> None:
    from omnibert.run.tools.evaluation import evaluate_pretrained

    cfg = compose("eval", [f"ckpt={damaged_last / 'last.ckpt'}", "data.eval_path=unused"])
    with pytest.raises(UserError) as refused:
        evaluate_pretrained(EvalConfig.of(cfg, TrainConfigError))
    _damaged_message(str(refused.value), "ckpt", damaged_last)


def test_resume_from_a_damaged_last_ckpt_names_the_intact_one(damaged_last: Path) -> None:
    from omnibert.run.pretraining.job import prepare as prepare_run

    root = damaged_last.parent.parent
    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={root}", "ckpt_path=last"])
    with pytest.raises(UserError) as refused:
        prepare_run(TrainConfig.of(cfg))
    _damaged_message(str(refused.value), "ckpt_path", damaged_last)


def test_a_file_that_is_no_checkpoint_is_not_called_damaged(tmp_path: Path) -> None:
    from omnibert.checkpoints.files import unreadable_checkpoint

    path = tmp_path / "notes.ckpt"
    path.write_text("not a checkpoint\n")
    try:
        import torch

        torch.load(path, weights_only=True)
    except Exception as err:
        message = unreadable_checkpoint("ckpt", path, err)
    assert message.startswith(f"ckpt={path} is not a torch checkpoint (")
    assert message.endswith("no checkpoint beside it can be read, so pass another one as ckpt")


def test_finetune_names_the_key_the_user_typed(tmp_path: Path) -> None:
    from finetune_data import mrpc_file

    from omnibert.apps.finetune import run

    train = mrpc_file(tmp_path / "train.tsv", 8, seed=1)
    cfg = compose(
        "finetune",
        ["task=mrpc", f"data.train_file={train}", "model.init_from=nope_dir",
         f"paths.output_root={tmp_path / 'ft'}", "logger=none"],
    )  # fmt: skip
    with pytest.raises(UserError) as refused:
        run(cfg)
    message = str(refused.value)
    assert message.startswith("model.init_from=nope_dir does not exist; "), message
    assert "ckpt=" not in message
