"""Every Triton kernel of ``omnibert_kernels`` compiles for CUDA (sm_80 and sm_90), here, with
no GPU: ``triton.compile`` with a ``GPUTarget`` runs the whole pipeline (type checking, TTIR,
TTGIR, LLVM, PTX and ``ptxas`` to a cubin), so a kernel that only the interpreter accepts
(``TRITON_INTERPRET=1`` never type-checks) fails the default suite.

The variants compiled are the ones the launcher really chooses: ``Lamb(impl="triton")`` steps
run with the kernels replaced by recorders (nothing is launched), for each optimiser setting
that changes a ``constexpr`` (L2 or decoupled decay, clipping on or off, the chunk size) and
each dtype layout (fp32, bf16 and fp16 weights with fp32 masters, bf16 weights alone); each recorded
call becomes a signature from its real arguments (tensor dtypes, Python ints and floats).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from omnibert_kernels import lamb_triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from omnibert.optim import Lamb  # noqa: E402

#: (architecture, warp size): A100 and H100/H200
TARGETS = {"sm_80": GPUTarget("cuda", 80, 32), "sm_90": GPUTarget("cuda", 90, 32)}
_TRITON_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16",
                 torch.int64: "i64", torch.int32: "i32"}  # fmt: skip


@contextmanager
def recording_launches() -> Iterator[list[tuple[str, tuple[Any, ...], dict[str, Any]]]]:
    """Replace the four kernels with recorders of ``(name, args, kwargs)``; nothing runs."""
    calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: calls.append((self.name, args, kwargs))

    names = list(lamb_triton.kernels())
    original = lamb_triton.kernels
    lamb_triton.kernels = lambda: {n: Recorder(n) for n in names}  # type: ignore[assignment]
    try:
        yield calls
    finally:
        lamb_triton.kernels = original


def _params(dtype: torch.dtype) -> list[tuple[str, torch.nn.Parameter]]:
    shapes = {"a.weight": (40, 30), "a.bias": (30,), "LayerNorm.weight": (8,)}
    return [(n, torch.nn.Parameter(torch.randn(s).to(dtype))) for n, s in shapes.items()]


#: name -> (parameter dtype, gradient dtype, Lamb keyword arguments)
SETTINGS: dict[str, tuple[torch.dtype, torch.dtype, dict[str, Any]]] = {
    "fp32-adamw-clip": (torch.float32, torch.float32, {}),
    "fp32-l2-noclip": (torch.float32, torch.float32, {"adam_w_mode": False,
                                                      "max_grad_norm": None}),
    "fp32-l2-clip-small-chunks": (torch.float32, torch.float32, {"adam_w_mode": False,
                                                                 "triton_chunk_size": 64}),
    "fp32-adamw-noclip-small-chunks": (torch.float32, torch.float32, {"max_grad_norm": None,
                                                                      "triton_chunk_size": 64}),
    "bf16-weights-fp32-masters": (torch.bfloat16, torch.bfloat16, {}),
    "bf16-weights-no-masters": (torch.bfloat16, torch.bfloat16, {"master_weights": False}),
    "fp16-weights-fp32-masters": (torch.float16, torch.float16, {}),
}  # fmt: skip


def _launches(setting: str) -> list[tuple[str, tuple[Any, ...], dict[str, Any]]]:
    param_dtype, grad_dtype, kwargs = SETTINGS[setting]
    named = _params(param_dtype)
    opt = Lamb(named, impl="triton", no_weight_decay=["bias", "LayerNorm"], **kwargs)
    with recording_launches() as calls:
        for _, p in named:
            p.grad = torch.randn(p.shape).to(grad_dtype)
        opt.step()
    return calls


def _signature(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[dict, dict]:
    """Triton's signature and constexprs for a call of ``fn`` with these real arguments."""
    values = dict(zip(fn.arg_names, args, strict=False)) | kwargs
    assert set(values) == set(fn.arg_names), (fn.arg_names, list(values))
    signature: dict[str, str] = {}
    constexprs: dict[str, Any] = {}
    for name, param in zip(fn.arg_names, fn.params, strict=True):
        value = values[name]
        if param.is_constexpr:
            signature[name] = "constexpr"
            constexprs[name] = value
        elif isinstance(value, torch.Tensor):
            signature[name] = "*" + _TRITON_TYPES[value.dtype]
        elif isinstance(value, bool):
            signature[name] = "i1"
        elif isinstance(value, int):
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
        elif isinstance(value, float):
            signature[name] = "fp32"
        else:
            raise AssertionError(f"{fn.__name__}: argument {name} of type {type(value)}")
    return signature, constexprs


@functools.cache
def _variants() -> dict[tuple[str, tuple, tuple], tuple[str, ...]]:
    """Distinct (kernel, signature, constexprs) the launcher chooses, with their settings."""
    jit = lamb_triton.kernels()
    found: dict[tuple[str, tuple, tuple], tuple[str, ...]] = {}
    for setting in SETTINGS:
        for name, args, kwargs in _launches(setting):
            signature, constexprs = _signature(jit[name], args, kwargs)
            key = (name, tuple(signature.items()), tuple(sorted(constexprs.items())))
            found[key] = (*found.get(key, ()), setting)
    return found


def test_every_kernel_and_constexpr_variant_is_recorded() -> None:
    variants = _variants()
    assert {name for name, _, _ in variants} == set(lamb_triton.kernels())
    moments = [dict(c) for name, _, c in variants if name == "moments"]
    # L2 x CLIP, each setting with one of the two chunk sizes
    assert {(c["L2"], c["CLIP"]) for c in moments} == {
        (False, True),
        (True, False),
        (True, True),
        (False, False),
    }, moments
    assert {c["CHUNK"] for c in moments} == {64, lamb_triton.CHUNK_SIZE}


@pytest.mark.parametrize("target", sorted(TARGETS))
def test_lamb_kernels_compile_for_cuda(target: str) -> None:
    jit = lamb_triton.kernels()
    failures = []
    for (name, signature, constexprs), settings in _variants().items():
        source = ASTSource(fn=jit[name], signature=dict(signature), constexprs=dict(constexprs))
        try:
            compiled = triton.compile(source, target=TARGETS[target])
        except Exception as err:  # report every variant that fails, not only the first
            failures.append(f"{name} {constexprs} ({', '.join(settings)}): {err}")
            continue
        assert compiled.asm["cubin"], name
    assert not failures, "\n".join(failures)
