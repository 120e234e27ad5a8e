"""The first steps' collectives wait long enough for every rank to compile.

A multi-process run's collectives wait ``accelerator.timeout_s`` for the other ranks, so a
rank that stopped answering ends the run after that long (:mod:`omnibert.accelerators.ddp`).
The first steps are different: there each rank compiles (``torch.compile``'s forward and
backward in the first step, the optimiser's compiled kernels in its update, evaluation's own
graph in the first validation), cold or from its compile cache
(:mod:`omnibert.run.pipeline.compile_cache`). A peer that finds its code cached waits in the
first gradient all-reduce while another compiles for minutes (BERT-large on a CPU), longer
than ``timeout_s``, and the run would end as a lost rank.

So :class:`CompileAllowance`, mixed into a Lightning strategy, keeps the process group's
timeout at the *compile allowance*, ``max(timeout_s,`` :data:`COMPILE_ALLOWANCE_S` ``)``, from
the group's start until this process has finished :data:`COMPILE_STEPS` optimiser steps (the
second step's all-reduce waits for every rank's first update), and again during its first
validation in ``fit`` and its first ``trainer.validate`` (each compiles a graph of its own);
at all other times a collective waits ``timeout_s``. A rank that dies is seen at
once whatever the timeout (its connection closes); only one that hangs in the first steps is
waited for longer.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch

__all__ = ["COMPILE_ALLOWANCE_S", "COMPILE_STEPS", "CompileAllowance", "compile_allowance"]

#: the shortest wait of a collective in the first steps (torch's own default process-group
#: timeout): a cold compile of BERT-large's step on a CPU takes minutes
COMPILE_ALLOWANCE_S = 1800.0
#: the optimiser steps of a process (counted from where it started or resumed) whose
#: collectives may wait for a peer's compile
COMPILE_STEPS = 2


def compile_allowance(timeout_s: float) -> timedelta:
    """The first steps' collective timeout for ``accelerator.timeout_s``."""
    return timedelta(seconds=max(float(timeout_s), COMPILE_ALLOWANCE_S))


class CompileAllowance:
    """Mixin for a Lightning strategy whose default process group carries its collectives:
    ``collective_timeout`` (``accelerator.timeout_s``) and ``compile_allowance`` (None: no
    allowance) are applied as the module docstring says; the rest of the arguments go to the
    strategy. The strategy calls :meth:`apply_collective_timeout` once the group exists."""

    def __init__(
        self,
        *args: Any,
        collective_timeout: timedelta | None = None,
        compile_allowance: timedelta | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.collective_timeout = collective_timeout
        self.compile_allowance = compile_allowance
        #: the global step of this process's first training batch (None: none yet)
        self._first_step: int | None = None
        self._steps_compiled = False
        #: the entry points (fit, validate) whose first validation has started: each compiles
        #: its own graph (``trainer.validate`` runs under inference mode)
        self._validated: set[str] = set()
        self._in_first_validation = False

    def collective_timeout_now(self) -> timedelta | None:
        """What a collective started now waits (None: the group's own)."""
        allowance, timeout = self.compile_allowance, self.collective_timeout
        if allowance is None or timeout is None:
            return timeout
        if self._in_first_validation:
            warming = True
        elif self._first_step is None:  # the start: nothing ran yet, or validations alone
            warming = not self._validated
        else:
            warming = not self._steps_compiled
        return max(allowance, timeout) if warming else timeout

    def apply_collective_timeout(self) -> None:
        """Set the default group's timeout to :meth:`collective_timeout_now` (where torch can)."""
        timeout = self.collective_timeout_now()
        dist = torch.distributed
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        if timeout is not None and set_timeout is not None and dist.is_initialized():
            set_timeout(timeout)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)  # type: ignore[misc]
        step = int(self._trainer().global_step)
        if self._first_step is None:
            self._first_step = step
        if not self._steps_compiled and step - self._first_step >= COMPILE_STEPS:
            self._steps_compiled = True
            self.apply_collective_timeout()

    def on_validation_start(self) -> None:
        super().on_validation_start()  # type: ignore[misc]
        entry = str(getattr(getattr(self._trainer(), "state", None), "fn", ""))
        if entry not in self._validated:
            self._validated.add(entry)
            self._in_first_validation = True
            self.apply_collective_timeout()

    def on_validation_end(self) -> None:
        super().on_validation_end()  # type: ignore[misc]
        if self._in_first_validation:
            self._in_first_validation = False
            self.apply_collective_timeout()

    def _trainer(self) -> Any:
        return self.lightning_module.trainer  # type: ignore[attr-defined]
