"""Which app a command line's ``experiment=`` and ``task=`` choices belong to, checked before
Hydra composes them (:func:`check_choices`, called by the console scripts' preflight).

``omnibert-train`` and ``omnibert-finetune`` share the ``experiment`` and ``task`` groups.
Composed by the other app, a choice fails inside Hydra (``omnibert-finetune
experiment=smoke``: "Could not override 'model'"; ``task=pretraining``: a traceback on the run
directory's ``${task.name}``) or, worse, runs something else: ``experiment=glue`` without
``-m`` ignores its sweep and fine-tunes the default task. Each is one sentence here, with the
command that does what was asked. An experiment is a fine-tuning one when it overrides
``task`` with a fine-tuning task or sweeps ``task`` (read from its YAML file, without
composing); a sweep experiment is one whose file sets ``hydra.sweeper.params``.

The command line is read with Hydra's own override parser: :func:`group_choices` (every
option a group is given, sweeps included) and :func:`single_run` (each sweep at its first
value: the run the preflight composes, :mod:`omnibert.apps.preflight`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cache
from importlib import resources

from omnibert.apps.compose import CONFIG_MODULE, group_options
from omnibert.errors import UserError

__all__ = [
    "AppChoiceError",
    "check_choices",
    "experiment_app",
    "group_choices",
    "single_run",
    "sweeps",
]

#: each app's config name → its console script
APPS = {"pretrain": "omnibert-train", "finetune": "omnibert-finetune"}
#: the task omnibert-train runs; every other ``task`` option is a fine-tuning task
PRETRAINING_TASK = "pretraining"


class AppChoiceError(UserError):
    """A group option of the other app, or a sweep experiment run without ``-m``."""


def group_choices(argv: Sequence[str], group: str) -> list[str]:
    """Every option the overrides ``argv`` choose for ``group`` (``task=mrpc``, each value of
    a sweep ``task=mrpc,rte``, ``+task=...``); empty when none does or the overrides do not
    parse (Hydra reports that itself)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(argv))
        return [
            str(value)
            for o in parsed
            if o.get_key_element().lstrip("+~") == group
            for value in (o.sweep_string_iterator() if o.is_sweep_override() else [o.value()])
        ]
    except Exception:  # grammar errors, interval/glob sweeps: Hydra handles them
        return []


def single_run(overrides: Sequence[str]) -> list[str] | None:
    """The overrides with each sweep reduced to its first value (None: cannot reduce)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return [
            f"{o.get_key_element()}={next(o.sweep_string_iterator())}"
            if o.is_sweep_override()
            else str(o.input_line)
            for o in parsed
        ]
    except Exception:  # grammar errors, interval/glob sweeps: Hydra handles them
        return None


@cache
def _experiment(name: str) -> dict:
    from omegaconf import OmegaConf

    path = resources.files(CONFIG_MODULE).joinpath("experiment", f"{name}.yaml")
    if not path.is_file():
        return {}
    node = OmegaConf.to_container(OmegaConf.create(path.read_text(encoding="utf-8")))
    return node if isinstance(node, dict) else {}


def _task_override(node: dict) -> str | None:
    for entry in node.get("defaults") or []:
        if isinstance(entry, dict):
            for key, value in entry.items():
                if str(key).split()[-1].strip("/") == "task":
                    return str(value)
    return None


def _swept(name: str) -> dict:
    """Experiment ``name``'s ``hydra.sweeper.params`` (empty: not a sweep)."""
    return ((_experiment(name).get("hydra") or {}).get("sweeper") or {}).get("params") or {}


def sweeps(name: str) -> bool:
    """Whether experiment ``name`` is a sweep (its file sets ``hydra.sweeper.params``)."""
    return bool(_swept(name))


def experiment_app(name: str) -> str:
    """The console script experiment ``name`` is for: ``omnibert-finetune`` when it chooses
    or sweeps a fine-tuning task, else ``omnibert-train``."""
    task = _task_override(_experiment(name))
    if (task is not None and task != PRETRAINING_TASK) or "task" in _swept(name):
        return APPS["finetune"]
    return APPS["pretrain"]


def _experiments_of(app: str) -> str:
    return ", ".join(e for e in group_options("experiment") if experiment_app(e) == app)


def check_choices(config_name: str, argv: Sequence[str], multirun: bool) -> None:
    """:class:`AppChoiceError` for an ``experiment=`` of the other app, a sweep experiment
    without ``-m`` and ``omnibert-finetune task=pretraining`` (``omnibert-train`` refuses a
    fine-tuning task itself, after composing: that composes)."""
    app = APPS.get(config_name)
    if app is None:
        return
    options = set(group_options("experiment"))
    for name in group_choices(argv, "experiment"):
        if name not in options:
            continue  # the unknown-option sentence of the preflight names the options
        owner = experiment_app(name)
        if owner != app:
            sweep = " -m" if sweeps(name) else ""
            raise AppChoiceError(
                f"experiment={name} is an {owner} experiment; run {owner}{sweep} "
                f"experiment={name} ({app} takes experiment={{{_experiments_of(app)}}})."
            )
        if sweeps(name) and not multirun:
            raise AppChoiceError(
                f"experiment={name} is a sweep (its file sets hydra.sweeper.params); run it "
                f"with -m: {app} -m experiment={name} ..."
            )
    if app == APPS["finetune"]:
        _refuse_added_task_keys(argv)
    if app == APPS["finetune"] and PRETRAINING_TASK in group_choices(argv, "task"):
        tasks = ", ".join(t for t in group_options("task") if t != PRETRAINING_TASK)
        raise AppChoiceError(
            f"task={PRETRAINING_TASK} is omnibert-train's task; pretrain with omnibert-train, "
            f"or fine-tune one of {tasks} (task=<name>)."
        )


def _refuse_added_task_keys(argv: Sequence[str]) -> None:
    """``+task.<key>=...`` that the chosen task's recipe does not have: a fine-tuning task
    keeps any key in its recipe (its ``**settings``), where nothing reads it."""
    added = [a for a in argv if re.match(r"^\+\+?task\.", a) and "=" in a]
    if not added:
        return
    from omegaconf import OmegaConf

    from omnibert.apps.compose import compose

    reduced = single_run([a for a in argv if a not in added])
    if reduced is None:
        return
    try:
        base = compose("finetune", reduced)
    except Exception:  # a composition problem of its own: the preflight reports it
        return
    for arg in added:
        key = arg.split("=", 1)[0].lstrip("+")
        if OmegaConf.select(base, key, default=_ABSENT) is _ABSENT:
            name = OmegaConf.select(base, "task.name")
            keys = ", ".join(sorted(k for k in base.task if not str(k).startswith("_")))
            raise AppChoiceError(
                f"{key} is not a setting of task={name} (its recipe has {keys}); nothing would "
                f"read it: remove +{key}."
            )


#: what OmegaConf.select answers for a key the config does not have
_ABSENT = object()
