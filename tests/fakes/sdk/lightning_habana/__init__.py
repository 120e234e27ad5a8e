"""FAKE lightning_habana for CPU tests (not the Lightning-AI/Habana package): classes with the
documented constructor signatures that record their arguments; they cannot train.

The top level re-exports the classes as the real package does: Lightning 2.5.0-2.5.5 imports
``HPUAccelerator``, ``HPUParallelStrategy`` and ``SingleHPUStrategy`` from it (and calls
their ``register_*`` class methods) whenever the lightning-habana distribution is installed,
which it is in the HPU environment of scripts/envs/hpu_env.sh."""

from .pytorch import HPUAccelerator, HPUParallelStrategy, HPUPrecisionPlugin, SingleHPUStrategy

__all__ = ["HPUAccelerator", "HPUParallelStrategy", "HPUPrecisionPlugin", "SingleHPUStrategy"]
