"""Resolving a composed config once, and the ``_target_`` nodes it holds.

:func:`resolve` turns Hydra's composed ``DictConfig`` into plain containers with every
interpolation resolved (a missing key or one that does not resolve is one sentence);
:class:`Node` keeps a ``_target_`` node (accelerator, data, optimizer, trainer, ...) as those
plain values, read-only, and :meth:`Node.build` is where every configured object is
instantiated: a :class:`~omnibert.errors.UserError` raised by its constructor reaches the
user as it is (Hydra wraps every exception in ``InstantiationException``).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

from omnibert.errors import UserError

__all__ = [
    "Composition",
    "Node",
    "Optimizer",
    "build",
    "composition",
    "interpolation_origins",
    "resolve",
    "with_composition",
]

ConfigT = TypeVar("ConfigT")

#: an interpolation that is one absolute key and nothing else: ``${phase.lr.adamw}``
_ALIAS = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def resolve(
    cfg: DictConfig,
    example: str,
    error: type[UserError],
    *,
    missing_first: bool = True,
) -> dict[str, Any]:
    """``cfg`` as plain containers with interpolations resolved. A missing key (``???``)
    is named with ``example`` (a full command) when ``missing_first``, else reported with
    the other problems as "the config does not resolve: ...; ``example``."."""
    try:
        if missing_first:
            missing = sorted(OmegaConf.missing_keys(cfg))
            if missing:
                raise error(f"{', '.join(missing)} must be set, {example}.")
        container = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationKeyError as err:
        if not missing_first:
            raise error(_does_not_resolve(err) + f"; {example}.") from err
        raise error(_interpolation_message(cfg, err)) from err
    except OmegaConfBaseException as err:
        if not missing_first:
            raise error(_does_not_resolve(err) + f"; {example}.") from err
        raise error(_does_not_resolve(err)) from err
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


@dataclass(frozen=True)
class Composition:
    """How a config was composed, beside its values: ``recorded``, the whole resolved config
    (read-only; what the loggers record as the run's hyper-parameters, nothing else reads it);
    ``command_line``, the keys set on the command line (Hydra's overrides: what the user chose,
    as against a preset's defaults; ``model.init_from`` of a Hugging Face directory refuses a
    ``model.config.*`` set there that contradicts its config.json); ``origins``, the keys whose
    value came from another key by interpolation -> that key (messages name the key the user
    typed: config.node.interpolation_origins)."""

    recorded: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    command_line: frozenset[str] = frozenset()
    origins: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def composition(config: Any) -> Composition:
    """The :class:`Composition` of a config built by its ``of`` (empty for one made directly)."""
    found: Composition = vars(config).get("_composition", Composition())
    return found


def with_composition(config: ConfigT, composed: Composition) -> ConfigT:
    """``config`` carrying ``composed`` (kept out of the dataclass fields, which are the
    schema's keys and so the config's)."""
    vars(config)["_composition"] = composed
    return config


def interpolation_origins(cfg: DictConfig) -> dict[str, str]:
    """Each key whose value is another key's, by interpolation (``optimizer.lr`` ->
    ``${phase.lr.adamw}`` -> ``${task.lr}``), mapped to the key the value is set at
    (``task.lr``): the key a user typed, for messages about the value."""
    try:
        raw = OmegaConf.to_container(cfg, resolve=False)
    except OmegaConfBaseException:
        return {}
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, Mapping):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        else:
            flat[prefix] = node

    walk(raw, "")
    origins = {}
    for key, value in flat.items():
        origin, hops = key, 0
        while isinstance(value, str) and hops < 32:
            match = _ALIAS.fullmatch(value)
            if match is None or match.group(1) not in flat:
                break
            origin, value, hops = match.group(1), flat[match.group(1)], hops + 1
        if origin != key:
            origins[key] = origin
    return origins


def _does_not_resolve(err: Exception) -> str:
    return f"the config does not resolve: {err}".splitlines()[0]


def _interpolation_message(cfg: DictConfig, err: InterpolationKeyError) -> str:
    key = str(err.full_key or "")
    text = str(err).splitlines()[0]
    if key == "optimizer.lr" and "phase.lr." in text:
        family = text.split("phase.lr.")[1].split("'")[0]
        tuned = ", ".join(OmegaConf.select(cfg, "phase.lr", default={}) or {}) or "none"
        return (
            f"the optimizer takes its learning rate from phase.lr.{family}, which "
            f"phase={OmegaConf.select(cfg, 'phase.name')} does not set (it has LRs for "
            f"{tuned}); set optimizer.lr=<value> or +phase.lr.{family}=<value>."
        )
    return f"{key or 'the config'} does not resolve: {text}"


def build(spec: Any, *args: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(spec, *args, **kwargs)`` for a ``_target_`` mapping; a
    :class:`UserError` raised by the target is re-raised as it is."""
    try:
        return instantiate(spec, *args, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        raise


class Node(Mapping[str, Any]):
    """A ``_target_`` node of the run's config: its resolved values, read-only, and
    ``path``, the key it sits under (``optimizer``, ``callbacks.checkpoint``, ...)."""

    __slots__ = ("_values", "path")

    def __init__(self, values: Mapping[str, Any], path: str) -> None:
        self._values = copy.deepcopy(dict(values))
        self.path = path

    def __getitem__(self, key: str) -> Any:
        return copy.deepcopy(self._values[key])

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Node({self.path}: {self._values!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Node) and other._values == self._values

    __hash__ = None  # type: ignore[assignment]

    @property
    def target(self) -> str | None:
        """The ``_target_`` it builds."""
        value = self._values.get("_target_")
        return None if value is None else str(value)

    def plain(self) -> dict[str, Any]:
        """A copy as plain containers (what a checkpoint's hyper-parameters keep)."""
        return copy.deepcopy(self._values)

    def build(self, *args: Any, **kwargs: Any) -> Any:
        """The configured object (:func:`build` of a copy: building never changes the node)."""
        return build(self.plain(), *args, **kwargs)


class Optimizer(Node):
    """``optimizer``: the update rule's ``_target_`` node (what it builds checks every key),
    with the keys the run itself reads as typed attributes, each as the target defaults it
    where the config leaves it out."""

    __slots__ = ()

    def __init__(self, values: Mapping[str, Any], path: str = "optimizer") -> None:
        super().__init__(values, path)

    @property
    def lr(self) -> float | None:
        """``optimizer.lr`` (None: not a number, e.g. unset)."""
        value = self._values.get("lr")
        return float(value) if isinstance(value, int | float) else None

    @property
    def weight_decay(self) -> float:
        return float(self._values.get("weight_decay", 0.0))

    def no_weight_decay(self, default: Any) -> Any:
        """``optimizer.no_weight_decay``: the parameter-name patterns kept out of the decay
        (``default`` where the node does not set it)."""
        return self._values.get("no_weight_decay", default)

    @property
    def sets_max_grad_norm(self) -> bool:
        """The node sets ``max_grad_norm`` (LAMB: null switches the optimiser's clip off)."""
        return "max_grad_norm" in self._values

    @property
    def max_grad_norm(self) -> float | None:
        """The norm the optimiser clips the accumulated gradient to (None: it does not)."""
        value = self._values.get("max_grad_norm")
        return None if value is None else float(value)

    @property
    def impl(self) -> str:
        """LAMB's ``impl`` (``auto``: :func:`omnibert.optim.lamb.choose_impl` decides)."""
        return str(self._values.get("impl", "auto"))

    @property
    def compile_min_numel(self) -> int | None:
        """LAMB's ``compile_min_numel`` (None: the optimiser's default)."""
        value = self._values.get("compile_min_numel")
        return None if value is None else int(value)

    @property
    def fused(self) -> Any:
        """AdamW's ``fused`` (``auto``, true, false or None)."""
        return self._values.get("fused")

    @property
    def foreach(self) -> Any:
        """AdamW's ``foreach`` (None: torch's choice)."""
        return self._values.get("foreach")


def node_or_none(values: Any, path: str) -> Node | None:
    """A :class:`Node` of ``values``, or None where the config has none (``schedule: null``)."""
    return None if values is None else Node(values, path)


def nodes(values: Mapping[str, Any] | None, path: str) -> tuple[Node, ...]:
    """The non-null entries of a group of nodes (``callbacks``, ``logger``), in order."""
    return tuple(Node(v, f"{path}.{k}") for k, v in (values or {}).items() if v is not None)
