"""Where the real tokens of a batch go in ``varlen``'s unpadded stream, and its fused kernel.

Two ways to index the stream (:class:`StreamIndex`), one maths:

* :func:`host_index`, off CUDA: the segments' lengths read on the host once per forward, the
  segments re-padded per length bucket for a dense kernel (eager between compiled graphs);
* :func:`traced_index`, where :data:`FUSED_KERNELS` has a kernel for the device (CUDA):
  tensor ops only, no value read into Python, so ``torch.compile`` captures the whole forward
  and backward in one graph. The segment count is a static bound (``sequences_per_row`` per
  row; unused segments are empty) and the maximal lengths are the row length (an upper bound
  is what a varlen kernel needs). The number of real tokens ``T`` (and of read rows ``Q``)
  comes from ``nonzero``: a size known only when the step runs, so the compiled graph serves
  every ``T`` without recompiling (Dynamo must capture such ops:
  :func:`omnibert.compat.capture_data_dependent_shapes`). Allocating a stream of ``T`` rows
  needs ``T`` on the host: ``nonzero``'s two counts are the forward's only device-to-host
  reads, inside the graph, computed from the batch's ids alone (traced before any layer).

The fused kernel (:func:`cuda_varlen`): flash attention on fp16/bf16, memory-efficient
attention on fp32, both with dropout, through the aten ops that carry their autograd formulas.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from omnibert.compat import compiler_disable

__all__ = [
    "FUSED_KERNELS",
    "Bucket",
    "Segments",
    "StreamIndex",
    "VarlenKernel",
    "call_fused",
    "cuda_varlen",
    "host_index",
    "traced_index",
]

#: (q, k, v, cu_q, cu_k, max_q, max_k, dropout_p) -> out: ``[Tq,heads,D]`` queries over
#: ``[Tk,heads,D]`` keys, query segment i (``cu_q[i]:cu_q[i+1]``) over key segment i; a
#: segment may be empty and ``max_q``/``max_k`` may exceed every segment's length
VarlenKernel = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, int, int, float], Tensor]


@dataclass
class Bucket:
    """Segments re-padded to one length: ``keys [n,L]`` / ``queries [n,Lq]`` index the stream
    (the extra last row stands for padding), ``key_mask [n,1,1,L]``, ``valid`` the query slots
    that are real, ``targets`` where they go in the output."""

    keys: Tensor
    key_mask: Tensor
    queries: Tensor
    valid: Tensor
    targets: Tensor


@dataclass
class Segments:
    """Queries grouped by segment over a key stream: cumulative lengths ``[N+1]`` (int32),
    bounds of the segments' lengths, and (host index only) the re-pad buckets."""

    cu_q: Tensor
    cu_k: Tensor
    max_q: int
    max_k: int
    buckets: list[Bucket] = field(default_factory=list)


@dataclass
class StreamIndex:
    """``tokens [T]``: flat ``B*S`` indices of the stream's tokens, grouped by segment;
    ``full``: every token over every token. With read rows: ``queries [Q]`` (stream indices
    grouped by segment), ``slots [Q]`` (where they sit in the flat ``B*N`` output), ``last``:
    those queries over every token."""

    tokens: Tensor
    full: Segments
    queries: Tensor | None = None
    slots: Tensor | None = None
    last: Segments | None = None


def cuda_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    max_q: int,
    max_k: int,
    dropout_p: float,
) -> Tensor:
    """The fused varlen kernel on CUDA: flash for fp16/bf16 (``varlen_attn``'s kernel, which
    has no dropout argument, hence the aten op), memory-efficient attention for fp32."""
    if q.dtype in (torch.float16, torch.bfloat16):
        flash = torch.ops.aten._flash_attention_forward(
            q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, False, False
        )
        out: Tensor = flash[0]
        return out
    efficient = torch.ops.aten._efficient_attention_forward(
        q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), None, cu_q, cu_k, max_q, max_k,
        dropout_p, 0, True,
    )  # fmt: skip
    out = efficient[0].squeeze(0)
    return out


