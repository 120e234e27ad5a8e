"""PretrainingTask: it learns, its metrics are exact, its checkpoints are plain and reload,
phase 2 starts from phase 1's weights with a fresh optimiser, MLPerf clipping is wired."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from omnibert.checkpoints.init_from import InitFromError, plan_pretraining_init
from omnibert.data.collate import PretrainingCollator
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.generated import GeneratedSource
from omnibert.data.samplers import EvalBatchSampler
from omnibert.models import BertConfig
from omnibert.optim.lamb_math import global_grad_norm
from omnibert.tasks.pretraining import PretrainingTask
from omnibert.tasks.rng_states import collect_rng_states, restore_rng_states

MODEL = {
    "vocab_size": 128,
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
LAMB = {"_target_": "omnibert.optim.Lamb", "_partial_": True, "lr": 2e-2, "impl": "foreach"}
SCHEDULE = {
    "_target_": "omnibert.optim.schedules.PolyWarmupLR",
    "_partial_": True,
    "total_steps": 40,
    "warmup_steps": 2,
}
STEPS = 40


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _data(rows: int = 8, **kwargs: Any) -> PretrainingDataModule:
    return PretrainingDataModule(
        source=GeneratedSource,
        vocab_size=128,
        max_seq_length=32,
        max_predictions_per_seq=5,
        micro_batch_size=4,
        num_train_samples=rows,
        num_eval_samples=0,
        num_workers=0,
        shuffle=False,
        **kwargs,
    )


def _trainer(max_steps: int, **kwargs: Any) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        max_epochs=-1,
        accumulate_grad_batches=2,
        use_distributed_sampler=False,
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        log_every_n_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


class LossLog(pl.Callback):
    def __init__(self) -> None:
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if "train/loss" in trainer.callback_metrics and batch_idx % 2 == 1:
            self.losses.append(float(trainer.callback_metrics["train/loss"]))


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict[str, Any]:
    """40 LAMB steps on one global batch of 8 generated rows (2 micro-batches of 4): the
    model memorises the masked tokens and the NSP labels."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = PretrainingTask(MODEL, {**LAMB, "lr": 0.1}, SCHEDULE, vocab_file="vocab.txt")
    losses = LossLog()
    trainer = _trainer(STEPS, callbacks=[losses])
    data = _data()
    trainer.fit(task, datamodule=data)
    ckpt = tmp_path_factory.mktemp("phase1") / "phase1.ckpt"
    trainer.save_checkpoint(ckpt)
    return {"task": task, "losses": losses.losses, "ckpt": ckpt, "data": data}


def test_loss_decreases(trained):
    losses = trained["losses"]
    assert len(losses) == STEPS
    assert all(math.isfinite(x) for x in losses)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:3])


def _hand_metrics(
    task: PretrainingTask, data: PretrainingDataModule, rows: int
) -> dict[str, float]:
    """Accuracy and losses row by row (each row alone, no padding), in float64."""
    collate = PretrainingCollator(32, 5)
    dataset = data.source.rows("train")
    sums = dict.fromkeys(("mlm_hit", "mlm_n", "mlm_ce", "nsp_hit", "nsp_n", "nsp_ce"), 0.0)
    task.model.eval()
    with torch.no_grad():
        for i in range(rows):
            batch = collate([dataset[i]])
            out = task.model(batch, return_logits=True)
            n = int(batch["masked_lm_weights"].sum())
            logits = out["mlm_logits"][0, :n, : MODEL["vocab_size"]].double()
            labels = batch["masked_lm_ids"][0, :n]
            sums["mlm_hit"] += float((logits.argmax(-1) == labels).sum())
            sums["mlm_n"] += n
            sums["mlm_ce"] += float(F.cross_entropy(logits, labels, reduction="sum"))
            nsp = out["nsp_logits"][0, :1].double()
            label = batch["nsp_labels"][0, :1]
            sums["nsp_hit"] += float((nsp.argmax(-1) == label).sum())
            sums["nsp_n"] += 1
            sums["nsp_ce"] += float(F.cross_entropy(nsp, label, reduction="sum"))
    return sums


def test_validation_is_exact_over_the_whole_eval_set(trained):
    task, data = trained["task"], trained["data"]
    rows = 8
    # eval batches of 3: 3 + 3 + 2 real rows, the last padded with a zero-weight row
    sampler = EvalBatchSampler(rows, 3)
    loader = torch.utils.data.DataLoader(
        data.source.rows("train"), batch_sampler=sampler, collate_fn=PretrainingCollator(32, 5, 3)
    )
    assert [len(b) for b in sampler] == [3, 3, 2]
    _trainer(1).validate(task, dataloaders=loader, verbose=False)
    got = task.last_validation
    assert got is not None
    want = _hand_metrics(task, data, rows)
    assert want["mlm_hit"] > 0  # the trained model gets some masks right: not a trivial 0
    assert got["val/mlm_count"] == want["mlm_n"] and got["val/nsp_count"] == rows
    # counts are whole numbers: float32 sums are exact, so the ratios match exactly
    assert got["val/mlm_acc"] == float(np.float32(want["mlm_hit"]) / np.float32(want["mlm_n"]))
    assert got["val/nsp_acc"] == float(np.float32(want["nsp_hit"]) / np.float32(rows))
    assert got["val/mlm_loss"] == pytest.approx(want["mlm_ce"] / want["mlm_n"], rel=1e-5)
    assert got["val/nsp_loss"] == pytest.approx(want["nsp_ce"] / rows, rel=1e-5)
    # a mean of batch means would weight the 2-row batch like the 3-row ones
    assert got["val/loss"] == pytest.approx(got["val/mlm_loss"] + got["val/nsp_loss"])


def _plain(value: Any) -> bool:
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (str, int, float, bool))


