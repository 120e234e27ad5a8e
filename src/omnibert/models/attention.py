"""Attention backends of the encoder: one maths (block-diagonal over ``sequence_ids``), several kernels.

``model.config.attention`` (:data:`~omnibert.models.config.ATTENTION_BACKENDS`):

* ``math``: the reference, written out: scores, ``-inf`` where the query's and the key's
  sequence ids differ, softmax in fp32 accumulation, dropout on the probabilities;
* ``sdpa``: ``F.scaled_dot_product_attention`` with the same ``[B,1,Q,S]`` boolean mask;
* ``flex``: FlexAttention with a block mask built from ``sequence_ids`` (a document mask: whole
  blocks across sequences are skipped). It has no attention dropout and, in torch 2.13, no
  backward on the CPU (:func:`~omnibert.models.attention_choice.check_backend` refuses those
  runs before compute);
* ``varlen``: the encoder runs on the real tokens only (:class:`Unpadded`): the non-padding
  tokens of the batch become one ``[T,H]`` stream of segments (one per sequence, packed rows
  give one per packed sequence), embeddings, QKV, FFN and LayerNorm run on ``T`` rows. On
  CUDA attention is one fused varlen kernel (flash in fp16/bf16, memory-efficient in fp32,
  dropout included) and the stream is indexed without host reads, so ``torch.compile``
  captures the whole step; elsewhere SDPA / the math kernel run on the segments re-padded per
  length bucket, indexed on the host (:mod:`omnibert.models.varlen`);
* ``auto``: the backend measured fastest for the device, the dropout and the sequence length
  (:mod:`omnibert.models.attention_choice`, which also refuses a backend that cannot run).

Every backend gives the same hidden states at real tokens (tests/e2e/test_attention.py checks it
against ``math``). Where they may differ is only what nobody reads: ``varlen`` does not compute
padding tokens when the caller reads a subset of rows (the pretraining heads): a read row at a
padding position is zero there (the heads weigh such slots 0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from omnibert.compat import compiler_disable
from omnibert.models.config import BertConfigError
from omnibert.models.varlen import (
    FUSED_KERNELS,
    Bucket,
    Segments,
    VarlenKernel,
    call_fused,
    host_index,
    traced_index,
)

__all__ = [
    "DenseAttention",
    "Unpadded",
    "alibi_slopes",
    "block_diagonal_mask",
    "explicit_attention",
]


def block_diagonal_mask(sequence_ids: Tensor, query_ids: Tensor | None = None) -> Tensor:
    """``[B,1,Q,S]`` bool: True where query i may attend key j (same sequence id).

    ``query_ids`` (``[B,Q]``, default ``sequence_ids``) are the sequence ids of the query rows.
    """
    queries = sequence_ids if query_ids is None else query_ids
    return (queries.unsqueeze(2) == sequence_ids.unsqueeze(1)).unsqueeze(1)


def alibi_slopes(heads: int) -> Tensor:
    """ALiBi's per-head slopes (Press et al. 2022), float32 ``[heads]``: for a power of two n,
    2^(-8 i / n) for i = 1..n; otherwise those of the largest power of two m below n, then
    every other slope of 2m for the remaining n - m heads."""

    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]

    below = 2 ** math.floor(math.log2(heads))
    slopes = geometric(below)
    if below < heads:
        slopes += geometric(2 * below)[0::2][: heads - below]
    return torch.tensor(slopes, dtype=torch.float32)


def positional_mask(
    mask: Tensor,
    query_positions: Tensor,
    key_positions: Tensor,
    half_window: int,
    slopes: Tensor | None,
) -> Tensor:
    """``mask [...,Q,S]`` (bool, with a head dim of 1 before Q) narrowed to keys within
    ``half_window`` positions of the query (0: no window), and with ``slopes [heads]`` the
    additive float bias ``-slope * |pos_q - pos_k|`` (``-inf`` outside the mask) instead.
    Positions ``[...,Q]`` / ``[...,S]``."""
    distance = (query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)).abs().unsqueeze(-3)
    if half_window > 0:
        mask = mask & (distance <= half_window)
    if slopes is None:
        return mask
    bias = -slopes.view(-1, 1, 1) * distance.float()
    return bias.masked_fill(mask.logical_not(), float("-inf"))


def explicit_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor, dropout_p: float
) -> Tensor:
    """softmax(q k^T / sqrt(d), -inf where not ``mask``) v, dropout on the probabilities, in
    the inputs' (autocast) dtype: scores from GEMMs that accumulate in fp32, softmax
    accumulated in fp32, as the fused kernels do. A float ``mask`` is an additive bias
    (alibi: ``-inf`` where attention is not allowed)."""
    scores = torch.matmul(query, key.transpose(-1, -2)).mul_(query.shape[-1] ** -0.5)
    if mask.dtype == torch.bool:
        scores = scores.masked_fill_(mask.logical_not(), float("-inf"))
    else:
        scores = scores + mask.to(scores.dtype)
    probs = F.dropout(torch.softmax(scores, dim=-1), dropout_p, training=dropout_p > 0.0)
    return torch.matmul(probs, value)


def sdpa_attention(
    query: Tensor, key: Tensor, value: Tensor, mask: Tensor, dropout_p: float
) -> Tensor:
    if mask.dtype != torch.bool:
        mask = mask.to(query.dtype)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout_p)


def masked_kernel(backend: str) -> Callable[[Tensor, Tensor, Tensor, Tensor, float], Tensor]:
    return explicit_attention if backend == "math" else sdpa_attention


@dataclass
class Band:
    """Positions of the query and key rows ``[B,Q]`` / ``[B,S]``, the half window (0: none)
    and the alibi slopes ``[heads]`` (or None): what attention reads beyond sequence ids."""

    query_positions: Tensor
    key_positions: Tensor
    half_window: int = 0
    slopes: Tensor | None = None


def _flex_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    query_ids: Tensor,
    key_ids: Tensor,
    band: Band | None = None,
) -> Tensor:
    # lazy: flex attention exists from torch 2.5 on; omnibert runs on torch 2.1 and later
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def same_sequence(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
        return query_ids[b, q] == key_ids[b, k]

    mask_mod: Any = same_sequence
    score_mod: Any = None
    if band is not None:
        q_pos, k_pos, half, slopes = (
            band.query_positions, band.key_positions, band.half_window, band.slopes,
        )  # fmt: skip
        if half > 0:

            def within_window(b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
                near = (q_pos[b, q] - k_pos[b, k]).abs() <= half
                return same_sequence(b, h, q, k) & near

            mask_mod = within_window
        if slopes is not None:
            heads_slopes = slopes

            def alibi(score: Tensor, b: Tensor, h: Tensor, q: Tensor, k: Tensor) -> Tensor:
                distance = (q_pos[b, q] - k_pos[b, k]).abs()
                return score - heads_slopes[h] * distance

            score_mod = alibi

    batch, _, rows, _ = query.shape
    block_mask = create_block_mask(
        mask_mod, batch, None, rows, key.shape[2], device=query.device.type
    )
    # fused kernels need torch.compile (eager flex materialises the scores); on the CPU,
    # where flex serves inference only, eager is enough
    attend = _compiled_flex(flex_attention) if query.is_cuda else flex_attention
    out: Tensor = attend(query, key, value, score_mod=score_mod, block_mask=block_mask)
    return out


_COMPILED: dict[str, Any] = {}


def _compiled_flex(flex_attention: Any) -> Any:
    if "flex" not in _COMPILED:
        _COMPILED["flex"] = torch.compile(flex_attention)
    return _COMPILED["flex"]


@dataclass
class DenseAttention:
    """Attention on ``[B,heads,Q,D]`` queries over ``[B,heads,S,D]`` keys, block-diagonal over
    the query rows' and the keys' sequence ids (``math``, ``sdpa`` or ``flex``)."""

    backend: str
    key_ids: Tensor  # [B,S]
    query_ids: Tensor  # [B,Q]
    mask: Tensor | None = None  # [B,1,Q,S] for math / sdpa (float [B,heads,Q,S] with alibi)
    band: Band | None = None  # flex: the window and alibi, applied in its mask / score mods

    @classmethod
    def build(
        cls,
        backend: str,
        key_ids: Tensor,
        query_ids: Tensor | None = None,
        *,
        key_positions: Tensor | None = None,
        query_positions: Tensor | None = None,
        half_window: int = 0,
        slopes: Tensor | None = None,
    ) -> DenseAttention:
        """Block-diagonal over the sequence ids; with ``half_window`` > 0 also within that
        many positions (``key_positions [B,S]``, ``query_positions [B,Q]``, default the
        keys'), with ``slopes`` the alibi bias on the position distance."""
        queries = key_ids if query_ids is None else query_ids
        band = None
        if half_window > 0 or slopes is not None:
            assert key_positions is not None, "a window or alibi needs the positions"
            q_pos = key_positions if query_positions is None else query_positions
            band = Band(q_pos, key_positions, half_window, slopes)
        if backend == "flex":
            return cls(backend, key_ids, queries, None, band)
        mask = block_diagonal_mask(key_ids, queries)
        if band is not None:
            mask = positional_mask(
                mask, band.query_positions, band.key_positions, half_window, slopes
            )
        return cls(backend, key_ids, queries, mask, band)

    def __call__(self, query: Tensor, key: Tensor, value: Tensor, dropout_p: float) -> Tensor:
        if self.mask is None:
            if dropout_p > 0.0:  # check_backend refuses this before a run starts
                raise BertConfigError("model.config.attention=flex has no attention dropout.")
            return _flex_attention(query, key, value, self.query_ids, self.key_ids, self.band)
        return masked_kernel(self.backend)(query, key, value, self.mask, dropout_p)


# ----------------------------------------------------------------------------- varlen


def _bucket_mask(bucket: Bucket, rows: int, band: Band) -> Tensor:
    """A bucket's mask with the window / alibi of ``band`` (stream positions ``[Q]`` of the
    queries, ``[T]`` of the keys; ``rows`` = Q, the padding slot's index): re-padded query
    slots see every key, so no row is empty (they are dropped afterwards)."""
    q_pos = torch.cat((band.query_positions, band.query_positions.new_zeros(1)))[bucket.queries]
    k_pos = torch.cat((band.key_positions, band.key_positions.new_zeros(1)))[bucket.keys]
    # [n,1,Lq,L]: keys of the segment, widened for the padding query slots
    padding_query = (bucket.queries == rows)[:, None, :, None]
    mask = bucket.key_mask | padding_query
    if band.half_window > 0:
        distance = (q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)).abs().unsqueeze(1)
        mask = mask & ((distance <= band.half_window) | padding_query)
    if band.slopes is None:
        return mask
    return positional_mask(mask, q_pos, k_pos, 0, band.slopes)


