"""The sections every run's typed config is made of, each checking its own ranges.

Built once from the resolved config (:mod:`omnibert.config.train`,
:mod:`omnibert.config.finetune`); frozen afterwards. A value outside its range is one
:class:`ConfigError` sentence naming the key and the fix. The types were checked when Hydra
composed the config (:mod:`omnibert.schema`); these classes read the resolved values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omnibert.config.node import Node, node_or_none, nodes
from omnibert.errors import UserError
from omnibert.models.config import BertConfig

__all__ = [
    "Accelerator",
    "Checkpointing",
    "ConfigError",
    "Float8Settings",
    "MLPerf",
    "Model",
    "Paths",
    "Phase",
    "Trainer",
    "at_least",
    "next_sentence_objective",
    "objective_name",
    "positive_int",
    "shared_sections",
]


class ConfigError(UserError):
    """A config value outside its range; the message names the key and the fix."""


def at_least(key: str, value: Any, low: int | float) -> None:
    """``value`` (unless None) must be at least ``low``."""
    if value is not None and value < low:
        raise ConfigError(f"{key}={value!r} must be at least {low}; fix {key}.")


def positive_int(value: Any) -> bool:
    """An int (not a bool) of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True)
class Paths:
    """``paths``: where a run writes (``conf/paths/default.yaml``)."""

    output_root: str
    run_dir: str
    checkpoint_dir: str
    log_dir: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Paths:
        return cls(
            str(values["output_root"]),
            str(values["run_dir"]),
            str(values["checkpoint_dir"]),
            None if values.get("log_dir") is None else str(values["log_dir"]),
        )

    def writable_keys(self) -> dict[str, str]:
        """``paths.<key>`` -> directory, for the directories a pretraining run writes."""
        named = {"output_root": self.output_root, "checkpoint_dir": self.checkpoint_dir}
        if self.log_dir is not None:
            named["log_dir"] = self.log_dir
        return {f"paths.{k}": v for k, v in named.items()}


@dataclass(frozen=True)
class Checkpointing:
    """``callbacks.checkpoint`` (``conf/callbacks/default.yaml``): how many ``step-*.ckpt`` are
    kept besides ``last.ckpt`` (``keep_last``; null: every one), what a checkpoint that cannot
    be written does (``on_write_error``: ``stop`` the run, exit code 74, or ``skip`` it with a
    warning and try again at the next interval), and the interval. ``keep_last`` sets
    Lightning's ``save_top_k`` (the newest N by step); ``save_top_k`` set as well is an alias
    (older command lines): it wins over ``keep_last``'s default and is refused when it
    disagrees with another ``keep_last``."""

    keep_last: int | None = 3
    on_write_error: str = "stop"
    every_n_train_steps: int | None = None

    #: what ``on_write_error`` may be
    ON_WRITE_ERROR = ("stop", "skip")

    @classmethod
    def of(cls, values: Mapping[str, Any] | None) -> Checkpointing | None:
        """The settings of a ``callbacks.checkpoint`` node (None: no checkpoint callback)."""
        if values is None:
            return None
        key = "callbacks.checkpoint"
        every = values.get("every_n_train_steps")  # its type and range: ModelCheckpoint's
        top_k = values.get("save_top_k")  # its type is checked against ModelCheckpoint's
        top_k = top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else None
        keep = values.get("keep_last", cls.keep_last)
        if keep is not None and (not isinstance(keep, int) or isinstance(keep, bool) or keep < 0):
            raise ConfigError(
                f"{key}.keep_last={keep!r} must be a whole number of at least 0 (or null to "
                f"keep every step checkpoint); fix {key}.keep_last."
            )
        if top_k is not None:  # Lightning's name, kept as an alias: it wins over the default
            alias = None if top_k < 0 else top_k
            if keep not in (cls.keep_last, alias):
                raise ConfigError(
                    f"{key}.save_top_k={top_k} disagrees with {key}.keep_last={keep}; "
                    f"save_top_k is an older name of keep_last: drop it and set {key}.keep_last="
                    f"{'null' if alias is None else alias} (null keeps every step checkpoint)."
                )
            keep = alias
        mode = values.get("on_write_error", cls.on_write_error)
        if mode not in cls.ON_WRITE_ERROR:
            raise ConfigError(
                f"{key}.on_write_error={mode!r} must be stop (end the run, exit code 74) or "
                f"skip (warn and try again at the next interval); fix {key}.on_write_error."
            )
        return cls(keep, str(mode), every if positive_int(every) else None)

    @property
    def save_top_k(self) -> int:
        """Lightning's ``save_top_k`` (``-1``: all)."""
        return -1 if self.keep_last is None else self.keep_last


