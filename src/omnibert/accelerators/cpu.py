"""CPU: fp32 or bf16 autocast, one process per ``devices`` (gloo DDP for more than one)."""

from __future__ import annotations

from typing import Any

from torch import nn

from omnibert.accelerators.base import AcceleratorPlugin
from omnibert.compat import compile_in_place

__all__ = ["CPUPlugin", "compile_in_place"]


class CPUPlugin(AcceleratorPlugin):
    """CPU training.

    Args:
        compile: ``torch.compile`` the model's forward in place before training.
        compile_options: ``torch.compile`` keyword arguments (``mode``, ``dynamic``, ...).
    """

    name = "cpu"
    precisions = ("32-true", "32", "bf16-mixed", "bf16-true")

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = None,
        compile: bool = False,
        compile_options: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator)
        self.compile = bool(compile)
        self.compile_options = dict(compile_options or {})

    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        kwargs = super().trainer_kwargs(precision)
        if self.strategy == "auto" and self.world_size > 1:
            kwargs["strategy"] = "ddp"  # gloo on CPU
        return kwargs

    def compile_model(self, model: nn.Module) -> nn.Module:
        return compile_in_place(model, self.compile_options) if self.compile else model

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "compile": self.compile}
