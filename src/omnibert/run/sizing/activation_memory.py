"""What one micro-batch of training keeps in memory on the run's device, counted on the meta
device: the numbers behind ``compile_only=true``'s estimate
(:mod:`omnibert.run.sizing.compile_only`) and the micro batch chosen to fit
(:mod:`omnibert.run.sizing.memory`).

1. **Counted on the meta device** (no memory, no compute, any size): parameters; FLOPs of
   forward + backward of one micro-batch with ``torch.utils.flop_counter.FlopCounterMode``
   (matmuls, bmm and attention, :func:`omnibert.callbacks.throughput.measure_flops`); the
   bytes autograd saves for backward (``torch.autograd.graph.saved_tensors_hooks``,
   de-duplicated by storage, parameters left out): the activation memory of one micro-batch.
   The meta forward counts what the run's device keeps (:func:`target_kernels`): the
   attention backend the run resolves there (``auto`` included); SDPA counted as the fused
   kernel where the device runs one (CUDA: memory-efficient/flash/cuDNN, and FlexAttention
   and varlen's kernel, which keep q, k, v, the output and a logsumexp per row, not the
   ``[B,H,S,S]`` probabilities; CPU: its flash kernel, used without dropout) and dropout's
   one-byte masks on CUDA; autocast's casts for ``bf16-mixed``/``16-mixed`` (bf16 matmul
   outputs and weight copies, layer norm and softmax in fp32 on CUDA, in bf16 on the CPU),
   applied by a ``TorchFunctionMode`` since autocast does not act on meta tensors; the
   parameters' dtype for ``bf16-true``/``16-true``. What the CPU runs (its autocast, its
   flash kernel) is checked against real CPU forwards (tests/unit/test_memory_estimate_gpu.py).
2. **Estimated memory**: parameters + gradients (same dtype) + optimiser state (two moments
   per parameter for LAMB and AdamW) + activations + the backward's transients (+ one
   gradient-sized buffer with ``clip_grad_per_micro_batch``). The transients: on CUDA,
   :data:`CUDA_TRANSIENT_LAYERS` encoder layers' worth of activations (the caching allocator
   frees each layer's saved tensors once its backward ends); elsewhere
   :data:`TRANSIENT_FACTOR` times the activations (the gradients of the activations and the
   temporaries of softmax, GELU and layer norm live alongside them). Both are set from
   measured peaks, on an H200 and on the CPU (docs/pretraining/profiling.md has the
   figures, with the records they come from). When the estimate exceeds the memory the
   device has (CPU: ``MemAvailable``; CUDA: the GPU's total memory) the step is not run and
   the report says ``fits: false`` instead of being killed by the kernel's OOM killer.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from omnibert.callbacks.throughput import measure_flops
from omnibert.models import BertForPreTraining
from omnibert.models.attention_choice import resolve_attention
from omnibert.optim.param_groups import BERT_NO_WEIGHT_DECAY
from omnibert.optim.zero1_plan import elements_per_rank

__all__ = [
    "CUDA_TRANSIENT_LAYERS",
    "TRANSIENT_FACTOR",
    "Target",
    "backward_transients",
    "estimate",
    "meta_batch",
    "saved_activation_bytes",
    "target_kernels",
]

#: the backward's transient memory per byte of saved activations off CUDA (module docstring,
#: point 2)
TRANSIENT_FACTOR = 1.25
#: on CUDA: the backward's transient memory in encoder layers' worth of saved activations
CUDA_TRANSIENT_LAYERS = 2

#: batch keys by shape (see omnibert.data.collate): [B,S], [B,P], [B,K]
_ROW_KEYS = ("input_ids", "segment_ids", "position_ids", "sequence_ids")
_MASK_KEYS = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
_NSP_KEYS = ("nsp_positions", "nsp_labels", "nsp_weights")


def meta_batch(shapes: Mapping[str, list[int]]) -> dict[str, Tensor]:
    """A batch of meta tensors with the data module's static shapes (``describe()["shapes"]``:
    ``input_ids`` [B,S], ``masked_lm_positions`` [B,P], ``nsp_labels`` [B,K])."""
    groups = (
        (_ROW_KEYS, shapes["input_ids"]),
        (_MASK_KEYS, shapes["masked_lm_positions"]),
        (_NSP_KEYS, shapes["nsp_labels"]),
    )
    batch = {}
    for keys, shape in groups:
        for key in keys:
            dtype = torch.float32 if key.endswith("weights") else torch.int64
            batch[key] = torch.empty(*shape, dtype=dtype, device="meta")
    return batch


#: autocast's low-precision dtype per mixed precision, and the parameters' dtype per true
#: precision (Lightning's names)
AUTOCAST_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}
TRUE_DTYPES = {"bf16-true": torch.bfloat16, "16-true": torch.float16}

#: autocast's policy for the functions BERT's forward calls (torch's
#: aten/src/ATen/autocast_mode.cpp): these run in the low-precision dtype on every device
#: type, the ``_AUTOCAST_FP32`` ones in fp32 (inputs cast up); all others run in their inputs'
#: dtype (BERT's promote-list ops, cat and the residual adds, see one dtype or promote anyway)
_AUTOCAST_LOW = frozenset(
    {"linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "addbmm",
     "scaled_dot_product_attention"}
)  # fmt: skip
#: CUDA's fp32 list (its normalisation, softmax and loss entries); also used for device types
#: not listed in ``_AUTOCAST_FP32``
_CUDA_FP32 = frozenset(
    {"layer_norm", "group_norm", "softmax", "log_softmax", "cross_entropy", "nll_loss",
     "binary_cross_entropy_with_logits", "mse_loss", "l1_loss", "smooth_l1_loss", "kl_div"}
)  # fmt: skip
_AUTOCAST_FP32 = {
    "cuda": _CUDA_FP32,
    # the CPU's keeps layer norm and softmax in bf16 (checked against torch.autocast("cpu")
    # in tests/unit/test_memory_estimate_gpu.py)
    "cpu": frozenset({"cross_entropy", "nll_loss", "binary_cross_entropy_with_logits"}),
}


def _dtype_name(dtype: torch.dtype) -> str:
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, str(dtype))


@dataclasses.dataclass(frozen=True)
class Target:
    """What the meta forward stands for: the kernels the run's device keeps tensors with.

    ``attention`` is the backend the meta model runs (``math`` or ``sdpa``); with
    ``fused_sdpa`` SDPA is counted as the fused kernel the device runs (flash,
    memory-efficient, cuDNN, FlexAttention, CUDA varlen: they keep q, k, v, the output, an fp32
    logsumexp per query row and the mask as a bias, never the ``[B,H,Q,S]`` probabilities);
    ``autocast`` the low-precision dtype of a mixed-precision run, whose casts are applied as
    ``device_type``'s autocast would (autocast itself does not act on meta tensors)."""

    device_type: str
    attention: str
    fused_sdpa: bool = False
    autocast: torch.dtype | None = None

    def describe(self) -> str:
        if self.fused_sdpa:
            kernel = "a fused SDPA kernel (q, k, v, output, logsumexp, mask)"
        elif self.attention == "math":
            kernel = "math (probabilities and dropout masks kept)"
        else:
            kernel = "SDPA's math decomposition (probabilities kept)"
        precision = (
            "no autocast" if self.autocast is None else f"{_dtype_name(self.autocast)} autocast"
        )
        return f"{self.device_type} kernels: attention as {kernel}, {precision}"


