"""What each console script checks before Hydra runs its app, because Hydra acts on the
command line before the app's code runs:

* a mistyped key (``phase.max_step=3``) fails inside Hydra's composition with advice to add
  it with ``+``; here it is one line naming the closest existing keys (``difflib``), exit 2;
  likewise a config group option that does not exist (``model=bert_bse``);
* Hydra creates its run directory (``omnibert-train``'s lives under ``paths.output_root``)
  before the app starts, where an unwritable one would end in Hydra's traceback; the app's
  output keys and Hydra's directory are checked here with
  :func:`omnibert.paths.check_writable_dir`.

* an experiment or task of the other app, and a sweep experiment without ``-m``
  (:mod:`omnibert.apps.choices`), which Hydra would compose into an error of its own or,
  worse, into another run than the one asked for;
* an app's ``checks`` (``omnibert-prepare``'s ranges) run on that composed config, so such
  errors appear in about a second instead of after the seconds torch, Lightning and the
  data libraries take to import (the other apps' ranges and data paths are checked first
  thing in the app by their typed configs, also before those imports).

The command line is composed once the way Hydra will compose it (a multirun sweep by its
first value, so ``-m`` keeps working); anything else that goes wrong is left to Hydra,
which reports it as before.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omnibert.apps.choices import check_choices, single_run
from omnibert.errors import UserError, exit_on
from omnibert.paths import check_writable_dir, check_writable_file, note_hydra_dir

__all__ = [
    "ConfigKeyError",
    "ConfigTypeError",
    "MissingPathError",
    "check_command_line",
    "check_paths",
    "preflight",
]

Check = Callable[[Any], None]


class ConfigKeyError(UserError):
    """A command-line key or group option that the config does not have."""


class MissingPathError(UserError):
    """An input path of the config does not exist."""


class ConfigTypeError(UserError):
    """A value of the wrong type for its key (``max_seq_length=abc``)."""


def preflight(
    app: str,
    config_name: str,
    output_keys: Sequence[str],
    checks: Sequence[Check] = (),
    output_files: Sequence[str] = (),
) -> Any:
    """:func:`check_command_line` on ``sys.argv``; a problem is one line and exit code 2.
    Returns the composed config (None when it was not composed)."""
    with exit_on(app):
        return check_command_line(config_name, output_keys, sys.argv[1:], checks, output_files)


def check_command_line(
    config_name: str,
    output_keys: Sequence[str],
    argv: Sequence[str],
    checks: Sequence[Check] = (),
    output_files: Sequence[str] = (),
) -> Any:
    """Raise :class:`ConfigKeyError` for an unknown key or group option in ``argv``,
    :class:`omnibert.paths.PathError` when an ``output_keys`` directory, an ``output_files``
    file or Hydra's run (or sweep) directory cannot be written, and what ``checks`` raise for the composed config
    (a :class:`UserError` only: anything else is left for the app to report). Returns the
    composed config of a run that will write, else None."""
    args = _parse(argv)
    if args is None or args.config_path or args.config_dir or args.experimental_rerun:
        return None  # another config than the packaged one: Hydra reports its own problems
    modes = [flag for flag, on in (("-m", args.multirun), ("--cfg", args.cfg),
                                   ("--info", args.info)) if on]  # fmt: skip
    if len(modes) > 1:  # Hydra's own ValueError, with its traceback
        raise ConfigKeyError(
            f"{' and '.join(modes)} cannot be combined (Hydra takes one of them); keep one: "
            "-m runs the sweep, --cfg prints the config, --info prints Hydra's information."
        )
    # the help composes the config too: another app's experiment fails inside it
    helping = bool(args.help or args.hydra_help or args.info or args.shell_completion)
    printing = helping or bool(args.cfg)  # nothing runs: a sweep experiment may be shown
    check_choices(config_name, args.overrides, multirun=bool(args.multirun) or printing)
    if helping:
        return None
    overrides = single_run(args.overrides)
    if overrides is None:
        return None
    cfg = _compose(args.config_name or config_name, overrides)
    if cfg is None or args.cfg:  # --cfg only prints the config: nothing is written
        return None
    hydra_dir = "hydra.sweep.dir" if args.multirun else "hydra.run.dir"
    for key in (*output_keys, hydra_dir):
        value = _select(cfg, key)
        if isinstance(value, str) and value and value != "???":
            check_writable_dir(value, key)
            if key == hydra_dir:
                note_hydra_dir(value)
    for key in output_files:
        value = _select(cfg, key)
        if isinstance(value, str) and value and value != "???":
            check_writable_file(value, key)
    for check in checks:
        try:
            check(cfg)
        except UserError:
            raise
        except Exception:  # an interpolation, a key a check did not expect: the app says
            pass
    return cfg


def check_paths(keys: Sequence[str]) -> Check:
    """A check that each of ``keys`` (``data.train_path``, ...) that is set and is not a glob
    names something that exists (relative to the working directory, as the app reads it)."""

    def check(cfg: Any) -> None:
        import glob
        from pathlib import Path

        for key in keys:
            value = _select(cfg, key)
            if not isinstance(value, str) or value in ("", "???") or glob.has_magic(value):
                continue
            if not Path(value).exists():
                raise MissingPathError(f"{key}={value} does not exist; fix {key}.")

    return check


def _parse(argv: Sequence[str]) -> Any:
    from hydra._internal.utils import get_args_parser

    try:
        return get_args_parser().parse_args(list(argv))
    except SystemExit:  # argparse's own error: Hydra prints it
        return None


def _compose(config_name: str, overrides: list[str]) -> Any:
    """The config Hydra will compose, or None when composing fails for a reason Hydra
    reports better; raises :class:`ConfigKeyError` for an unknown key or option."""
    from hydra.errors import ConfigCompositionException, MissingConfigException

    from omnibert.apps.compose import compose

    try:
        return compose(config_name, overrides, return_hydra_config=True)
    except MissingConfigException as err:
        _missing_option(err, overrides)
    except ConfigCompositionException as err:
        _wrong_type(err)
        match = re.match(r"Could not override '([^']+)'", str(err))
        if match is None:
            return None
        _unknown_key(match.group(1), config_name, overrides)
    except Exception:  # e.g. OmegaConf's assertion on a key under a group left null
        _key_of_null_group(config_name, overrides)
        return None
    return None


def _key_of_null_group(config_name: str, overrides: list[str]) -> None:
    """Raise :class:`ConfigKeyError` when an override sets a key under a config group this
    config leaves off (``mlperf: null`` in the defaults): composing it fails inside OmegaConf
    with an assertion that names nothing."""
    from importlib import resources

    from omegaconf import OmegaConf

    from omnibert.apps.compose import CONFIG_MODULE, compose

    for override in overrides:
        key, eq, value = override.partition("=")
        if not eq or key.startswith(("~", "+")) or "." not in key or "@" in key:
            continue
        group = key.split(".", 1)[0]
        # the group selections alone: another key's problem must not hide this one's
        rest = [o for o in overrides if "." not in o.partition("=")[0]]
        try:
            off = OmegaConf.select(compose(config_name, rest), group, default=0) is None
        except Exception:
            continue
        if not off:
            continue
        folder = resources.files(CONFIG_MODULE) / group
        options = sorted(
            f.name.removesuffix(".yaml")
            for f in (folder.iterdir() if folder.is_dir() else ())
            if f.name.endswith(".yaml")
        )
        choose = (
            f"choose one first ({', '.join(f'{group}={o}' for o in options)})" if options else ""
        )
        raise ConfigKeyError(
            f"{key}={value} sets a key of {group}, which this config leaves off ({group}: null); "
            f"{choose + ' or ' if choose else ''}drop {key}."
        )


#: the first line of OmegaConf's conversion error -> what the value is not
_EXPECTED = (
    ("converted to Integer", "is not an integer"),
    ("converted to Float", "is not a number"),
    ("is not a valid bool", "is not true or false"),
    ("is not Optional", "cannot be null"),
    ("Cannot assign", "is not a mapping of keys to values"),
)


def _wrong_type(err: Exception) -> None:
    """Raise :class:`ConfigTypeError` when composing failed on a value the schema does not
    accept (OmegaConf's ``ValidationError`` behind Hydra's exception names the key)."""
    from omegaconf.errors import ValidationError

    cause = err.__cause__
    if not isinstance(cause, ValidationError) or not getattr(cause, "full_key", None):
        return
    key = str(cause.full_key)
    first = str(getattr(cause, "msg", "") or "").split("\n", 1)[0]
    problem = next((said for found, said in _EXPECTED if found in first), None)
    if problem is None:
        problem = f"is not accepted ({first.rstrip('.')})"
    value = getattr(cause, "value", None)
    shown = "null" if value is None else str(value)
    raise ConfigTypeError(f"{key}={shown} {problem}; fix {key}.")


def _unknown_key(bad: str, config_name: str, overrides: list[str]) -> None:
    from omnibert.apps.compose import compose

    rest = [o for o in overrides if o.split("=", 1)[0].lstrip("~+") != bad]
    try:
        keys = _keys(compose(config_name, rest, return_hydra_config=bad.startswith("hydra.")))
    except Exception:
        keys = []
    matches = closest(bad, keys)
    if matches:
        hint = f"did you mean {' or '.join(matches)}?"
    else:
        parent = bad.rpartition(".")[0]
        siblings = [k for k in keys if k.rpartition(".")[0] == parent]
        where = parent or "the top level"
        more = ", ..." if len(siblings) > 15 else ""
        hint = (
            f"{where} has {', '.join(siblings[:15])}{more}." if siblings else "check its spelling."
        )
    raise ConfigKeyError(f"{bad} is not a key of the config; {hint}")


def closest(bad: str, keys: Sequence[str]) -> list[str]:
    """The keys ``bad`` most likely meant: a close name under the same parent, else the
    same or a close name anywhere (``max_steps`` -> ``phase.max_steps``)."""
    parent, _, leaf = bad.rpartition(".")
    siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == parent}
    near = difflib.get_close_matches(leaf, list(siblings), n=3, cutoff=0.6)
    if near:
        return [siblings[name] for name in near]
    by_leaf: dict[str, list[str]] = {}
    for key in keys:
        by_leaf.setdefault(key.rpartition(".")[2], []).append(key)
    near = difflib.get_close_matches(leaf, list(by_leaf), n=3, cutoff=0.75)
    return [key for name in near for key in by_leaf[name]][:4]


def _missing_option(err: Exception, overrides: list[str]) -> None:
    missing = str(getattr(err, "missing_cfg_file", "") or "")
    options = [str(o) for o in (getattr(err, "options", None) or [])]
    group, _, name = missing.rpartition("/")
    if not group or not options:
        return
    given = next(
        (o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0].endswith(group)), name
    )
    matches = difflib.get_close_matches(name, options, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(matches)}? " if matches else ""
    raise ConfigKeyError(
        f"{group}={given} is not an option of {group}; {hint}(options: {', '.join(options)})."
    )


def _keys(node: Any, prefix: str = "") -> list[str]:
    """Every key path of a config (interpolations left unresolved)."""
    from omegaconf import OmegaConf

    out: list[str] = []
    for key in node:
        path = f"{prefix}{key}"
        out.append(path)
        child = node._get_node(key)
        if OmegaConf.is_dict(child):
            out += _keys(child, f"{path}.")
    return out


def _select(cfg: Any, key: str) -> Any:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.select(cfg, key, throw_on_missing=False)
    except Exception:  # an interpolation that does not resolve: the app reports it
        return None
