"""The keys of every ``_target_`` node (accelerator, data, optimizer, schedule, task, trainer,
callbacks, logger) checked against the signature of what the node builds, before anything is
built: ``trainer.max_epochs=abc`` or ``optimizer.lr=abc`` is one sentence naming the key,
not an error from deep inside a constructor after the data was opened.

Only plain annotations are checked (``int``, ``float``, ``bool`` and ``Optional``/unions of
them); a value of null and a target that cannot be imported are left to the constructor,
which reports them itself. A key the signature does not name (added with ``+``) is refused
where the target takes no ``**kwargs``.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from omnibert.config.node import Node
from omnibert.errors import UserError

__all__ = ["TargetTypeError", "check_target_types"]

_SCALARS = {int: "an integer", float: "a number", bool: "true or false"}


class TargetTypeError(UserError):
    """A key of a ``_target_`` node whose value is not of the type its target takes."""


def check_target_types(nodes: Iterable[Node], origins: Mapping[str, str] | None = None) -> None:
    """Raise :class:`TargetTypeError` for the first key of a ``_target_`` node (one of
    ``nodes``, or one nested in them: a data source, a task's data) whose value its
    target's signature refuses. ``origins`` (the config's
    :func:`~omnibert.config.node.interpolation_origins`) name the key the value was typed
    at when it came by interpolation (``task.lr`` for fine-tuning's ``optimizer.lr``)."""
    for root in nodes:
        for path, node in _target_nodes(root, root.path):
            hints = _hints(str(node["_target_"]))
            _refuse_unnamed(path, node)
            for key, value in node.items():
                if key.startswith("_") or value is None or key not in hints:
                    continue
                kinds = hints[key]
                if not any(_accepts(kind, value) for kind in kinds):
                    expected = " or ".join(dict.fromkeys(_SCALARS[k] for k in kinds))
                    where = f"{path}.{key}" if path else key
                    typed = (origins or {}).get(where, where)
                    sets = f"it sets {where}: " if typed != where else ""
                    raise TargetTypeError(
                        f"{typed}={value!r} is not {expected} ({sets}{node['_target_']} takes "
                        f"{key} as {expected}); fix {typed}."
                    )


def _refuse_unnamed(path: str, node: Mapping[str, Any]) -> None:
    """A key (added with ``+``) that a target taking no ``**kwargs`` does not name: its
    constructor would end the run in a ``TypeError`` traceback."""
    names = _parameter_names(str(node["_target_"]))
    for key in node:
        if names is not None and not key.startswith("_") and key not in names:
            where = f"{path}.{key}" if path else key
            taken = ", ".join(sorted(n for n in names if n not in ("self", "args", "kwargs")))
            raise TargetTypeError(
                f"{where} is not a setting of {node['_target_']} (it takes {taken}); remove "
                f"{where}."
            )


def _parameter_names(target: str) -> set[str] | None:
    """The keyword names ``target`` takes; None when it takes any (``**kwargs`` at the end
    of its initialisers) or cannot be imported (left to it)."""
    try:
        from hydra.utils import get_object

        obj = get_object(target)
        functions = _initialisers(obj) if inspect.isclass(obj) else [obj]
        parameters = [p for f in functions for p in inspect.signature(f).parameters.values()]
    except Exception:
        return None
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        return None  # where **kwargs go (a base class, a data source, a recipe) is its own
    return {p.name for p in parameters}


def _target_nodes(node: Any, path: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    if isinstance(node, Mapping):
        if isinstance(node.get("_target_"), str):
            yield path, node
        for key, child in node.items():
            yield from _target_nodes(child, f"{path}.{key}" if path else str(key))


def _accepts(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind is float:
        return isinstance(value, (int, float))
    return isinstance(value, kind)


def _hints(target: str) -> dict[str, tuple[type, ...]]:
    """Parameter name -> the scalar types it takes, for the parameters of ``target``
    (a class's ``__init__`` or a function) annotated with scalars only."""
    try:
        from hydra.utils import get_object

        obj = get_object(target)
        functions = _initialisers(obj) if inspect.isclass(obj) else [obj]
        annotations: dict[str, Any] = {}
        for function in reversed(functions):  # a subclass's own annotation wins
            annotations.update(typing.get_type_hints(function))
    except Exception:  # not importable, or annotations that do not evaluate: left to it
        return {}
    out: dict[str, tuple[type, ...]] = {}
    for name, annotation in annotations.items():
        kinds = _scalar_kinds(annotation)
        if kinds:
            out[name] = kinds
    return out


def _initialisers(cls: type) -> list[Any]:
    """``cls.__init__``, and while each passes ``**kwargs`` on, its bases' (a subclass such
    as ``PretrainingCheckpoint`` takes the keys of Lightning's ``ModelCheckpoint`` too)."""
    found: list[Any] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        found.append(init)
        kinds = {p.kind for p in inspect.signature(init).parameters.values()}
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            break
    return found


def _scalar_kinds(annotation: Any) -> tuple[type, ...]:
    """The scalar types of ``annotation`` when it is made of scalars (and None) only."""
    if annotation in _SCALARS:
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if args and all(a in _SCALARS for a in args):
            return tuple(args)
    return ()
