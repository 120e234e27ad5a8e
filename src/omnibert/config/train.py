"""``omnibert-train``'s config, typed and defined once: :class:`TrainConfig` is the schema
Hydra composes ``conf/pretrain.yaml`` against (types, at composition) and, built by
:meth:`TrainConfig.of`, the run's config with every range checked beside its field; below the
apps nothing reads the composed config again.

    config = TrainConfig.of(cfg)   # one sentence naming the key on any problem
    config.phase.max_steps, config.trainer.precision, config.optimizer.build(params), ...
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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
from omnibert.config.pretraining import MLPerf, Model, Phase
from omnibert.config.sections import (
    DERIVED_TRAINER_KEYS,
    NO_NODES,
    AcceleratorSection,
    Checkpointing,
    ConfigError,
    JobSections,
    Nodes,
    OptimizerNode,
    Paths,
    TargetNode,
    TrainerSection,
    at_least,
    positive_int,
    refuse_unknown_keys,
    section,
    shared_sections,
)
from omnibert.errors import UserError, yes_no

__all__ = ["TrainConfig", "TrainConfigError", "override_keys"]

EXAMPLE = "e.g. omnibert-train data.train_path=<dir> data.eval_path=<dir> (or experiment=demo)"


class TrainConfigError(UserError):
    """The training configuration cannot work; the message names the key and the fix."""


def override_keys(overrides: Iterable[str] | None) -> frozenset[str]:
    """The keys of command-line overrides (``+model.config.x=1`` -> ``model.config.x``);
    ``None``: those of the running Hydra app (none outside one)."""
    if overrides is None:
        from hydra.core.hydra_config import HydraConfig

        if not HydraConfig.initialized():
            return frozenset()
        overrides = [str(o) for o in HydraConfig.get().overrides.task]
    return frozenset(o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o)


@dataclass
class TrainConfig(JobSections):
    """One pretraining run (one phase): the schema ``conf/pretrain.yaml`` is composed against
    (:func:`omnibert.apps.compose.register`) and, built by :meth:`of`, the run's typed
    config. ``_target_`` nodes are open to OmegaConf and :class:`Node` values here."""

    paths: Paths = MISSING
    accelerator: AcceleratorSection = MISSING
    model: Model = MISSING
    data: TargetNode = MISSING
    task: TargetNode = MISSING
    phase: Phase = MISSING
    optimizer: OptimizerNode = MISSING
    schedule: Optional[TargetNode] = None  # noqa: UP045 (OmegaConf reads the annotation)
    trainer: TrainerSection = MISSING
    logger: Nodes = NO_NODES
    callbacks: Nodes = NO_NODES
    run_name: str = MISSING
    seed: int = 12345
    micro_batch_size: Optional[int] = None  # noqa: UP045
    eval_micro_batch_size: Optional[int] = None  # noqa: UP045
    # share of the device's memory a micro batch the app chooses may use
    # (omnibert.run.sizing.memory)
    memory_fraction: float = 0.8
    # time a few sizes that fit and keep the fastest (omnibert.run.sizing.speed_probe)
    micro_batch_probe: bool = True
    ckpt_path: Optional[str] = None  # noqa: UP045
    val_every_n_steps: Optional[int] = None  # noqa: UP045
    steps_per_epoch: Optional[int] = None  # noqa: UP045
    # auto | null | a positive norm
    clip_grad_per_micro_batch: Any = "auto"
    compile_only: bool = False
    # false | true | a mapping of omnibert.run.launching.profiling.ProfileSettings fields
    profile: Any = False
    # several phases in one command: {name: {phase: ..., data: {...}, <key>: ...}}
    # (run/pretraining/phases.py)
    phases: Optional[dict[str, Any]] = None  # noqa: UP045
    # MLPerf mode (phase=mlperf); null: off
    mlperf: Optional[MLPerf] = None  # noqa: UP045

    @classmethod
    def of(cls, cfg: DictConfig, command_line: Iterable[str] | None = None) -> TrainConfig:
        """Resolve ``cfg`` (a missing key or an interpolation that does not resolve is one
        sentence) and check every range. ``command_line``: the overrides (``key=value``) the
        config was composed with; None: Hydra's, when a Hydra app runs."""
        c = resolve(cfg, EXAMPLE, TrainConfigError)
        refuse_unknown_keys(c, cls)
        task = c.get("task") or {}
        config = cls(
            model=Model.of(c["model"]),
            data=Node(c["data"], "data"),
            phase=section(Phase, c["phase"], "phase"),
            eval_micro_batch_size=c.get("eval_micro_batch_size"),
            memory_fraction=float(c.get("memory_fraction", 0.8)),
            micro_batch_probe=yes_no(
                c.get("micro_batch_probe", True), "micro_batch_probe", ConfigError
            ),
            val_every_n_steps=c.get("val_every_n_steps"),
            steps_per_epoch=c.get("steps_per_epoch"),
            clip_grad_per_micro_batch=c.get("clip_grad_per_micro_batch", "auto"),
            compile_only=bool(c.get("compile_only")),
            profile=c.get("profile", False),
            phases=c.get("phases"),
            mlperf=None if c.get("mlperf") is None else section(MLPerf, c["mlperf"], "mlperf"),
            **shared_sections(c),
        )
        if task.get("data") is not None:  # conf/task/squad.yaml, mrpc.yaml, the GLUE tasks
            raise TrainConfigError(
                f"task={task.get('name')} is a fine-tuning task; run omnibert-finetune "
                f"task={task.get('name')} (omnibert-train pretrains: task=pretraining)."
            )
        composed = Composition(
            MappingProxyType(c),
            override_keys(command_line),
            MappingProxyType(interpolation_origins(cfg)),
        )
        return with_composition(config, composed)

    def __post_init__(self) -> None:
        for key in ("micro_batch_size", "eval_micro_batch_size", "val_every_n_steps"):
            at_least(key, getattr(self, key), 1)
        at_least("steps_per_epoch", self.steps_per_epoch, 1)
        if not 0.0 < self.memory_fraction <= 1.0:
            raise ConfigError(
                f"memory_fraction={self.memory_fraction} must lie in (0, 1]; fix memory_fraction."
            )
        if not positive_int(self.trainer.max_steps):
            raise TrainConfigError(
                f"phase.max_steps={self.trainer.max_steps!r} must be a positive integer."
            )
        Checkpointing.among(self.callbacks)  # its ranges, now
        self.trainer.refuse_derived(
            self.accelerator.node,
            {
                **DERIVED_TRAINER_KEYS,
                "accumulate_grad_batches": "phase.global_batch_size over micro_batch_size",
                "limit_train_batches": "steps_per_epoch (optimiser steps per pass over the data)",
                "val_check_interval": "val_every_n_steps (optimiser steps between evaluations)",
            },
        )

    def starting_from(
        self, init_from: str | None, ckpt_path: str | None = None, *, model_init: bool = True
    ) -> TrainConfig:
        """This run started from other weights: ``phase.init_from=init_from`` (and
        ``model.init_from`` kept or, ``model_init=False``, cleared), resumed from
        ``ckpt_path``. What a later phase of a multi-phase run is given (run/pretraining/phases.py).
        """
        recorded = copy.deepcopy(dict(self.composition.recorded))
        if recorded:
            recorded["phase"]["init_from"] = init_from
            recorded["ckpt_path"] = ckpt_path
        model = self.model
        if not model_init:
            if recorded:
                recorded["model"]["init_from"] = None
            model = dataclasses.replace(model, init_from=None)
        changed = dataclasses.replace(
            self,
            phase=dataclasses.replace(self.phase, init_from=init_from),
            model=model,
            ckpt_path=ckpt_path,
        )
        composed = dataclasses.replace(self.composition, recorded=MappingProxyType(recorded))
        return with_composition(changed, composed)

    @property
    def max_steps(self) -> int:
        """The run's optimiser steps (``trainer.max_steps``, ``phase.max_steps`` by default)."""
        return int(self.trainer.max_steps)

    def target_nodes(self) -> Iterator[Node]:
        """Every ``_target_`` node of the run, for checks of what they build."""
        yield from (self.accelerator.node, self.data, self.task, self.optimizer)
        if self.schedule is not None:
            yield self.schedule
        yield self.trainer.node
        yield from self.logger
        yield from self.callbacks