def target_kernels(config: Any, device_type: str, precision: str, seq_length: int) -> Target:
    """How to count a training step of ``config`` at ``seq_length`` on ``device_type``: the
    attention backend it runs (``model.config.attention``, auto resolved as
    :func:`omnibert.models.attention_choice.resolve_attention` does for the device) and whether its
    SDPA is a fused kernel there; ``precision`` sets autocast."""
    dropout = config.attention_probs_dropout_prob > 0.0
    autocast = AUTOCAST_DTYPES.get(precision)
    backend = resolve_attention(config.attention, device_type, dropout, seq_length)
    if backend == "varlen" and device_type != "cuda":
        # off CUDA varlen re-pads its segments per length bucket for a dense kernel (the choice
        # of BertModel.forward): counted on whole padded rows, an upper bound
        backend = "math" if dropout and device_type == "cpu" else "sdpa"
    if backend == "math":
        return Target(device_type, "math", autocast=autocast)
    if backend == "sdpa":
        dtype = autocast or TRUE_DTYPES.get(precision, torch.float32)
        fused = _sdpa_fused(device_type, dtype, config.hidden_size // config.num_attention_heads,
                            dropout)  # fmt: skip
        return Target(device_type, "sdpa", fused, autocast)
    # flex, and varlen's one CUDA kernel: fused kernels that keep what SDPA's fused ones do
    # (flex keeps its block mask instead of a bias; varlen runs the real tokens only: counted
    # on whole padded rows, an upper bound)
    return Target(device_type, "sdpa", True, autocast)