@compiler_disable  # a loop over data-dependent buckets: eager, between compiled graphs
def _bucketed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    buckets: list[Bucket],
    kernel: str,
    dropout_p: float,
    band: Band | None = None,
) -> Tensor:
    """``[Q,heads,D]`` queries over ``[T,heads,D]`` keys, each bucket's segments re-padded to
    its width (the appended zero row is the padding slot) and attended with ``kernel``; with
    ``band`` (stream positions) within its window / with its alibi bias."""
    if not buckets:  # no query row is a real token
        return q * 0.0
    q_pad, k_pad, v_pad = (torch.cat((x, x.new_zeros(1, *x.shape[1:]))) for x in (q, k, v))
    attend = masked_kernel(kernel)
    parts, targets = [], []
    for b in buckets:
        # [n,L,heads,D] -> [n,heads,L,D]
        qb = q_pad[b.queries].transpose(1, 2)
        kb, vb = k_pad[b.keys].transpose(1, 2), v_pad[b.keys].transpose(1, 2)
        mask = b.key_mask if band is None else _bucket_mask(b, q.shape[0], band)
        context = attend(qb, kb, vb, mask, dropout_p).transpose(1, 2)
        parts.append(context.reshape(-1, *q.shape[1:])[b.valid])
        targets.append(b.targets)
    return torch.empty_like(q).index_copy(0, torch.cat(targets), torch.cat(parts))


