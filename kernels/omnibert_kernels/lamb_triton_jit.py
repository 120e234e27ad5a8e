"""The Triton kernels of :mod:`omnibert_kernels.lamb_triton` (this module imports ``triton``,
so it is imported only when a step runs; Triton resolves helper functions from module globals).

Table layout (all built by :class:`omnibert_kernels.lamb_triton.MultiTensorLamb`):
``chunks`` ``[3, C]`` int64 (tensor, start, length); ``ptrs`` ``[5, T]`` int64 addresses of
g, p, m, v and the optional low-precision mirror; ``codes`` ``[5, T]`` their dtype codes
(0 fp32, 1 bf16, 2 fp16; mirror 0: none); ``tensor_group`` ``[T]``; ``decays`` ``[T]`` fp32;
``adapt`` ``[T]`` int32; ``coefs`` ``[G, NCOEF]`` fp32 (lr, b1, b3, b2, 1-b2, 1/bc1,
1/sqrt(bc2), eps, max weight norm).
"""

# mypy: ignore-errors

import triton
import triton.language as tl


@triton.jit
def _load(ptr_table, t, offs, mask, code):
    """Elements ``offs`` of tensor ``t`` whose address and dtype code are in the table, as fp32.

    ``code`` is a run-time value, so every branch must yield the same type: each widens its
    load to fp32 itself (a compiled kernel refuses a variable that is bf16 in one branch and
    fp32 in another; the interpreter never checks)."""
    addr = tl.load(ptr_table + t)
    if code == 1:
        x = tl.load(addr.to(tl.pointer_type(tl.bfloat16)) + offs, mask=mask, other=0.0)
        x = x.to(tl.float32)
    elif code == 2:
        x = tl.load(addr.to(tl.pointer_type(tl.float16)) + offs, mask=mask, other=0.0)
        x = x.to(tl.float32)
    else:
        x = tl.load(addr.to(tl.pointer_type(tl.float32)) + offs, mask=mask, other=0.0)
    return x


