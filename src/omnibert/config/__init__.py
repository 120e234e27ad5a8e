"""Each job's configuration, typed and defined once: the dataclasses here are the schemas
Hydra composes ``conf/`` against (:func:`omnibert.apps.compose.register`; OmegaConf checks
each key and type, naming the key) and, built by their ``of`` from the composed config, what
everything below the apps reads as attributes (:class:`TrainConfig`,
:class:`FinetuneConfig`, the tools' configs); ranges are checked in ``__post_init__``.
``_target_`` nodes stay :class:`Node` values until :meth:`Node.build` makes the object. No
torch here: a config error is one sentence before anything heavy is imported."""

from omnibert.config.finetune import FinetuneConfig, FinetuneData
from omnibert.config.node import Composition, Node, build, resolve
from omnibert.config.sections import ConfigError
from omnibert.config.train import TrainConfig, TrainConfigError

__all__ = [
    "Composition",
    "ConfigError",
    "FinetuneConfig",
    "FinetuneData",
    "Node",
    "TrainConfig",
    "TrainConfigError",
    "build",
    "resolve",
]
