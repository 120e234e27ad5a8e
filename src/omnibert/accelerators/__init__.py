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