@triton.jit
def _to_bf16(x):
    """fp32 -> bf16 rounded to nearest, ties to even, as torch rounds (integer ops, so the
    interpreter, whose cast truncates, and CUDA give the same bits); inf stays inf, NaN NaN."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    bits = tl.where(x == x, bits, 0x7FC00000)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _store(ptr_table, t, offs, mask, code, x):
    addr = tl.load(ptr_table + t)
    if code == 1:
        tl.store(addr.to(tl.pointer_type(tl.bfloat16)) + offs, _to_bf16(x), mask=mask)
    elif code == 2:
        tl.store(addr.to(tl.pointer_type(tl.float16)) + offs, x.to(tl.float16), mask=mask)
    else:
        tl.store(addr.to(tl.pointer_type(tl.float32)) + offs, x, mask=mask)


@triton.jit
def grad_sumsq(chunks, ptrs, codes, out, T, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0)
    t = tl.load(chunks + c)
    start = tl.load(chunks + tl.num_programs(0) + c)
    n = tl.load(chunks + 2 * tl.num_programs(0) + c)
    g_code = tl.load(codes + t)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, CHUNK, BLOCK):
        offs = i + tl.arange(0, BLOCK)
        mask = offs < n
        g = _load(ptrs, t, start + offs, mask, g_code)
        acc += g * g
    tl.store(out + c, tl.sum(acc, axis=0))


@triton.jit
def _direction(m, v, coef_row):
    inv_bc1 = tl.load(coef_row + 5)
    inv_sqrt_bc2 = tl.load(coef_row + 6)
    eps = tl.load(coef_row + 7)
    return (m * inv_bc1) / (tl.sqrt(v) * inv_sqrt_bc2 + eps)


@triton.jit
def moments(
    chunks,
    ptrs,
    codes,
    tensor_group,
    decays,
    coefs,
    grad_sumsq,
    out,
    T,
    max_grad_norm,
    L2: tl.constexpr,
    CLIP: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    NCOEF: tl.constexpr,
):
    c = tl.program_id(0)
    t = tl.load(chunks + c)
    start = tl.load(chunks + tl.num_programs(0) + c)
    n = tl.load(chunks + 2 * tl.num_programs(0) + c)
    g_code = tl.load(codes + t)
    p_code = tl.load(codes + T + t)
    row = coefs + tl.load(tensor_group + t) * NCOEF
    decay = tl.load(decays + t)
    inv_clip = 1.0
    if CLIP:
        norm = tl.sqrt(tl.load(grad_sumsq))
        inv_clip = 1.0 / tl.maximum(norm / max_grad_norm, 1.0)
    b1 = tl.load(row + 1)
    b3 = tl.load(row + 2)
    b2 = tl.load(row + 3)
    omb2 = tl.load(row + 4)
    u_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    p_acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, CHUNK, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        mask = i + tl.arange(0, BLOCK) < n
        g = _load(ptrs, t, offs, mask, g_code) * inv_clip
        p = _load(ptrs + T, t, offs, mask, p_code)
        m = _load(ptrs + 2 * T, t, offs, mask, 0)
        v = _load(ptrs + 3 * T, t, offs, mask, 0)
        if L2:
            g = g + decay * p
        m = m * b1 + g * b3
        v = v * b2 + g * g * omb2
        _store(ptrs + 2 * T, t, offs, mask, 0, m)
        _store(ptrs + 3 * T, t, offs, mask, 0, v)
        u = _direction(m, v, row)
        if not L2:
            u = u + decay * p
        u = tl.where(mask, u, 0.0)
        u_acc += u * u
        p_acc += p * p
    tl.store(out + 2 * c, tl.sum(u_acc, axis=0))
    tl.store(out + 2 * c + 1, tl.sum(p_acc, axis=0))


@triton.jit
def segment_sums(first_chunk, partials, out):
    t = tl.program_id(0)
    lo = tl.load(first_chunk + t)
    hi = tl.load(first_chunk + t + 1)
    u_sq = 0.0
    p_sq = 0.0
    for c in range(lo, hi):
        u_sq += tl.load(partials + 2 * c)
        p_sq += tl.load(partials + 2 * c + 1)
    tl.store(out + 2 * t, u_sq)
    tl.store(out + 2 * t + 1, p_sq)


@triton.jit
def apply(
    chunks,
    ptrs,
    codes,
    tensor_group,
    decays,
    adapt,
    coefs,
    sums,
    T,
    L2: tl.constexpr,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    NCOEF: tl.constexpr,
):
    c = tl.program_id(0)
    t = tl.load(chunks + c)
    start = tl.load(chunks + tl.num_programs(0) + c)
    n = tl.load(chunks + 2 * tl.num_programs(0) + c)
    p_code = tl.load(codes + T + t)
    mirror_code = tl.load(codes + 4 * T + t)
    row = coefs + tl.load(tensor_group + t) * NCOEF
    decay = tl.load(decays + t)
    u_norm = tl.sqrt(tl.load(sums + 2 * t))
    p_norm = tl.minimum(tl.sqrt(tl.load(sums + 2 * t + 1)), tl.load(row + 8))
    ok = (tl.load(adapt + t) != 0) & (p_norm != 0.0) & (u_norm != 0.0)
    ratio = tl.where(ok, p_norm / tl.where(ok, u_norm, 1.0), 1.0)
    scale = -tl.load(row + 0) * ratio
    for i in range(0, CHUNK, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        mask = i + tl.arange(0, BLOCK) < n
        p = _load(ptrs + T, t, offs, mask, p_code)
        m = _load(ptrs + 2 * T, t, offs, mask, 0)
        v = _load(ptrs + 3 * T, t, offs, mask, 0)
        u = _direction(m, v, row)
        if not L2:
            u = u + decay * p
        p = p + scale * u
        _store(ptrs + T, t, offs, mask, p_code, p)
        if mirror_code != 0:
            _store(ptrs + 4 * T, t, offs, mask, mirror_code, p)
