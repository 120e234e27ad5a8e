"""MLPerf mode: the evaluation cadence formula, BERT's hyper-parameters under MLPerf's names,
experiment=mlperf_smoke reaching its target with a log the official compliance checker
passes, and the checker failing a closed-division run that stops short of 0.720."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.callbacks.mlperf import eval_interval_samples, mlperf_hyperparameters
from omnibert.config import TrainConfig
from omnibert.prepare.corpus import build_embedded_corpus
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare
from omnibert.prepare.vocab_training import train_wordpiece_vocab

#: keys MLPerf Training 5.0.0's closed BERT rules require exactly once
BERT_KEYS = (
    "global_batch_size", "opt_base_learning_rate", "opt_lamb_epsilon",
    "opt_learning_rate_training_steps", "opt_learning_rate_warmup_steps", "num_warmup_steps",
    "start_warmup_step", "opt_lamb_beta_1", "opt_lamb_beta_2", "opt_lamb_weight_decay_rate",
    "gradient_accumulation_steps",
)  # fmt: skip


@pytest.mark.parametrize(
    ("batch", "samples"), [(256, 150_000), (3072, 175_000), (8192, 225_000), (448, 150_000)]
)
def test_the_eval_cadence_is_mlperfs_formula(batch, samples):
    assert eval_interval_samples(batch) == samples


def test_phase_mlperf_is_the_reference_point_under_mlperfs_names(tmp_path):
    cfg = compose("pretrain", ["phase=mlperf", "data.train_path=x", "data.eval_path=y",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    c = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(c, dict)
    names = mlperf_hyperparameters(TrainConfig.of(cfg), accumulation=1)
    assert names == {
        "global_batch_size": 256, "gradient_accumulation_steps": 1,
        "opt_base_learning_rate": 3.5e-4, "opt_lamb_epsilon": 1e-6, "opt_epsilon": 1e-6,
        "opt_learning_rate_training_steps": 13700, "opt_learning_rate_warmup_steps": 0,
        "num_warmup_steps": 0, "start_warmup_step": 0, "opt_lamb_beta_1": 0.9,
        "opt_lamb_beta_2": 0.999, "opt_lamb_weight_decay_rate": 0.01,
        "max_predictions_per_seq": 76, "seed": 12345,
    }  # fmt: skip
    # MLPerf's TF LAMB: clipping per micro-batch, not in the optimiser; linear decay
    assert c["optimizer"]["max_grad_norm"] is None and c["schedule"]["power"] == 1.0
    assert (c["phase"]["max_seq_length"], c["mlperf"]["target_accuracy"]) == (512, 0.72)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The embedded corpus as `make demo` prepares it (a smaller dupe factor), in this process:
    the corpus, the vocab and the shards are the same files whatever the worker count, and
    worker processes would each start an interpreter for seconds of work."""
    root = tmp_path_factory.mktemp("mlperf")
    text = build_embedded_corpus(root / "corpus", num_train_files=2, progress=False, processes=1)
    vocab = root / "vocab.txt"
    train_wordpiece_vocab(list(text.train_files), vocab, 8192, True, processes=1)
    settings = InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    prepare(list(map(str, text.train_files)), vocab, root / "train", settings, progress=False)
    prepare([str(text.eval_file)], vocab, root / "eval", settings, eval_samples=1000,
            progress=False)  # fmt: skip
    return {"train": root / "train", "eval": root / "eval", "vocab": vocab}


def _smoke(corpus: dict[str, Path], root: Path, *overrides: str) -> dict:
    data = [f"data.{k}_path={corpus[k]}" for k in ("train", "eval")]
    cfg = compose("pretrain", ["experiment=mlperf_smoke", f"paths.output_root={root}", *data,
                               f"data.vocab_file={corpus['vocab']}", "data.num_workers=0",
                               "callbacks=minimal", "logger=none", *overrides])  # fmt: skip
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # deterministic whatever the machine's load
    try:
        return run_or_exit(cfg, root / "out")
    finally:
        torch.set_num_threads(threads)


def _check(log: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
         "--ruleset", "5.0.0", str(log)],
        capture_output=True, text=True, timeout=300, cwd=log.parent,
    )  # fmt: skip


def test_the_smoke_run_reaches_its_target_and_passes_the_compliance_checker(corpus, tmp_path):
    # 0.03 evaluated every 320 samples (10 steps), not the experiment's 0.10 every 1,600: the
    # untrained model scores about 0.001 at step 10, and the masked-LM accuracy reaches the
    # majority token's (about 0.06) by step 20 or 30: a later evaluation reaches the target
    # after at least one below it (the experiment's own 0.10 takes 250 steps)
    summary = _smoke(corpus, tmp_path, "mlperf.target_accuracy=0.03",
                     "mlperf.eval_every_samples=320")  # fmt: skip
    mlperf = summary["mlperf"]
    assert mlperf["status"] == "success" and mlperf["reached"]
    evals = mlperf["evaluations"]
    assert [e["samples"] for e in evals] == [320 * (i + 1) for i in range(len(evals))]
    assert len(evals) >= 2 and evals[-1]["val/mlm_acc"] >= 0.03 > max(
        e["val/mlm_acc"] for e in evals[:-1]
    )
    # unpacked, a sample is a row: 32 per step, training stopped right after the last eval
    assert mlperf["samples_to_target"] == 32 * summary["steps"] == evals[-1]["samples"]
    assert mlperf["seconds_to_target"] > 0
    log = Path(mlperf["log_file"])
    assert log.parent == tmp_path / "out"
    done = _check(log)
    assert done.returncode == 0 and "SUCCESS" in done.stdout + done.stderr, done.stderr[-2000:]
    lines = [json.loads(x.removeprefix(":::MLLOG ")) for x in log.read_text().splitlines()]
    keys = [line["key"] for line in lines]
    for key in (*BERT_KEYS, "train_samples", "eval_samples", "run_stop", "init_stop"):
        assert keys.count(key) == 1, key
    stop = next(line for line in lines if line["key"] == "run_stop")
    assert stop["metadata"]["status"] == "success"


