"""Pretraining throughput: samples, slots, real tokens, real sequences, FLOPs and MFU.

Counts come from the batch contract: a batch has ``B`` rows of ``S`` slots; a slot holds a
real token where ``sequence_ids > 0``; each real (packed) sequence has ``nsp_weights == 1``.
Per micro-batch the callback only adds two on-device sums (no host sync); on logging steps
it reduces them over ranks, reads the clock and logs rates over a window of the most recent
logging points (``window`` of them), so a slow first step or a validation pass does not
distort the numbers (time spent in validation is excluded from the training clock).

FLOPs per micro-batch are *measured* once, on the first training batch, with
:class:`torch.utils.flop_counter.FlopCounterMode` (torch >= 2.1; on older torch the
equivalent matmul counter of :func:`omnibert.compat.flop_counter`) around forward + backward of a copy of the
model built on the ``meta`` device (no memory, no compute; matmuls, bmm and attention are
counted, elementwise ops are not), so the count follows whatever the model does (e.g. its
last layer running only the rows the heads read). :func:`bert_pretraining_flops` states the
same count analytically; the tests check that the two agree. MFU is ``flops/s / (peak_flops ·
world_size)``. Without ``peak_flops`` the peak is the training GPU's dense bf16 peak from
:data:`omnibert.accelerators.peaks.PEAK_BF16` (whatever the precision); MFU is not logged on a
GPU the table does not know or off CUDA, and the callback says which once at the start.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor, nn

from omnibert.accelerators.peaks import device_peak_flops
from omnibert.compat import flop_counter

log = logging.getLogger(__name__)

#: Keys logged (under the ``throughput/`` prefix) once a window holds two logging points.
RATE_KEYS = (
    "samples_per_sec",
    "sequences_per_sec",
    "tokens_per_sec",
    "real_tokens_per_sec",
    "sequences_per_step",
    "padding_fraction",
    "step_time",
)


def measure_flops(model_factory: Callable[[], nn.Module], batch: Mapping[str, Tensor]) -> int:
    """FLOPs of forward + backward of ``model_factory()`` on ``batch``'s shapes (meta device)."""
    with torch.device("meta"):
        model = model_factory()
    meta_batch = {k: torch.empty_like(v, device="meta") for k, v in batch.items()}
    with flop_counter() as counter:
        out = model(meta_batch)
        out["loss"].backward()
    return int(counter.get_total_flops())


def bert_pretraining_flops(
    config: Any,
    batch_size: int,
    seq_len: int,
    predictions: int,
    sequences: int = 1,
    *,
    prune_last_layer: bool = True,
) -> int:
    """Analytic matmul FLOPs of one forward + backward of BERT pretraining (2 per MAC).

    Per layer and token: the Q, K, V and output projections (``4H²`` MACs) and the
    feed-forward (``2HI``), plus ``2SH`` for the attention scores and their weighted sum.
    ``omnibert.models`` runs the last layer only for the ``Q = B·(P+K)`` rows the heads read
    (the ``P`` masked positions and the ``K`` [CLS] positions of every row): keys and values
    for all ``B·S`` tokens (``2H²``), the rest for the ``Q`` rows (``2H² + 2HI + 2SH``). The
    MLM head works on the gathered positions (transform ``H²`` + decoder ``H·V_pad``), the
    pooler and NSP classifier on the [CLS] rows. Backward costs twice the forward.
    A gated feed-forward (``geglu``/``swiglu``) costs ``3HI`` (its input projection is twice as
    wide); without the next-sentence head the [CLS] rows are neither read nor classified.
    Sliding windows are not discounted (an upper bound for local layers).
    """
    h, layers = config.hidden_size, config.num_hidden_layers
    gated = getattr(config, "feed_forward", "mlp") != "mlp"
    ffn = h * config.intermediate_size * (3 if gated else 2)  # MACs per token
    if not getattr(config, "next_sentence_head", True):
        sequences = 0
    tokens = batch_size * seq_len
    full_layer = tokens * (4 * h * h + ffn) + 2 * batch_size * seq_len**2 * h
    if prune_last_layer:
        queries = batch_size * (predictions + sequences)
        last = tokens * 2 * h * h + queries * (2 * h * h + ffn + 2 * seq_len * h)
        encoder = (layers - 1) * full_layer + last
    else:
        encoder = layers * full_layer
    mlm = batch_size * predictions * (h * h + h * config.padded_vocab_size)
    nsp = batch_size * sequences * (h * h + 2 * h)
    return 3 * 2 * (encoder + mlm + nsp)


