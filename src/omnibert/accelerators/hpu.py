"""Intel Gaudi (HPU) through ``lightning-habana``: single/parallel strategies, the HPU
precision plugin, lazy or eager mode, optional HPU graphs. omnibert's LAMB runs as it is;
Habana's FusedLamb is the explicit choice ``optimizer=lamb_habana``.

Every ``habana_frameworks`` / ``lightning_habana`` import happens inside these methods. In
lazy mode (``PT_HPU_LAZY_MODE=1``) ops are accumulated until ``mark_step``:
``SingleHPUStrategy`` and ``HPUParallelStrategy`` already call
``habana_frameworks.torch.core.mark_step()`` after backward and after the optimiser step, so
the plugin adds it only to its own ``compile_only`` step. Eager mode (``PT_HPU_LAZY_MODE=0``)
runs ops one by one and ``compile: true`` builds graphs with ``torch.compile(backend=
"hpu_backend")``. Not run on Gaudi hardware in this project: the tests use fake
``habana_frameworks`` / ``lightning_habana`` modules that record these calls.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin

_MISSING = (
    "accelerator=hpu needs Intel Gaudi's habana_frameworks and lightning-habana, and {what} is "
    "not importable here; run inside Intel's Gaudi PyTorch container (vault.habana.ai) or "
    "`pip install -r requirements-hpu.txt` in an environment with the Gaudi software stack."
)


class HPUPlugin(AcceleratorPlugin):
    """Gaudi training through ``lightning_habana``.

    Args:
        mode: ``lazy`` (graphs accumulated until ``mark_step``; Gaudi's default for training)
            or ``eager``; sets ``PT_HPU_LAZY_MODE`` before ``habana_frameworks`` is imported.
        compile: eager mode only: ``torch.compile(backend="hpu_backend")`` the model's forward.
        hpu_graphs: lazy mode only: record the model's forward/backward as HPU graphs and
            replay them (``habana_frameworks.torch.hpu.ModuleCacher``); needs static shapes,
            which omnibert's batches have.
        max_graphs: how many recorded graphs ``ModuleCacher`` keeps.
    """

    name = "hpu"
    precisions = ("32-true", "32", "bf16-mixed")
    device_kind = "an Intel Gaudi HPU"
    fp8_emulation = False  # torchao's float8 tensors inside Habana's graph modes: never run

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = None,
        timeout_s: float = 300,
        optimizer_sharding: str = "none",
        mode: str = "lazy",
        compile: bool = False,
        hpu_graphs: bool = False,
        max_graphs: int = 10,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator, timeout_s, optimizer_sharding)
        if mode not in ("lazy", "eager"):
            raise AcceleratorError(f"accelerator.mode={mode!r} must be lazy or eager.")
        if compile and mode == "lazy":
            raise AcceleratorError(
                "accelerator.compile=true needs accelerator.mode=eager (torch.compile's "
                "hpu_backend runs on eager mode); set one of them."
            )
        if hpu_graphs and mode == "eager":
            raise AcceleratorError(
                "accelerator.hpu_graphs=true needs accelerator.mode=lazy (HPU graphs record "
                "lazy-mode graphs); set accelerator.hpu_graphs=false or mode=lazy."
            )
        self.mode = mode
        self.compile = bool(compile)
        self.hpu_graphs = bool(hpu_graphs)
        self.max_graphs = int(max_graphs)

    @property
    def device(self) -> torch.device:
        return torch.device("hpu")

    # ------------------------------------------------------------------ checks
    def _set_mode(self) -> None:
        wanted = "1" if self.mode == "lazy" else "0"
        current = os.environ.get("PT_HPU_LAZY_MODE")
        if "habana_frameworks.torch.core" in sys.modules and current not in (None, wanted):
            raise AcceleratorError(
                f"accelerator.mode={self.mode} but habana_frameworks was already imported with "
                f"PT_HPU_LAZY_MODE={current}; start a new process with the mode you want."
            )
        os.environ["PT_HPU_LAZY_MODE"] = wanted

    def check(self) -> None:
        self._set_mode()
        for module in ("habana_frameworks.torch.core", "lightning_habana"):
            try:
                __import__(module)
            except ImportError as err:
                raise AcceleratorError(_MISSING.format(what=module)) from err
        import habana_frameworks.torch.hpu as hthpu

        if not hthpu.is_available():
            raise AcceleratorError(
                "accelerator=hpu found the Gaudi software but no Gaudi device "
                "(habana_frameworks.torch.hpu.is_available() is False); run on a Gaudi host "
                "with the device visible to this container, or use accelerator=cpu."
            )
        found = int(hthpu.device_count())
        if found < self.devices:
            raise AcceleratorError(
                f"accelerator.devices={self.devices} but this node has {found} Gaudi "
                f"device(s); set accelerator.devices={found} or fewer."
            )

    # ------------------------------------------------------------------ Trainer
    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        self.check_precision(precision)
        from lightning_habana.pytorch.accelerator import HPUAccelerator
        from lightning_habana.pytorch.plugins import HPUPrecisionPlugin
        from lightning_habana.pytorch.strategies import HPUParallelStrategy, SingleHPUStrategy

        from omnibert.accelerators.ddp import mpi_environment

        if self.world_size > 1 or self.strategy in ("ddp", "hpu_parallel"):
            strategy: Any = HPUParallelStrategy(
                parallel_devices=[torch.device("hpu")] * self.devices,
                timeout=timedelta(seconds=self.timeout_s),
                cluster_environment=mpi_environment(),
            )
        else:
            strategy = SingleHPUStrategy()
        return {
            "accelerator": HPUAccelerator(),
            "devices": self.devices,
            "num_nodes": self.num_nodes,
            "strategy": strategy,
            # the precision lives in the plugin: Lightning refuses both
            "precision": None,
            "plugins": [HPUPrecisionPlugin(precision=_hpu_precision(precision))],
        }

    # ------------------------------------------------------------------ model
    def compile_model(self, model: nn.Module) -> nn.Module:
        if self.compile:
            import habana_frameworks.torch.core  # noqa: F401  (registers hpu_backend)

            from omnibert.compat import compile_in_place

            compile_in_place(model, {"backend": "hpu_backend"})
        elif self.hpu_graphs:
            import habana_frameworks.torch as ht

            ht.hpu.ModuleCacher(max_graphs=self.max_graphs)(model=model, inplace=True)
        return model

    def _graph_break(self) -> None:
        if self.mode == "lazy":  # lazy mode runs the accumulated graph at mark_step
            import habana_frameworks.torch.core as htcore

            htcore.mark_step()

    def synchronize(self) -> None:
        import habana_frameworks.torch.hpu as hthpu

        hthpu.synchronize()

    def reset_peak_memory(self) -> None:
        import habana_frameworks.torch.hpu as hthpu

        hthpu.reset_peak_memory_stats()

    def peak_memory(self) -> tuple[int | None, str | None]:
        import habana_frameworks.torch.hpu as hthpu

        return int(hthpu.max_memory_allocated()), "habana_frameworks.torch.hpu.max_memory_allocated"

    # ------------------------------------------------------------------ report
    def kernels(self) -> dict[str, str]:
        if self.compile:
            return {"compile": "torch.compile, backend hpu_backend (eager mode)"}
        graphs = ", HPU graphs" if self.hpu_graphs else ""
        return {"compile": f"{self.mode} mode{graphs}"}

    def devices_found(self) -> dict[str, Any]:
        try:
            import habana_frameworks.torch.hpu as hthpu
        except ImportError:
            return {"kind": "hpu", "count": 0, "names": []}
        count = int(hthpu.device_count()) if hthpu.is_available() else 0
        return {"kind": "hpu", "count": count, "names": [hthpu.get_device_name()] if count else []}

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "mode": self.mode,
            "PT_HPU_LAZY_MODE": os.environ.get("PT_HPU_LAZY_MODE"),
            "compile": self.compile,
            "hpu_graphs": self.hpu_graphs,
        }


def _hpu_precision(precision: str) -> str:
    """Lightning's spelling to ``HPUPrecisionPlugin``'s (``"32"``, ``"32-true"``, ``"bf16-mixed"``)."""
    return "32-true" if str(precision) == "32" else str(precision)