@dataclass(frozen=True)
class Accelerator:
    """``accelerator``: the plugin node and the device counts the plan divides by."""

    node: Node
    devices: int
    num_nodes: int
    #: seconds a collective waits for the other ranks (the process-group timeout)
    timeout_s: float = 300.0

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Accelerator:
        timeout = values.get("timeout_s", 300)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0:
            raise ConfigError(
                f"accelerator.timeout_s={timeout!r} must be a positive number of seconds; "
                "fix accelerator.timeout_s (e.g. 300)."
            )
        return cls(
            Node(values, "accelerator"), int(values["devices"]), int(values["num_nodes"]),
            float(timeout),
        )  # fmt: skip

    @property
    def world_size(self) -> int:
        return self.devices * self.num_nodes


#: what ``trainer.nonfinite`` may be (docs/faults.md#non-finite-losses-and-gradients)
NONFINITE_POLICIES = ("skip", "stop")
#: ``trainer`` keys that are omnibert's, not Lightning's: kept out of the Trainer's arguments
OMNIBERT_TRAINER_KEYS = ("nonfinite", "nonfinite_max_consecutive", "stop_within_s", "fp8")
#: ``trainer.precision`` of torchao's float8 training (bf16 autocast around fp8 matmuls)
FP8 = "fp8"
#: ``trainer.fp8.recipe``: torchao's scaling recipes (``Float8LinearRecipeName`` values)
FP8_RECIPES = ("tensorwise", "rowwise")


@dataclass(frozen=True)
class Float8Settings:
    """``trainer.fp8``: how ``trainer.precision=fp8`` scales its fp8 casts (``recipe``) and
    whether it emulates the fp8 matmuls in higher precision on any device (``emulate``: for
    numerics checks; :mod:`omnibert.accelerators.float8`)."""

    recipe: str = "tensorwise"
    emulate: bool = False

    @classmethod
    def of(cls, values: Mapping[str, Any] | None, precision: str) -> Float8Settings:
        values = dict(values or {})
        unknown = sorted(set(values) - {"recipe", "emulate"})
        if unknown:
            raise ConfigError(
                f"trainer.fp8.{unknown[0]} is not a key of trainer.fp8 (recipe, emulate); "
                f"remove it."
            )
        settings = cls(str(values.get("recipe", "tensorwise")), values.get("emulate", False))
        if settings.recipe not in FP8_RECIPES:
            raise ConfigError(
                f"trainer.fp8.recipe={settings.recipe!r} is not one of "
                f"{', '.join(FP8_RECIPES)}; fix trainer.fp8.recipe."
            )
        if not isinstance(settings.emulate, bool):
            raise ConfigError(
                f"trainer.fp8.emulate={settings.emulate!r} must be true or false; fix "
                "trainer.fp8.emulate."
            )
        if precision != FP8 and settings != cls():
            changed = next(
                f"trainer.fp8.{f.name}={str(getattr(settings, f.name)).lower()}"
                for f in dataclasses.fields(cls)
                if getattr(settings, f.name) != f.default
            )
            raise ConfigError(
                f"{changed} applies to trainer.precision=fp8 only, and this run's is "
                f"trainer.precision={precision}; set trainer.precision=fp8 or drop {changed}."
            )
        return settings


@dataclass(frozen=True)
class Trainer:
    """``trainer``: Lightning's Trainer node (without omnibert's own keys), the keys the run
    reads from it, and the policy for steps whose gradients are not finite."""

    node: Node
    precision: str
    max_steps: Any
    gradient_clip_val: float | None
    enable_progress_bar: bool
    log_every_n_steps: int | None
    profiler: Any
    nonfinite: str = "skip"
    nonfinite_max_consecutive: int = 10
    #: seconds from SIGTERM / SIGINT to the end of the process
    stop_within_s: float = 20.0
    #: ``trainer.fp8``: the recipe and emulation of ``precision=fp8``
    fp8: Float8Settings = Float8Settings()

    def __post_init__(self) -> None:
        if self.nonfinite not in NONFINITE_POLICIES:
            raise ConfigError(
                f"trainer.nonfinite={self.nonfinite!r} is not one of {', '.join(NONFINITE_POLICIES)}; "
                "fix trainer.nonfinite."
            )
        if not positive_int(self.nonfinite_max_consecutive):
            raise ConfigError(
                f"trainer.nonfinite_max_consecutive={self.nonfinite_max_consecutive!r} must be "
                "an integer of at least 1; fix trainer.nonfinite_max_consecutive."
            )

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Trainer:
        lightning = {k: v for k, v in values.items() if k not in OMNIBERT_TRAINER_KEYS}
        return cls(
            Node(lightning, "trainer"),
            str(values.get("precision")),
            values.get("max_steps"),
            values.get("gradient_clip_val"),
            bool(values.get("enable_progress_bar", True)),
            values.get("log_every_n_steps"),
            values.get("profiler"),
            str(values.get("nonfinite", "skip")),
            values.get("nonfinite_max_consecutive", 10),
            _seconds("trainer.stop_within_s", values.get("stop_within_s", 20.0)),
            Float8Settings.of(values.get("fp8"), str(values.get("precision"))),
        )


