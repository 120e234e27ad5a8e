"""The run's configuration, typed: Hydra composes ``conf/``, the app turns the composed
config into one of these frozen dataclasses at once, and everything below the apps reads
attributes (:class:`TrainConfig`, :class:`FinetuneConfig`); ``_target_`` nodes stay
:class:`Node` values until :meth:`Node.build` makes the object. No torch here: a config
error is one sentence before anything heavy is imported."""

from omnibert.config.finetune import FinetuneConfig, FinetuneData
from omnibert.config.node import Node, build, resolve
from omnibert.config.sections import ConfigError
from omnibert.config.train import TrainConfig, TrainConfigError

__all__ = [
    "ConfigError",
    "FinetuneConfig",
    "FinetuneData",
    "Node",
    "TrainConfig",
    "TrainConfigError",
    "build",
    "resolve",
]
