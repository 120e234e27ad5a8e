"""FAKE ``lightning_habana.pytorch.plugins``: ``HPUPrecisionPlugin(precision, device="hpu")``."""

from __future__ import annotations

from typing import Any

_SUPPORTED = ("32", "32-true", "bf16", "bf16-mixed", "fp8")


class HPUPrecisionPlugin:
    def __init__(self, precision: str, device: str = "hpu", **kwargs: Any) -> None:
        if precision not in _SUPPORTED:  # the real plugin raises the same way
            raise ValueError(f"precision={precision!r} is not supported on HPU")
        self.precision = precision
        self.device = device
        self.fake = True
