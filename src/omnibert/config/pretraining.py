"""The sections only pretraining has: ``model`` (with its architecture), ``phase``,
``mlperf`` and ``data.pack``. Each is the schema Hydra composes ``conf/`` against (types,
with the key's path in the message) and the typed value the run reads (ranges checked in
``__post_init__``), as :mod:`omnibert.config.sections` describes."""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from omegaconf import MISSING

from omnibert.config.sections import ConfigError, InitialWeights, at_least, section
from omnibert.models.config import BertConfig

__all__ = ["MLPerf", "Model", "Pack", "Phase", "Submission"]


def _architecture_schema() -> type:
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
    return dataclasses.make_dataclass("Architecture", fields)


if TYPE_CHECKING:
    #: the architecture's fields as the run holds them (``vocab_size`` None: the data's)
    ArchitectureFields = dict[str, Any]
else:  # what OmegaConf checks the composed ``model.config`` against
    ArchitectureFields = _architecture_schema()


@dataclass
class Model(InitialWeights):
    """``model``: optional initial weights (and the ``bert_config.json`` of a TensorFlow 1
    ``init_from``), a name for run directories, the architecture's fields with ``vocab_size``
    open (None: the data's)."""

    name: str = MISSING
    config: ArchitectureFields = field(default_factory=ArchitectureFields)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Model:
        plain = {k: v for k, v in values.items() if k != "config"}
        model = section(cls, plain, "model")
        model.config = dict(values.get("config") or {})
        known = [f.name for f in dataclasses.fields(BertConfig)]
        for key in model.config:
            if key not in known:  # added with +model.config.<key>=...
                close = difflib.get_close_matches(str(key), known, n=2)
                hint = (
                    f"did you mean {' or '.join(f'model.config.{c}' for c in close)}? "
                    if close
                    else ""
                )
                raise ConfigError(
                    f"model.config.{key} is not a field of the architecture "
                    f"(omnibert.models.BertConfig); {hint}remove model.config.{key}."
                )
        return model

    def bert(self, vocab_size: int) -> BertConfig:
        """The architecture with the vocab size the run resolved."""
        return BertConfig(**{**self.config, "vocab_size": int(vocab_size)})

    def _setting(self, name: str) -> Any:
        """The architecture's ``name`` field as configured (BertConfig's default where unset)."""
        if name in self.config:
            return self.config[name]
        default = {f.name: f.default for f in dataclasses.fields(BertConfig)}[name]
        return None if default is dataclasses.MISSING else default

    @property
    def head_size(self) -> int:
        return int(self._setting("hidden_size")) // int(self._setting("num_attention_heads"))

    @property
    def num_hidden_layers(self) -> int:
        return int(self._setting("num_hidden_layers") or 1)

    @property
    def attention(self) -> str:
        """``model.config.attention``: the attention backend asked for (``auto``: chosen)."""
        return str(self._setting("attention") or "auto")

    @property
    def attention_dropout(self) -> float:
        """``model.config.attention_probs_dropout_prob``."""
        return float(self._setting("attention_probs_dropout_prob"))

    @property
    def vocab_size(self) -> int | None:
        """``model.config.vocab_size`` (None: the data's)."""
        value = self.config.get("vocab_size")
        return None if value is None else int(value)


@dataclass
class Phase:
    """``phase``: one training recipe (``conf/phase/phase1.yaml`` says what it owns)."""

    name: str = MISSING
    max_seq_length: int = MISSING
    max_predictions_per_seq: int = MISSING
    global_batch_size: int = MISSING
    max_steps: int = MISSING
    lr: dict[str, float] = field(default_factory=dict)
    warmup_proportion: float = 0.0
    warmup_steps: Optional[int] = None  # noqa: UP045 (OmegaConf reads the annotation)
    init_from: Optional[str] = None  # noqa: UP045

    def __post_init__(self) -> None:
        if self.max_steps == MISSING:  # the schema's defaults: nothing to check yet
            return
        at_least("phase.max_seq_length", self.max_seq_length, 5)
        at_least("phase.max_predictions_per_seq", self.max_predictions_per_seq, 1)
        at_least("phase.global_batch_size", self.global_batch_size, 1)
        at_least("phase.max_steps", self.max_steps, 1)
        at_least("phase.warmup_steps", self.warmup_steps, 0)
        if not 0.0 <= self.warmup_proportion <= 1.0:
            raise ConfigError(
                f"phase.warmup_proportion={self.warmup_proportion} must lie in [0, 1]; fix it."
            )
        for name, lr in self.lr.items():
            if lr <= 0:
                raise ConfigError(f"phase.lr.{name}={lr} must be positive; fix phase.lr.{name}.")

    @property
    def warmup(self) -> int:
        """Warmup steps: ``warmup_steps``, else ``warmup_proportion`` of ``max_steps``."""
        if self.warmup_steps is not None:
            return int(self.warmup_steps)
        return round(float(self.warmup_proportion) * self.max_steps)


@dataclass
class Submission:
    """The ``submission_*`` keys of an MLPerf compliance log."""

    benchmark: str = "bert"
    division: str = "closed"
    org: str = "omnibert"
    platform: str = MISSING
    status: str = "onprem"

    def __post_init__(self) -> None:
        if self.division not in ("closed", "open"):
            raise ConfigError(
                f"mlperf.submission.division={self.division!r} must be closed or open."
            )


@dataclass
class MLPerf:
    """``mlperf`` (``conf/mlperf/bert.yaml`` documents each key)."""

    target_accuracy: float = 0.720
    eval_every_samples: Optional[int] = None  # noqa: UP045
    max_samples: Optional[int] = None  # noqa: UP045
    log_file: str = "mlperf.log"
    submission: Submission = field(default_factory=Submission)

    def __post_init__(self) -> None:
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ConfigError(
                f"mlperf.target_accuracy={self.target_accuracy} must lie in (0, 1]; fix it."
            )
        at_least("mlperf.eval_every_samples", self.eval_every_samples, 1)
        at_least("mlperf.max_samples", self.max_samples, 1)


@dataclass
class Pack:
    """``data.pack`` (``conf/data/pack/default.yaml`` documents each key); the data module
    checks the ranges."""

    max_sequences_per_pack: int = 3
    max_predictions_per_pack: Optional[int] = None  # noqa: UP045
    buffer_size: int = 16384
    algorithm: str = "nnlshp"
    index: Optional[str] = None  # noqa: UP045
