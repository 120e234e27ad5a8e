"""Where the apps' Hydra configs live and how tests and scripts compose them as the apps do.

The configs are the package ``omnibert.conf`` (the repository's top-level ``conf/``, mapped
into the package by pyproject.toml), found through Hydra's ``pkg://`` search path, so an
editable install and a wheel on a cluster node read the same files.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from omegaconf import DictConfig

CONFIG_MODULE = "omnibert.conf"
#: ``config_path`` of every ``@hydra.main`` in :mod:`omnibert.apps`
CONFIG_PATH = f"pkg://{CONFIG_MODULE}"

_REGISTERED = False


#: ConfigStore name -> the module and class of the schema; each config lists its schema
#: first in its defaults (``- pretrain_schema``); ``schema/pack`` is ``data.pack`` of every
#: data config
SCHEMAS = {
    "pretrain_schema": ("omnibert.config.train", "TrainConfig"),
    "finetune_schema": ("omnibert.config.finetune", "FinetuneConfig"),
    "eval_schema": ("omnibert.config.tools", "EvalConfig"),
    "predict_schema": ("omnibert.config.tools", "PredictConfig"),
    "export_schema": ("omnibert.config.tools", "ExportConfig"),
    "prepare_schema": ("omnibert.config.prepare", "PrepareConfig"),
    "schema/pack": ("omnibert.config.pretraining", "Pack"),
}


def register() -> None:
    """Put the typed configs (:mod:`omnibert.config`: each app's config class is the schema its
    config is composed against) in Hydra's ConfigStore and the config resolvers
    (:mod:`omnibert.run.launching.sweeps`) in OmegaConf (idempotent); every app calls it
    before composing."""
    global _REGISTERED
    if _REGISTERED:
        return
    from hydra.core.config_store import ConfigStore

    from omnibert.run.launching.sweeps import register_resolvers

    register_resolvers()
    store = ConfigStore.instance()
    for key, (module, name) in SCHEMAS.items():
        group, _, option = key.rpartition("/")
        node = getattr(importlib.import_module(module), name)
        store.store(group=group or None, name=option, node=node)
    _REGISTERED = True


def compose(
    config_name: str, overrides: Sequence[str] = (), return_hydra_config: bool = False
) -> DictConfig:
    """The config an app composes for these command-line ``overrides`` (no Hydra run dir,
    no logging setup): what tests and scripts pass to an app's ``run``. With
    ``return_hydra_config`` the ``hydra`` node (launcher, sweep dir) is kept."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module

    register()
    with initialize_config_module(CONFIG_MODULE, version_base="1.3"):
        return hydra_compose(
            config_name=config_name,
            overrides=list(overrides),
            return_hydra_config=return_hydra_config,
        )


def group_options(group: str) -> list[str]:
    """The options of a config group (``conf/<group>/*.yaml``) as installed."""
    folder = resources.files(CONFIG_MODULE).joinpath(group)
    return sorted(
        entry.name.removesuffix(".yaml")
        for entry in folder.iterdir()
        if entry.name.endswith(".yaml")
    )