def call_fused(
    kernel: VarlenKernel, q: Tensor, k: Tensor, v: Tensor, segments: Segments, dropout_p: float
) -> Tensor:
    """``kernel`` over ``segments``, on the streams with one zero row appended to each, a
    segment of its own: no kernel ever sees an empty stream, and the length bounds can be
    capped at the streams' lengths and stay above zero (the memory-efficient backward
    refuses bounds above the lengths or at zero), so a batch without real tokens, or without
    real read rows, runs as any other. The appended rows are contiguous copies, which the
    kernels need anyway."""
    q, k, v = (torch.cat((x, x.new_zeros(1, *x.shape[1:]))) for x in (q, k, v))
    cu_q = torch.cat((segments.cu_q, segments.cu_q[-1:] + 1))
    cu_k = torch.cat((segments.cu_k, segments.cu_k[-1:] + 1))
    # sym_min: the streams' lengths are symbolic under torch.compile, known at run time only
    max_q = torch.sym_min(segments.max_q, q.shape[0])
    max_k = torch.sym_min(segments.max_k, k.shape[0])
    return kernel(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p)[:-1]


#: the device types whose varlen attention is one fused kernel, so that the stream is indexed
#: by :func:`traced_index`; tests add a CPU stand-in here to run that path on the CPU
FUSED_KERNELS: dict[str, VarlenKernel] = {"cuda": cuda_varlen}


def _cumulative(lengths: Tensor) -> Tensor:
    return torch.cat((lengths.new_zeros(1), lengths.cumsum(0))).to(torch.int32)


@torch.no_grad()
def traced_index(
    sequence_ids: Tensor,
    output_positions: Tensor | None,
    *,
    keep_padding: bool,
    sequences_per_row: int | None,
) -> StreamIndex:
    """The stream's index without host reads: ``B * per_row`` segments (``per_row`` =
    ``sequences_per_row``, default the row length, plus one for the padding when kept),
    segment j of a row holding its j-th sequence id in increasing order (padding, id 0, first
    when kept). A row with more sequences than ``sequences_per_row`` (outside the batch
    contract, where packed rows number theirs 1..K) merges its last ones into one segment."""
    batch, seq = sequence_ids.shape
    device = sequence_ids.device
    per_row = (sequences_per_row or seq) + int(keep_padding)
    # each row's tokens by sequence id, stable: a segment is contiguous whatever the ids' order
    ids, order = torch.sort(sequence_ids, dim=1, stable=True)
    real = torch.ones_like(ids, dtype=torch.bool) if keep_padding else ids != 0
    new = torch.ones_like(real)
    new[:, 1:] = ids[:, 1:] != ids[:, :-1]
    rank = (torch.cumsum(new & real, dim=1) - 1).clamp(0, per_row - 1)
    rows = torch.arange(batch, device=device).unsqueeze(1)
    segment = (rows * per_row + rank).reshape(-1)  # [B*S] in sorted order
    real = real.reshape(-1)
    lengths = torch.zeros(batch * per_row, dtype=torch.long, device=device)
    cu = _cumulative(lengths.scatter_add_(0, segment, real.long()))
    flat_order = (order + rows * seq).reshape(-1)
    tokens = flat_order if keep_padding else flat_order[real]  # [T], T known at run time
    full = Segments(cu, cu, seq, seq)
    if output_positions is None:
        return StreamIndex(tokens, full)
    # the read rows: flat positions -> stream indices (-1: padding) and segments
    stream_at = torch.where(real, torch.cumsum(real, 0) - 1, -1)
    where = torch.empty_like(flat_order).scatter_(0, flat_order, stream_at)
    segment_at = torch.empty_like(flat_order).scatter_(0, flat_order, segment)
    read = (output_positions + rows * seq).reshape(-1)
    stream, read_segment = where[read], segment_at[read]
    is_real = stream >= 0
    slots = is_real.nonzero().squeeze(1)  # [Q], Q known at run time
    slots = slots[torch.argsort(read_segment[slots], stable=True)]
    q_lengths = torch.zeros_like(lengths).scatter_add_(0, read_segment, is_real.long())
    last = Segments(_cumulative(q_lengths), cu, min(seq, output_positions.shape[1]), seq)
    return StreamIndex(tokens, full, stream[slots], slots, last)


# ----------------------------------------------------------------------------- host index


def _padded_index(
    starts: list[int], lengths: list[int], width: int, pad: int, device: torch.device
) -> Tensor:
    """``[n,width]``: ``starts[i] + j`` where ``j < lengths[i]``, else ``pad``."""
    start = torch.tensor(starts, device=device).unsqueeze(1)
    offsets = torch.arange(width, device=device)
    inside = offsets < torch.tensor(lengths, device=device).unsqueeze(1)
    return torch.where(inside, start + offsets, pad)


