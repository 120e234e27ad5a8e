"""The report a finished run ends with: curves.png next to summary.json, drawn from the CSV
logger's metrics.csv (omnibert-train and omnibert-finetune, tiny runs through the apps)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from finetune_data import mrpc_file

from omnibert import reporting
from omnibert.apps import finetune
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.convert import export_hf
from omnibert.models import BertConfig, BertForPreTraining

SMOKE = ("experiment=smoke", "callbacks=default", "trainer.enable_progress_bar=false")
PNG = b"\x89PNG\r\n\x1a\n"


def _image(path: Path):
    from matplotlib.image import imread

    assert path.read_bytes()[:8] == PNG
    return imread(path)


def test_train_writes_loss_accuracy_and_lr_curves_next_to_the_summary(tmp_path, capsys):
    out = tmp_path / "out"
    cfg = compose("pretrain", [*SMOKE, f"paths.output_root={tmp_path}", "logger=csv",
                               "trainer.log_every_n_steps=1"])  # fmt: skip
    summary = run_or_exit(cfg, out)
    curves = out / reporting.CURVES_FILE
    assert summary["curves"] == str(curves)
    assert json.loads((out / "summary.json").read_text())["curves"] == str(curves)
    assert f"curves        {curves}" in capsys.readouterr().out
    image = _image(curves)
    assert image.shape[1] > 2 * image.shape[0]  # three panels side by side
    assert image[..., :3].std() > 0.05  # something was drawn
    # what was drawn: every optimiser step's training loss, the validations, the LR
    metrics = reporting.read_metrics(
        tmp_path / "smoke" / "logs" / "csv" / "version_0" / "metrics.csv"
    )
    assert metrics["train/loss"][0] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert metrics["val/mlm_acc"][0][-1] == 5.0 and len(metrics["val/mlm_acc"][0]) >= 2
    panels = dict(reporting._panels(metrics))
    assert "train/loss" in panels["loss"] and "val/loss" in panels["loss"]
    assert {"val/mlm_acc", "val/mlm_majority_baseline"} <= set(panels["accuracy"])
    assert panels["learning rate"] == ["train/lr"]


def test_no_csv_logger_no_curves(tmp_path):
    from lightning.pytorch.loggers import TensorBoardLogger

    loggers = [TensorBoardLogger(tmp_path)]
    assert reporting.write_curves(loggers, tmp_path, "t") is None
    assert not (tmp_path / reporting.CURVES_FILE).exists()


def test_finetune_writes_its_loss_curve_and_final_metrics(tmp_path, bert_vocab_file):
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1,
                                          num_attention_heads=2, intermediate_size=64,
                                          max_position_embeddings=64))  # fmt: skip
    export_hf(model, tmp_path / "hf", bert_vocab_file)
    train = mrpc_file(tmp_path / "train.tsv", 16, seed=1)
    dev = mrpc_file(tmp_path / "dev.tsv", 8, seed=2)
    cfg = compose("finetune", ["task=mrpc", f"data.train_file={train}", f"data.eval_file={dev}",
                               f"model.init_from={tmp_path / 'hf'}", f"paths.output_root={tmp_path}",
                               "task.epochs=1", "task.batch_size=4", "task.max_seq_length=32",
                               "logger=csv", "trainer.log_every_n_steps=1",
                               "trainer.enable_progress_bar=false"])  # fmt: skip
    summary = finetune.run(cfg)
    curves = Path(summary["run_dir"]) / reporting.CURVES_FILE
    assert summary["curves"] == str(curves)
    _image(curves)
    (metrics_csv,) = Path(summary["run_dir"]).rglob("metrics.csv")
    assert len(reporting.read_metrics(metrics_csv)["train/loss"][0]) == summary["steps"] == 4


def test_read_metrics_skips_rows_without_the_column(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train/loss,val/acc\n0,0,2.5,\n0,1,2.0,\n0,1,,0.4\n0,2,nan,\n")
    assert reporting.read_metrics(path) == {
        "train/loss": ([0.0, 1.0], [2.5, 2.0]),
        "val/acc": ([1.0], [0.4]),
    }
    fig = reporting.plot(reporting.read_metrics(path), "t", final={"f1": 0.5})
    assert [ax.get_title() for ax in fig.axes] == ["loss", "accuracy"]