def test_checkpoint_is_plain_and_reloads_from_itself(trained):
    ckpt = torch.load(trained["ckpt"], weights_only=True)  # tensors and plain data only
    hparams = ckpt["hyper_parameters"]
    assert _plain(hparams)
    assert hparams["model_config"] == dataclasses.asdict(BertConfig(**MODEL))
    assert hparams["vocab_file"] == str(Path("vocab.txt").absolute())  # exports run anywhere
    keys = set(ckpt["state_dict"])
    assert all(k.startswith("model.") for k in keys)
    assert {
        "model.bert.embeddings.word_embeddings.weight",
        "model.bert.encoder.layer.0.attention.self.query.weight",
        "model.cls.predictions.bias",
        "model.cls.seq_relationship.weight",
    } <= keys
    assert ckpt["optimizer_states"][0]["param_groups"][0]["step"] == STEPS

    reloaded = PretrainingTask.load_from_checkpoint(trained["ckpt"])
    # the RNG states travel for resumes; a plain reload must not reseed the caller's RNGs
    assert not torch.equal(torch.get_rng_state(), ckpt["omnibert_rng_states"]["torch"])
    assert dict(reloaded.hparams) == hparams
    for name, tensor in trained["task"].state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    states = collect_rng_states()
    torch.save(states, tmp_path / "rng.pt")
    first = (torch.rand(3), np.random.rand(3), random.random())
    restore_rng_states(torch.load(tmp_path / "rng.pt", weights_only=True))
    second = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(first[0], second[0])
    assert np.array_equal(first[1], second[1]) and first[2] == second[2]


def test_phase2_starts_from_phase1_weights_with_a_fresh_optimiser(trained):
    config = {**MODEL, "hidden_dropout_prob": 0.0}  # regularisation may change between phases
    task = PretrainingTask(config, LAMB, SCHEDULE, init_from=str(trained["ckpt"]))
    untouched = copy.deepcopy(task.model.state_dict())
    init = plan_pretraining_init(str(trained["ckpt"]), None, task.hparams["model_config"])
    assert init is not None and "fresh optimiser" in init.load_into(task.model)
    phase1 = trained["task"].model.state_dict()
    for name, tensor in task.model.state_dict().items():
        assert torch.equal(tensor, phase1[name]), name
    assert not torch.equal(
        untouched["bert.pooler.dense.weight"], phase1["bert.pooler.dense.weight"]
    )

    trainer = _trainer(1)
    trainer.fit(task, datamodule=_data())
    optimizer = trainer.optimizers[0]
    assert {g["step"] for g in optimizer.param_groups} == {1}
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 1

    other = PretrainingTask({**MODEL, "hidden_size": 64}, LAMB, init_from=str(trained["ckpt"]))
    with pytest.raises(InitFromError, match="hidden_size=32"):
        plan_pretraining_init(str(trained["ckpt"]), None, other.hparams["model_config"])
    with pytest.raises(InitFromError, match="does not exist"):
        plan_pretraining_init(str(trained["ckpt"]) + ".nope", None, task.hparams["model_config"])


class GradProbe(pl.Callback):
    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        self.norms.append(float(global_grad_norm(grads)))


def test_train_metrics_are_the_steps_micro_batches_exactly():
    config = {**MODEL, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
    torch.manual_seed(1)
    task = PretrainingTask(config, LAMB, SCHEDULE)
    start = copy.deepcopy(task.model)
    data = _data()
    data.setup()
    micro = list(data.train_dataloader())[:2]
    results = [start(b) for b in micro]
    (0.5 * (results[0]["loss"] + results[1]["loss"])).backward()
    grad_norm = float(global_grad_norm([p.grad for p in start.parameters()]))
    outs = [{k: v.detach() for k, v in r.items()} for r in results]

    trainer = _trainer(1)
    trainer.fit(task, datamodule=data)
    got = {k: float(v) for k, v in trainer.callback_metrics.items()}
    mlm_hits = sum(float(o["mlm_correct"]) for o in outs)
    mlm_n = sum(float(o["mlm_count"]) for o in outs)
    assert got["train/mlm_acc"] == pytest.approx(mlm_hits / mlm_n, abs=1e-7)
    nsp_hits = sum(float(o["nsp_correct"]) for o in outs)
    assert got["train/nsp_acc"] == pytest.approx(nsp_hits / 8, abs=1e-7)
    assert got["train/loss"] == pytest.approx(float(outs[0]["loss"] + outs[1]["loss"]) / 2)
    # the progress bar's copy (held on the host between logging steps) is the same number
    assert trainer.progress_bar_metrics["train/loss"] == got["train/loss"]
    assert got["train/mlm_loss"] == pytest.approx(
        float(outs[0]["mlm_loss"] + outs[1]["mlm_loss"]) / 2
    )
    assert got["train/grad_norm"] == pytest.approx(grad_norm, rel=1e-4)
    assert got["train/lr"] == 0.0  # PolyWarmupLR's first step: warmup from 0


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_micro_batch_clipping_bounds_the_accumulated_gradient(clip):
    optimizer = {**LAMB, "max_grad_norm": None}
    task = PretrainingTask(MODEL, optimizer, SCHEDULE, clip_grad_per_micro_batch=clip)
    probe = GradProbe()
    _trainer(2, callbacks=[probe]).fit(task, datamodule=_data())
    assert len(probe.norms) == 2
    if clip is None:
        assert task.clipper is None and min(probe.norms) > 0.1
    else:
        assert task.clipper is not None and task.clipper.prescale == 2  # accumulation
        # each micro-batch clipped to 1e-3 (before Lightning's 1/2 scaling): the sum <= 1e-3
        assert max(probe.norms) <= clip * (1 + 1e-5)
        assert min(probe.norms) > 0.5 * clip
