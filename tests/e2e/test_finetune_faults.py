"""omnibert-finetune and the tools guarded as pretraining is (docs/faults.md): fine-tuning's plan
counts its checkpoints against the free space (a checkpoint of the task, head included, within
10 % of the real file; refused before compute when not one fits)."""

from __future__ import annotations

from pathlib import Path

import pytest
from finetune_data import mrpc_file

from omnibert.apps.compose import compose
from omnibert.errors import UserError

FAST = ["task.epochs=1", "task.batch_size=8", "task.max_seq_length=32", "logger=none",
        "trainer.enable_progress_bar=false"]  # fmt: skip


@pytest.fixture(scope="module")
def mrpc_train(tmp_path_factory) -> Path:
    return mrpc_file(tmp_path_factory.mktemp("mrpc") / "train.tsv", 16, seed=1)


def _finetune(tmp_path: Path, tiny_hf: Path, train: Path, *extra: str):
    return compose("finetune", [
        "task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
        f"paths.output_root={tmp_path / 'runs'}", *FAST, *extra,
    ])  # fmt: skip


def test_the_plan_counts_a_checkpoint_within_ten_percent(tmp_path, tiny_hf, mrpc_train, capsys):
    from omnibert.apps import finetune

    summary = finetune.run(_finetune(tmp_path, tiny_hf, mrpc_train))
    space = summary["plan"]["checkpoint_space"]
    line = next(
        line for line in capsys.readouterr().out.splitlines()
        if line.startswith("omnibert-finetune: checkpoint space: about ")
    )  # fmt: skip
    assert space["description"] in line
    real = Path(summary["checkpoint"]).stat().st_size
    assert abs(space["bytes_each"] / real - 1) < 0.10, (space["bytes_each"], real)


def test_the_plan_refuses_a_disk_without_room_for_one_checkpoint(
    tmp_path, tiny_hf, mrpc_train, monkeypatch
):
    from omnibert.checkpoints import space
    from omnibert.config import FinetuneConfig
    from omnibert.finetune.tokenizer import FineTuneInputError
    from omnibert.run.finetuning.job import prepare

    cfg = FinetuneConfig.of(_finetune(tmp_path, tiny_hf, mrpc_train), FineTuneInputError)
    monkeypatch.setattr(space, "free_bytes", lambda path: 1000)
    with pytest.raises(UserError, match=r"paths\.checkpoint_dir=.* has 1000 bytes free on its file "
                       r"system, less than one checkpoint of this run \(about .*\); free space "
                       "there or set paths.checkpoint_dir to a file system with room."):  # fmt: skip
        prepare(cfg)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("*.ckpt"))
