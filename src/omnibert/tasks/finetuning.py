"""Fine-tuning LightningModules: extractive QA (SQuAD) and sentence (pair) classification or
regression (GLUE; STS-B with one output) on the BERT encoder.

Like :class:`~omnibert.tasks.PretrainingTask` they keep plain data in ``hparams`` (the model
config, the optimiser and schedule ``_target_`` dicts, the task's recipe, where the encoder
came from, the vocab), so a fine-tuned checkpoint reloads from itself with
``load_from_checkpoint`` (what ``omnibert-predict`` does). ``state_dict`` keys are
``"model." + <Hugging Face name>`` (``bert.*``, ``qa_outputs.*``, ``classifier.*``).

The encoder's weights come from :meth:`FineTuningTask.load_encoder` (a model read by
:func:`omnibert.checkpoints.reading.load_pretrained`); the head stays freshly initialised,
unless the checkpoint is a Hugging Face fine-tuned model with this task's head, and the keys
that were new are returned for the run's log. The optimiser is the configured one
(AdamW, no decay on bias/LayerNorm) with the configured per-step schedule (linear warmup and
decay). The training losses of every step are kept (``train_losses``) for the summary.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from omnibert.config.recorded import RecordedRecipe
from omnibert.models import BertConfig
from omnibert.models.heads import (
    HEAD_KEYS,
    BertForQuestionAnswering,
    BertForSequenceClassification,
)
from omnibert.tasks.base import TrainingTask, UpdateRule, plain

__all__ = ["FineTuningTask", "QuestionAnsweringTask", "SequenceClassificationTask"]


class FineTuningTask(TrainingTask):
    """What both fine-tuning tasks share: hparams, encoder loading, optimisation, losses.

    Args:
        model_config: :class:`~omnibert.models.BertConfig` fields (the checkpoint's).
        optimizer: a ``_partial_`` optimiser config called with ``named_parameters()``.
        schedule: a ``_partial_`` LR-scheduler config called with the optimiser and
            ``total_steps``; ``None`` keeps the LR constant.
        total_steps: the run's optimiser steps (epochs × steps per epoch).
        recipe: the task node's settings (``conf/task/<name>.yaml`` without ``_target_``):
            sequence lengths, post-processing limits, the ``data`` node
            (:mod:`omnibert.finetune.spec`), ...; inference reads them back.
        init_from: where the encoder came from (recorded; the app loads it).
        vocab_file: the vocab.txt the data is tokenised with (the run's copy).
        **settings: the task node's keys when the app instantiates it
            (``instantiate(cfg.task)(...)``): merged into ``recipe``.
    """

    head = "question_answering"

    def __init__(
        self,
        model_config: Mapping[str, Any],
        optimizer: Mapping[str, Any] | None = None,
        schedule: Mapping[str, Any] | None = None,
        total_steps: int | None = None,
        recipe: Mapping[str, Any] | None = None,
        init_from: str | None = None,
        vocab_file: str | None = None,
        **settings: Any,
    ) -> None:
        super().__init__()
        config = BertConfig(**plain(model_config))
        recipe = {**(plain(recipe) or {}), **(plain(settings) or {})}
        self.save_hyperparameters(
            {
                "model_config": dataclasses.asdict(config),
                "optimizer": plain(optimizer),
                "schedule": plain(schedule),
                "total_steps": total_steps,
                "recipe": recipe,
                "init_from": None if init_from is None else str(init_from),
                "vocab_file": None if vocab_file is None else str(vocab_file),
            }
        )
        self.update_rule = UpdateRule(plain(optimizer), plain(schedule), total_steps)
        self.config = config
        #: the recipe read back typed (what a checkpoint of this task records)
        self.recipe = RecordedRecipe(recipe)
        self.model = self.build_model(config)
        self.train_losses: list[Tensor] = []

    def build_model(self, config: BertConfig) -> nn.Module:
        raise NotImplementedError

    def load_encoder(
        self,
        encoder_state: Mapping[str, Tensor],
        fresh: tuple[str, ...],
        head: Mapping[str, Tensor] | None = None,
    ) -> list[str]:
        """Copy the pretrained encoder (``bert.*`` keys without the prefix) in, and ``head``
        (this task's head of a fine-tuned model, under its :data:`HEAD_KEYS` names) when
        given; returns the parameter names left freshly initialised (the head when not given,
        and the pooler when the checkpoint had none: ``fresh`` lists such encoder modules,
        e.g. ``bert.pooler``)."""
        bert: nn.Module = self.model.bert  # type: ignore[assignment]
        bert.load_state_dict(dict(encoder_state), strict=True)
        new = list(HEAD_KEYS[self.head])
        if head is not None:
            with torch.no_grad():
                for name in new:
                    self.model.get_parameter(name).copy_(head[name])
            new = []
        for module in fresh:
            if module.startswith("bert."):
                sub = bert.get_submodule(module.removeprefix("bert."))
                new += [f"{module}.{name}" for name, _ in sub.named_parameters()]
        return new

    def _record(self, loss: Tensor) -> Tensor:
        self.train_losses.append(loss.detach().float())
        self.log("train/loss", loss, on_step=True, on_epoch=False, prog_bar=True)
        return loss

    def last_step_loss(self) -> float | None:
        """The last micro-batch's loss (read when a step went wrong)."""
        return float(self.train_losses[-1]) if self.train_losses else None

    def losses(self) -> list[float]:
        """Every training micro-batch's loss so far, as floats (one host sync)."""
        if not self.train_losses:
            return []
        return [float(x) for x in torch.stack(self.train_losses).cpu()]


class QuestionAnsweringTask(FineTuningTask):
    """SQuAD: start/end logits, loss = mean of the two cross-entropies."""

    head = "question_answering"

    def build_model(self, config: BertConfig) -> nn.Module:
        return BertForQuestionAnswering(config)

    def forward(self, batch: Mapping[str, Tensor]) -> tuple[Tensor, Tensor]:
        start, end = self.model(batch["input_ids"], batch["segment_ids"], batch["attention_mask"])
        return start, end

    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        start, end = self(batch)
        loss = BertForQuestionAnswering.loss(
            start, end, batch["start_positions"], batch["end_positions"], batch["attention_mask"]
        )
        return self._record(loss)


class SequenceClassificationTask(FineTuningTask):
    """GLUE sentence(-pair) classification: logits over the recipe's ``num_labels`` classes,
    cross-entropy; with ``num_labels: 1`` a regression (STS-B): one score, mean squared error
    (Hugging Face's ``problem_type="regression"``)."""

    head = "classification"

    def build_model(self, config: BertConfig) -> nn.Module:
        return BertForSequenceClassification(config, self.recipe.num_labels)

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        logits: Tensor = self.model(
            batch["input_ids"], batch["segment_ids"], batch["attention_mask"]
        )
        return logits

    def training_step(self, batch: Mapping[str, Tensor], batch_idx: int) -> Tensor:
        logits = self(batch)
        if logits.shape[-1] == 1:
            loss = torch.nn.functional.mse_loss(logits[:, 0], batch["labels"].float())
        else:
            loss = BertForSequenceClassification.loss(logits, batch["labels"])
        return self._record(loss)
