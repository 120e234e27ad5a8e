"""The sections every run's typed config is made of, each checking its own ranges.

The plain sections (:class:`Paths`, :class:`InitialWeights`, and those of
:mod:`omnibert.config.pretraining`) are dataclasses that serve twice: Hydra composes the
config against them (:func:`omnibert.apps.compose.register`: OmegaConf checks each key and
type, naming the key), and :func:`section` builds them from the resolved values, when their
``__post_init__`` checks the ranges. The sections around a ``_target_`` node
(:class:`Accelerator`, :class:`Trainer`, :class:`Checkpointing`) read the node's values. A
value outside its range is one :class:`ConfigError` sentence naming the key and the fix; the
one range helper is :func:`at_least`.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, TypeVar

from omegaconf import MISSING

from omnibert.config.node import Composition, Node, Optimizer, composition, node_or_none, nodes
from omnibert.errors import UserError

SectionT = TypeVar("SectionT")

__all__ = [
    "DERIVED_TRAINER_KEYS",
    "NO_NODES",
    "Accelerator",
    "AcceleratorSection",
    "Checkpointing",
    "ConfigError",
    "Float8Settings",
    "InitialWeights",
    "Nodes",
    "OptimizerNode",
    "Paths",
    "TargetNode",
    "Trainer",
    "TrainerSection",
    "at_least",
    "next_sentence_objective",
    "objective_name",
    "positive_int",
    "refuse_unknown_keys",
    "section",
    "shared_sections",
]


class ConfigError(UserError):
    """A config value outside its range; the message names the key and the fix."""


def at_least(key: str, value: Any, low: int | float) -> None:
    """``value`` (unless None) must be at least ``low``."""
    if value is not None and value < low:
        raise ConfigError(f"{key}={value!r} must be at least {low}; fix {key}.")


def section(
    cls: type[SectionT], values: Mapping[str, Any], path: str = "", **built: Any
) -> SectionT:
    """The section ``cls`` (a schema dataclass) holding the resolved ``values`` of the node at
    ``path`` ("": the root), nested sections built alike and ``built`` (values the caller made,
    e.g. :class:`Node` values) taking precedence; its ``__post_init__`` checks the ranges. The
    keys and types were checked when Hydra composed the config against the same class."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        key = f"{path}.{unknown[0]}" if path else unknown[0]
        raise ConfigError(f"{key} is not a key of {path or 'the config'}; remove it.")
    kwargs = dict(built)
    for name, value in values.items():
        kind = _without_none(hints[name])
        if name in built:
            continue
        if dataclasses.is_dataclass(kind) and isinstance(kind, type) and value is not None:
            value = section(kind, value, f"{path}.{name}" if path else name)
        kwargs[name] = value
    return cls(**kwargs)


def _without_none(kind: Any) -> Any:
    """``X`` of ``Optional[X]``."""
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    return args[0] if typing.get_origin(kind) is typing.Union and len(args) == 1 else kind


def positive_int(value: Any) -> bool:
    """An int (not a bool) of at least 1."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass
class Paths:
    """``paths``: where a run writes (``conf/paths/default.yaml``)."""

    output_root: str = MISSING
    run_dir: str = MISSING
    checkpoint_dir: str = MISSING
    log_dir: Optional[str] = None  # noqa: UP045 (OmegaConf reads the annotation)

    def writable_keys(self) -> dict[str, str]:
        """``paths.<key>`` -> directory, for the directories a pretraining run writes."""
        named = {"output_root": self.output_root, "checkpoint_dir": self.checkpoint_dir}
        if self.log_dir is not None:
            named["log_dir"] = self.log_dir
        return {f"paths.{k}": v for k, v in named.items()}


@dataclass
class InitialWeights:
    """``model`` of a run that starts from other weights: ``init_from`` (a Hugging Face
    directory, an omnibert checkpoint or a TensorFlow 1 prefix) and the ``bert_config.json``
    of a TensorFlow 1 ``init_from`` (null: the one beside it)."""

    init_from: Optional[str] = None  # noqa: UP045
    bert_config: Optional[str] = None  # noqa: UP045


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

    @classmethod
    def among(cls, callbacks: tuple[Node, ...]) -> Checkpointing | None:
        """The settings of the ``callbacks.checkpoint`` node among ``callbacks``."""
        found = [n for n in callbacks if n.path == "callbacks.checkpoint"]
        return cls.of(found[0]) if found else None

    @property
    def save_top_k(self) -> int:
        """Lightning's ``save_top_k`` (``-1``: all)."""
        return -1 if self.keep_last is None else self.keep_last


