"""``omnibert-finetune``'s config, typed: built once from the composed config, frozen, every
range checked beside its field (the task's recipe against its data is checked with the data:
:func:`omnibert.run.finetuning.inputs.check_inputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from omegaconf import DictConfig

from omnibert.config.node import Node, interpolation_origins, resolve
from omnibert.config.sections import (
    Accelerator,
    Checkpointing,
    ConfigError,
    Model,
    Paths,
    Trainer,
    at_least,
    shared_sections,
)
from omnibert.errors import UserError

__all__ = ["PADDINGS", "FinetuneConfig", "FinetuneData"]

EXAMPLE = (
    "e.g. omnibert-finetune task=mrpc model.init_from=<checkpoint> (data from the Hub's "
    "nyu-mll/glue, or data.train_file=train.tsv data.eval_file=dev.tsv)"
)
#: ``data.padding``: each batch cut to its longest row, or kept at ``task.max_seq_length``
PADDINGS = ("longest", "max_length")


@dataclass(frozen=True)
class FinetuneData:
    """``data`` of a fine-tuning run (``conf/finetune.yaml`` documents each key)."""

    dataset: Any
    train_file: Any
    eval_file: Any
    test_file: Any
    predict_test: bool
    cache_dir: str | None
    num_workers: int
    padding: str
    pad_to_multiple_of: int

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> FinetuneData:
        return cls(
            values.get("dataset"),
            values.get("train_file"),
            values.get("eval_file"),
            values.get("test_file"),
            bool(values.get("predict_test")),
            values.get("cache_dir"),
            int(values.get("num_workers", 0)),
            str(values.get("padding", "longest")),
            int(values.get("pad_to_multiple_of", 8)),
        )

    def __post_init__(self) -> None:
        at_least("data.num_workers", self.num_workers, 0)
        at_least("data.pad_to_multiple_of", self.pad_to_multiple_of, 1)
        if self.padding not in PADDINGS:
            raise ConfigError(
                f"data.padding={self.padding!r} is not one of {', '.join(PADDINGS)}: longest "
                "cuts each batch to its longest row, max_length keeps task.max_seq_length."
            )

    @property
    def local(self) -> bool:
        """Files are configured: a run on local files never reaches the Hub."""
        return any((self.train_file, self.eval_file, self.test_file))

    def source(self) -> dict[str, Any]:
        """The keys :mod:`omnibert.finetune.sources` reads, as it reads them."""
        return {
            "dataset": self.dataset,
            "train_file": self.train_file,
            "eval_file": self.eval_file,
            "test_file": self.test_file,
            "cache_dir": self.cache_dir,
        }


@dataclass(frozen=True)
class FinetuneConfig:
    """One fine-tuning run, as ``conf/finetune.yaml`` composes it."""

    raw: Mapping[str, Any]
    paths: Paths
    accelerator: Accelerator
    model: Model
    data: FinetuneData
    task: Node
    optimizer: Node
    schedule: Node | None
    trainer: Trainer
    loggers: tuple[Node, ...]
    callbacks: tuple[Node, ...]
    run_name: str
    seed: int
    micro_batch_size: int | None
    ckpt_path: str | None
    #: ``callbacks.checkpoint``'s settings, checked (None: no checkpoint callback)
    checkpointing: Checkpointing | None = None
    #: keys whose value came from another key by interpolation -> that key (messages name
    #: the key the user typed: config.node.interpolation_origins)
    origins: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError] = ConfigError) -> FinetuneConfig:
        """Resolve ``cfg`` (a problem is one ``error`` sentence) and check every range."""
        c = resolve(cfg, EXAMPLE, error, missing_first=False)
        at_least("micro_batch_size", c.get("micro_batch_size"), 1)
        return cls(
            raw=MappingProxyType(c),
            data=FinetuneData.of(c["data"]),
            origins=MappingProxyType(interpolation_origins(cfg)),
            **shared_sections(c),
        )

    @property
    def task_name(self) -> str:
        return str(self.task.get("name"))

    @property
    def recipe(self) -> dict[str, Any]:
        """The task node's settings (its keys without ``_target_`` and the like)."""
        return {k: v for k, v in self.task.items() if not str(k).startswith("_")}

    def target_nodes(self) -> list[Node]:
        """Every ``_target_`` node of the run, for checks of what they build."""
        found = [self.accelerator.node, self.task, self.optimizer, self.trainer.node]
        found += [self.schedule] if self.schedule is not None else []
        return [*found, *self.loggers, *self.callbacks]