class VarlenAttention:
    """Attention of a query stream over a key stream ``[1,heads,T,D]``, each query seeing
    only the keys of its segment: one ``fused`` kernel call, else ``kernel`` (math or sdpa) on
    the segments re-padded per bucket."""

    def __init__(
        self,
        segments: Segments,
        kernel: str,
        fused: VarlenKernel | None,
        band: Band | None = None,
    ) -> None:
        self.segments = segments
        self.kernel = kernel
        self.fused = fused
        self.band = band

    def restricted(
        self,
        key_positions: Tensor,
        query_positions: Tensor | None,
        half_window: int,
        slopes: Tensor | None,
    ) -> VarlenAttention:
        """This attention within ``half_window`` positions (0: none) and with the alibi
        ``slopes`` (or None), by the stream's positions ``[1,T]`` (queries ``[1,Q]``, default
        the keys'); itself when neither applies. Only the bucket path enforces them (the
        model builds a host-indexed stream where a window or alibi is configured)."""
        if half_window == 0 and slopes is None:
            return self
        if self.fused is not None:
            raise BertConfigError(
                "the fused varlen kernel has no sliding window or alibi here; build the stream "
                "with fused=False (omnibert's BertModel does)."
            )
        q_pos = key_positions if query_positions is None else query_positions
        band = Band(q_pos.reshape(-1), key_positions.reshape(-1), half_window, slopes)
        return VarlenAttention(self.segments, self.kernel, None, band)

    def __call__(self, query: Tensor, key: Tensor, value: Tensor, dropout_p: float) -> Tensor:
        seg = self.segments
        # [1,heads,T,D] -> [T,heads,D]
        q, k, v = (x.squeeze(0).transpose(0, 1) for x in (query, key, value))
        if self.fused is not None:
            out = call_fused(self.fused, q, k, v, seg, dropout_p)
        else:
            out = _bucketed_attention(q, k, v, seg.buckets, self.kernel, dropout_p, self.band)
        return out.transpose(0, 1).unsqueeze(0)


