"""``omnibert-train``'s config, typed: built once from the composed config, frozen, every
range checked beside its field; below the apps nothing reads the composed config again.

    config = TrainConfig.of(cfg)   # one sentence naming the key on any problem
    config.phase.max_steps, config.trainer.precision, config.optimizer.build(params), ...
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from omegaconf import DictConfig

from omnibert.config.node import Node, interpolation_origins, resolve
from omnibert.config.sections import (
    Accelerator,
    Checkpointing,
    ConfigError,
    MLPerf,
    Model,
    Paths,
    Phase,
    Trainer,
    at_least,
    positive_int,
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


@dataclass(frozen=True)
class TrainConfig:
    """One pretraining run (one phase), as ``conf/pretrain.yaml`` composes it."""

    #: the whole resolved config, read-only: what loggers record and summaries show
    raw: Mapping[str, Any]
    paths: Paths
    accelerator: Accelerator
    model: Model
    data: Node
    task: Node
    phase: Phase
    optimizer: Node
    schedule: Node | None
    trainer: Trainer
    loggers: tuple[Node, ...]
    callbacks: tuple[Node, ...]
    run_name: str
    seed: int
    micro_batch_size: int | None
    eval_micro_batch_size: int | None
    memory_fraction: float
    micro_batch_probe: bool
    ckpt_path: str | None
    val_every_n_steps: int | None
    steps_per_epoch: int | None
    clip_grad_per_micro_batch: Any
    compile_only: bool
    profile: Any
    mlperf: MLPerf | None
    #: ``callbacks.checkpoint``'s settings, checked (None: no checkpoint callback)
    checkpointing: Checkpointing | None = None
    #: the keys set on the command line (Hydra's overrides): what the user chose, as against
    #: a preset's defaults (``model.init_from`` of a Hugging Face directory refuses a
    #: ``model.config.*`` set there that contradicts its config.json)
    command_line: frozenset[str] = frozenset()
    #: keys whose value came from another key by interpolation -> that key (messages name
    #: the key the user typed: config.node.interpolation_origins)
    origins: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, cfg: DictConfig, command_line: Iterable[str] | None = None) -> TrainConfig:
        """Resolve ``cfg`` (a missing key or an interpolation that does not resolve is one
        sentence) and check every range. ``command_line``: the overrides (``key=value``) the
        config was composed with; None: Hydra's, when a Hydra app runs."""
        c = resolve(cfg, EXAMPLE, TrainConfigError)
        task = c.get("task") or {}
        phase = Phase.of(c["phase"])
        mlperf = MLPerf.of(c.get("mlperf"))
        config = cls(
            raw=MappingProxyType(c),
            data=Node(c["data"], "data"),
            phase=phase,
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
            mlperf=mlperf,
            command_line=override_keys(command_line),
            origins=MappingProxyType(interpolation_origins(cfg)),
            **shared_sections(c),
        )
        if task.get("data") is not None:  # conf/task/squad.yaml, mrpc.yaml, the GLUE tasks
            raise TrainConfigError(
                f"task={task.get('name')} is a fine-tuning task; run omnibert-finetune "
                f"task={task.get('name')} (omnibert-train pretrains: task=pretraining)."
            )
        return config

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

    def starting_from(
        self, init_from: str | None, ckpt_path: str | None = None, *, model_init: bool = True
    ) -> TrainConfig:
        """This run started from other weights: ``phase.init_from=init_from`` (and
        ``model.init_from`` kept or, ``model_init=False``, cleared), resumed from
        ``ckpt_path``. What a later phase of a multi-phase run is given (run/pretraining/phases.py).
        """
        raw = copy.deepcopy(dict(self.raw))
        raw["phase"]["init_from"] = init_from
        raw["ckpt_path"] = ckpt_path
        model = self.model
        if not model_init:
            raw["model"]["init_from"] = None
            model = dataclasses.replace(model, init_from=None)
        return dataclasses.replace(
            self,
            raw=MappingProxyType(raw),
            phase=dataclasses.replace(self.phase, init_from=init_from),
            model=model,
            ckpt_path=ckpt_path,
        )

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
        yield from self.loggers
        yield from self.callbacks
