"""FAKE ``lightning_habana.pytorch.strategies`` with the documented constructors."""

from __future__ import annotations

from typing import Any

from .accelerator import REGISTERED


class SingleHPUStrategy:
    @classmethod
    def register_strategies(cls, registry: Any) -> None:
        REGISTERED.append(("strategies", registry))

    def __init__(self, device: Any = "hpu", accelerator: Any = None, **kwargs: Any) -> None:
        self.device = device
        self.accelerator = accelerator
        self.fake = True


class HPUParallelStrategy:
    @classmethod
    def register_strategies(cls, registry: Any) -> None:
        REGISTERED.append(("strategies", registry))

    def __init__(
        self,
        accelerator: Any = None,
        parallel_devices: list[Any] | None = None,
        process_group_backend: str | None = "hccl",
        **kwargs: Any,
    ) -> None:
        self.parallel_devices = parallel_devices
        self.process_group_backend = process_group_backend
        self.kwargs = kwargs
        self.fake = True