def _sdpa_fused(device_type: str, dtype: torch.dtype, head_dim: int, dropout: bool) -> bool:
    """Whether ``F.scaled_dot_product_attention`` with a boolean mask runs a fused kernel on
    ``device_type``. CUDA: where the head size is a multiple of 8 (memory-efficient and cuDNN
    attention take a mask and dropout, in fp32 too; BERT's head sizes are 64); CPU: torch's
    own choice for such inputs (its flash kernel, without dropout); other devices: counted
    as the math decomposition. Where unsure, the math count: the larger one."""
    if device_type == "cuda":
        return head_dim % 8 == 0
    if device_type != "cpu":
        return False
    q = torch.zeros(1, 1, 2, head_dim, dtype=dtype)
    mask = torch.ones(1, 1, 2, 2, dtype=torch.bool)
    try:
        choice = torch._fused_sdp_choice(q, q, q, attn_mask=mask, dropout_p=0.1 if dropout else 0.0)
    except (AttributeError, RuntimeError):  # a torch that cannot answer: count the maths
        return False
    return int(choice) != 0  # 0: SDPBackend.MATH


class _FusedAttention(torch.autograd.Function):
    """What a fused attention kernel keeps for backward, on meta tensors: q, k, v, the output
    (written ``[B,Q,H,D]`` and returned transposed, as the kernels do, so the output
    projection's saved input is the same storage), an fp32 logsumexp per query row and the
    bias the mask became; dropout keeps only a random seed and offset."""

    @staticmethod
    def forward(ctx: Any, query: Tensor, key: Tensor, value: Tensor, bias: Tensor | None) -> Tensor:
        batch, heads, rows, _ = query.shape
        out = query.new_empty(batch, rows, heads, value.shape[-1]).transpose(1, 2)
        lse = query.new_empty(batch, heads, rows, dtype=torch.float32)
        ctx.save_for_backward(query, key, value, out, lse, *(() if bias is None else (bias,)))
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:  # the estimate runs no backward
        raise RuntimeError("the memory estimate's attention stand-in has no backward")


def _fused_sdpa(
    query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
    dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
    enable_gqa: bool = False,
) -> Tensor:  # fmt: skip
    bias = None
    if attn_mask is not None:
        # each call converts a boolean mask to an additive bias of q's dtype and keeps it
        # (eager CUDA and CPU kernels alike); a float mask is kept as it is
        bias = attn_mask
        if attn_mask.dtype == torch.bool:
            bias = torch.empty(attn_mask.shape, dtype=query.dtype, device=query.device)
    out: Tensor = _FusedAttention.apply(query, key, value, bias)
    return out


class _BoolMaskDropout(torch.autograd.Function):
    """CUDA's dropout kernel (``native_dropout``) on meta tensors: it keeps a one-byte mask
    (elsewhere, the meta device included, dropout multiplies by a mask of the input's dtype)."""

    @staticmethod
    def forward(ctx: Any, tensor: Tensor) -> Tensor:
        ctx.save_for_backward(torch.empty(tensor.shape, dtype=torch.bool, device=tensor.device))
        return torch.empty_like(tensor)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> Any:  # the estimate runs no backward
        raise RuntimeError("the memory estimate's dropout stand-in has no backward")


def _dropout_args(
    input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False, **train: bool
) -> tuple[Tensor, float, bool]:
    """The arguments of ``F.dropout`` and of ``torch.dropout`` (which calls ``training``
    ``train``)."""
    return input, p, train.get("train", training)


class _TargetMode(TorchFunctionMode):
    """The meta forward with ``target``'s autocast casts, its fused SDPA stand-in and, on
    CUDA, dropout's one-byte masks."""

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.fp32 = _AUTOCAST_FP32.get(target.device_type, _CUDA_FP32)
        self.cache: dict[int, Tensor] = {}  # autocast casts each parameter once per forward

    def _cast(self, value: Any, dtype: torch.dtype) -> Any:
        if not isinstance(value, Tensor) or not value.is_floating_point():
            return value
        if value.dtype in (dtype, torch.float64):  # autocast never casts fp64
            return value
        if value.is_leaf and value.requires_grad and dtype != torch.float32:
            if id(value) not in self.cache:
                self.cache[id(value)] = value.to(dtype)
            return self.cache[id(value)]
        return value.to(dtype)

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        dtype = self.target.autocast
        if dtype is not None and (name in _AUTOCAST_LOW or name in self.fp32):
            dtype = dtype if name in _AUTOCAST_LOW else torch.float32
            args = tuple(self._cast(a, dtype) for a in args)
            kwargs = {k: self._cast(v, dtype) for k, v in kwargs.items()}
        if name == "scaled_dot_product_attention" and self.target.fused_sdpa:
            return _fused_sdpa(*args, **kwargs)
        if name == "dropout" and self.target.device_type == "cuda":
            tensor, p, training = _dropout_args(*args, **kwargs)
            if training and 0.0 < p < 1.0:
                return _BoolMaskDropout.apply(tensor)
        return func(*args, **kwargs)


