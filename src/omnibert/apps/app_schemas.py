"""Structured configs of the roots of ``prepare.yaml``, ``eval.yaml``, ``export.yaml``,
``predict.yaml`` and ``finetune.yaml`` (``pretrain.yaml``'s is in :mod:`omnibert.schema`):
OmegaConf checks each key's type when the config is composed (``max_seq_length=abc`` is refused
naming the key); :func:`check_prepare` checks ``omnibert-prepare``'s ranges before any work (the
other apps' ranges are checked by their typed configs, :mod:`omnibert.config`).

Groups that are ``_target_`` nodes (accelerator, data, optimizer, schedule, task, trainer,
logger) are left open here: :mod:`omnibert.run.pipeline.target_types` checks their keys against the
signature of what they build.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from omnibert.errors import UserError

__all__ = ["SCHEMAS", "check_prepare"]


class AppConfigError(UserError):
    """A value outside its range; the message names the key and the fix."""


def _at_least(key: str, value: Any, low: int | float) -> None:
    if value is not None and value < low:
        raise AppConfigError(f"{key}={value!r} must be at least {low}; fix {key}.")


@dataclass
class TrainVocabNode:
    enabled: bool = False
    vocab_size: int = 30522
    min_frequency: int = 2


@dataclass
class PreparePackNode:
    enabled: bool = False
    algorithm: str = "nnlshp"
    max_sequences_per_pack: int = 3
    max_predictions_per_pack: Optional[int] = None  # noqa: UP045 (OmegaConf reads it)
    name: Optional[str] = None  # noqa: UP045
    overwrite: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrepareConfig:
    """The root of ``conf/prepare.yaml`` (its comments say what each key does)."""

    input_files: Any = MISSING  # a list of patterns, or one comma-separated string
    input_format: str = "text"
    vocab_file: str = MISSING
    output_dir: str = MISSING
    do_lower_case: bool = True
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_whole_word_mask: bool = False
    next_sentence: bool = True
    num_workers: int = 1
    eval_samples: Optional[int] = None  # noqa: UP045
    overwrite: bool = False
    max_shard_size: Any = "500MB"  # "500MB" or a byte count
    progress: bool = True
    train_vocab: TrainVocabNode = field(default_factory=TrainVocabNode)
    pack: PreparePackNode = field(default_factory=PreparePackNode)


def check_prepare(cfg: DictConfig) -> None:
    """Ranges of ``omnibert-prepare``'s keys (InstanceSettings checks the recipe's own)."""
    from omnibert.prepare.instances import InstanceSettings

    settings = InstanceSettings.from_config(cfg)
    try:
        settings.validate()
    except ValueError as err:
        raise AppConfigError(str(err)) from err
    _at_least("random_seed", cfg.random_seed, 0)
    _at_least("num_workers", cfg.num_workers, 1)
    _at_least("eval_samples", cfg.eval_samples, 1)
    _at_least("train_vocab.vocab_size", cfg.train_vocab.vocab_size, 6)
    _at_least("train_vocab.min_frequency", cfg.train_vocab.min_frequency, 1)
    size = cfg.max_shard_size
    if (
        isinstance(size, bool)
        or not isinstance(size, (int, str))
        or (isinstance(size, int) and size < 1)
    ):
        raise AppConfigError(
            f"max_shard_size={size!r} must be a size such as 500MB or a byte count; fix "
            "max_shard_size."
        )


@dataclass
class EvalPhaseNode:
    max_seq_length: Optional[int] = None  # noqa: UP045
    max_predictions_per_seq: Optional[int] = None  # noqa: UP045


@dataclass
class EvalConfig:
    """The root of ``conf/eval.yaml``."""

    ckpt: str = MISSING
    bert_config: Optional[str] = None  # noqa: UP045
    out: Optional[str] = None  # noqa: UP045
    eval_micro_batch_size: int = 32
    precision: Optional[str] = None  # noqa: UP045
    seed: int = 12345
    phase: EvalPhaseNode = field(default_factory=EvalPhaseNode)
    accelerator: Any = MISSING
    data: Any = MISSING


@dataclass
class ExportConfig:
    """The root of ``conf/export.yaml``."""

    ckpt: str = MISSING
    out: str = MISSING
    vocab_file: Optional[str] = None  # noqa: UP045
    bert_config: Optional[str] = None  # noqa: UP045
    overwrite: bool = False
    heads: Optional[str] = None  # noqa: UP045
    do_lower_case: Optional[bool] = None  # noqa: UP045


@dataclass
class PredictConfig:
    """The root of ``conf/predict.yaml``."""

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
    top_k: int = 5
    accelerator: Any = MISSING


@dataclass
class FinetuneDataNode:
    # a Hub name or a local directory, or files (a path, or a mapping of split -> path)
    dataset: Any = None
    train_file: Any = None
    eval_file: Any = None
    test_file: Any = None
    predict_test: bool = False
    cache_dir: Optional[str] = None  # noqa: UP045
    num_workers: int = 0
    padding: str = "longest"
    pad_to_multiple_of: int = 8


@dataclass
class FinetuneModelNode:
    init_from: Optional[str] = None  # noqa: UP045
    bert_config: Optional[str] = None  # noqa: UP045


@dataclass
class FinetuneConfig:
    """The root of ``conf/finetune.yaml`` (its ranges: :class:`omnibert.config.FinetuneConfig`;
    the task's recipe: :func:`omnibert.run.finetuning.inputs.check_inputs`)."""

    paths: Any = MISSING
    accelerator: Any = MISSING
    task: Any = MISSING
    optimizer: Any = MISSING
    schedule: Any = None
    trainer: Any = MISSING
    logger: Any = None
    callbacks: Any = None
    phase: Any = None
    run_name: str = MISSING
    seed: int = 42
    micro_batch_size: Optional[int] = None  # noqa: UP045
    ckpt_path: Optional[str] = None  # noqa: UP045
    data: FinetuneDataNode = field(default_factory=FinetuneDataNode)
    model: FinetuneModelNode = field(default_factory=FinetuneModelNode)


#: ConfigStore name -> schema; each config lists its schema first in its defaults
SCHEMAS = {
    "prepare_schema": PrepareConfig,
    "eval_schema": EvalConfig,
    "export_schema": ExportConfig,
    "predict_schema": PredictConfig,
    "finetune_schema": FinetuneConfig,
}
