"""Structured configs of ``conf/pretrain.yaml``'s keys: their types are checked by OmegaConf
when the config is composed (:func:`omnibert.apps.compose.register` puts these in Hydra's
ConfigStore), with the key's path in the message. Ranges are checked once the config is
composed, by the typed config the app builds from it (:mod:`omnibert.config`).

* ``pretrain_schema``: the root of ``conf/pretrain.yaml`` (run keys, the ``phase`` node, the
  model's ``config``); groups that are ``_target_`` nodes (accelerator, data, optimizer,
  schedule, task, trainer, callbacks, logger) are checked by what they build.
* ``schema/pack``: ``data.pack.*`` of every data config (``data.packing`` is checked by the
  data module).
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

from omnibert.models.config import BertConfig

__all__ = ["MLPerfNode", "PackNode", "PhaseConfig", "PretrainConfig"]


@dataclass
class PhaseConfig:
    """``phase``: one training recipe (conf/phase/phase1.yaml says what it owns)."""

    name: str = MISSING
    max_seq_length: int = MISSING
    max_predictions_per_seq: int = MISSING
    global_batch_size: int = MISSING
    max_steps: int = MISSING
    lr: dict[str, float] = field(default_factory=dict)
    warmup_proportion: float = 0.0
    warmup_steps: Optional[int] = None  # noqa: UP045 (OmegaConf reads the annotation)
    init_from: Optional[str] = None  # noqa: UP045


def _model_config_schema() -> type:
    """:class:`~omnibert.models.BertConfig`'s fields with ``vocab_size`` optional (null: the
    data's), as a structured config; BertConfig itself checks ranges when the model is built."""
    hints = typing.get_type_hints(BertConfig)
    fields = []
    for f in dataclasses.fields(BertConfig):
        kind: Any = hints[f.name]
        default: Any = f.default if f.default is not dataclasses.MISSING else None
        if f.name == "vocab_size":
            kind = Optional[int]  # noqa: UP045
        fields.append((f.name, kind, field(default=default)))
    return dataclasses.make_dataclass("BertConfigNode", fields)


BertConfigNode = _model_config_schema()


@dataclass
class ModelNode:
    """``model``: a name for run directories, optional initial weights (and the
    ``bert_config.json`` of a TensorFlow 1 ``init_from``), the architecture."""

    name: str = MISSING
    init_from: Optional[str] = None  # noqa: UP045
    bert_config: Optional[str] = None  # noqa: UP045
    config: Any = field(default_factory=BertConfigNode)


@dataclass
class PackNode:
    """``data.pack`` (conf/data/pack/default.yaml documents each key)."""

    max_sequences_per_pack: int = 3
    max_predictions_per_pack: Optional[int] = None  # noqa: UP045
    buffer_size: int = 16384
    algorithm: str = "nnlshp"
    index: Optional[str] = None  # noqa: UP045


@dataclass
class SubmissionNode:
    """The ``submission_*`` keys of an MLPerf compliance log."""

    benchmark: str = "bert"
    division: str = "closed"
    org: str = "omnibert"
    platform: str = MISSING
    status: str = "onprem"


@dataclass
class MLPerfNode:
    """``mlperf`` (conf/mlperf/bert.yaml documents each key)."""

    target_accuracy: float = 0.720
    eval_every_samples: Optional[int] = None  # noqa: UP045
    max_samples: Optional[int] = None  # noqa: UP045
    log_file: str = "mlperf.log"
    submission: SubmissionNode = field(default_factory=SubmissionNode)


@dataclass
class PretrainConfig:
    """The root of ``conf/pretrain.yaml``."""

    paths: Any = MISSING
    accelerator: Any = MISSING
    model: ModelNode = field(default_factory=ModelNode)
    data: Any = MISSING
    task: Any = MISSING
    phase: PhaseConfig = field(default_factory=PhaseConfig)
    optimizer: Any = MISSING
    schedule: Any = None
    trainer: Any = MISSING
    logger: Any = None
    callbacks: Any = None
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
    mlperf: Optional[MLPerfNode] = None  # noqa: UP045
