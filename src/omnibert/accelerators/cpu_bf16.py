"""Whether this CPU runs bf16 natively, and what a bf16 matmul costs here.

PyTorch's bf16 kernels are fast on x86 CPUs with AVX512-BF16 or AMX-BF16 instructions. On
one without them (say an AVX2 laptop) bf16 is emulated, orders of magnitude slower than fp32
(docs/accelerators/cpu.md has a matmul's timing), so ``trainer=bf16`` on such a CPU does not
train slowly, it does not train. :func:`cpu_bf16_support` reads the instruction flags
torch detected (``torch.backends.cpu.get_cpu_capability()`` names only the vector width,
``AVX512`` with or without BF16) and times a bf16 and an fp32 matmul small enough to be quick
even where bf16 is emulated, so a refusal can say what this CPU did.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["Bf16Support", "cpu_bf16_support", "cpu_capability", "native_bf16_flags"]

#: x86 instruction sets whose bf16 kernels PyTorch uses (names as torch._C._cpu reports them)
NATIVE_FLAGS = ("avx512_bf16", "amx_bf16")
#: bf16 slower than this many times fp32 in the probe counts as emulated where the flags
#: cannot tell (non-x86 CPUs)
SLOW_RATIO = 3.0
PROBE_SIZE = 128


@dataclass(frozen=True)
class Bf16Support:
    """``native``: bf16 runs at least as well as fp32 here; ``reason``: why, in words."""

    native: bool
    capability: str
    flags: dict[str, bool]
    bf16_ms: float
    fp32_ms: float
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def cpu_capability() -> str:
    """``torch.backends.cpu.get_cpu_capability()`` (``AVX2``, ``AVX512``, ``SVE256``, ...)."""
    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except Exception:  # compat: torch < 2.1 has no torch.backends.cpu
        return "unknown"


def native_bf16_flags() -> dict[str, bool]:
    """The bf16 instruction flags torch detected (empty where it reports none: non-x86, or
    a torch without ``torch._C._cpu._get_cpu_capability``)."""
    try:
        info = torch._C._cpu._get_cpu_capability()  # compat: the dict of torch >= 2.6
    except Exception:
        return {}
    if not isinstance(info, dict) or "avx512_bf16" not in info:
        return {}
    return {name: bool(info.get(name, False)) for name in NATIVE_FLAGS}


def _best_ms(a: torch.Tensor, b: torch.Tensor, repeats: int = 3) -> float:
    torch.mm(a, b)  # first call: kernel selection
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def probe_matmul_ms(size: int = PROBE_SIZE) -> tuple[float, float]:
    """Best of three ``size``×``size`` matmuls in bf16 and in fp32, in milliseconds."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen)
    b = torch.randn(size, size, generator=gen)
    return _best_ms(a.bfloat16(), b.bfloat16()), _best_ms(a, b)


def cpu_bf16_support() -> Bf16Support:
    """Native bf16 by the instruction flags where torch reports them (x86), else by the
    probe (bf16 within :data:`SLOW_RATIO` of fp32); the probe's timings are kept either way."""
    capability, flags = cpu_capability(), native_bf16_flags()
    bf16_ms, fp32_ms = probe_matmul_ms()
    ratio = bf16_ms / max(fp32_ms, 1e-6)
    timing = (
        f"a {PROBE_SIZE}x{PROBE_SIZE} bf16 matmul took {bf16_ms:.2f} ms against "
        f"{fp32_ms:.2f} ms in fp32 ({ratio:.1f}x)"
    )
    if flags:
        native = any(flags.values())
        have = [name for name, on in flags.items() if on]
        what = f"has {'/'.join(have)}" if native else "has neither AVX512-BF16 nor AMX-BF16"
        reason = f"this CPU (capability {capability}) {what}; {timing}"
    else:
        native = ratio <= SLOW_RATIO
        reason = f"this CPU (capability {capability}): {timing}"
    return Bf16Support(native, capability, flags, round(bf16_ms, 3), round(fp32_ms, 3), reason)


def bench_precision(requested: str) -> tuple[str, str]:
    """The precision (``bf16`` / ``fp32``) a CPU benchmark runs for ``--precision
    requested`` (``auto``: bf16 where this CPU runs it natively, else fp32) and why."""
    if requested == "fp32":
        return "fp32", "as requested"
    support = cpu_bf16_support()
    if requested == "bf16":
        note = "" if support.native else " (this CPU emulates bf16: expect it to be very slow)"
        return "bf16", f"as requested; {support.reason}{note}"
    if support.native:
        return "bf16", f"auto: {support.reason}"
    return "fp32", f"auto: no native bf16, {support.reason}"