def saved_activation_bytes(
    model: nn.Module, batch: Mapping[str, Tensor], target: Target | None = None
) -> int:
    """Bytes autograd keeps for backward in one forward of ``model`` (meta tensors): each
    storage counted once, parameters (counted separately) left out. With ``target``, the
    forward runs as on its device (:class:`Target`: autocast, a fused SDPA kernel)."""
    params = {p.untyped_storage()._cdata for p in model.parameters()}
    seen: dict[int, int] = {}
    alive: list[Tensor] = []  # keep storages alive so that no address is reused

    def pack(tensor: Tensor) -> Tensor:
        storage = tensor.untyped_storage()
        if storage._cdata not in params:
            seen[storage._cdata] = storage.nbytes()
            alive.append(tensor)
        return tensor

    mode = contextlib.nullcontext() if target is None else _TargetMode(target)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor), mode:
        model(dict(batch))
    return sum(seen.values())


def backward_transients(activations: int, device_type: str, layers: int) -> int:
    """What the backward allocates beside the saved activations (module docstring, point 2):
    on CUDA the caching allocator frees each layer's saved tensors as its backward ends, so
    the peak holds about :data:`CUDA_TRANSIENT_LAYERS` layers' worth more; off CUDA
    :data:`TRANSIENT_FACTOR` times them (the process's resident size keeps what was freed)."""
    if device_type == "cuda":
        return int(CUDA_TRANSIENT_LAYERS * activations / max(layers, 1))
    return int(TRANSIENT_FACTOR * activations)


def optimizer_share(model: torch.nn.Module, ranks: int) -> int:
    """The parameters whose optimiser state one of ``ranks`` ranks holds at most: ZeRO-1's
    partition of whole tensors, group by group (decayed, then BERT's no-decay names), as
    :func:`omnibert.optim.zero1_plan.elements_per_rank` predicts it."""
    groups: list[list[int]] = [[], []]
    for name, parameter in model.named_parameters():
        groups[any(key in name for key in BERT_NO_WEIGHT_DECAY)].append(parameter.numel())
    if ranks <= 1:
        return sum(map(sum, groups))
    return max(elements_per_rank(groups, ranks))


def estimate(
    config: Any,
    shapes: Mapping[str, list[int]],
    precision: str,
    clip: float | None,
    device_type: str = "cpu",
    *,
    flops: bool = True,
    optimizer_ranks: int = 1,
) -> dict[str, Any]:
    """Parameters, FLOPs of one micro-batch (``flops=False``: ``None``, not counted) and the
    memory of a training step of ``config`` at ``shapes`` in ``precision`` on a
    ``device_type`` device (module docstring, points 1-2): its activations counted on the meta
    device with the kernels that device runs (:func:`target_kernels`)."""
    batch = meta_batch(shapes)
    target = target_kernels(config, device_type, precision, shapes["input_ids"][1])
    with torch.device("meta"):
        model = BertForPreTraining(dataclasses.replace(config, attention=target.attention))
    if precision in TRUE_DTYPES:
        model.to(TRUE_DTYPES[precision])
    params = sum(p.numel() for p in model.parameters())
    width = 2 if precision in TRUE_DTYPES else 4
    memory = {
        "parameters": params * width,
        "gradients": params * width,
        "optimizer_state": optimizer_share(model, optimizer_ranks) * 2 * 4,
        "activations": saved_activation_bytes(model, batch, target),
        "clip_buffer": params * width if clip is not None else 0,
    }
    memory["backward_transients"] = backward_transients(
        memory["activations"], device_type, config.num_hidden_layers
    )
    memory["total"] = sum(memory.values())
    counted = measure_flops(lambda: BertForPreTraining(config), batch) if flops else None
    return {
        "parameters": params,
        "flops_per_micro_batch": counted,
        "memory": memory,
        "counted_as": target.describe(),
    }
