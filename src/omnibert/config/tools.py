"""The configs of the tools around a run, each defined once: the schema Hydra composes the
tool's ``conf/<tool>.yaml`` against and, built by ``of``, its typed config:
``omnibert-eval`` (:class:`EvalConfig`), ``omnibert-predict`` (:class:`PredictConfig`) and
``omnibert-export`` (:class:`ExportConfig`, whose app reads the composed config)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from omnibert.config.node import Node, resolve
from omnibert.config.sections import ConfigError, TargetNode, at_least, section
from omnibert.errors import UserError

__all__ = ["EvalConfig", "EvalPhase", "ExportConfig", "PredictConfig"]


@dataclass
class EvalPhase:
    """``phase`` of ``omnibert-eval``: the sequence shape of the eval set (null: the
    checkpoint's)."""

    max_seq_length: Optional[int] = None  # noqa: UP045 (OmegaConf reads the annotation)
    max_predictions_per_seq: Optional[int] = None  # noqa: UP045

    def __post_init__(self) -> None:
        at_least("phase.max_seq_length", self.max_seq_length, 5)
        at_least("phase.max_predictions_per_seq", self.max_predictions_per_seq, 1)


@dataclass
class EvalConfig:
    """``conf/eval.yaml``: a checkpoint on a prepared eval set."""

    ckpt: str = MISSING
    bert_config: Optional[str] = None  # noqa: UP045
    out: Optional[str] = None  # noqa: UP045
    eval_micro_batch_size: int = 32
    #: None: the precision the checkpoint's run validated in (else fp32)
    precision: Optional[str] = None  # noqa: UP045
    seed: int = 12345
    phase: EvalPhase = field(default_factory=EvalPhase)
    accelerator: TargetNode = MISSING
    data: TargetNode = MISSING

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError]) -> EvalConfig:
        c = resolve(cfg, "e.g. omnibert-eval ckpt=<checkpoint> data.eval_path=<dir>", error)
        return section(
            cls, c, accelerator=Node(c["accelerator"], "accelerator"), data=Node(c["data"], "data")
        )

    def __post_init__(self) -> None:
        at_least("eval_micro_batch_size", self.eval_micro_batch_size, 1)

    @property
    def eval_path(self) -> Any:
        return self.data.get("eval_path")


@dataclass
class PredictConfig:
    """``conf/predict.yaml``: what a fine-tuned run (or a pretrained model: masked words)
    predicts, and how."""

    ckpt: str = MISSING
    task_name: Optional[str] = None  # noqa: UP045
    question: Optional[str] = None  # noqa: UP045
    context: Optional[str] = None  # noqa: UP045
    text: Optional[str] = None  # noqa: UP045
    text_pair: Optional[str] = None  # noqa: UP045
    input_file: Optional[str] = None  # noqa: UP045
    out: Optional[str] = None  # noqa: UP045
    batch_size: Optional[int] = None  # noqa: UP045
    precision: str = "32-true"
    #: fill-mask: predictions per [MASK]
    top_k: int = 5
    accelerator: TargetNode = MISSING

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError]) -> PredictConfig:
        c = resolve(cfg, "e.g. omnibert-predict ckpt=<run> text=...", error)
        try:
            return section(cls, c, accelerator=Node(c["accelerator"], "accelerator"))
        except ConfigError as err:  # the app's own error class, as its callers expect
            raise error(str(err)) from err

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size={self.batch_size} must be a positive integer.")
        if self.top_k < 1:
            raise ConfigError(
                f"top_k={self.top_k} must be a positive integer (predictions per [MASK])."
            )

    def given(self, key: str) -> str | None:
        """The text given as ``key`` (``question``, ``context``, ``text``, ``text_pair``)."""
        value: str | None = getattr(self, key)
        return value


@dataclass
class ExportConfig:
    """``conf/export.yaml`` (its comments say what each key does)."""

    ckpt: str = MISSING
    out: str = MISSING
    vocab_file: Optional[str] = None  # noqa: UP045
    bert_config: Optional[str] = None  # noqa: UP045
    overwrite: bool = False
    heads: Optional[str] = None  # noqa: UP045
    do_lower_case: Optional[bool] = None  # noqa: UP045
