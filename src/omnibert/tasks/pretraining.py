"""``PretrainingTask``: BERT masked-LM + next-sentence pretraining as a LightningModule.

The module holds plain data only (``hparams``: the model config as a dict, the optimizer and
schedule as ``_target_`` dicts, paths as strings), so every checkpoint reloads from itself
with :meth:`PretrainingTask.load_from_checkpoint` and opens with
``torch.load(path, weights_only=True)``; ``state_dict`` keys are ``"model." + <HF name>``.

Metrics (Lightning logging steps only, aggregated over the optimiser step's micro-batches and
summed over ranks with one collective; nothing is read on the host inside a step, and the
progress bar's ``train/loss`` is kept on the host, read once per logging step): ``train/loss``, ``train/mlm_loss``, ``train/nsp_loss``
(means of the micro-batch losses the optimiser minimised), ``train/mlm_acc``, ``train/nsp_acc``
(exact: correct / count over the step's predictions), ``train/grad_norm`` (global L2 norm of
the accumulated gradient before any clipping in the optimiser, one ``foreach`` pass) and
``train/lr``. Validation sums weighted correct predictions, counts and losses with
torchmetrics ``SumMetric``s (synced across ranks), so ``val/mlm_acc``, ``val/nsp_acc`` and the
``val/*loss`` values are exact over the whole eval set, not means of batch means.
Next to them, ``val/mlm_majority_baseline`` and ``val/nsp_majority_baseline``: the accuracy
of always predicting the eval set's own most frequent masked token / NSP label, from
weighted label histograms of the rows evaluated (:class:`LabelHistogram`, synced the same
way): what an accuracy has to beat to mean anything (the demo's eval set is 59.5 %
random-next pairs, so NSP's baseline is 0.595, not the 0.5 of chance). ``val/samples``: the
sequences evaluated (the rows' ``nsp_weights``, whatever the model's heads).

A model without a next-sentence head (``model.config.next_sentence_head=false``, the MLM-only
objective of RoBERTa, MosaicBERT and ModernBERT) returns ``nsp_count`` 0 and
``loss = mlm_loss``; the task then logs and reports no ``*nsp*`` metric at all (no 0/0 accuracy)
and ``val/loss`` is the masked-LM loss. Which metrics exist is decided once, from the model's
config (:func:`~omnibert.config.sections.next_sentence_objective`), never inside ``forward``.

Every rank's RNG states travel in the checkpoint and each rank draws dropout from a stream of
its own (:class:`~omnibert.tasks.base.TrainingTask`, for every task).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor, nn
from torchmetrics import Metric, SumMetric

from omnibert.config.sections import next_sentence_objective
from omnibert.errors import UserError
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.models.bert import OUTPUT_KEYS
from omnibert.optim.accumulation import MicroBatchClipper
from omnibert.optim.lamb_math import global_grad_norm
from omnibert.tasks.base import TrainingTask, UpdateRule, plain
from omnibert.tokenization.vocab import sha256_file

log = logging.getLogger(__name__)

#: per-micro-batch training statistics, summed over an optimiser step ("n": micro-batches)
TRAIN_STATS = (*OUTPUT_KEYS, "n")
#: validation sums over the whole eval set
VAL_SUMS = (
    "mlm_correct",
    "mlm_count",
    "nsp_correct",
    "nsp_count",
    "mlm_loss",
    "nsp_loss",
    "samples",
)


def weighted_label_counts(labels: Tensor, weights: Tensor, num_labels: int) -> Tensor:
    """Sum of ``weights`` per label id ``0 .. num_labels - 1`` (ids outside are left out): what
    ``torch.bincount(labels, weights)[:num_labels]`` computes, float32. Not bincount: with
    ``weights`` its CUDA kernel raises under ``torch.use_deterministic_algorithms(True)``
    (``trainer.deterministic``); ``index_add_`` takes a deterministic kernel in that mode, and
    outside it the data's 0/1 weights sum exactly in any order."""
    labels = labels.reshape(-1).long()
    weights = weights.reshape(-1).float()
    inside = (labels >= 0) & (labels < num_labels)
    counts = torch.zeros(num_labels, dtype=torch.float32, device=labels.device)
    return counts.index_add_(0, labels.clamp(0, num_labels - 1), torch.where(inside, weights, 0.0))


class LabelHistogram(Metric):
    """Weighted counts of each label id over everything :meth:`update` saw, summed across
    ranks; :meth:`compute` is the majority label's share (the accuracy of always predicting
    it), 0 before anything was counted."""

    full_state_update = False

    def __init__(self, num_labels: int) -> None:
        super().__init__()
        self.num_labels = int(num_labels)
        self.add_state("counts", default=torch.zeros(self.num_labels), dist_reduce_fx="sum")

    def update(self, labels: Tensor, weights: Tensor) -> None:
        state: Tensor = self.counts  # type: ignore[assignment]
        counts = weighted_label_counts(labels, weights, self.num_labels)
        state += counts.to(state.dtype)

    def compute(self) -> Tensor:
        counts: Tensor = self.counts  # type: ignore[assignment]
        return counts.max() / counts.sum().clamp(min=1e-12)


