"""``omnibert-finetune``'s config, typed and defined once: the schema Hydra composes
``conf/finetune.yaml`` against and, built by :meth:`FinetuneConfig.of`, the run's config with
every range checked beside its field (the task's recipe against its data is checked with the data:
:func:`omnibert.run.finetuning.inputs.check_inputs`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Optional

from omegaconf import MISSING, DictConfig

from omnibert.config.node import (
    Composition,
    Node,
    interpolation_origins,
    resolve,
    with_composition,
)
from omnibert.config.sections import (
    DERIVED_TRAINER_KEYS,
    NO_NODES,
    AcceleratorSection,
    Checkpointing,
    ConfigError,
    InitialWeights,
    JobSections,
    Nodes,
    OptimizerNode,
    Paths,
    TargetNode,
    TrainerSection,
    at_least,
    refuse_unknown_keys,
    section,
    shared_sections,
)
from omnibert.errors import UserError

__all__ = ["PADDINGS", "FinetuneConfig", "FinetuneData", "Recipe"]

EXAMPLE = (
    "e.g. omnibert-finetune task=mrpc model.init_from=<checkpoint> (data from the Hub's "
    "nyu-mll/glue, or data.train_file=train.tsv data.eval_file=dev.tsv)"
)
#: ``data.padding``: each batch cut to its longest row, or kept at ``task.max_seq_length``
PADDINGS = ("longest", "max_length")


@dataclass
class FinetuneData:
    """``data`` of a fine-tuning run (``conf/finetune.yaml`` documents each key)."""

    # a Hub name or a local directory, or files (a path, or a mapping of split -> path)
    dataset: Any = None
    train_file: Any = None
    eval_file: Any = None
    test_file: Any = None
    predict_test: bool = False
    cache_dir: Optional[str] = None  # noqa: UP045 (OmegaConf reads the annotation)
    num_workers: int = 0
    padding: str = "longest"
    pad_to_multiple_of: int = 8

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
class Recipe:
    """A fine-tuning task's recipe: the task node's own keys (``conf/task/<name>.yaml``
    without ``_target_`` and the like), those the run reads as typed fields, ``settings`` all
    of them as the task's data (features, predictions) and the checkpoint read and keep
    them."""

    name: str
    epochs: int
    batch_size: int
    eval_batch_size: int
    max_seq_length: int
    #: the peak LR (``task.lr``; None: the optimizer node's own)
    lr: float | None = None
    #: GLUE's classes (1: a regression score); None: a task without a classifier (SQuAD)
    num_labels: int | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)

    #: the keys that must be whole numbers of at least 1
    COUNTS = ("epochs", "batch_size", "max_seq_length", "eval_batch_size")

    @classmethod
    def of(cls, values: Mapping[str, Any], error: type[UserError] = ConfigError) -> Recipe:
        """The recipe of a task node's (or a checkpoint's recorded) ``values``; a count that is
        not a positive integer is one ``error`` sentence naming ``task.<key>``."""
        settings = {k: v for k, v in values.items() if not str(k).startswith("_")}
        for key in cls.COUNTS:
            value = settings.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise error(f"task.{key}={value!r} must be a positive integer; fix it.")
        lr, labels = settings.get("lr"), settings.get("num_labels")
        return cls(
            name=str(settings.get("name")),
            epochs=int(settings["epochs"]),
            batch_size=int(settings["batch_size"]),
            eval_batch_size=int(settings["eval_batch_size"]),
            max_seq_length=int(settings["max_seq_length"]),
            lr=float(lr) if isinstance(lr, int | float) and not isinstance(lr, bool) else None,
            num_labels=None if labels is None else int(labels),
            settings=MappingProxyType(settings),
        )

    def plain(self) -> dict[str, Any]:
        """The settings as a plain dict (what the task's data functions take)."""
        return dict(self.settings)


@dataclass
class FinetuneConfig(JobSections):
    """One fine-tuning run: the schema ``conf/finetune.yaml`` is composed against and, built
    by :meth:`of`, the run's typed config (``_target_`` nodes: :class:`Node` values)."""

    paths: Paths = MISSING
    accelerator: AcceleratorSection = MISSING
    task: TargetNode = MISSING
    optimizer: OptimizerNode = MISSING
    schedule: Optional[TargetNode] = None  # noqa: UP045
    trainer: TrainerSection = MISSING
    logger: Nodes = NO_NODES
    callbacks: Nodes = NO_NODES
    #: the recipe as the shared groups read it (``conf/finetune.yaml``), the task's
    phase: Any = None
    run_name: str = MISSING
    seed: int = 42
    micro_batch_size: Optional[int] = None  # noqa: UP045
    ckpt_path: Optional[str] = None  # noqa: UP045
    data: FinetuneData = field(default_factory=FinetuneData)
    model: InitialWeights = field(default_factory=InitialWeights)

    @classmethod
    def of(cls, cfg: DictConfig, error: type[UserError] = ConfigError) -> FinetuneConfig:
        """Resolve ``cfg`` (a problem is one ``error`` sentence) and check every range."""
        c = resolve(cfg, EXAMPLE, error, missing_first=False)
        refuse_unknown_keys(c, cls)
        config = cls(
            data=section(FinetuneData, c["data"], "data"),
            model=section(InitialWeights, c["model"], "model"),
            phase=c.get("phase"),
            **shared_sections(c),
        )
        composed = Composition(
            MappingProxyType(c), origins=MappingProxyType(interpolation_origins(cfg))
        )
        return with_composition(config, composed)

    def __post_init__(self) -> None:
        at_least("micro_batch_size", self.micro_batch_size, 1)
        Checkpointing.among(self.callbacks)  # its ranges, now
        epochs = "task.epochs (the steps are epochs x steps per epoch)"
        self.trainer.refuse_derived(
            self.accelerator.node,
            {
                **DERIVED_TRAINER_KEYS,
                "accumulate_grad_batches": "task.batch_size over micro_batch_size",
                "limit_val_batches": "the task (it evaluates after training)",
            },
            {"max_steps": (-1, epochs), "max_epochs": (-1, epochs)},
        )

    @property
    def task_name(self) -> str:
        return str(self.task.get("name"))

    def recipe(self, error: type[UserError] = ConfigError) -> Recipe:
        """The task's :class:`Recipe` (a count that is not a positive integer: one ``error``
        sentence)."""
        return Recipe.of(self.task, error)

    def target_nodes(self) -> list[Node]:
        """Every ``_target_`` node of the run, for checks of what they build."""
        found = [self.accelerator.node, self.task, self.optimizer, self.trainer.node]
        found += [self.schedule] if self.schedule is not None else []
        return [*found, *self.logger, *self.callbacks]
