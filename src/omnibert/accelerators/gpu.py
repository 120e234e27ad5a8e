"""NVIDIA GPU: bf16/fp16 mixed precision, DDP (FSDP for large runs), optional ``torch.compile``.

LAMB runs omnibert's own optimiser, whose ``impl: auto`` picks the multi-tensor Triton kernel
from ``omnibert_kernels`` on CUDA when Triton imports (else the foreach path); the plugin
reports which one in the environment report and leaves the optimiser config unchanged. Under
``strategy: fsdp`` LAMB sums its per-tensor norms over the shards' ranks (the task hands it
FSDP's process group: :mod:`omnibert.optim.sharding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin
from omnibert.accelerators.cpu import compile_in_place
from omnibert.accelerators.environment import sdk_present

#: optimisers correct on FSDP shards: elementwise updates, and omnibert's LAMB, which sums
#: its per-tensor and global norms over the shards' ranks (omnibert.optim.sharding)
_SHARD_SAFE = (
    "omnibert.optim.AdamW",
    "omnibert.optim.param_groups.AdamW",
    "torch.optim.AdamW",
    "omnibert.optim.Lamb",
    "omnibert.optim.lamb.Lamb",
)


class GPUPlugin(AcceleratorPlugin):
    """CUDA training through Lightning's ``cuda`` accelerator.

    Args:
        strategy: ``auto`` (DDP when ``devices * num_nodes > 1``), ``ddp``, ``fsdp`` or any
            Lightning strategy name.
        fsdp: ``FSDPStrategy`` keyword arguments for ``strategy=fsdp`` (``sharding_strategy``,
            ``cpu_offload``, ``state_dict_type``); each BERT layer is one FSDP unit, and
            ``activation_checkpointing: true`` recomputes each layer's activations.
        compile: ``torch.compile`` the model's forward in place before training.
        compile_options: ``torch.compile`` keyword arguments (``mode``, ...).
    """

    name = "gpu"
    precisions = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true")

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = "cuda",
        compile: bool = False,
        compile_options: dict[str, Any] | None = None,
        fsdp: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator)
        self.compile = bool(compile)
        self.compile_options = dict(compile_options or {})
        self.fsdp = dict(fsdp or {})

    @property
    def device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device() if self._cuda() else 0)

    @staticmethod
    def _cuda() -> bool:
        return torch.cuda.is_available()

    def check(self) -> None:
        if not self._cuda():
            raise AcceleratorError(
                "accelerator=gpu needs a CUDA GPU that torch can see (torch.cuda.is_available() "
                f"is False with torch {torch.__version__}); install a CUDA build of torch on a "
                "GPU host or use accelerator=cpu."
            )
        found = torch.cuda.device_count()
        if found < self.devices:
            raise AcceleratorError(
                f"accelerator.devices={self.devices} but this node has {found} CUDA GPU(s); "
                f"set accelerator.devices={found} or fewer."
            )

    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        kwargs = super().trainer_kwargs(precision)
        if str(precision).startswith("bf16") and not torch.cuda.is_bf16_supported():
            raise AcceleratorError(
                f"trainer.precision={precision} needs a GPU with bf16 (Ampere or newer); use "
                "trainer=fp16 (16-mixed) on this GPU."
            )
        if self.strategy == "auto" and self.world_size > 1:
            kwargs["strategy"] = "ddp"
        elif self.strategy == "fsdp":
            kwargs["strategy"] = self._fsdp_strategy()
        return kwargs

    def _fsdp_strategy(self) -> Any:
        from lightning.pytorch.strategies import FSDPStrategy

        from omnibert.models.bert import BertLayer

        options = dict(self.fsdp)
        checkpointing = bool(options.pop("activation_checkpointing", False))
        return FSDPStrategy(
            auto_wrap_policy={BertLayer},
            activation_checkpointing_policy={BertLayer} if checkpointing else None,
            use_orig_params=True,
            **options,
        )

    def check_optimizer(self, optimizer_cfg: Mapping[str, Any]) -> None:
        target = str(optimizer_cfg.get("_target_"))
        if self.strategy == "fsdp" and target not in _SHARD_SAFE:
            raise AcceleratorError(
                f"accelerator.strategy=fsdp shards every tensor across ranks, and {target} "
                "is not known to compute its per-tensor norms over shards; use optimizer=lamb "
                "or optimizer=adamw with FSDP, or accelerator.strategy=ddp."
            )

    def compile_model(self, model: nn.Module) -> nn.Module:
        return compile_in_place(model, self.compile_options) if self.compile else model

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def reset_peak_memory(self) -> None:
        torch.cuda.reset_peak_memory_stats()

    def peak_memory(self) -> tuple[int | None, str | None]:
        return int(torch.cuda.max_memory_allocated()), "torch.cuda.max_memory_allocated"

    def devices_found(self) -> dict[str, Any]:
        count = torch.cuda.device_count() if self._cuda() else 0
        names = [torch.cuda.get_device_name(i) for i in range(count)]
        return {"kind": "cuda", "count": count, "names": names}

    def lamb_impl(self) -> str:
        """What omnibert's Lamb (``impl: auto``) runs on this GPU."""
        if not sdk_present("omnibert_kernels"):
            return "foreach"
        from omnibert_kernels.lamb_triton import triton_available

        return (
            "triton multi-tensor (omnibert_kernels)" if triton_available(self.device) else "foreach"
        )

    def describe(self) -> dict[str, Any]:
        return {
            **super().describe(),
            "compile": self.compile,
            "fsdp": self.fsdp if self.strategy == "fsdp" else None,
            "lamb_impl": self.lamb_impl(),
        }