def _sha256(path: str | None) -> str | None:
    if path is None or not Path(path).is_file():
        return None
    return sha256_file(path)


class PretrainingTask(TrainingTask):
    """BERT pretraining (MLM + NSP, or MLM only without a next-sentence head) with LAMB/AdamW
    and a per-step LR schedule.

    Args:
        model_config: :class:`~omnibert.models.BertConfig` fields (``vocab_size`` resolved).
        optimizer: a ``_partial_`` optimiser config, called with ``model.named_parameters()``
            (``None``: the task only evaluates, as in ``omnibert-eval``).
        schedule: a ``_partial_`` LR-scheduler config called with the optimiser and
            ``total_steps``, stepped every optimiser step; ``None`` keeps the LR constant.
        total_steps: the run's optimiser steps (``phase.max_steps``): the schedule's length
            (``None``: the Trainer's ``max_steps``).
        init_from: where a fresh run's initial weights came from (recorded; the run loads
            them: :mod:`omnibert.checkpoints.init_from`): a Hugging Face BERT directory, a Lightning
            ``.ckpt`` of an earlier phase, or the prefix of a Google / MLPerf TensorFlow 1
            checkpoint (weights only; the optimiser and schedule start fresh).
        init_bert_config: the Google ``bert_config.json`` of a TensorFlow 1 ``init_from``
            (``None``: the one next to the checkpoint).
        vocab_file: the vocab.txt the data was tokenised with, kept for exports as an
            absolute path (an export runs from anywhere) with its sha256 (``vocab_sha256``,
            computed here when not given), so an export notices a file changed since.
        clip_grad_per_micro_batch: clip each micro-batch's gradient to this global norm
            before accumulation (MLPerf TF order, ``optimizer=lamb_mlperf``); ``None``: off.
        do_lower_case: whether the training text was lower-cased (the data's
            ``metadata.json``; ``None`` where the data does not say), kept so that an export's
            tokenizer reads text as the model was trained.
    """

    def __init__(
        self,
        model_config: Mapping[str, Any],
        optimizer: Mapping[str, Any] | None = None,
        schedule: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        init_from: str | None = None,
        vocab_file: str | None = None,
        clip_grad_per_micro_batch: float | None = None,
        init_bert_config: str | None = None,
        vocab_sha256: str | None = None,
        do_lower_case: bool | None = None,
    ) -> None:
        super().__init__()
        config = BertConfig(**plain(model_config))
        hparams = {
            "model_config": dataclasses.asdict(config),
            "optimizer": plain(optimizer),
            "schedule": plain(schedule),
            "total_steps": total_steps,
            "init_from": None if init_from is None else str(init_from),
            "vocab_file": None if vocab_file is None else str(Path(vocab_file).absolute()),
            "vocab_sha256": vocab_sha256 if vocab_sha256 is not None else _sha256(vocab_file),
            "clip_grad_per_micro_batch": clip_grad_per_micro_batch,
            "init_bert_config": None if init_bert_config is None else str(init_bert_config),
            "do_lower_case": None if do_lower_case is None else bool(do_lower_case),
        }
        self.save_hyperparameters(hparams)
        self.update_rule = UpdateRule(plain(optimizer), plain(schedule), total_steps)
        #: MLPerf's clipping of each micro-batch's gradient (None: off)
        self.clip_grad_per_micro_batch = clip_grad_per_micro_batch
        self.config = config
        #: the objective has next-sentence prediction (the NSP metrics exist)
        self.next_sentence = next_sentence_objective(config)
        self.model = BertForPreTraining(config)
        self.val_sums = nn.ModuleDict({k: SumMetric(nan_strategy="disable") for k in VAL_SUMS})
        self.val_labels = nn.ModuleDict(
            {"mlm": LabelHistogram(config.vocab_size), "nsp": LabelHistogram(2)}
        )
        self.clipper: MicroBatchClipper | None = None
        self.last_validation: dict[str, float] | None = None
        self._train_sums: Tensor | None = None
        self._step_sums: Tensor | None = None  # the last optimiser step's

    # ------------------------------------------------------------------ training
    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        out = self.model(batch)
        stats = torch.stack([out[k].detach().float() for k in TRAIN_STATS[:-1]])
        stats = torch.cat([stats, stats.new_ones(1)])
        self._train_sums = stats if self._train_sums is None else self._train_sums + stats
        loss: Tensor = out["loss"]
        return loss

    def on_before_backward(self, loss: Tensor) -> None:
        super().on_before_backward(loss)  # the gradient tensors first: the clipper sets them aside
        if self.clipper is not None:
            self.clipper.before_backward()

    def on_after_backward(self) -> None:
        if self.clipper is not None:
            self.clipper.after_backward()

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        sums, self._train_sums = self._train_sums, None
        self._step_sums = sums
        every = int(getattr(self.trainer, "log_every_n_steps", 0))
        if sums is None or every <= 0 or (self.trainer.global_step + 1) % every:
            return
        sums = self.trainer.strategy.reduce(sums, reduce_op="sum")
        s = dict(zip(TRAIN_STATS, sums, strict=True))
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = global_grad_norm(grads)
        if self._shard_group is not None:  # each rank holds shards: sum the squares
            import torch.distributed as dist

            squared = grad_norm.square()
            dist.all_reduce(squared, group=self._shard_group)
            grad_norm = squared.sqrt()
        metrics = {
            "train/mlm_loss": s["mlm_loss"] / s["n"],
            "train/mlm_acc": s["mlm_correct"] / s["mlm_count"].clamp(min=1.0),
            "train/grad_norm": grad_norm,
            "train/lr": float(optimizer.param_groups[0]["lr"]),
        }
        if self.next_sentence:
            metrics["train/nsp_loss"] = s["nsp_loss"] / s["n"]
            metrics["train/nsp_acc"] = s["nsp_correct"] / s["nsp_count"].clamp(min=1.0)
        # on the host: Lightning turns progress-bar values into numbers after every micro-batch
        # (a device tensor would make each one wait for the device); read once here, where the
        # logging step reads its metrics anyway
        loss = (s["loss"] / s["n"]).cpu()
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        self.log_dict(metrics, on_step=True, on_epoch=False)

    def last_step_loss(self) -> float | None:
        sums = self._step_sums
        if sums is None:
            return None
        s = dict(zip(TRAIN_STATS, sums.tolist(), strict=True))
        return s["loss"] / max(s["n"], 1.0)

    # ------------------------------------------------------------------ validation
    def _val_sum(self, name: str) -> SumMetric:
        return cast(SumMetric, self.val_sums[name])

    def validation_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> None:
        out = self.model(batch)
        for key in ("mlm_correct", "mlm_count", "nsp_correct", "nsp_count"):
            self._val_sum(key).update(out[key].detach().float())
        # the losses are weighted means over the batch's real slots: weight them back
        self._val_sum("mlm_loss").update((out["mlm_loss"] * out["mlm_count"]).detach().float())
        self._val_sum("nsp_loss").update((out["nsp_loss"] * out["nsp_count"]).detach().float())
        self._val_sum("samples").update(batch["nsp_weights"].detach().float().sum())
        labels = cast(LabelHistogram, self.val_labels["mlm"])
        labels.update(batch["masked_lm_ids"], batch["masked_lm_weights"])
        if self.next_sentence:
            labels = cast(LabelHistogram, self.val_labels["nsp"])
            labels.update(batch["nsp_labels"], batch["nsp_weights"])

    def validation_metrics(self) -> dict[str, Tensor]:
        """The metrics of everything :meth:`validation_step` saw since the last call, summed
        over every rank (masked-LM accuracy = weighted correct / weights, MLPerf's), and a
        reset of the sums. The ``val/nsp_*`` ones only where the objective has next-sentence
        prediction; ``val/loss`` is the objective's loss."""
        sums = {k: self._val_sum(k).compute() for k in VAL_SUMS}  # synced over ranks
        for key in VAL_SUMS:
            self._val_sum(key).reset()
        used = ("mlm", "nsp") if self.next_sentence else ("mlm",)
        baselines = {k: cast(LabelHistogram, self.val_labels[k]).compute() for k in used}
        for metric in self.val_labels.values():
            cast(LabelHistogram, metric).reset()
        mlm_loss = sums["mlm_loss"] / sums["mlm_count"]
        metrics = {
            "val/mlm_acc": sums["mlm_correct"] / sums["mlm_count"],
            "val/mlm_majority_baseline": baselines["mlm"],
            "val/mlm_loss": mlm_loss,
            "val/loss": mlm_loss,
            "val/mlm_count": sums["mlm_count"],
            "val/samples": sums["samples"],
        }
        if self.next_sentence:
            nsp_loss = sums["nsp_loss"] / sums["nsp_count"]
            metrics |= {
                "val/nsp_acc": sums["nsp_correct"] / sums["nsp_count"],
                "val/nsp_majority_baseline": baselines["nsp"],
                "val/nsp_loss": nsp_loss,
                "val/loss": mlm_loss + nsp_loss,
                "val/nsp_count": sums["nsp_count"],
            }
        return metrics

    def on_validation_epoch_end(self) -> None:
        metrics = self.validation_metrics()
        self.last_validation = {"step": float(self.global_step)}
        self.last_validation |= {k: float(v) for k, v in metrics.items()}
        self.log("val/mlm_acc", metrics.pop("val/mlm_acc"), prog_bar=True)
        self.log_dict(metrics)

    # ------------------------------------------------------------------ optimisation
    def configured_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        clip = self.clip_grad_per_micro_batch
        if clip is not None and self._shard_group is not None:
            raise UserError(
                "clip_grad_per_micro_batch (MLPerf's per-micro-batch clipping) is not "
                "implemented for sharded parameters; with accelerator.strategy=fsdp set "
                "clip_grad_per_micro_batch=null (LAMB clips the accumulated gradient)."
            )
        if clip is not None:
            self.clipper = MicroBatchClipper(
                self.model.parameters(),
                float(clip),
                grads_prescaled_by=self.trainer.accumulate_grad_batches,
            )
