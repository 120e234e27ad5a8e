"""PretrainingThroughput: counts from the batch contract, windowed rates, FLOPs, MFU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from omnibert.callbacks import throughput as tp
from omnibert.callbacks.throughput import (
    PretrainingThroughput,
    bert_pretraining_flops,
    measure_flops,
)
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.generated import GeneratedSource
from omnibert.models import BertConfig, BertForPreTraining

CONFIG = BertConfig(
    vocab_size=100,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=64,
)


@pytest.fixture(scope="module")
def batches() -> list[dict[str, torch.Tensor]]:
    """Generated micro-batches of 4 rows, seq 32, 5 masks (10% of rows are short)."""
    dm = PretrainingDataModule(
        source=GeneratedSource,
        vocab_size=100,
        max_seq_length=32,
        max_predictions_per_seq=5,
        micro_batch_size=4,
        num_train_samples=64,
        num_eval_samples=4,
    )
    dm.setup()
    return list(dm.train_dataloader())


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    """Stands in for the LightningModule: the model (for FLOPs) and ``log_dict``."""

    def __init__(self) -> None:
        self.model = BertForPreTraining(CONFIG)
        self.logged: list[dict[str, float]] = []

    def log_dict(self, metrics: dict[str, float], **kwargs: Any) -> None:
        self.logged.append(dict(metrics))


def _trainer(world_size: int = 1, log_every: int = 1) -> SimpleNamespace:
    return SimpleNamespace(
        global_step=0,
        world_size=world_size,
        log_every_n_steps=log_every,
        state=SimpleNamespace(fn="fit"),
        # a rank's counts summed over `world_size` identical ranks
        strategy=SimpleNamespace(reduce=lambda t, reduce_op: t * world_size),
    )


def _step(cb, trainer, module, micro_batches, clock, seconds) -> None:
    """One optimiser step of ``len(micro_batches)`` micro-batches taking ``seconds``."""
    for i, batch in enumerate(micro_batches):
        cb.on_train_batch_start(trainer, module, batch, 0)
        clock.now += seconds / len(micro_batches)
        if i == len(micro_batches) - 1:
            trainer.global_step += 1
        cb.on_train_batch_end(trainer, module, None, batch, 0)


def _real(batch) -> tuple[float, float]:
    return float((batch["sequence_ids"] > 0).sum()), float(batch["nsp_weights"].sum())


def test_measured_flops_equal_the_analytic_count(batches):
    batch = batches[0]
    measured = measure_flops(lambda: BertForPreTraining(CONFIG), batch)
    assert measured == bert_pretraining_flops(CONFIG, 4, 32, 5)
    # and the count scales with the batch: twice the rows, twice the FLOPs
    double = {k: torch.cat([v, v]) for k, v in batch.items()}
    assert measure_flops(lambda: BertForPreTraining(CONFIG), double) == 2 * measured


@pytest.mark.parametrize(
    "changes",
    [
        {"feed_forward": "geglu", "next_sentence_head": False},
        {"feed_forward": "swiglu", "position_encoding": "alibi", "attention": "math"},
    ],
)
def test_measured_flops_of_modern_options_equal_the_analytic_count(batches, changes):
    config = CONFIG.replace(**changes)
    measured = measure_flops(lambda: BertForPreTraining(config), batches[0])
    assert measured == bert_pretraining_flops(config, 4, 32, 5)


@pytest.mark.parametrize("world_size", [1, 2])
def test_rates_over_the_window_from_the_batches(batches, monkeypatch, world_size):
    clock = FakeClock()
    monkeypatch.setattr(tp.time, "perf_counter", clock)
    cb = PretrainingThroughput(peak_flops=1e9, window=3)
    trainer, module = _trainer(world_size), Recorder()
    cb.on_train_start(trainer, module)
    steps = [batches[2 * i : 2 * i + 2] for i in range(4)]  # 4 steps of 2 micro-batches
    seconds = [5.0, 2.0, 3.0, 4.0]  # the first (slow) step falls out of the window
    for micro, sec in zip(steps, seconds, strict=True):
        _step(cb, trainer, module, micro, clock, sec)

    # logging points after steps 1..4; the window (3 points) spans steps 3 and 4
    assert len(module.logged) == 3
    got = {k.removeprefix("throughput/"): v for k, v in module.logged[-1].items()}
    window = [b for micro in steps[2:] for b in micro]
    real = sum(_real(b)[0] for b in window) * world_size
    seqs = sum(_real(b)[1] for b in window) * world_size
    rows, slots, dt = 16 * world_size, 16 * 32 * world_size, 7.0
    assert got["samples_per_sec"] == pytest.approx(rows / dt)
    assert got["tokens_per_sec"] == pytest.approx(slots / dt)
    assert got["real_tokens_per_sec"] == pytest.approx(real / dt)
    assert got["sequences_per_sec"] == pytest.approx(seqs / dt)
    assert got["sequences_per_step"] == pytest.approx(seqs / 2)
    assert got["padding_fraction"] == pytest.approx(1 - real / slots)
    assert got["step_time"] == pytest.approx(3.5)
    assert real < slots  # generated data has short rows: real tokens are not slots
    flops = bert_pretraining_flops(CONFIG, 4, 32, 5) / 4 * rows / dt
    assert got["flops_per_sec"] == pytest.approx(flops)
    assert got["mfu"] == pytest.approx(flops / (1e9 * world_size))


def test_validation_time_is_not_training_time(batches, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tp.time, "perf_counter", clock)
    cb = PretrainingThroughput(window=2, count_flops=False)
    trainer, module = _trainer(), Recorder()
    cb.on_train_start(trainer, module)
    _step(cb, trainer, module, batches[:1], clock, 1.0)
    cb.on_validation_start(trainer, module)
    clock.now += 50.0  # a long validation pass
    cb.on_validation_end(trainer, module)
    _step(cb, trainer, module, batches[1:2], clock, 2.0)
    got = module.logged[-1]
    assert got["throughput/step_time"] == pytest.approx(2.0)
    assert "throughput/flops_per_sec" not in got and "throughput/mfu" not in got
    summary = cb.summary()
    assert summary["train_seconds"] == pytest.approx(3.0)
    assert summary["steps"] == 2 and summary["samples"] == 8


def test_logs_only_on_logging_steps_and_no_mfu_without_peak(batches, monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(tp.time, "perf_counter", clock)
    cb = PretrainingThroughput(window=2)
    trainer, module = _trainer(log_every=2), Recorder()
    cb.on_train_start(trainer, module)
    for i in range(4):
        _step(cb, trainer, module, batches[i : i + 1], clock, 1.0)
    assert len(module.logged) == 1  # points at steps 2 and 4; rates need two points
    assert "throughput/mfu" not in module.logged[0]
    assert module.logged[0]["throughput/samples_per_sec"] == pytest.approx(8 / 2.0)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="window"):
        PretrainingThroughput(window=1)
    with pytest.raises(ValueError, match="peak_flops"):
        PretrainingThroughput(peak_flops=0)


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A10G", 70e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table(name, peak):
    from omnibert.accelerators.peaks import peak_for_name

    assert peak_for_name(name) == peak


@pytest.mark.parametrize(
    ("device", "name", "peak"),
    [
        ("cuda", "NVIDIA H100 80GB HBM3", 989e12),  # a known GPU: MFU on its bf16 peak
        ("cuda", "Some Future GPU", None),  # unknown: no MFU
        ("cpu", "NVIDIA H100 80GB HBM3", None),  # not on the GPU: no MFU
    ],
)
def test_without_peak_flops_mfu_is_against_the_training_gpus_peak(
    batches, monkeypatch, caplog, device, name, peak
):
    clock = FakeClock()
    monkeypatch.setattr(tp.time, "perf_counter", clock)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cb = PretrainingThroughput(window=2)
    trainer, module = _trainer(), Recorder()
    module.device = torch.device(device, 0) if device == "cuda" else torch.device("cpu")
    with caplog.at_level("INFO", logger=tp.__name__):
        cb.on_train_start(trainer, module)
    assert cb.mfu_peak == peak and cb.peak_flops is None
    for i in range(2):
        _step(cb, trainer, module, batches[i : i + 1], clock, 1.0)
    got = module.logged[-1]
    if peak is None:
        assert "throughput/mfu" not in got
    else:
        assert got["throughput/mfu"] == pytest.approx(got["throughput/flops_per_sec"] / peak)
    said = caplog.text
    if device == "cuda":  # the choice is said once, at the start
        assert name in said and ("989 TFLOP/s" in said if peak else "MFU is not logged" in said)
    # a given peak_flops wins over the table
    given = PretrainingThroughput(peak_flops=1e9, window=2)
    given.on_train_start(_trainer(), module)
    assert given.mfu_peak == 1e9
