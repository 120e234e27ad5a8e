"""CPU: fp32 or bf16 autocast, one process per ``devices`` (gloo DDP for more than one).

Threads: :mod:`omnibert.threads` (the CPUs this process may use, less the cores its loader
workers really use; waiting OpenMP threads sleep). bf16: refused on a CPU without native bf16
(:mod:`omnibert.accelerators.cpu_bf16`) unless ``allow_slow_bf16``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin
from omnibert.accelerators.cpu_bf16 import Bf16Support, cpu_bf16_support
from omnibert.compat import compile_in_place
from omnibert.errors import yes_no
from omnibert.threads import WAIT_POLICIES, choose_threads, set_wait_policy_env

__all__ = ["CPUPlugin", "compile_in_place"]


#: ``accelerator.compile=auto`` on a CPU: seconds a cold compile of bert-tiny's training step
#: takes on 2 cores (a warm inductor cache takes a fraction of it), scaled by layers / 2: an
#: estimate that decides compile=auto, not a recorded measurement
COMPILE_SECONDS_PER_2_LAYERS = 37.0
#: ... and compile only where the run is projected to last this many compile times: on a CPU
#: the compiled step gains nothing on small steps and a little where larger steps fuse
#: (docs/accelerators/cpu.md has the timings), so a run this long loses at most 1/20 to
#: compiling and keeps what the fusion gains
COMPILE_PAYS_AFTER = 20.0


def compile_pays(run_seconds: float | None, layers: int) -> tuple[bool, str]:
    """``accelerator.compile=auto`` on a CPU: compile when the eager run is projected to last
    :data:`COMPILE_PAYS_AFTER` times the estimated compile time, and why (in words)."""
    cost = COMPILE_SECONDS_PER_2_LAYERS * max(1.0, layers / 2)
    if run_seconds is None:
        return False, "compile=auto; no timed rate to project the run's length (eager)"
    need = COMPILE_PAYS_AFTER * cost
    span = f"the run is projected at {run_seconds / 60:.1f} min eager"
    if run_seconds >= need:
        return True, (
            f"compile=auto: {span}, over {COMPILE_PAYS_AFTER:.0f}x the ~{cost:.0f} s compile"
        )
    return False, (
        f"compile=auto; {span}, under {COMPILE_PAYS_AFTER:.0f}x the ~{cost:.0f} s compile, "
        "too short for what it saves per step on a CPU"
    )


class CPUPlugin(AcceleratorPlugin):
    """CPU training.

    Args:
        compile: ``torch.compile`` the model's forward in place before training (``True``),
            or not; ``"auto"``: where the run is long enough to pay (:func:`compile_pays`).
        compile_options: ``torch.compile`` keyword arguments (``mode``, ``dynamic``, ...).
        threads: intra-op threads per process; ``None``: ``OMP_NUM_THREADS`` if set, else
            the CPUs this process may use, less what its loader workers really use
            (:mod:`omnibert.threads`).
        omp_wait_policy: ``passive`` (waiting OpenMP threads sleep), ``active`` (they spin)
            or ``None`` (the runtime's default); set before torch loads by ``omnibert-train``.
        allow_slow_bf16: run bf16 on a CPU without native bf16 (emulated: orders of
            magnitude slower than fp32) instead of refusing.
        auto_bf16: ``trainer.precision=auto`` runs bf16 autocast where the CPU has native
            bf16 (else fp32); ``False``: fp32 always.
    """

    name = "cpu"
    precisions = ("32-true", "32", "bf16-mixed", "bf16-true")
    zero1_strategies = ("auto", "ddp")  # gloo DDP (trainer_kwargs)

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = None,
        timeout_s: float = 300,
        optimizer_sharding: str = "none",
        compile: Any = "auto",
        compile_options: dict[str, Any] | None = None,
        threads: int | None = None,
        omp_wait_policy: str | None = "passive",
        allow_slow_bf16: bool = False,
        auto_bf16: Any = True,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator, timeout_s, optimizer_sharding)
        if threads is not None and (
            isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
        ):
            raise AcceleratorError(
                f"accelerator.threads={threads!r} must be a positive integer, or null to choose "
                "from the CPUs this process may use."
            )
        if omp_wait_policy not in (None, *WAIT_POLICIES):
            raise AcceleratorError(
                f"accelerator.omp_wait_policy={omp_wait_policy!r} is not a wait policy; use "
                "passive, active or null (the OpenMP runtime's default)."
            )
        if compile not in ("auto", True, False):
            raise AcceleratorError(
                f"accelerator.compile={compile!r} is not auto, true or false; set one."
            )
        #: auto: decided by :meth:`decide_compile` from the run's projected length (eager
        #: until then)
        self.compile_auto = compile == "auto"
        self.compile = compile is True
        self.compile_reason = (
            "compile=auto; not decided (eager)" if self.compile_auto else "accelerator.compile"
        )
        self.compile_options = dict(compile_options or {})
        self.threads = threads
        self.omp_wait_policy = omp_wait_policy
        self.allow_slow_bf16 = bool(allow_slow_bf16)
        self.auto_bf16 = yes_no(auto_bf16, "accelerator.auto_bf16", AcceleratorError)
        self._bf16: Bf16Support | None = None

    def resolve_precision(self, precision: Any) -> tuple[str, str]:
        """``auto``: bf16 autocast where this CPU runs bf16 natively (AVX512-BF16/AMX: it
        reached the same held-out accuracy sooner, docs/benchmarks cpu_precision), fp32
        elsewhere or with ``accelerator.auto_bf16=false``; any other value as written."""
        if str(precision) != "auto":
            return super().resolve_precision(precision)
        if not self.auto_bf16:
            return "32-true", "trainer.precision=auto: fp32 (accelerator.auto_bf16=false)"
        support = self.bf16_support()
        if support.native:
            return "bf16-mixed", f"trainer.precision=auto: bf16 autocast, {support.reason}"
        return "32-true", f"trainer.precision=auto: fp32, no native bf16: {support.reason}"

    def check_precision(self, precision: str) -> None:
        super().check_precision(precision)
        if not str(precision).startswith("bf16") or self.allow_slow_bf16:
            return
        support = self.bf16_support()
        if not support.native:
            raise AcceleratorError(
                f"trainer.precision={precision} on a CPU without native bf16: {support.reason}, "
                "so bf16 would train orders of magnitude slower than fp32; use trainer=default "
                "(fp32), or set accelerator.allow_slow_bf16=true to run it anyway."
            )

    def bf16_support(self) -> Bf16Support:
        """:func:`~omnibert.accelerators.cpu_bf16.cpu_bf16_support`, measured once."""
        if self._bf16 is None:
            self._bf16 = cpu_bf16_support()
        return self._bf16

    def configure_threads(self, num_workers: int, rows_per_second: float | None = None) -> str:
        """Set torch's intra-/inter-op threads (:mod:`omnibert.threads`) for ``num_workers``
        loader workers feeding ``rows_per_second`` (None: not measured); what and why."""
        threads, reason = choose_threads(
            self.threads, num_workers, self.devices, rows_per_second=rows_per_second
        )
        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # only before the first inter-op work
            torch.set_num_interop_threads(threads)
        policy = set_wait_policy_env(self.omp_wait_policy)
        return f"{threads} intra-op ({reason}); {policy}"

    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        kwargs = super().trainer_kwargs(precision)
        if self.world_size > 1 and self.strategy in ("auto", "ddp"):
            from omnibert.accelerators.ddp import ddp_strategy

            kwargs["strategy"] = ddp_strategy(  # gloo on CPU
                self.timeout_s, optimizer_sharding=self.optimizer_sharding
            )
        return kwargs

    def compile_model(self, model: nn.Module) -> nn.Module:
        return compile_in_place(model, self.compile_options) if self.compile else model

    def decide_compile(self, run_seconds: float | None, layers: int) -> None:
        """``accelerator.compile=auto``: compile iff the run is long enough to pay
        (:func:`compile_pays`); an explicit true/false stays."""
        if self.compile_auto:
            self.compile, self.compile_reason = compile_pays(run_seconds, layers)

    def kernels(self) -> dict[str, str]:
        if self.compile:
            out = super().kernels()
            if self.compile_auto:
                out["compile"] += f" ({self.compile_reason})"
            return out
        return {"compile": f"off (eager: {self.compile_reason})"}

    def describe(self) -> dict[str, Any]:
        out = {**super().describe(), "compile": self.compile, "threads": self.threads}
        out["omp_wait_policy"] = self.omp_wait_policy
        if self._bf16 is not None:
            out["bf16"] = self._bf16.to_dict()
        return out
