"""The typed configs of the tools around a run: ``omnibert-eval`` (:class:`EvalConfig`) and
``omnibert-predict`` (:class:`PredictConfig`), built once from the composed config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from omnibert.config.node import Node, resolve
from omnibert.config.sections import at_least
from omnibert.errors import UserError

__all__ = ["EvalConfig", "PredictConfig"]


@dataclass(frozen=True)
class EvalConfig:
    """``conf/eval.yaml``: a checkpoint on a prepared eval set."""

    raw: Mapping[str, Any]
    ckpt: str
    bert_config: str | None
    out: str | None
    eval_micro_batch_size: int
    #: None: the precision the checkpoint's run validated in (else fp32)
    precision: str | None
    seed: int
    accelerator: Node
    data: Node

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError]) -> EvalConfig:
        c = resolve(cfg, "e.g. omnibert-eval ckpt=<checkpoint> data.eval_path=<dir>", error)
        size = c["eval_micro_batch_size"]
        at_least("eval_micro_batch_size", size, 1)
        phase = c.get("phase") or {}
        at_least("phase.max_seq_length", phase.get("max_seq_length"), 5)
        at_least("phase.max_predictions_per_seq", phase.get("max_predictions_per_seq"), 1)
        return cls(
            c,
            str(c["ckpt"]),
            c.get("bert_config"),
            c.get("out"),
            int(size),
            None if c.get("precision") is None else str(c["precision"]),
            int(c["seed"]),
            Node(c["accelerator"], "accelerator"),
            Node(c["data"], "data"),
        )

    @property
    def eval_path(self) -> Any:
        return self.data.get("eval_path")


@dataclass(frozen=True)
class PredictConfig:
    """``conf/predict.yaml``: what a fine-tuned run (or a pretrained model: masked words)
    predicts, and how."""

    ckpt: str
    task_name: str | None
    question: str | None
    context: str | None
    text: str | None
    text_pair: str | None
    input_file: str | None
    out: str | None
    batch_size: int | None
    precision: str
    accelerator: Node
    #: fill-mask: predictions per [MASK]
    top_k: int = 5

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError]) -> PredictConfig:
        c = resolve(cfg, "e.g. omnibert-predict ckpt=<run> text=...", error)

        def text(key: str) -> str | None:
            return None if c.get(key) is None else str(c[key])

        batch = c.get("batch_size")
        if batch is not None and int(batch) < 1:
            raise error(f"batch_size={batch} must be a positive integer.")
        top_k = int(c.get("top_k", 5))
        if top_k < 1:
            raise error(f"top_k={top_k} must be a positive integer (predictions per [MASK]).")
        return cls(
            str(c["ckpt"]),
            text("task_name"),
            text("question"),
            text("context"),
            text("text"),
            text("text_pair"),
            text("input_file"),
            text("out"),
            None if batch is None else int(batch),
            str(c.get("precision", "32-true")),
            Node(c["accelerator"], "accelerator"),
            top_k,
        )

    def given(self, key: str) -> str | None:
        """The text given as ``key`` (``question``, ``context``, ``text``, ``text_pair``)."""
        value: str | None = getattr(self, key)
        return value