def test_the_checker_fails_a_closed_run_that_stops_short_of_0720(corpus, tmp_path):
    summary = _smoke(corpus, tmp_path, "mlperf.submission.division=closed",
                     "mlperf.target_accuracy=0.72", "mlperf.max_samples=320",
                     "mlperf.eval_every_samples=320")  # fmt: skip
    assert summary["mlperf"]["status"] == "aborted" and not summary["mlperf"]["reached"]
    assert summary["steps"] == 320 // 32  # stopped at max_samples
    done = _check(Path(summary["mlperf"]["log_file"]))
    output = done.stdout + done.stderr
    assert done.returncode != 0 and "SUCCESS" not in output
    # the only failure is the accuracy: every required key of the closed rules was logged
    failures = [line for line in output.splitlines() if "Failed" in line or "Required" in line]
    assert len(failures) == 1 and "eval_accuracy" in failures[0] and ">= 0.720" in failures[0]


def test_packed_samples_count_sequences_not_rows(tmp_path):
    """With online packing a step's samples are the sequences its rows hold."""
    histogram = tmp_path / "lengths.json"  # sequences of 5..16 tokens: 2-3 share a row of 32
    histogram.write_text(json.dumps({"counts": [0] * 4 + [1] * 12}))
    overrides = ["experiment=smoke", f"paths.output_root={tmp_path}", "phase=mlperf",
                 "phase.max_seq_length=32", "phase.max_predictions_per_seq=5",
                 "phase.global_batch_size=8", "micro_batch_size=2", "phase.max_steps=3",
                 "data.num_train_samples=256", "data.packing=online",
                 f"data.length_histogram={histogram}", "mlperf.eval_every_samples=100000",
                 "mlperf.submission.division=open"]  # fmt: skip
    cfg = compose("pretrain", overrides)
    from omnibert.run.pretraining.job import prepare as prepare_run

    datamodule = prepare_run(TrainConfig.of(cfg)).datamodule  # the run's own data, read again below
    summary = run_or_exit(cfg, tmp_path / "out")
    datamodule.setup("fit")
    rows = summary["plan"]["batch"]["rows_per_step"]
    loader = iter(datamodule.train_dataloader())
    micro = [next(loader) for _ in range(3 * rows // 2)]
    sequences = int(sum(b["nsp_weights"].sum() for b in micro))
    assert summary["mlperf"]["samples"] == sequences > 3 * rows


def test_the_log_survives_a_library_that_reconfigures_logging(tmp_path):
    """submitit runs logging.config.dictConfig when imported, which closes every handler and
    disables registered loggers: the compliance log must go on regardless."""
    import logging.config

    from omnibert.callbacks.mlperf import MLPerfCompliance

    submission = {"benchmark": "bert", "division": "open", "org": "x", "platform": "cpu",
                  "status": "onprem"}  # fmt: skip
    callback = MLPerfCompliance(tmp_path / "mlperf.log", target_accuracy=0.72,
                                eval_every_samples=100, max_samples=None, submission=submission,
                                hyperparameters={"seed": 1}, eval_samples=10)  # fmt: skip
    registered = [x for x in logging.Logger.manager.loggerDict.values()
                  if isinstance(x, logging.Logger)]  # fmt: skip
    enabled = [x for x in registered if not x.disabled]
    try:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": True})
        callback._interval("end", "init_stop")
        callback._close()
    finally:  # the other tests in this worker log through the loggers it disabled
        for x in enabled:
            x.disabled = False
    keys = [json.loads(x.removeprefix(":::MLLOG "))["key"]
            for x in (tmp_path / "mlperf.log").read_text().splitlines()]  # fmt: skip
    assert keys[:2] == ["cache_clear", "init_start"] and keys[-1] == "init_stop"


def test_sequences_are_counted_on_the_device_until_the_step_ends(tmp_path):
    """Inside an accumulation group the callback adds the micro-batch's sequences on the
    batch's device and reads nothing on the host: a batch on the meta device (which has no
    values to read) goes through; the count is read once the optimiser step has ended."""
    from types import SimpleNamespace

    from omnibert.callbacks.mlperf import MLPerfCompliance

    submission = {"benchmark": "bert", "division": "open", "org": "x", "platform": "cpu",
                  "status": "onprem"}  # fmt: skip
    callback = MLPerfCompliance(tmp_path / "mlperf.log", target_accuracy=0.72,
                                eval_every_samples=100, max_samples=None, submission=submission,
                                hyperparameters={"seed": 1}, eval_samples=10)  # fmt: skip
    try:
        trainer = SimpleNamespace(global_step=0)
        for _ in range(2):  # two micro-batches of step 1, still accumulating
            meta = {"nsp_weights": torch.ones(4, 2, device="meta")}
            callback.on_train_batch_end(trainer, None, None, meta, 0)
        assert callback._local is not None and callback._local.device.type == "meta"
        assert callback.samples == 0
        callback._local = None  # the step's last micro-batch, on the CPU: read at the boundary
        trainer.strategy = SimpleNamespace(reduce=lambda t, reduce_op: t)
        module = SimpleNamespace(device=torch.device("cpu"))
        for weights in (torch.ones(4, 2), torch.tensor([[1.0, 0.0]] * 4)):
            callback.on_train_batch_end(trainer, module, None, {"nsp_weights": weights}, 0)
            trainer.global_step += 1
        assert callback.samples == 8 + 4 and callback._local is None
    finally:
        callback._close()
