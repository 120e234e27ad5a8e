"""``omnibert.optim.Lamb``: one LAMB with explicit semantics (docs/lamb.md has the table).

Defaults are NVIDIA apex ``FusedLAMB``'s: global gradient norm over all groups, clipped to
``max_grad_norm``; per-group step count; bias correction; decoupled weight decay; trust ratio
``‖p‖/‖u‖`` where the group's weight decay is not 0 (or ``use_nvlamb``), 1 when either norm
is 0. Extra keyword-only flags cover the other references (MLPerf TF name exclusions,
poptorch's ``max_weight_norm``) and omnibert's own needs (fp32 master weights for bf16/fp16
parameters, the implementation choice). The implementations themselves and the step
drivers that run them over the groups live in :mod:`omnibert.optim.lamb_impls`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from omnibert.optim.lamb_impls import (
    IMPLS,
    STAGES,
    UPDATES,
    Built,
    multi_tensor_lamb,
    partition_all_reduce,
    shard_all_reduce,
    staged_step,
    triton_step,
)
from omnibert.optim.lamb_math import LambBatch, LambHyper
from omnibert.optim.param_groups import matches_any, normalize_params
from omnibert.optim.sharding import dtensor_shard_group, local

#: ``compile_min_numel``'s default: parameters from which the compiled CPU kernels pay
COMPILE_MIN_NUMEL = 20_000_000


def choose_impl(
    impl: str,
    device: torch.device,
    numel: int,
    compile_min_numel: int = COMPILE_MIN_NUMEL,
    *,
    contiguous: bool = True,
    broken: frozenset[str] | set[str] = frozenset(),
) -> tuple[str, str]:
    """The implementation ``Lamb(impl=impl)`` runs for ``numel`` parameters on ``device``
    (``contiguous``: every parameter is; ``broken``: implementations that failed to build
    here), and why, as the run's plan says it: the one statement of the rule, which
    :meth:`Lamb.resolve_impl` applies to its parameters and the plan
    (:mod:`omnibert.run.pipeline.kernels`) to the config before any parameter exists."""
    if impl != "auto":
        return impl, f"{impl} (optimizer.impl)"
    if device.type == "cuda" and "triton" not in broken and contiguous:
        # lazy: only the Triton path needs omnibert_kernels
        from omnibert_kernels.lamb_triton import triton_available

        if triton_available(device):
            return "triton", "triton, omnibert_kernels (optimizer.impl=auto on CUDA)"
        return "foreach", "foreach (optimizer.impl=auto: Triton does not import here)"
    if (
        device.type == "cpu"
        and "compiled" not in broken
        and contiguous
        and numel >= compile_min_numel
    ):
        why = f"compiled (optimizer.impl=auto: {numel:,} parameters >= {compile_min_numel:,})"
        return "compiled", why
    return "foreach", f"foreach (optimizer.impl=auto on {device.type}, {numel:,} parameters)"


class Lamb(torch.optim.Optimizer):
    """LAMB (You et al. 2019) with apex ``FusedLAMB``'s keyword arguments and semantics.

    Args (apex's, same defaults): ``lr``, ``bias_correction``, ``betas``, ``eps``,
    ``weight_decay``, ``amsgrad`` (must be False), ``adam_w_mode`` (False: L2 added to the
    gradient), ``grad_averaging`` (False: ``m = b1·m + g``), ``set_grad_none``,
    ``max_grad_norm`` (clip the global gradient norm; ``None`` or ``<= 0``: no clipping,
    unlike apex where 0 zeroes every update), ``use_nvlamb`` (trust ratio for all tensors).

    Keyword-only extras:
        no_weight_decay: regexes searched in parameter names (MLPerf TF
            ``exclude_from_weight_decay``); needs named parameters or a module. Matching
            tensors go to a group with weight decay 0, hence no trust ratio (apex rule).
        exclude_from_layer_adaptation: regexes; when given, the trust ratio applies exactly to
            the tensors whose name matches none of them (MLPerf TF), whatever their decay.
        max_weight_norm: clamp ``‖p‖`` in the trust ratio to this (poptorch); ``None``: no clamp.
        master_weights: keep an fp32 copy of bf16/fp16 parameters in the state and update
            that (state ``master``); moments are always fp32.
        impl: ``"auto"`` (the multi-tensor Triton kernel on CUDA when Triton imports; the
            compiled CPU kernels when the model has at least ``compile_min_numel``
            elements; foreach otherwise), ``"reference"``, ``"foreach"``, ``"compiled"`` or
            ``"triton"``.
        triton_chunk_size: elements per Triton program for ``impl="triton"`` (apex: 65,536).

    Sharded parameters (FSDP2 ``DTensor``s, found by themselves; FSDP1 flat views after
    :meth:`shard_norms_over`): the squared global gradient norm and the stacked squared
    ``‖p‖``, ``‖u‖`` of every tensor are summed over the ranks' shards, one all-reduce each
    (the clip factor must be known before the moments, hence two), so the step is the
    unsharded one (:mod:`omnibert.optim.sharding`).

    Partitioned whole tensors (ZeRO-1, :meth:`partition_norms_over`: this optimiser updates
    one rank's share of a model's tensors): per-tensor norms are local, and only the squared
    global gradient norm is summed over the ranks (one all-reduce of one number).
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        amsgrad: bool = False,
        adam_w_mode: bool = True,
        grad_averaging: bool = True,
        set_grad_none: bool = True,
        max_grad_norm: float | None = 1.0,
        use_nvlamb: bool = False,
        *,
        no_weight_decay: Sequence[str] | None = None,
        exclude_from_layer_adaptation: Sequence[str] | None = None,
        max_weight_norm: float | None = None,
        master_weights: bool = True,
        impl: str = "auto",
        compile_min_numel: int = COMPILE_MIN_NUMEL,
        triton_chunk_size: int = 65536,
    ) -> None:
        if amsgrad:
            raise ValueError("Lamb does not implement AMSGrad (neither does apex FusedLAMB).")
        if impl not in IMPLS:
            raise ValueError(f"Lamb impl={impl!r} is not one of {IMPLS}.")
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("Lamb needs lr >= 0, eps >= 0 and weight_decay >= 0.")
        if triton_chunk_size < 16 or triton_chunk_size & (triton_chunk_size - 1):
            raise ValueError(
                f"Lamb triton_chunk_size={triton_chunk_size} must be a power of two >= 16 "
                "(apex: 65536)."
            )
        b1, b2 = (float(b) for b in betas)
        if not (0.0 <= b1 < 1.0 and 0.0 <= b2 < 1.0):
            raise ValueError(f"Lamb betas must lie in [0, 1), got {tuple(betas)}.")
        defaults = {
            "lr": lr,
            "bias_correction": bias_correction,
            "betas": (b1, b2),
            "eps": eps,
            "weight_decay": weight_decay,
            "grad_averaging": grad_averaging,
            "max_weight_norm": max_weight_norm,
        }
        groups = normalize_params(params, weight_decay, no_weight_decay)
        super().__init__(groups, defaults)
        self.adam_w_mode = adam_w_mode
        self.set_grad_none = set_grad_none
        self.max_grad_norm = max_grad_norm
        self.use_nvlamb = use_nvlamb
        self.exclude_from_layer_adaptation = (
            list(exclude_from_layer_adaptation) if exclude_from_layer_adaptation else None
        )
        self.master_weights = master_weights
        self.impl = impl
        self.compile_min_numel = compile_min_numel
        self.triton_chunk_size = triton_chunk_size
        self._multi_tensor: Any = None  # omnibert_kernels.lamb_triton.MultiTensorLamb
        self.shard_group: Any = None  # torch.distributed process group of the shards
        #: the process group whose ranks update the other whole tensors of the model (ZeRO-1)
        self.partition_group: Any = None
        #: the elements of the whole model (``impl="auto"`` judges by them; None: these params)
        self.model_numel: int | None = None
        self._dtensor_group: Any = None
        self._dtensor_checked = False
        self.last_grad_norm: Tensor | None = None  # global norm before clipping (for logging)
        #: skip a step whose global gradient norm is not finite (omnibert.optim.nonfinite)
        self.skip_nonfinite = False
        self.last_step_skipped = False
        self._fresh: list[Tensor] = []
        self._broken_impls: set[str] = set()
        self._warmed: set[str] = {"reference", "foreach"}
        if self.exclude_from_layer_adaptation:
            for group in self.param_groups:
                if "param_names" not in group:
                    raise ValueError(
                        "exclude_from_layer_adaptation needs parameter names: pass "
                        "model.named_parameters() (or the module) to Lamb."
                    )

    def shard_norms_over(self, group: Any) -> None:
        """Declare the parameters shards over the ranks of ``group`` (a
        ``torch.distributed`` process group; FSDP's): norms are then summed over it.

        Every rank must hold the same parameter list in the same order (FSDP with
        ``use_orig_params=True`` gives each rank a flat slice, possibly empty, of every
        tensor), and every rank steps together: each step makes two all-reduces.
        """
        self.shard_group = group

    def partition_norms_over(self, group: Any, model_numel: int) -> None:
        """Declare the parameters this rank's whole tensors of a model of ``model_numel``
        elements whose other tensors the other ranks of ``group`` update (ZeRO-1,
        :mod:`omnibert.optim.zero1`): the global gradient norm (clipping, the non-finite
        check) is then summed over ``group``, one all-reduce of one number per step, while each
        tensor's ``‖p‖`` and ``‖u‖`` stay local; ``impl="auto"`` chooses by the whole model's
        size, so every rank runs the kernel the unsharded model would."""
        if self.shard_group is not None:
            raise ValueError("Lamb takes sharded tensors (FSDP) or partitioned ones, not both.")
        self.partition_group = group
        self.model_numel = int(model_numel)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        """Like apex: ``set_grad_none`` decides unless ``set_to_none`` is given."""
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    # --- implementation choice ---------------------------------------------------------

    def resolve_impl(self) -> str:
        """The implementation the next step will use (``impl`` with ``"auto"`` resolved)."""
        if self.impl != "auto":
            return self.impl
        params = [p for g in self.param_groups for p in g["params"]]
        if not params:
            return "foreach"
        name, _ = choose_impl(
            self.impl,
            params[0].device,
            self.model_numel or sum(p.numel() for p in params),
            self.compile_min_numel,
            contiguous=all(local(p).is_contiguous() for p in params),
            broken=self._broken_impls,
        )
        return name

    def _warm_up(self, name: str, device: torch.device) -> bool:
        """Run ``name`` once on tiny tensors so a compiler failure cannot hit mid-step."""
        if name in self._warmed or self.impl != "auto":
            return True
        try:
            for decay in (0.0, 0.01):
                ts = [torch.ones(37, device=device) for _ in range(4)]
                hyper = LambHyper(0.0, 0.9, 0.999, 1e-6, 1, True, True, self.adam_w_mode, None)
                batch = LambBatch(ts[:1], ts[1:2], ts[2:3], ts[3:], [decay], [True], hyper)
                UPDATES[name](batch, torch.ones((), device=device))
        except Exception as err:  # a missing compiler, an unsupported GPU, ...
            warnings.warn(
                f"Lamb: the {name!r} implementation failed to build ({err!r}); "
                "using the foreach implementation instead.",
                stacklevel=3,
            )
            self._broken_impls.add(name)
            return False
        self._warmed.add(name)
        return True

    # --- the step ----------------------------------------------------------------------

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as torch does, but keep the state fp32 (torch casts it to bf16/fp16 params)."""
        saved = state_dict["state"]
        super().load_state_dict(state_dict)
        ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for pid, p in zip(ids, params, strict=True):
            for key, value in saved.get(pid, {}).items():
                if isinstance(value, Tensor) and value.is_floating_point():
                    self.state[p][key] = value.to(p.device, torch.float32, copy=True)

    def _adapt_flags(self, names: list[str], decays: list[float]) -> list[bool]:
        if self.exclude_from_layer_adaptation is not None:
            return [not matches_any(n, self.exclude_from_layer_adaptation) for n in names]
        return [self.use_nvlamb or d != 0 for d in decays]

    def _group_batch(self, group: dict[str, Any], native_low_precision: bool = False) -> Built:
        """The tensors of ``group`` with a gradient, (param, master) pairs to copy back, and
        per tensor the low-precision model tensor a kernel writes itself (``None``: none).

        ``native_low_precision``: the kernel reads bf16/fp16 gradients and parameters and
        writes bf16/fp16 copies itself (Triton), so nothing is converted or copied here.
        """
        names_all = group.get("param_names") or [""] * len(group["params"])
        params, grads, ms, vs, names = [], [], [], [], []
        copy_back: list[tuple[Tensor, Tensor]] = []
        mirrors: list[Tensor | None] = []
        for p, name in zip(group["params"], names_all, strict=True):
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Lamb does not support sparse gradients.")
            state = self.state[p]
            low_precision = p.dtype in (torch.float16, torch.bfloat16)
            if not state:  # DTensor state for DTensor parameters (FSDP2's state dicts)
                self._fresh.append(p)
                state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                if low_precision and self.master_weights:
                    state["master"] = p.detach().to(torch.float32, copy=True)
            own = local(p.detach())  # this rank's shard (the tensor itself when unsharded)
            master = state.get("master")
            mirror = None
            if master is not None:
                work = local(master)
                if native_low_precision:
                    mirror = own
                else:
                    copy_back.append((own, work))
            elif low_precision and not native_low_precision:
                work = own.float()  # master_weights=False: fp32 work, rounded after
                copy_back.append((own, work))
            else:
                work = own  # same storage: updated in place
            params.append(work)
            grad = local(p.grad)
            if not native_low_precision and grad.dtype != torch.float32:
                grad = grad.float()
            grads.append(grad)
            ms.append(local(state["exp_avg"]))
            vs.append(local(state["exp_avg_sq"]))
            names.append(name)
            mirrors.append(mirror)
        decays = [float(group["weight_decay"])] * len(params)
        beta1, beta2 = group["betas"]
        hyper = LambHyper(
            lr=float(group["lr"]),
            beta1=beta1,
            beta2=beta2,
            eps=group["eps"],
            step=group["step"],
            bias_correction=group["bias_correction"],
            grad_averaging=group["grad_averaging"],
            adam_w_mode=self.adam_w_mode,
            max_weight_norm=group["max_weight_norm"],
        )
        adapt = self._adapt_flags(names, decays)
        return LambBatch(params, grads, ms, vs, decays, adapt, hyper), copy_back, mirrors

    def _slots(self) -> list[list[int]]:
        """Per group, the index in the optimiser's whole parameter list of each tensor that
        has a gradient (the rows of the vector all-reduced over shards)."""
        out, base = [], 0
        for group in self.param_groups:
            out.append([base + i for i, p in enumerate(group["params"]) if p.grad is not None])
            base += len(group["params"])
        return out

    def _reducer(self, slots: list[int]) -> Callable[[Tensor], None] | None:
        """``None`` unsharded; else an in-place sum over the shards' ranks: ``[1]`` (Σg²) as
        is, ``[n, 2]`` per-tensor rows through a vector with one row per parameter.
        Partitioned whole tensors: only ``[1]`` is summed."""
        if self.partition_group is not None:
            return partition_all_reduce(self.partition_group)
        group = self.shard_group
        if group is None:
            if not self._dtensor_checked:
                self._dtensor_group = dtensor_shard_group(
                    p for g in self.param_groups for p in g["params"]
                )
                self._dtensor_checked = True
            group = self._dtensor_group
        if group is None:
            return None
        return shard_all_reduce(group, slots, sum(len(g["params"]) for g in self.param_groups))

    def _finite(self, grad_norm: Tensor) -> bool:
        """Whether the step goes on: its global gradient norm is finite (one read of it)."""
        self.last_step_skipped = not bool(torch.isfinite(grad_norm))
        return not self.last_step_skipped

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One LAMB step over every group (gradients after accumulation)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = [p for g in self.param_groups for p in g["params"]]
        device = local(params[0]).device if params else torch.device("cpu")
        name = self.resolve_impl()
        if not self._warm_up(name, device):
            name = self.resolve_impl()
        for group in self.param_groups:
            group["step"] = group.get("step", 0) + 1  # per group, even without grads (apex)
        self._fresh = []  # the tensors whose state this step creates (removed on a skip)
        self.last_step_skipped = False
        slots = self._slots()
        reduce = self._reducer([i for s in slots for i in s])
        built = [
            self._group_batch(g, native_low_precision=name == "triton") for g in self.param_groups
        ]
        proceed = self._finite if self.skip_nonfinite else None
        if name == "triton":
            if self._multi_tensor is None:
                self._multi_tensor = multi_tensor_lamb(chunk_size=self.triton_chunk_size)
            self.last_grad_norm = triton_step(
                self._multi_tensor,
                *(built, reduce, device, self.adam_w_mode, self.max_grad_norm, proceed),
            )
        else:
            self.last_grad_norm = staged_step(
                STAGES[name], built, reduce, device, self.max_grad_norm, proceed
            )
        if self.last_step_skipped:  # as if the step had not been called
            for group in self.param_groups:
                group["step"] -= 1
            for p in self._fresh:
                self.state.pop(p, None)
            return loss
        for _, copy_back, _ in built:
            for p, work in copy_back:
                p.copy_(work)
        return loss