def _seconds(key: str, value: Any) -> float:
    """A number of seconds above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{key}={value!r} is not a number of seconds; fix {key}.")
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"{key}={value!r} must be a number of seconds above 0; fix {key}.")
    return float(value)


def next_sentence_objective(model_config: Any) -> bool:
    """Whether a model trains (and is scored on) next-sentence prediction besides masked-LM:
    ``model.config.next_sentence_head``, read from a :class:`BertConfig` or its dict; true
    where the field is absent (BERT's objective, and every config written before it)."""
    if isinstance(model_config, Mapping):
        return bool(model_config.get("next_sentence_head", True))
    return bool(getattr(model_config, "next_sentence_head", True))


def objective_name(next_sentence: bool) -> str:
    """The objective as the plan, the summary and omnibert-eval's report name it."""
    return "MLM + next-sentence" if next_sentence else "MLM only"


@dataclass(frozen=True)
class Model:
    """``model``: a name for run directories, optional initial weights (and the
    ``bert_config.json`` of a TensorFlow 1 ``init_from``), the architecture's fields with
    ``vocab_size`` open (None: the data's)."""

    name: str | None
    init_from: str | None
    bert_config: str | None
    fields: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Model:
        init = values.get("init_from")
        bert = values.get("bert_config")
        return cls(
            None if values.get("name") is None else str(values["name"]),
            None if init is None else str(init),
            None if bert is None else str(bert),
            dict(values.get("config") or {}),
        )

    def bert(self, vocab_size: int) -> BertConfig:
        """The architecture with the vocab size the run resolved."""
        return BertConfig(**{**self.fields, "vocab_size": int(vocab_size)})

    @property
    def head_size(self) -> int:
        return int(self.fields["hidden_size"]) // int(self.fields["num_attention_heads"])


@dataclass(frozen=True)
class Phase:
    """``phase``: one training recipe (``conf/phase/phase1.yaml`` says what it owns)."""

    name: str
    max_seq_length: int
    max_predictions_per_seq: int
    global_batch_size: int
    max_steps: int
    lr: Mapping[str, float] = field(default_factory=dict)
    warmup_proportion: float = 0.0
    warmup_steps: int | None = None
    init_from: str | None = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Phase:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in values.items() if k in known})

    def __post_init__(self) -> None:
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


@dataclass(frozen=True)
class MLPerf:
    """``mlperf`` (``conf/mlperf/bert.yaml`` documents each key)."""

    target_accuracy: float
    eval_every_samples: int | None
    max_samples: int | None
    log_file: str
    submission: Mapping[str, str]

    @classmethod
    def of(cls, values: Mapping[str, Any] | None) -> MLPerf | None:
        if values is None:
            return None
        return cls(
            float(values["target_accuracy"]),
            values.get("eval_every_samples"),
            values.get("max_samples"),
            str(values["log_file"]),
            dict(values["submission"]),
        )

    def __post_init__(self) -> None:
        if not 0.0 < self.target_accuracy <= 1.0:
            raise ConfigError(
                f"mlperf.target_accuracy={self.target_accuracy} must lie in (0, 1]; fix it."
            )
        at_least("mlperf.eval_every_samples", self.eval_every_samples, 1)
        at_least("mlperf.max_samples", self.max_samples, 1)
        division = self.submission.get("division")
        if division not in ("closed", "open"):
            raise ConfigError(f"mlperf.submission.division={division!r} must be closed or open.")


def shared_sections(c: Mapping[str, Any]) -> dict[str, Any]:
    """The sections every training run has (pretraining's and fine-tuning's configs alike),
    read from the resolved config ``c``: keyword arguments of either config class."""
    return {
        "paths": Paths.of(c["paths"]),
        "accelerator": Accelerator.of(c["accelerator"]),
        "model": Model.of(c["model"]),
        "task": Node(c.get("task") or {}, "task"),
        "optimizer": Node(c["optimizer"], "optimizer"),
        "schedule": node_or_none(c.get("schedule"), "schedule"),
        "trainer": Trainer.of(c["trainer"]),
        "loggers": nodes(c.get("logger"), "logger"),
        "callbacks": nodes(c.get("callbacks"), "callbacks"),
        "run_name": str(c["run_name"]),
        "seed": int(c["seed"]),
        "micro_batch_size": c.get("micro_batch_size"),
        "ckpt_path": None if c.get("ckpt_path") is None else str(c["ckpt_path"]),
        "checkpointing": Checkpointing.of((c.get("callbacks") or {}).get("checkpoint")),
    }