class PretrainingThroughput(pl.Callback):
    """Log training throughput and MFU on Lightning's logging steps (module docstring).

    Logged as ``throughput/<key>``: ``samples_per_sec`` (rows), ``sequences_per_sec`` (real
    sequences, ``nsp_weights`` sums: more than rows once packed), ``tokens_per_sec`` (slots,
    ``B·S``), ``real_tokens_per_sec`` (``sequence_ids > 0``), ``sequences_per_step``,
    ``padding_fraction``, ``step_time`` (seconds per optimiser step), ``flops_per_sec`` and
    ``mfu``. All are totals over every rank.

    Args:
        peak_flops: peak FLOP/s of one device for MFU; ``None``: the training GPU's dense
            bf16 peak from :data:`omnibert.accelerators.peaks.PEAK_BF16`, no MFU where the
            table has none (an unknown GPU, a CPU).
        window: number of logging points the rates are averaged over (at least 2).
        count_flops: count FLOPs with ``FlopCounterMode`` on the first batch.
    """

    def __init__(
        self, peak_flops: float | None = None, window: int = 5, count_flops: bool = True
    ) -> None:
        super().__init__()
        if window < 2:
            raise ValueError(f"PretrainingThroughput window must be >= 2, got {window}.")
        if peak_flops is not None and peak_flops <= 0:
            raise ValueError(f"PretrainingThroughput peak_flops must be > 0, got {peak_flops}.")
        self.peak_flops = peak_flops
        #: the peak MFU is computed against in this fit (``peak_flops`` or the device's)
        self.mfu_peak: float | None = peak_flops
        self.window = window
        self.count_flops = count_flops
        #: FLOPs of forward + backward of one row (measured batch FLOPs / its rows)
        self.flops_per_sample: float | None = None
        self._points: deque[tuple[float, ...]] = deque(maxlen=window)
        self._first_point: tuple[float, ...] | None = None
        self._pending: Tensor | None = None  # on-device [real tokens, sequences] since last point
        self._rows = self._slots = 0  # this rank's rows and slots since the last point
        self._totals = [0.0] * 5  # all ranks: rows, slots, real tokens, sequences; steps
        self._world = 1
        self._last_step = 0
        self._steps_at_start = 0
        self._clock = 0.0  # training seconds before ``_since``
        self._since: float | None = None  # perf_counter when the clock last (re)started

    # -- clock: training time only (validation inside fit is excluded) -------------------------
    def _now(self) -> float:
        if self._since is None:
            return self._clock
        return self._clock + time.perf_counter() - self._since

    def _choose_peak(self, pl_module: pl.LightningModule) -> None:
        """``peak_flops`` when given, else the training device's peak from the table; the
        choice said once, so a missing MFU is never a surprise."""
        if self.peak_flops is not None:
            self.mfu_peak = self.peak_flops
            return
        device = getattr(pl_module, "device", None)
        peak, name = device_peak_flops(device) if device is not None else (None, "unknown")
        self.mfu_peak = peak
        if peak is not None:
            log.info(
                "throughput: MFU against %s's dense bf16 peak, %.0f TFLOP/s "
                "(callbacks.throughput.peak_flops sets another)",
                name,
                peak / 1e12,
            )
        elif device is not None and device.type == "cuda":
            log.info(
                "throughput: no dense bf16 peak is known for %s, so MFU is not logged; set "
                "callbacks.throughput.peak_flops to one device's peak FLOP/s (e.g. 312e12) to log "
                "it",
                name,
            )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._choose_peak(pl_module)
        self._world = trainer.world_size
        self._last_step = self._steps_at_start = trainer.global_step
        self._clock, self._since = 0.0, time.perf_counter()
        self._points.clear()
        self._first_point = None
        self._totals = [0.0] * 5
        self._pending, self._rows, self._slots = None, 0, 0

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._since is not None:
            self._clock, self._since = self._now(), None

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._clock, self._since = self._now(), None

    # -- counting -------------------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._since is None:  # restarted after a validation pass
            self._since = time.perf_counter()
        if self.count_flops and self.flops_per_sample is None:
            model = getattr(pl_module, "model", pl_module)
            config = getattr(model, "config", None)
            try:
                flops = measure_flops(lambda: type(model)(config), batch)
            except Exception as err:  # a model that cannot run on meta tensors: no FLOPs
                log.warning("throughput: could not count FLOPs on the meta device (%s)", err)
                self.count_flops = False
            else:
                self.flops_per_sample = flops / batch["input_ids"].shape[0]

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        counts = torch.stack(
            [(batch["sequence_ids"] > 0).sum().float(), batch["nsp_weights"].float().sum()]
        )
        self._pending = counts if self._pending is None else self._pending + counts
        rows, seq_len = batch["input_ids"].shape
        self._rows += rows
        self._slots += rows * seq_len
        step = trainer.global_step
        if step == self._last_step:
            return  # inside an accumulation
        self._last_step = step
        every = int(getattr(trainer, "log_every_n_steps", 0))
        if every > 0 and step % every == 0:
            self._add_point(trainer)
            metrics = self.rates()
            if metrics:
                pl_module.log_dict(
                    {f"throughput/{k}": v for k, v in metrics.items()},
                    on_step=True,
                    on_epoch=False,
                )

    def _add_point(self, trainer: pl.Trainer) -> None:
        assert self._pending is not None
        real = trainer.strategy.reduce(self._pending, reduce_op="sum").tolist()  # host sync
        now = self._now()
        world = self._world
        deltas = (self._rows * world, self._slots * world, real[0], real[1])
        for i, d in enumerate(deltas):
            self._totals[i] += float(d)
        self._totals[4] = float(trainer.global_step - self._steps_at_start)
        point = (now, *self._totals)
        self._points.append(point)
        if self._first_point is None:
            self._first_point = point
        self._pending, self._rows, self._slots = None, 0, 0

    def rates(self) -> dict[str, float]:
        """Rates over the current window (empty until it holds two logging points)."""
        if len(self._points) < 2:
            return {}
        return self._rates(self._points[0], self._points[-1])

    def _rates(self, first: tuple[float, ...], last: tuple[float, ...]) -> dict[str, float]:
        dt = last[0] - first[0]
        rows, slots, real, seqs, steps = (b - a for a, b in zip(first[1:], last[1:], strict=True))
        if dt <= 0 or steps <= 0:
            return {}
        out = {
            "samples_per_sec": rows / dt,
            "sequences_per_sec": seqs / dt,
            "tokens_per_sec": slots / dt,
            "real_tokens_per_sec": real / dt,
            "sequences_per_step": seqs / steps,
            "padding_fraction": 1.0 - real / slots if slots else 0.0,
            "step_time": dt / steps,
        }
        if self.flops_per_sample is not None:
            out["flops_per_sec"] = self.flops_per_sample * rows / dt
            if self.mfu_peak is not None:
                out["mfu"] = out["flops_per_sec"] / (self.mfu_peak * self._world)
        return out

    def summary(self) -> dict[str, float]:
        """This invocation's training: totals, and rates from the first logging point on.

        The first logging point is the baseline, so start-up (first step, compilation) is not
        in the rates; ``train_seconds`` is the whole training time, validation excluded.
        """
        if not self._points or self._first_point is None:
            return {}
        last = self._points[-1]
        out = {
            "train_seconds": self._now(),
            "steps": last[5],
            "samples": last[1],
            "real_tokens": last[3],
        }
        if self.flops_per_sample is not None:
            out["flops_per_sample"] = self.flops_per_sample
        return out | self._rates(self._first_point, last)
