"""Step 1 of the GPU check (``scripts/gpu_check.py``): what the machine is and whether each
layer of the GPU path works, one small check at a time, each recorded even when it fails.

Checks: versions (Python, torch, CUDA, Triton, Lightning, transformers, omnibert and where it
was imported from), ``nvidia-smi``, a C compiler and ``Python.h`` (Triton builds its launcher
with them), a one-line Triton kernel, ``torch.compile`` on CUDA, ``varlen_attn`` forward and
backward against SDPA per segment, flash attention with dropout on cumulative lengths, one
LAMB step per implementation against the reference implementation, and the two ceilings the
benchmarks are read against (device-to-device copy bandwidth, bf16 matrix-product rate).
Without CUDA (the CPU rehearsal) the CUDA checks are recorded as skipped.

    python scripts/gpu_probe.py --json probe.json
"""

from __future__ import annotations

import argparse
import importlib
import json
import shutil
import subprocess
import sys
import sysconfig
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

CHECKS: list[tuple[str, Callable[[], Any], bool]] = []  # name, function, needs CUDA


def check(name: str, cuda: bool = True) -> Callable[[Callable[[], Any]], Callable[[], Any]]:
    def register(fn: Callable[[], Any]) -> Callable[[], Any]:
        CHECKS.append((name, fn, cuda))
        return fn

    return register


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """‖got − want‖ / ‖want‖ in float64 (NaN fails every bound)."""
    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    return float((got - want).norm() / want.norm().clamp_min(1e-30))


@check("versions", cuda=False)
def versions() -> dict[str, Any]:
    out: dict[str, Any] = {"python": sys.version.split()[0], "torch": torch.__version__,
                           "cuda": torch.version.cuda}  # fmt: skip
    for name in ("triton", "lightning", "transformers", "datasets", "hydra", "omegaconf",
                 "torchmetrics", "numpy", "omnibert", "omnibert_kernels"):  # fmt: skip
        try:
            module = importlib.import_module(name)
        except Exception as err:  # a missing package is what this records
            out[name] = f"import failed: {err!r}"
            continue
        out[name] = getattr(module, "__version__", "?")
        if name.startswith("omnibert"):
            out[name] += f" ({Path(module.__file__ or '').parent})"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        out["device"] = props.name
        out["multiprocessors"] = props.multi_processor_count
        out["memory_gib"] = round(props.total_memory / 2**30, 1)
        out["capability"] = f"{props.major}.{props.minor}"
    return out


@check("nvidia-smi", cuda=False)
def nvidia_smi() -> str:
    if shutil.which("nvidia-smi") is None:
        return "not found"
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return done.stdout.strip()


@check("C compiler and Python.h", cuda=False)
def compiler() -> dict[str, Any]:
    header = Path(sysconfig.get_paths()["include"]) / "Python.h"
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None or not header.is_file():
        raise RuntimeError(f"cc: {cc}, {header}: {'found' if header.is_file() else 'missing'}")
    return {"cc": cc, "Python.h": str(header)}


@check("triton kernel")
def triton_kernel() -> str:
    import triton
    import triton.language as tl

    @triton.jit
    def add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=mask) + tl.load(y + offs, mask=mask), mask=mask)

    x, y = torch.randn(10_000, device="cuda"), torch.randn(10_000, device="cuda")
    out = torch.full_like(x, float("nan"))
    add[(triton.cdiv(x.numel(), 1024),)](x, y, out, x.numel(), BLOCK=1024)
    torch.testing.assert_close(out, x + y)
    return "ok"


@check("torch.compile")
def compiled() -> str:
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ w).sum(-1)

    x, w = torch.randn(256, 512, device="cuda"), torch.randn(512, 512, device="cuda")
    start = time.perf_counter()
    got = torch.compile(f)(x, w)
    seconds = time.perf_counter() - start
    torch.testing.assert_close(got, f(x, w), rtol=1e-3, atol=1e-3)
    return f"ok ({seconds:.1f} s cold)"


def _segments(device: str) -> tuple[torch.Tensor, list[int]]:
    lengths = [37, 128, 1, 90]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return cu.to(device), lengths


def _per_segment_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int]):
    outs, start = [], 0
    for n in lengths:
        sl = slice(start, start + n)
        qs, ks, vs = (x[sl].transpose(0, 1).unsqueeze(0).float() for x in (q, k, v))
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)[0].transpose(0, 1))
        start += n
    return torch.cat(outs)