@dataclass
class Unpadded:
    """A batch's real tokens as one stream (``varlen``), from ``sequence_ids [B,S]``.

    ``tokens [T]`` are flat ``B*S`` indices of the real tokens ordered by (row, sequence id):
    one contiguous segment per sequence. ``attention`` serves every layer but the last;
    with ``output_positions`` the last layer runs only the read rows that are real tokens
    (``queries [Q]``: stream indices grouped by segment, ``slots [Q]``: where they sit in the
    flat ``B*N`` output) with ``last``. ``keep_padding`` makes each row's padding a segment
    too (full outputs: every position computed as the reference does).
    """

    shape: tuple[int, int]
    tokens: Tensor
    attention: VarlenAttention
    queries: Tensor | None = None
    slots: Tensor | None = None
    last: VarlenAttention | None = None

    @classmethod
    def build(
        cls,
        sequence_ids: Tensor,
        output_positions: Tensor | None,
        kernel: str,
        *,
        keep_padding: bool = False,
        granule: int = 32,
        sequences_per_row: int | None = None,
        fused: bool = True,
    ) -> Unpadded:
        """Indexed on the device where it has a fused kernel (:data:`FUSED_KERNELS`: no host
        read, traceable; ``sequences_per_row`` bounds the segments of a row, by default the
        row length) unless ``fused`` is false, else on the host with re-pad buckets of
        ``granule`` tokens for ``kernel``."""
        fused_kernel = FUSED_KERNELS.get(sequence_ids.device.type) if fused else None
        if fused_kernel is not None:
            index = traced_index(
                sequence_ids,
                output_positions,
                keep_padding=keep_padding,
                sequences_per_row=sequences_per_row,
            )
        else:
            index = host_index(
                sequence_ids, output_positions, keep_padding=keep_padding, granule=granule
            )
        batch, seq = sequence_ids.shape
        out = cls((batch, seq), index.tokens, VarlenAttention(index.full, kernel, fused_kernel))
        if index.last is not None:
            out.queries, out.slots = index.queries, index.slots
            out.last = VarlenAttention(index.last, kernel, fused_kernel)
        return out

    def gather(self, values: Tensor) -> Tensor:
        """``[B,S,...]`` -> ``[1,T,...]``: the stream's tokens."""
        return values.reshape(-1, *values.shape[2:])[self.tokens].unsqueeze(0)

    def scatter(self, hidden: Tensor, rows: int | None = None) -> Tensor:
        """The stream's ``[1,T,H]`` (or the read rows' ``[1,Q,H]``) back in ``[B,S,H]`` (or
        ``[B,N,H]``, ``rows`` = N) with zeros where no row was computed."""
        width = hidden.shape[-1]
        if rows is None:
            batch, seq = self.shape
            index, size = self.tokens, batch * seq
        else:
            assert self.slots is not None
            batch, index, size = self.shape[0], self.slots, self.shape[0] * rows
        flat = hidden.new_zeros(size, width).index_copy(0, index, hidden.squeeze(0))
        return flat.view(batch, -1, width)
