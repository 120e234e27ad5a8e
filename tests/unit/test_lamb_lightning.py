"""Lamb under Lightning: optimizer hooks, gradient accumulation (clip after it by default, or
MLPerf's per-micro-batch clipping), bf16 autocast, checkpoint round trips, fresh phase 2."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from omnibert.checkpoints.resuming import CompletedBatchProgress
from omnibert.optim import Lamb
from omnibert.optim.accumulation import MicroBatchClipper
from omnibert.optim.schedules import PolyWarmupLR

ACCUM = 2
MICRO_BATCHES = 4  # two optimiser steps per epoch


def _data(seed: int = 0) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(MICRO_BATCHES * 8, 6, generator=g) * 3
    return TensorDataset(x, (x @ torch.randn(6, 1, generator=g)).squeeze(-1))


def _net() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 1))


def _lamb(net, mlperf: bool) -> Lamb:
    return Lamb(
        net.named_parameters(),
        lr=5e-2,
        no_weight_decay=["bias", r"^1\."],
        max_grad_norm=None if mlperf else 1.0,
        impl="foreach",
    )


class Tiny(L.LightningModule):
    def __init__(self, mlperf: bool = False) -> None:
        super().__init__()
        self.net = _net()
        self.mlperf = mlperf
        self.clipper: MicroBatchClipper | None = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).squeeze(-1).float(), y)

    def on_before_backward(self, loss):
        if self.clipper is not None:
            self.clipper.before_backward()

    def on_after_backward(self):
        if self.clipper is not None:
            self.clipper.after_backward()

    def configure_optimizers(self):
        opt = _lamb(self.net, self.mlperf)
        if self.mlperf:
            self.clipper = MicroBatchClipper(self.net.parameters(), 1.0, grads_prescaled_by=ACCUM)
        sched = PolyWarmupLR(opt, total_steps=8, warmup_steps=2, power=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _trainer(max_steps: int, precision: str = "32-true", **kwargs) -> L.Trainer:
    return L.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        max_epochs=kwargs.pop("max_epochs", None),
        accumulate_grad_batches=ACCUM,
        precision=precision,
        logger=False,
        enable_checkpointing=kwargs.pop("enable_checkpointing", False),
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def _manual(steps: int, mlperf: bool) -> list[torch.Tensor]:
    """The same training written out by hand: the maths Lightning must reproduce."""
    net = _net()
    opt = _lamb(net, mlperf)
    sched = PolyWarmupLR(opt, total_steps=8, warmup_steps=2, power=0.5)
    batches = list(DataLoader(_data(), batch_size=8))
    for step in range(steps):
        opt.zero_grad()
        for x, y in batches[(step % 2) * ACCUM : (step % 2) * ACCUM + ACCUM]:
            loss = torch.nn.functional.mse_loss(net(x).squeeze(-1), y)
            if not mlperf:
                (loss / ACCUM).backward()
                continue
            grads = torch.autograd.grad(loss, list(net.parameters()))
            norm = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads]))
            scale = 1.0 / max(float(norm) / 1.0, 1.0)
            for p, g in zip(net.parameters(), grads, strict=True):
                p.grad = g * scale / ACCUM if p.grad is None else p.grad + g * scale / ACCUM
        opt.step()
        sched.step()
    return [p.detach().clone() for p in net.parameters()]


@pytest.mark.parametrize(
    "mlperf", [False, True], ids=["clip-after-accumulation", "mlperf-clip-before"]
)
def test_lightning_accumulation_matches_manual_loop(mlperf):
    model = Tiny(mlperf)
    _trainer(4).fit(model, DataLoader(_data(), batch_size=8))
    expected = _manual(4, mlperf)
    for got, want in zip(model.net.parameters(), expected, strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)


def test_the_two_clipping_orders_really_differ():
    a, b = _manual(2, mlperf=False), _manual(2, mlperf=True)
    assert any(not torch.allclose(x, y) for x, y in zip(a, b, strict=True))


def test_bf16_autocast_keeps_fp32_state_and_trains():
    model = Tiny()
    _trainer(4, precision="bf16-mixed").fit(model, DataLoader(_data(), batch_size=8))
    opt = model.trainer.optimizers[0]
    assert all(s["exp_avg"].dtype == torch.float32 for s in opt.state.values())
    assert [g["step"] for g in opt.param_groups] == [4, 4]
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_checkpoint_resume_continues_the_same_trajectory(tmp_path):
    full = Tiny()
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=2, save_top_k=-1)
    # CompletedBatchProgress: Lightning < 2.5 (the IPU environment's) would rerun a batch
    callbacks = [saver, CompletedBatchProgress()]
    _trainer(4, callbacks=callbacks, enable_checkpointing=True).fit(
        full, DataLoader(_data(), batch_size=8)
    )
    ckpt = next(tmp_path.glob("*step=2.ckpt"))
    raw = torch.load(ckpt, weights_only=True)  # plain tensors and numbers only
    assert raw["optimizer_states"][0]["param_groups"][0]["step"] == 2

    resumed = Tiny()
    _trainer(4).fit(resumed, DataLoader(_data(), batch_size=8), ckpt_path=ckpt)
    for a, b in zip(full.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)

    # phase 2: weights from the checkpoint, a fresh optimiser and schedule
    phase2 = Tiny()
    phase2.load_state_dict(raw["state_dict"])
    _trainer(1).fit(phase2, DataLoader(_data(), batch_size=8))
    assert [g["step"] for g in phase2.trainer.optimizers[0].param_groups] == [1, 1]
