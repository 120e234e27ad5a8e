"""FAKE ``lightning_habana.pytorch``."""

from .accelerator import HPUAccelerator
from .plugins import HPUPrecisionPlugin
from .strategies import HPUParallelStrategy, SingleHPUStrategy

__all__ = ["HPUAccelerator", "HPUParallelStrategy", "HPUPrecisionPlugin", "SingleHPUStrategy"]