class JobSections:
    """What the jobs' configs (training, fine-tuning) read alike from their sections: the
    checkpoint callback's settings and how the config was composed. A base without fields:
    the dataclass that takes it keeps its own schema."""

    callbacks: tuple[Node, ...]

    @property
    def checkpointing(self) -> Checkpointing | None:
        """``callbacks.checkpoint``'s settings, checked (None: no checkpoint callback)."""
        return Checkpointing.among(self.callbacks)

    @property
    def composition(self) -> Composition:
        """How this config was composed (:class:`~omnibert.config.node.Composition`)."""
        return composition(self)


@dataclass(frozen=True)
class Accelerator:
    """``accelerator``: the plugin node and the device counts the plan divides by."""

    node: Node
    devices: int
    num_nodes: int
    #: seconds a collective waits for the other ranks (the process-group timeout)
    timeout_s: float = 300.0
    #: ``none`` or ``zero1`` (each data-parallel rank holds 1/N of the optimiser state): the
    #: memory estimate counts the share a rank holds; the plugin checks where it applies
    optimizer_sharding: str = "none"

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
            float(timeout), str(values.get("optimizer_sharding", "none")),
        )  # fmt: skip

    @property
    def optimizer_ranks(self) -> int:
        """The ranks the optimiser state is split over (1: every rank holds all of it)."""
        return self.world_size if self.optimizer_sharding == "zero1" else 1

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

    def refuse_derived(
        self,
        accelerator: Node,
        derived: Mapping[str, str],
        composed: Mapping[str, tuple[Any, str]] | None = None,
    ) -> None:
        """Refuse (one sentence) a Lightning key of ``trainer`` the app sets itself, which it
        would otherwise override without a word: each of ``derived`` (key → what sets it
        instead), each of ``composed`` (key → (the value the app's config composes, what
        sets it instead)) at another value, and ``accelerator``/``devices``/``num_nodes``/
        ``strategy`` set apart from the ``accelerator`` section they are read from (the
        plugin passes those)."""
        fixed = {k: v for k, v in (composed or {}).items() if k in self.node}
        for key, (value, instead) in fixed.items():
            if self.node[key] != value:
                derived = {**derived, key: instead}
        for key, instead in derived.items():
            if key in self.node:
                raise ConfigError(
                    f"trainer.{key}={self.node[key]!r} is not read: the app sets it from "
                    f"{instead}; remove trainer.{key}."
                )
        for key in ("accelerator", "devices", "num_nodes", "strategy"):
            if key in self.node and key in accelerator and self.node[key] != accelerator[key]:
                raise ConfigError(
                    f"trainer.{key}={self.node[key]!r} is not read: the accelerator plugin "
                    f"passes accelerator.{key}={accelerator[key]!r}; set accelerator.{key} "
                    f"instead of trainer.{key}."
                )


#: ``trainer`` keys every app derives (key → what sets it instead; each app adds its own,
#: e.g. ``accumulate_grad_batches``)
DERIVED_TRAINER_KEYS = {
    "callbacks": "the callbacks section (callbacks=...)",
    "logger": "the logger section (logger=...)",
    "plugins": "the accelerator plugin and trainer.precision",
}


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


def refuse_unknown_keys(c: Mapping[str, Any], cls: type) -> None:
    """A top-level key of the resolved config ``c`` that ``cls`` (the job's config class)
    does not have: added with ``+key=...``, it would be read by nothing."""
    known = [f.name for f in dataclasses.fields(cls)]
    for key in c:
        if key not in known:
            raise ConfigError(f"{key} is not a key of the config; remove +{key}.")


def shared_sections(c: Mapping[str, Any]) -> dict[str, Any]:
    """The sections every training run has (pretraining's and fine-tuning's configs alike),
    read from the resolved config ``c``: keyword arguments of either config class."""
    return {
        "paths": section(Paths, c["paths"], "paths"),
        "accelerator": Accelerator.of(c["accelerator"]),
        "task": Node(c.get("task") or {}, "task"),
        "optimizer": Optimizer(c["optimizer"]),
        "schedule": node_or_none(c.get("schedule"), "schedule"),
        "trainer": Trainer.of(c["trainer"]),
        "logger": nodes(c.get("logger"), "logger"),
        "callbacks": nodes(c.get("callbacks"), "callbacks"),
        "run_name": str(c["run_name"]),
        "seed": int(c["seed"]),
        "micro_batch_size": c.get("micro_batch_size"),
        "ckpt_path": None if c.get("ckpt_path") is None else str(c["ckpt_path"]),
    }


if TYPE_CHECKING:
    AcceleratorSection = Accelerator
    TargetNode = Node
    OptimizerNode = Optimizer
    TrainerSection = Trainer
    Nodes = tuple[Node, ...]
else:  # to OmegaConf, a ``_target_`` node is open: what it builds checks its keys
    AcceleratorSection = TargetNode = OptimizerNode = TrainerSection = Nodes = Any
#: the schema's default of a group of nodes (``logger``, ``callbacks``): none; built, a run's
#: config holds a tuple of its nodes
NO_NODES: Any = None
