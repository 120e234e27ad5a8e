"""Every GLUE task fine-tunes through omnibert-finetune from a pretrained checkpoint (a tiny
random BERT exported the Hugging Face way; learning is shown with MiniLM in test_finetune.py)
on fixture data in the Hub's layout, loaded through the same ``datasets.load_dataset`` call
as ``nyu-mll/glue``: summary.json holds the task's official metrics, equal to the GLUE
definitions recomputed here from the predictions it wrote, and the GLUE server's files
(``CoLA.tsv`` ... ``MNLI-m.tsv``, ``MNLI-mm.tsv``, ``AX.tsv`` from the MNLI model) with the
server's label names. A fine-tuned checkpoint continues only into a task with its head; the
GLUE sweep ends with its table."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from glue_data import LABELS, hub_glue_dir

from omnibert.apps import finetune
from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig
from omnibert.finetune.tokenizer import FineTuneInputError

FAST = ["task.epochs=1", "task.batch_size=8", "task.max_seq_length=32", "task.lr=1e-3",
        "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false"]  # fmt: skip
TASKS = ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli"]
METRICS = {
    "cola": ["matthews_correlation"], "sst2": ["accuracy"], "mrpc": ["accuracy", "f1"],
    "qqp": ["accuracy", "f1"], "stsb": ["pearson", "spearmanr"],
    "mnli": ["accuracy_matched", "accuracy_mismatched"], "qnli": ["accuracy"],
    "rte": ["accuracy"], "wnli": ["accuracy"],
}  # fmt: skip
SUBMISSIONS = {
    "cola": ["CoLA"], "sst2": ["SST-2"], "mrpc": ["MRPC"], "qqp": ["QQP"], "stsb": ["STS-B"],
    "mnli": ["MNLI-m", "MNLI-mm", "AX"], "qnli": ["QNLI"], "rte": ["RTE"], "wnli": ["WNLI"],
}  # fmt: skip
#: how the GLUE server wants labels written: names for these, class ids for the others
BY_NAME = {"mnli", "qnli", "rte"}


@pytest.fixture(scope="module")
def hub(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("glue")
    return hub_glue_dir(root, [*TASKS, "ax"], train=16, evaluation=10, test=4)


def _glue_metric(name: str, predictions: list, labels: list) -> float:
    """The GLUE definitions, written here independently of omnibert.finetune.glue_metrics."""
    p, y = np.asarray(predictions, dtype=float), np.asarray(labels, dtype=float)
    if name == "accuracy":
        return float(np.mean(p == y))
    tp, fp = np.sum((p == 1) & (y == 1)), np.sum((p == 1) & (y == 0))
    fn, tn = np.sum((p == 0) & (y == 1)), np.sum((p == 0) & (y == 0))
    if name == "f1":
        return float(2 * tp / (2 * tp + fp + fn)) if tp else 0.0
    if name == "matthews_correlation":
        denominator = math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))
        return float((tp * tn - fp * fn) / denominator) if denominator else 0.0
    if name == "spearmanr":  # Pearson of the ranks (no ties in continuous outputs)
        p, y = np.argsort(np.argsort(p)), _average_ranks(y)
    return float(np.corrcoef(p, y)[0, 1])


def _average_ranks(values: np.ndarray) -> np.ndarray:
    ranks = np.empty(len(values))
    for value in np.unique(values):
        where = values == value
        order = np.argsort(np.argsort(values))
        ranks[where] = order[where].mean()
    return ranks


def _read_tsv(path: Path, task: str) -> tuple[list[int], list]:
    lines = path.read_text().splitlines()
    assert lines[0] == "index\tprediction"
    rows = [line.split("\t") for line in lines[1:]]
    names = LABELS["ax" if task == "AX" else task]
    if names is None:
        return [int(r[0]) for r in rows], [float(r[1]) for r in rows]
    if task in BY_NAME or task == "AX":
        assert {r[1] for r in rows} <= set(names)
        return [int(r[0]) for r in rows], [names.index(r[1]) for r in rows]
    assert {r[1] for r in rows} <= {str(i) for i in range(len(names))}
    return [int(r[0]) for r in rows], [int(r[1]) for r in rows]


def _run(task: str, hub: Path, init_from: Path, tmp_path: Path, *extra: str) -> dict:
    return finetune.run(compose("finetune", [
        f"task={task}", f"data.dataset={hub}", f"data.cache_dir={tmp_path / 'cache'}",
        f"model.init_from={init_from}", f"paths.output_root={tmp_path / 'runs'}", *FAST, *extra,
    ]))  # fmt: skip


def _check_written(run_dir: Path, task: str, metrics: dict, hub: Path, cache: Path) -> None:
    """The eval files hold one prediction per dev example whose GLUE metrics are
    ``metrics``; the submission files are the server's, with the test split's index."""
    import datasets

    evals = {"matched": "validation_matched", "mismatched": "validation_mismatched"}
    for name, split in (evals if task == "mnli" else {"validation": "validation"}).items():
        gold = datasets.load_dataset(str(hub), task, split=split, cache_dir=cache)
        index, predicted = _read_tsv(run_dir / "eval" / f"{name}.tsv", task)
        assert index == list(gold["idx"])
        for metric in METRICS[task]:
            base = metric.removesuffix(f"_{name}")
            if base == metric and task == "mnli":
                continue
            expected = _glue_metric(base, predicted, list(gold["label"]))
            assert metrics[metric] == pytest.approx(expected, abs=1e-6), metric
    written = sorted(p.stem for p in (run_dir / "submission").iterdir())
    assert written == sorted(SUBMISSIONS[task])
    for name in SUBMISSIONS[task]:
        index, _ = _read_tsv(run_dir / "submission" / f"{name}.tsv", "AX" if name == "AX" else task)
        assert index == [0, 1, 2, 3]  # the test split's idx, in order


@pytest.mark.parametrize("task", TASKS)
def test_every_glue_task_config_scores_and_writes_the_server_files(task, hub, tmp_path,
                                                                   bert_vocab_file):  # fmt: skip
    """Each task's config, data, features, predictions, metrics and files through the run's
    own evaluate step, on random head outputs (training is the shared path tested below)."""
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning.inputs import check_inputs
    from omnibert.run.finetuning.outputs import evaluate_finetuned

    inputs = check_inputs(FinetuneConfig.of(compose("finetune", [
        f"task={task}", f"data.dataset={hub}", f"data.cache_dir={tmp_path / 'cache'}",
        "model.init_from=unused", f"paths.output_root={tmp_path / 'runs'}",
        "data.predict_test=true", *FAST,
    ]), FineTuneInputError))  # fmt: skip
    labels = inputs.recipe.num_labels
    assert labels == (1 if LABELS[task] is None else len(LABELS[task]))
    tokenizer = build_tokenizer(bert_vocab_file)
    generator = torch.Generator().manual_seed(0)

    class RandomHead(torch.nn.Module):  # stands in for a fine-tuned model's logits
        def forward(self, batch):
            width = batch["input_ids"].shape[1]  # cut to the longest row (data.padding)
            assert width <= 32 and width % 8 == 0  # task.max_seq_length, pad_to_multiple_of
            return torch.randn(batch["input_ids"].shape[0], labels, generator=generator)

    head = RandomHead()
    head.register_parameter("p", torch.nn.Parameter(torch.zeros(1)))
    run_dir = tmp_path / "run"
    result = evaluate_finetuned(inputs, tokenizer, head, None, run_dir)
    assert list(result["metrics"]) == METRICS[task]
    _check_written(run_dir, task, result["metrics"], hub, tmp_path / "c2")


@pytest.fixture(scope="module")
def mnli_run(hub, tiny_hf, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mnli")
    return _run("mnli", hub, tiny_hf, tmp, "data.predict_test=true"), tmp


@pytest.mark.parametrize("task", ["mnli", "stsb"])
def test_fine_tuning_reports_the_official_metrics(task, mnli_run, hub, tiny_hf, tmp_path):
    """Classification with two dev sets and AX (MNLI) and regression (STS-B) end to end."""
    summary, tmp = mnli_run if task == "mnli" else (
        _run("stsb", hub, tiny_hf, tmp_path, "data.predict_test=true"), tmp_path
    )  # fmt: skip
    run_dir = Path(summary["run_dir"])
    assert summary["benchmark"] == "glue" and summary["steps"] == 2  # 16 examples / batch 8
    assert list(summary["metrics"]) == METRICS[task]
    assert summary["new_keys"] == ["classifier.weight", "classifier.bias"]
    _check_written(run_dir, task, summary["metrics"], hub, tmp / "c2")
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk["metrics"] == summary["metrics"]
    state = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=True)["state_dict"]
    assert state["model.classifier.weight"].shape[0] == len(LABELS[task] or [0])


def test_a_fine_tuned_checkpoint_continues_only_into_a_task_with_its_head(
    mnli_run, hub, tiny_hf, tmp_path
):
    mnli = Path(mnli_run[0]["run_dir"])
    again = _run("mnli", hub, mnli, tmp_path)  # 3 labels -> 3 labels: encoder and head
    assert again["new_keys"] == []
    final = Path(again["run_dir"]) / "checkpoints" / "final.ckpt"
    written = final.stat().st_mtime_ns
    with pytest.raises(FineTuneInputError, match=r"already holds final\.ckpt, a finished"):
        _run("mnli", hub, tiny_hf, tmp_path)  # the same run directory: nothing overwritten
    assert final.stat().st_mtime_ns == written
    with pytest.raises(FineTuneInputError) as caught:  # a regression task, a classifier
        _run("stsb", hub, mnli, tmp_path / "stsb")
    assert str(caught.value) == (
        f"model.init_from={mnli} is a fine-tuned mnli model with a classification "
        "(3 labels) head, but task=stsb needs a regression (1 output) head; start from a "
        f"pretrained checkpoint (the one that run started from: {tiny_hf})."
    )
    assert not (tmp_path / "stsb" / "runs").exists()  # refused before anything was written


def test_the_glue_sweep_ends_with_one_table(hub, tiny_hf, tmp_path):
    sweep = tmp_path / "sweep"
    script = Path(sys.executable).parent / "omnibert-finetune"
    out = subprocess.run(
        [str(script), "-m", "experiment=glue", "task=rte,stsb", "seed=1,2",
         f"data.dataset={hub}", f"data.cache_dir={tmp_path / 'cache'}",
         f"model.init_from={tiny_hf}", f"hydra.sweep.dir={sweep}", *FAST],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(p.read_text()) for p in sorted(sweep.glob("*/summary.json"))]
    assert sorted((s["task"], s["seed"]) for s in summaries) == [
        ("rte", 1),
        ("rte", 2),
        ("stsb", 1),
        ("stsb", 2),
    ]
    report = json.loads((sweep / "glue_report.json").read_text())
    assert list(report["tasks"]) == ["stsb", "rte"]  # GLUE's order
    for task, entry in report["tasks"].items():
        assert entry["seeds"] == [1, 2]
        for metric, stats in entry["metrics"].items():
            values = sorted(s["metrics"][metric] for s in summaries if s["task"] == task)
            assert stats["median"] == pytest.approx(sum(values) / 2)
    scores = [entry["score"] for entry in report["tasks"].values()]
    assert report["average"] == pytest.approx(sum(scores) / 2)
    table = (sweep / "glue_report.md").read_text()
    assert "| STS-B | pearson / spearmanr |" in table and "| RTE | accuracy |" in table
    assert "**GLUE average** (2 tasks)" in table and table in out.stdout