def _buckets(
    q_starts: list[int],
    q_lengths: list[int],
    k_starts: list[int],
    k_lengths: list[int],
    pad_q: int,
    pad_k: int,
    granule: int,
    device: torch.device,
) -> list[Bucket]:
    """Group the segments by key length rounded up to ``granule`` (segments without queries
    are left out) and index them for re-padded attention."""
    groups: dict[int, list[int]] = {}
    for s, (q_len, k_len) in enumerate(zip(q_lengths, k_lengths, strict=True)):
        if q_len:
            groups.setdefault(-(-k_len // granule) * granule, []).append(s)
    out = []
    for width, segments in sorted(groups.items()):
        q_counts = [q_lengths[s] for s in segments]
        keys = _padded_index(
            [k_starts[s] for s in segments], [k_lengths[s] for s in segments], width, pad_k, device
        )
        queries = _padded_index(
            [q_starts[s] for s in segments], q_counts, max(q_counts), pad_q, device
        )
        valid = (queries != pad_q).reshape(-1)
        out.append(
            Bucket(
                keys=keys,
                key_mask=(keys != pad_k)[:, None, None, :],
                queries=queries,
                valid=valid.nonzero().squeeze(1),
                targets=queries.reshape(-1)[valid],
            )
        )
    return out


def _starts(lengths: list[int]) -> list[int]:
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    return starts


@compiler_disable  # host-side indexing: one graph break, eager
@torch.no_grad()
def host_index(
    sequence_ids: Tensor, output_positions: Tensor | None, *, keep_padding: bool, granule: int
) -> StreamIndex:
    """The stream's index with its segments' lengths read on the host (one segment per
    (row, sequence id), empty ones left out) and re-pad buckets of ``granule`` tokens."""
    batch, seq = sequence_ids.shape
    device = sequence_ids.device
    ids = sequence_ids.reshape(-1).long()
    flat = torch.arange(batch * seq, device=device)
    keys = (flat // seq) * (int(ids.max()) + 1) + ids  # (row, sequence id) in one number
    real = flat if keep_padding else flat[ids != 0]
    if len(real) == 0:  # a batch of padding rows only: computed as the reference does
        real = flat
    tokens = real[torch.argsort(keys[real], stable=True)]
    # T changes from batch to batch: compiled graphs take it as a dynamic size at once
    # (no recompile per T) where this torch can say so
    mark = getattr(getattr(torch, "_dynamo", None), "maybe_mark_dynamic", None)
    if mark is not None:
        mark(tokens, 0)
    _, lengths_t = torch.unique_consecutive(keys[tokens], return_counts=True)
    lengths = lengths_t.tolist()
    starts = _starts(lengths)
    total = len(tokens)
    cu = torch.tensor([*starts, total], dtype=torch.int32, device=device)
    longest = max(lengths, default=0)
    buckets = _buckets(starts, lengths, starts, lengths, total, total, granule, device)
    full = Segments(cu, cu, longest, longest, buckets)
    if output_positions is None:
        return StreamIndex(tokens, full)
    # the read rows: flat positions -> stream indices (-1: padding), grouped by segment
    where = torch.full((batch * seq,), -1, dtype=torch.long, device=device)
    where[tokens] = torch.arange(total, device=device)
    segment_of = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths_t)
    read = output_positions + (torch.arange(batch, device=device) * seq).unsqueeze(1)
    stream = where[read.reshape(-1)]
    slots = (stream >= 0).nonzero().squeeze(1)
    slots = slots[torch.argsort(segment_of[stream[slots]], stable=True)]
    queries = stream[slots]
    if mark is not None:
        mark(queries, 0)
        mark(slots, 0)
    q_lengths = torch.bincount(segment_of[queries], minlength=len(lengths)).tolist()
    q_starts = _starts(q_lengths)
    rows = len(queries)
    last = Segments(
        torch.tensor([*q_starts, rows], dtype=torch.int32, device=device),
        cu,
        max(q_lengths, default=0),
        longest,
        _buckets(q_starts, q_lengths, starts, lengths, rows, total, granule, device),
    )
    return StreamIndex(tokens, full, queries, slots, last)
