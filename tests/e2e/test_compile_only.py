"""compile_only=true: one compiled/timed step at the run's shapes, a report of parameters,
FLOPs, estimated and measured memory and times, written as compile_report.json; no
training; a -m sweep over micro batch sizes; steps that cannot fit are not run."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from in_process import train_main_sweep

import omnibert.run.sizing.compile_only as compile_only_module
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.apps.train import run_or_exit
from omnibert.callbacks.throughput import bert_pretraining_flops
from omnibert.data.collate import PretrainingCollator
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.generated import GeneratedSource
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.run.sizing.activation_memory import meta_batch, saved_activation_bytes

SMOKE = ("experiment=smoke", "data.num_workers=0", "compile_only=true")
# the smoke model (conf/experiment/smoke.yaml)
TINY = dict(
    vocab_size=128,
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)


def test_compile_only_reports_without_training(tmp_path, capsys, compose_config):
    out = tmp_path / "out"
    report = run_or_exit(compose_config(*SMOKE, root=tmp_path), out)
    assert json.loads((out / "compile_report.json").read_text()) == report
    printed = capsys.readouterr().out
    assert "compile-only, bert-smoke on cpu" in printed and "fits                yes" in printed

    config = BertConfig(**TINY)
    params = sum(p.numel() for p in BertForPreTraining(config).parameters())
    assert report["parameters"] == params
    # micro batch 4 x seq 32 with 5 masks, accumulated twice (global batch 8)
    assert report["batch"]["shapes"]["input_ids"] == [4, 32]
    assert report["flops"]["per_micro_batch"] == bert_pretraining_flops(config, 4, 32, 5)
    assert report["flops"]["per_optimizer_step"] == 2 * report["flops"]["per_micro_batch"]
    memory = report["memory_estimate_bytes"]
    assert memory["parameters"] == memory["gradients"] == 4 * params
    # counted as the CPU runs the smoke model's training step: math attention (dropout 0.1)
    assert report["memory_estimate_counted_as"].startswith("cpu kernels: attention as math")
    assert "counted as          cpu kernels" in printed
    assert memory["total"] == sum(v for k, v in memory.items() if k != "total")

    measured = report["measured"]
    assert report["fits"] is True and measured["ran_steps"] == 2
    assert measured["step_seconds"] > 0 and measured["compile_seconds"] > 0
    # RSS growth, read in this long-lived worker (whose allocator reuses freed pages): its
    # size is checked in a fresh process below
    assert "RSS" in measured["peak_memory_source"]
    # LAMB's two fp32 moments per parameter, as estimated
    assert measured["optimizer_state_bytes"] == memory["optimizer_state"] == 8 * params
    # nothing trained: no checkpoints, no summary
    assert not (tmp_path / "smoke" / "checkpoints").exists()
    assert not (out / "summary.json").exists()


def _real_batch(b: int, s: int, p: int) -> dict[str, torch.Tensor]:
    data = PretrainingDataModule(
        source=GeneratedSource,
        vocab_size=128,
        max_seq_length=s,
        max_predictions_per_seq=p,
        micro_batch_size=b,
    )
    data.check()
    rows = data.source.rows("train")
    return PretrainingCollator(s, p)(rows.__getitems__(list(range(b))))


def _meta_bytes(b: int, s: int, p: int = 5) -> int:
    with torch.device("meta"):
        model = BertForPreTraining(BertConfig(**TINY))
    shapes = {"input_ids": [b, s], "masked_lm_positions": [b, p], "nsp_labels": [b, 1]}
    return saved_activation_bytes(model, meta_batch(shapes))


def test_activation_estimate_matches_a_real_forward_and_scales_with_the_shapes():
    real = saved_activation_bytes(BertForPreTraining(BertConfig(**TINY)), _real_batch(4, 32, 5))
    meta = _meta_bytes(4, 32)
    # the CPU attention kernel saves a little more than the meta decomposition
    assert abs(meta - real) / real < 0.05, (meta, real)
    assert 1.9 < _meta_bytes(8, 32) / meta <= 2.0  # linear in the batch
    # longer rows: more activations (less than twice here: the only layer is the last one,
    # which runs the feed-forward and attention queries only for the heads' rows)
    assert 1.5 < _meta_bytes(4, 64) / meta < 2.0


def test_a_step_whose_estimate_exceeds_the_memory_is_not_run(tmp_path, monkeypatch, compose_config):
    monkeypatch.setattr(compile_only_module, "available_memory", lambda device: (2**16, "test"))
    ran = []
    monkeypatch.setattr(CPUPlugin, "compile_only", lambda *a, **k: ran.append(a) or {})
    report = run_or_exit(compose_config(*SMOKE, root=tmp_path), tmp_path / "out")
    assert report["fits"] is False and report["measured"] is None and not ran
    assert "exceeds the 0.1 MiB the device has" in report["reason"]  # 2**16 bytes
    assert "the step was not run" in report["reason"]
    assert report["memory_estimate_bytes"]["total"] > 2**16
    saved = json.loads((tmp_path / "out" / "compile_report.json").read_text())
    assert saved["fits"] is False


def test_out_of_memory_in_the_step_is_reported_and_other_errors_are_not_hidden(
    tmp_path, monkeypatch, compose_config
):
    def oom(*args, **kwargs):
        # torch.OutOfMemoryError from torch 2.1 (the IPU environment's 2.0 has the CUDA one)
        error = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)
        raise error("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(CPUPlugin, "compile_only", oom)
    report = run_or_exit(compose_config(*SMOKE, root=tmp_path), tmp_path / "out")
    assert report["fits"] is False and report["reason"].startswith("out of memory: CUDA")

    def broken(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    monkeypatch.setattr(CPUPlugin, "compile_only", broken)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        run_or_exit(compose_config(*SMOKE, root=tmp_path), tmp_path / "out2")


def test_a_multirun_sweep_over_micro_batch_sizes(tmp_path, monkeypatch):
    """omnibert-train's entry point in-process, as its console script calls it (Hydra's basic
    launcher runs the jobs in this process, one after the other)."""
    sweep = tmp_path / "sweep1" / "multirun"  # under paths.output_root
    train_main_sweep(monkeypatch, tmp_path, [*SMOKE, f"paths.output_root={tmp_path / 'sweep1'}",
                                             "micro_batch_size=2,4"])  # fmt: skip
    # one directory per job, named by its number and the swept value (conf/hydra/default.yaml);
    # the job's whole command line is in its .hydra/overrides.yaml
    jobs = sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert jobs == ["0-micro_batch_size=2", "1-micro_batch_size=4"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep1"]  # no multirun/ beside
    overrides = (sweep / jobs[0] / ".hydra" / "overrides.yaml").read_text()
    assert f"paths.output_root={tmp_path / 'sweep1'}" in overrides
    assert "micro_batch_size=2" in overrides and "experiment=smoke" in overrides
    small, large = (json.loads((sweep / job / "compile_report.json").read_text()) for job in jobs)
    assert small["batch"]["micro_batch_size"] == 2 and large["batch"]["micro_batch_size"] == 4
    assert small["batch"]["accumulate_grad_batches"] == 4
    assert large["batch"]["accumulate_grad_batches"] == 2
    assert small["fits"] and large["fits"]
    assert large["flops"]["per_micro_batch"] == 2 * small["flops"]["per_micro_batch"]
    assert large["flops"]["per_optimizer_step"] == small["flops"]["per_optimizer_step"]
    ratio = (
        large["memory_estimate_bytes"]["activations"]
        / small["memory_estimate_bytes"]["activations"]
    )
    assert 1.9 < ratio <= 2.0


def test_the_measured_peak_holds_what_the_step_allocated(tmp_path):
    """In a fresh process, the CPU peak (resident-set growth) covers at least the gradients
    and LAMB's two moments, which the step allocates, and the estimate covers the peak."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "omnibert.apps.train", *SMOKE, f"hydra.run.dir={out}"),
            f"paths.output_root={tmp_path}",
            # ~11 M parameters: 44 MB of gradients and 88 MB of optimiser state
            *("data.vocab_size=30522", "model.config.hidden_size=256"),
            *("model.config.num_hidden_layers=4", "model.config.intermediate_size=1024"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "compile_report.json").read_text())
    measured, estimate = report["measured"], report["memory_estimate_bytes"]
    assert report["parameters"] > 10_000_000
    allocated = estimate["gradients"] + measured["optimizer_state_bytes"]
    assert allocated <= measured["peak_memory_bytes"] <= estimate["total"] * 1.5, measured


def test_the_memory_estimate_covers_the_measured_peak_of_a_fresh_process(tmp_path):
    """The estimate sizes the micro batch chosen to fit (80 % of the memory): the measured
    peak of a real step must stay within that headroom. Counting only the activations saved
    for backward, it was half the peak (bert-tiny micro 2048 estimated 8.6 GiB and reached
    18 GB), so the natural first command nearly met the OOM killer."""
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", "compile_only=true", "model=bert_tiny",
         "data=generated", "data.num_workers=0", "data.vocab_size=1024", "micro_batch_size=256",
         "phase.global_batch_size=256", f"paths.output_root={tmp_path}", f"hydra.run.dir={out}"],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = list(tmp_path.rglob("compile_report.json"))
    report = json.loads(path.read_text())
    measured = report["measured"]["peak_memory_bytes"]
    estimate = report["memory_estimate_bytes"]["total"]
    assert measured > report["memory_estimate_bytes"]["activations"]  # a real peak was read
    assert measured <= 1.25 * estimate, (measured / 2**30, estimate / 2**30)
