"""FAKE ``habana_frameworks.torch.hpu``: device queries answer from ``FAKE_DEVICES``."""

from __future__ import annotations

from typing import Any

from ..core import CALLS

#: how many Gaudi devices the fake reports (tests change it)
FAKE_DEVICES = 8


def is_available() -> bool:
    return FAKE_DEVICES > 0


def device_count() -> int:
    return FAKE_DEVICES


def get_device_name(device: Any = None) -> str:
    return "GAUDI2 (fake)"


def synchronize() -> None:
    CALLS.append(("synchronize", None))


def reset_peak_memory_stats() -> None:
    CALLS.append(("reset_peak_memory_stats", None))


def max_memory_allocated() -> int:
    return 0


class ModuleCacher:
    """Records ``ModuleCacher(max_graphs)(model=..., inplace=True)`` and returns the model."""

    def __init__(self, max_graphs: int = 10) -> None:
        self.max_graphs = max_graphs

    def __call__(self, model: Any, inplace: bool = True, **kwargs: Any) -> Any:
        CALLS.append(
            ("ModuleCacher", {"max_graphs": self.max_graphs, "inplace": inplace, **kwargs})
        )
        return model
