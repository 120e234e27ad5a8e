"""NVIDIA GPU: bf16 autocast and ``torch.compile`` by default, CUDA graphs as an option, DDP
(FSDP for large runs).

Defaults (``conf/accelerator/gpu.yaml``, ``conf/trainer/default.yaml``): ``trainer.precision:
auto`` resolves to ``bf16-mixed`` where the GPU runs bf16 (Ampere or newer), else fp32 (fp16
needs loss scaling, so it stays the explicit ``trainer=fp16``); the model's forward is compiled
with static shapes (``dynamic: false``: the batch contract fixes every shape, so training
compiles once). ``cuda_graphs: true`` compiles in ``reduce-overhead`` mode (inductor's CUDA
graph trees), marks each step's start and keeps the gradient tensors out of the graphs'
buffers, so gradient accumulation stays exact (:mod:`omnibert.accelerators.cuda_graphs`).
LAMB runs omnibert's own optimiser, whose ``impl: auto`` picks the multi-tensor Triton kernel
from ``omnibert_kernels`` on CUDA when Triton imports (else the foreach path); the plugin
reports which one in the environment report and leaves the optimiser config unchanged. Under ``strategy: fsdp`` LAMB sums its per-tensor norms
over the shards' ranks (the task hands it FSDP's process group: :mod:`omnibert.optim.sharding`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from omnibert.accelerators.base import AcceleratorError, AcceleratorPlugin
from omnibert.accelerators.cpu import compile_in_place
from omnibert.accelerators.cuda_graphs import cuda_graph_step_marker
from omnibert.accelerators.environment import sdk_present

#: the first compute capability with fp8 tensor cores (Ada Lovelace sm_89; Hopper is 9.0)
FP8_CAPABILITY = (8, 9)
#: torch.compile modes that capture CUDA graphs (inductor's cudagraph trees)
GRAPH_MODES = ("reduce-overhead", "max-autotune")
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
        compile_options: ``torch.compile`` keyword arguments (``mode``, ``dynamic``, ...).
        cuda_graphs: replay each compiled step as CUDA graphs (``mode: reduce-overhead``
            unless ``compile_options.mode`` is ``max-autotune``, which captures them too);
            needs ``compile``.
    """

    name = "gpu"
    precisions = ("32-true", "32", "16-mixed", "bf16-mixed", "bf16-true")
    zero1_strategies = ("auto", "ddp")  # DDP over NCCL (trainer_kwargs)

    def __init__(
        self,
        devices: int = 1,
        num_nodes: int = 1,
        strategy: str = "auto",
        accelerator: str | None = "cuda",
        timeout_s: float = 300,
        optimizer_sharding: str = "none",
        compile: bool = True,
        compile_options: dict[str, Any] | None = None,
        fsdp: dict[str, Any] | None = None,
        cuda_graphs: bool = False,
    ) -> None:
        super().__init__(devices, num_nodes, strategy, accelerator, timeout_s, optimizer_sharding)
        self.compile = bool(compile)
        self.cuda_graphs = bool(cuda_graphs)
        self.compile_options = compile_settings(
            self.compile, dict(compile_options or {}), self.cuda_graphs
        )
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

    def resolve_precision(self, precision: Any) -> tuple[str, str]:
        """``auto``: bf16 autocast where this GPU runs bf16, else fp32 (module docstring)."""
        if str(precision) != "auto":
            return str(precision), "set by trainer.precision"
        if self._cuda() and torch.cuda.is_bf16_supported():
            name = torch.cuda.get_device_name(torch.cuda.current_device())
            return "bf16-mixed", f"trainer.precision=auto: {name} runs bf16"
        return "32-true", (
            "trainer.precision=auto: fp32, this GPU has no bf16 (trainer=fp16 for fp16 with "
            "loss scaling)"
        )

    def fp8_unsupported(self) -> str | None:
        """``None`` on a GPU of compute capability 8.9 or newer (fp8 tensor cores: Ada,
        Hopper, Blackwell), else the GPU with its capability (or that torch sees none)."""
        if not self._cuda():
            return "no CUDA GPU (torch.cuda.is_available() is False)"
        index = torch.cuda.current_device()
        capability = torch.cuda.get_device_capability(index)
        if tuple(capability) >= FP8_CAPABILITY:
            return None
        name = torch.cuda.get_device_name(index)
        return f"{name}, compute capability {capability[0]}.{capability[1]}"

    def trainer_kwargs(self, precision: str) -> dict[str, Any]:
        kwargs = super().trainer_kwargs(precision)
        precision = kwargs["precision"]  # fp8 trains in bf16-mixed
        if str(precision).startswith("bf16") and not torch.cuda.is_bf16_supported():
            raise AcceleratorError(
                f"trainer.precision={precision} needs a GPU with bf16 (Ampere or newer); use "
                "trainer=fp16 (16-mixed) on this GPU."
            )
        if self.world_size > 1 and self.strategy in ("auto", "ddp"):
            from omnibert.accelerators.ddp import ddp_strategy

            kwargs["strategy"] = ddp_strategy(
                self.timeout_s, optimizer_sharding=self.optimizer_sharding
            )
        elif self.strategy == "fsdp":
            kwargs["strategy"] = self._fsdp_strategy()
        return kwargs

    def _fsdp_strategy(self) -> Any:
        from omnibert.accelerators.ddp import mpi_environment
        from omnibert.accelerators.fsdp import fsdp_strategy
        from omnibert.models.layers import BertLayer

        options = dict(self.fsdp)
        checkpointing = bool(options.pop("activation_checkpointing", False))
        return fsdp_strategy(
            self.timeout_s,
            auto_wrap_policy={BertLayer},
            activation_checkpointing_policy={BertLayer} if checkpointing else None,
            use_orig_params=True,
            cluster_environment=mpi_environment(),
            **options,
        )

    def check_optimizer(self, optimizer_cfg: Mapping[str, Any]) -> None:
        super().check_optimizer(optimizer_cfg)
        target = str(optimizer_cfg.get("_target_"))
        if self.strategy == "fsdp" and target not in _SHARD_SAFE:
            raise AcceleratorError(
                f"accelerator.strategy=fsdp shards every tensor across ranks, and {target} "
                "is not known to compute its per-tensor norms over shards; use optimizer=lamb "
                "or optimizer=adamw with FSDP, or accelerator.strategy=ddp."
            )

    def compile_model(self, model: nn.Module) -> nn.Module:
        return compile_in_place(model, self.compile_options) if self.compile else model

    @property
    def uses_cuda_graphs(self) -> bool:
        """Whether the compiled step replays CUDA graphs (``cuda_graphs`` or a graph mode)."""
        inductor = self.compile_options.get("options") or {}
        graphs = self.compile_options.get("mode") in GRAPH_MODES
        return self.compile and (graphs or bool(inductor.get("triton.cudagraphs")))

    def check_accumulation(self, accumulate_grad_batches: int) -> None:
        """CUDA graphs accumulate gradients soundly where the task owns the gradient tensors
        (:mod:`omnibert.accelerators.cuda_graphs`: each backward adds into them in place and
        never keeps a graph's output); FSDP keeps its sharded parameters' gradients itself,
        so that combination is refused."""
        if self.uses_cuda_graphs and accumulate_grad_batches > 1 and self.strategy == "fsdp":
            raise AcceleratorError(
                f"accelerator.cuda_graphs=true with accelerator.strategy=fsdp cannot accumulate "
                f"gradients over {accumulate_grad_batches} micro-batches per step (FSDP keeps "
                "the gradients of its sharded parameters itself, so they cannot be kept out of "
                "the CUDA graphs' output buffers); make micro_batch_size x devices the whole "
                "phase.global_batch_size, use accelerator.strategy=ddp, or set "
                "accelerator.cuda_graphs=false."
            )

    def check_attention(self, configured: str, backends: tuple[str, ...]) -> None:
        """CUDA graphs replay fixed shapes; ``varlen`` runs on each batch's real tokens, a count
        the graph reads on the device, so inductor would run that graph without CUDA graphs
        (it disables them for data-dependent sizes): refused rather than silently not applied."""
        if self.uses_cuda_graphs and "varlen" in backends:
            chosen = "" if configured == "varlen" else f" ({configured}'s choice here)"
            raise AcceleratorError(
                f"accelerator.cuda_graphs=true replays graphs of fixed shapes, but "
                f"model.config.attention=varlen{chosen} runs on each batch's real tokens, a "
                "count known only on the device, so torch would run those graphs without CUDA "
                "graphs; set model.config.attention=sdpa or accelerator.cuda_graphs=false."
            )

    def callbacks(self) -> list[Any]:
        """With CUDA graphs, a callback that marks where each step begins and has the task keep
        its gradient tensors (:mod:`omnibert.accelerators.cuda_graphs`)."""
        return [cuda_graph_step_marker()] if self.uses_cuda_graphs else []

    def kernels(self) -> dict[str, str]:
        mode = self.compile_options.get("mode") or "default"
        graphs = f"on (torch.compile mode {mode})" if self.uses_cuda_graphs else "off"
        return {**super().kernels(), "CUDA graphs": graphs}

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
            "compile_options": self.compile_options,
            "cuda_graphs": self.uses_cuda_graphs,
            "fsdp": self.fsdp if self.strategy == "fsdp" else None,
            "lamb_impl": self.lamb_impl(),
        }


def compile_settings(compile: bool, options: dict[str, Any], cuda_graphs: bool) -> dict[str, Any]:
    """``torch.compile`` keyword arguments for ``compile_options`` with ``cuda_graphs``, or one
    sentence (:class:`AcceleratorError`) when the two disagree."""
    if not cuda_graphs:
        return options
    if not compile:
        raise AcceleratorError(
            "accelerator.cuda_graphs=true replays torch.compile's graphs (mode reduce-overhead) "
            "but accelerator.compile=false; set accelerator.compile=true or cuda_graphs=false."
        )
    mode = options.get("mode")
    if mode in GRAPH_MODES:
        return options
    if mode in (None, "default") and "options" in options:  # inductor options: no mode allowed
        inductor = {**dict(options["options"] or {}), "triton.cudagraphs": True}
        return {**{k: v for k, v in options.items() if k != "mode"}, "options": inductor}
    if mode in (None, "default"):
        return {**options, "mode": "reduce-overhead"}
    raise AcceleratorError(
        f"accelerator.cuda_graphs=true needs a torch.compile mode that captures CUDA graphs, "
        f"not accelerator.compile_options.mode={mode} (or inductor options); remove the mode "
        "(reduce-overhead is used) or set it to max-autotune."
    )