def _streams(total: int, heads: int = 4, dim: int = 64) -> tuple[torch.Tensor, ...]:
    """Query, key and value streams ``[total, heads, dim]`` in bf16 on CUDA, with gradients."""
    return tuple(
        torch.randn(total, heads, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for _ in range(3)
    )


@check("varlen_attn forward and backward")
def varlen() -> str:
    from torch.nn.attention.varlen import varlen_attn

    cu, lengths = _segments("cuda")
    q, k, v = _streams(sum(lengths))
    out = varlen_attn(q, k, v, cu, cu, max(lengths), max(lengths))
    ref = _per_segment_sdpa(q, k, v, lengths)
    err = _rel(out, ref)
    if not err < 2e-2:
        raise RuntimeError(f"forward differs from SDPA per segment: rel {err:.2e}")
    out.float().square().sum().backward()
    grads = [x.grad.clone() for x in (q, k, v)]
    for x in (q, k, v):
        x.grad = None
    ref.square().sum().backward()
    errs = [_rel(g, x.grad) for g, x in zip(grads, (q, k, v), strict=True)]
    if not max(errs) < 5e-2:
        raise RuntimeError(f"gradients differ from SDPA per segment: rel {errs}")
    return f"ok (forward rel {err:.1e}, gradients rel max {max(errs):.1e})"


@check("flash attention with dropout on cumulative lengths")
def flash_dropout() -> str:
    cu, lengths = _segments("cuda")
    q, k, v = _streams(sum(lengths))
    out = torch.ops.aten._flash_attention_forward(
        q, k, v, cu, cu, max(lengths), max(lengths), 0.1, False, False
    )[0]
    out.float().sum().backward()
    if not (torch.isfinite(out).all() and all(torch.isfinite(x.grad).all() for x in (q, k, v))):
        raise RuntimeError("non-finite output or gradient")
    return "ok (forward and backward with dropout_p=0.1)"


@check("LAMB step per implementation", cuda=False)
def lamb_impls() -> dict[str, str]:
    from omnibert.optim import Lamb

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(0)
    shapes = {"l.weight": (300, 257), "l.bias": (257,), "LayerNorm.weight": (64,)}
    start = {n: torch.randn(s, generator=gen) for n, s in shapes.items()}
    grads = [{n: torch.randn(s, generator=gen) for n, s in shapes.items()} for _ in range(3)]

    def run(impl: str) -> dict[str, torch.Tensor]:
        named = [(n, torch.nn.Parameter(t.clone().to(device))) for n, t in start.items()]
        opt = Lamb(named, lr=1e-2, impl=impl, no_weight_decay=["bias", "LayerNorm"])
        for step in grads:
            for n, p in named:
                p.grad = step[n].to(device)
            opt.step()
        if opt.resolve_impl() != impl:
            raise RuntimeError(f"{impl} ran as {opt.resolve_impl()}")
        return {n: p.detach().cpu() for n, p in named}

    want = run("reference")
    out = {}
    # the compiled implementation's cold compile (tens of seconds) is left to bench_lamb.py
    impls = ("foreach", "triton") if device == "cuda" else ("foreach",)
    for impl in impls:
        try:
            got = run(impl)
            err = max(_rel(got[n], want[n]) for n in want)
            out[impl] = f"{'ok' if err < 1e-5 else 'DIFFERS'} (rel {err:.1e})"
        except Exception as exc:  # one implementation's failure is a finding
            out[impl] = f"failed: {exc!r}"[:300]
    if any(not v.startswith("ok") for v in out.values()):
        raise RuntimeError(json.dumps(out))
    return out


@check("ceilings")
def ceilings() -> dict[str, float]:
    n = 1 << 28  # 1 GiB of fp32
    src, dst = torch.randn(n, device="cuda"), torch.empty(n, device="cuda")
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def timed(fn: Callable[[], Any], reps: int) -> float:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        return begin.elapsed_time(end) / 1e3 / reps

    copy = timed(lambda: dst.copy_(src), 20)
    matmul = timed(lambda: a @ b, 20)
    return {"copy_GBps_read_plus_write": round(2 * n * 4 / copy / 1e9, 1),
            "bf16_matmul_TFLOPs": round(2 * 8192**3 / matmul / 1e12, 1)}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", required=True, help="where to write the results")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    results: dict[str, Any] = {}
    failed = 0
    for name, fn, needs_cuda in CHECKS:
        start = time.perf_counter()
        if needs_cuda and not cuda:
            entry: dict[str, Any] = {"status": "skipped", "detail": "no CUDA device"}
        else:
            try:
                entry = {"status": "ok", "detail": fn()}
            except Exception as exc:  # every check is recorded, then the next
                failed += 1
                entry = {"status": "failed", "detail": f"{exc!r}"[:2000],
                         "traceback": traceback.format_exc()[-3000:]}  # fmt: skip
        entry["seconds"] = round(time.perf_counter() - start, 2)
        results[name] = entry
        print(f"probe: {name:<52} {entry['status']:<8} {json.dumps(entry['detail'])[:300]}",
              flush=True)  # fmt: skip
    Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
