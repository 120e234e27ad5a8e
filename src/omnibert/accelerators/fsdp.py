"""Lightning's FSDP strategy with the first steps' compile allowance
(:mod:`omnibert.accelerators.compile_allowance`): the GPU plugin's ``strategy: fsdp``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import FSDPStrategy

from omnibert.accelerators.compile_allowance import CompileAllowance, compile_allowance

__all__ = ["OmnibertFSDPStrategy", "fsdp_strategy"]


class OmnibertFSDPStrategy(CompileAllowance, FSDPStrategy):
    """``FSDPStrategy`` whose collectives wait ``collective_timeout`` once the first steps
    are done, ``compile_allowance`` before (``timeout``: every rank joining)."""

    def setup_environment(self) -> None:
        super().setup_environment()
        self.apply_collective_timeout()


def fsdp_strategy(timeout_s: float, **kwargs: Any) -> OmnibertFSDPStrategy:
    """:class:`OmnibertFSDPStrategy` waiting ``timeout_s`` to join and per collective, at
    least the compile allowance in the first steps; ``kwargs`` passed on."""
    return OmnibertFSDPStrategy(
        timeout=timedelta(seconds=timeout_s),
        collective_timeout=timedelta(seconds=timeout_s),
        compile_allowance=compile_allowance(timeout_s),
        **kwargs,
    )
