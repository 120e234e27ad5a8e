"""Accelerator plugins selected by ``accelerator=<name>`` (cpu, gpu, hpu, ipu).

Each plugin owns its vendor imports, done lazily inside its methods: importing this package
imports no SDK. :func:`build_plugin` instantiates ``conf/accelerator/<name>.yaml`` and checks
that the backend can run here before any compute starts.
"""

from __future__ import annotations

from typing import Any

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin

__all__ = ["AcceleratorError", "AcceleratorPlugin", "build_plugin"]


def build_plugin(accelerator_cfg: Any) -> AcceleratorPlugin:
    """The plugin ``accelerator_cfg`` (the composed ``accelerator`` node) describes, checked."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    if "_target_" not in accelerator_cfg:
        raise AcceleratorError(
            "the accelerator config has no _target_; select one of conf/accelerator/*.yaml, "
            "e.g. accelerator=cpu."
        )
    _check_keys(accelerator_cfg)
    try:
        plugin = instantiate(accelerator_cfg, _convert_="all")
    except InstantiationException as err:  # a plugin's own check of its keys
        if isinstance(err.__cause__, AcceleratorError):
            raise err.__cause__ from None
        raise
    if not isinstance(plugin, AcceleratorPlugin):
        raise AcceleratorError(
            f"accelerator._target_={accelerator_cfg['_target_']} is not an AcceleratorPlugin; "
            "point it at a class in omnibert.accelerators."
        )
    plugin.check()
    return plugin


def _check_keys(accelerator_cfg: Any) -> None:
    """Refuse keys the plugin class does not take (e.g. an HPU experiment's ``mode`` after
    ``accelerator=cpu``) with one sentence naming them, instead of Hydra's traceback."""
    import inspect

    from hydra.utils import get_class

    target = str(accelerator_cfg["_target_"])
    try:
        cls = get_class(target)
    except Exception:
        return  # instantiate reports an unknown target itself
    params = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    unknown = sorted(
        str(k) for k in accelerator_cfg if not str(k).startswith("_") and str(k) not in params
    )
    if unknown:
        keys = ", ".join(f"accelerator.{k}" for k in unknown)
        removal = " ".join(f"~accelerator.{k}" for k in unknown)
        raise AcceleratorError(
            f"{keys} {'is not a setting' if len(unknown) == 1 else 'are not settings'} of "
            f"{cls.__name__} (accelerator={accelerator_cfg.get('accelerator', '?')}), left by "
            f"a config made for another accelerator; add {removal} to the command line or "
            "pick that accelerator."
        )
