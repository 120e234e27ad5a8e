"""One encoder layer of the BERT family in pure torch, in Hugging Face's module names: the
embeddings, self-attention on separate ``query``/``key``/``value`` parameters (or a fused
``Wqkv``), the feed-forward block (GELU, or a GLU for the modern encoders), the norms and
activations, rotary position tables and the weight init. :mod:`omnibert.models.bert` stacks
these layers into the encoder.

Everything stays on the device: no ``.item()``, no data-dependent Python branches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omnibert.models.config import BertConfig

__all__ = [
    "Attend",
    "BertAttention",
    "BertEmbeddings",
    "BertIntermediate",
    "BertLayer",
    "BertSelfAttention",
    "LayerInputs",
    "RMSNorm",
    "ResidualOutput",
    "Rotary",
    "hidden_activation",
    "init_bert_weights_",
    "make_norm",
    "rotary_tables",
    "truncated_normal_",
]


#: one attention of query rows over key rows: (query, key, value, dropout_p) -> context
Attend = Callable[[Tensor, Tensor, Tensor, float], Tensor]


def hidden_activation(name: str) -> nn.Module:
    """The module of ``config.hidden_act`` (HF's names; anything else: ReLU)."""
    if name == "gelu":
        return nn.GELU()
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return nn.GELU(approximate="tanh")
    return nn.ReLU()


@torch.no_grad()
def truncated_normal_(tensor: Tensor, std: float) -> Tensor:
    """Fill with N(0, std²) truncated to ±2 std (values outside are drawn again: exact).

    Much faster on CPU than ``nn.init.trunc_normal_``'s inverse-CDF sampling (a normal draw
    and a redraw of the few values outside, against an ``erfinv`` per value), which matters for
    the 23M-entry embedding of BERT-base.
    """
    if tensor.is_meta or not tensor.is_contiguous():
        return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)
    flat = tensor.view(-1).normal_(0.0, std)
    outside = (flat.abs() > 2 * std).nonzero().squeeze(1)
    while outside.numel():
        redrawn = torch.empty_like(flat[outside]).normal_(0.0, std)
        flat[outside] = redrawn
        outside = outside[redrawn.abs() > 2 * std]
    return tensor


class RMSNorm(nn.Module):
    """Root-mean-square norm with a weight and no bias, computed in fp32 (``norm: rmsnorm``)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, hidden_states: Tensor) -> Tensor:
        x = hidden_states.float()
        normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * self.weight.float()).to(hidden_states.dtype)


def make_norm(config: BertConfig) -> nn.Module:
    """The norm of ``config.norm`` (LayerNorm with a bias iff ``config.bias``; RMSNorm has none)."""
    if config.norm == "rmsnorm":
        return RMSNorm(config.hidden_size, config.layer_norm_eps)
    norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
    if not config.bias:
        # what LayerNorm(bias=False) builds (torch >= 2.1), without that keyword: the IPU
        # environment's torch 2.0.1 (poptorch 3.4) has no such argument, and its
        # F.layer_norm takes a bias of None as well
        norm.register_parameter("bias", None)
    return norm


@torch.no_grad()
def init_bert_weights_(model: nn.Module, std: float, skip: nn.Module | None = None) -> None:
    """Google BERT's init of every submodule of ``model`` but ``skip``: truncated normal (±2
    std) Linear/Embedding weights (the gated feed-forward's double-width input too), zero
    Linear biases, norm weights 1 and biases (where a norm has one) 0."""
    for module in model.modules():
        if module is skip:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            truncated_normal_(module.weight, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, (nn.LayerNorm, RMSNorm)):
            module.weight.fill_(1.0)
            bias = getattr(module, "bias", None)
            if bias is not None:
                bias.zero_()


@dataclass
class Rotary:
    """cos/sin tables ``[B,1,rows,head_dim]`` of the key rows and of the query rows."""

    cos: Tensor
    sin: Tensor
    cos_q: Tensor
    sin_q: Tensor

    @staticmethod
    def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate-half rotary embedding (dimension i pairs with i + head_dim/2, as Hugging
        Face's ModernBERT), in fp32, back in ``x``'s dtype."""
        xf = x.float()
        half = x.shape[-1] // 2
        turned = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
        return (xf * cos + turned * sin).to(x.dtype)


def rotary_tables(positions: Tensor, head_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin ``[B,1,rows,head_dim]`` of ``positions [B,rows]`` for the rotary base
    ``theta`` (frequencies theta^(-2i/head_dim), each used for both halves)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float, device=positions.device) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.unsqueeze(-1).float() * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


@dataclass
class LayerInputs:
    """What one encoder layer attends with: the kernel and, with ``rope``, the rotary tables."""

    attend: Attend
    rotary: Rotary | None = None


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        # no position embedding with rope / alibi, no token types with type_vocab_size 0
        self.position_embeddings: nn.Embedding | None = None
        if config.position_encoding == "learned":
            self.position_embeddings = nn.Embedding(
                config.max_position_embeddings, config.hidden_size
            )
        self.token_type_embeddings: nn.Embedding | None = None
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = make_norm(config) if config.embedding_norm else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor) -> Tensor:
        embeddings = self.word_embeddings(input_ids)
        if self.token_type_embeddings is not None:
            embeddings = embeddings + self.token_type_embeddings(segment_ids)
        if self.position_embeddings is not None:
            embeddings = embeddings + self.position_embeddings(position_ids)
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    """Multi-head attention on HF's separate ``query``/``key``/``value`` parameters.

    Q, K and V run as one GEMM on the concatenated weights (fewer, larger GEMMs; no gain on a
    CPU, where the GEMMs are large anyway) while they are plain ``nn.Linear``; a subclass
    swapped in (torchao's ``Float8Linear`` under ``trainer.precision=fp8``) runs its own
    forward, one projection each. With ``queries`` (the hidden states of a subset of rows)
    only those rows attend, over all keys: the last layer of the pretraining forward needs no
    other row.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(hidden, hidden, bias=config.bias)
        self.key = nn.Linear(hidden, hidden, bias=config.bias)
        self.value = nn.Linear(hidden, hidden, bias=config.bias)
        self.dropout_prob = config.attention_probs_dropout_prob

    def _heads(self, projected: Tensor, parts: int) -> tuple[Tensor, ...]:
        batch, rows, _ = projected.shape
        split = projected.view(batch, rows, parts, self.num_heads, self.head_dim)
        # each [B, heads, rows, head_dim]; tuple(): torch 2.0's stubs type unbind as a list
        return tuple(split.permute(2, 0, 3, 1, 4).unbind(0))

    def forward(
        self,
        hidden_states: Tensor,
        attend: Attend,
        queries: Tensor | None = None,
        rotary: Rotary | None = None,
    ) -> Tensor:
        q, k, v = self.query, self.key, self.value
        if not all(type(m) is nn.Linear for m in (q, k, v)):  # swapped (fp8): their forwards
            (query,) = self._heads(q(hidden_states if queries is None else queries), 1)
            (key,) = self._heads(k(hidden_states), 1)
            (value,) = self._heads(v(hidden_states), 1)
        elif queries is None:
            qkv = F.linear(
                hidden_states,
                torch.cat((q.weight, k.weight, v.weight)),
                None if q.bias is None else torch.cat((q.bias, k.bias, v.bias)),
            )
            query, key, value = self._heads(qkv, 3)
        else:
            (query,) = self._heads(q(queries), 1)
            kv = F.linear(
                hidden_states,
                torch.cat((k.weight, v.weight)),
                None if k.bias is None else torch.cat((k.bias, v.bias)),
            )
            key, value = self._heads(kv, 2)
        if rotary is not None:
            query = Rotary.rotate(query, rotary.cos_q, rotary.sin_q)
            key = Rotary.rotate(key, rotary.cos, rotary.sin)
        dropout_p = self.dropout_prob if self.training else 0.0
        context = attend(query, key, value, dropout_p)
        batch, heads, rows, width = context.shape
        # no -1: rows may be 0 (varlen's stream of a batch without real tokens)
        return context.transpose(1, 2).reshape(batch, rows, heads * width)


class ResidualOutput(nn.Module):
    """A projection back to the hidden width, dropout and the residual sum (then the norm,
    post-norm only): the attention's output (from ``hidden_size``, Hugging Face's
    ``BertSelfOutput``) and the feed-forward's (from ``intermediate_size``, ``BertOutput``)."""

    def __init__(self, config: BertConfig, in_features: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_features, config.hidden_size, bias=config.bias)
        self.LayerNorm = make_norm(config) if config.norm_position == "post" else nn.Identity()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = ResidualOutput(config, config.hidden_size)

    def forward(
        self,
        hidden_states: Tensor,
        attend: Attend,
        queries: Tensor | None = None,
        rotary: Rotary | None = None,
        residual: Tensor | None = None,
    ) -> Tensor:
        """``residual`` (default: the query rows' input) is what the output adds to."""
        if residual is None:
            residual = hidden_states if queries is None else queries
        return self.output(self.self(hidden_states, attend, queries, rotary), residual)


class BertIntermediate(nn.Module):
    """BERT's ``Linear -> hidden_act``, or the gated ``geglu`` / ``swiglu``: one Linear to twice
    the width, split into (input, gate) in that order (Hugging Face ModernBERT's ``Wi``), and
    ``act(input) * gate``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.gated = config.feed_forward != "mlp"
        width = config.intermediate_size * (2 if self.gated else 1)
        self.dense = nn.Linear(config.hidden_size, width, bias=config.bias)
        self.intermediate_act_fn: nn.Module
        if config.feed_forward == "geglu":
            self.intermediate_act_fn = nn.GELU()
        elif config.feed_forward == "swiglu":
            self.intermediate_act_fn = nn.SiLU()
        else:
            self.intermediate_act_fn = hidden_activation(config.hidden_act)

    def forward(self, hidden_states: Tensor) -> Tensor:
        projected = self.dense(hidden_states)
        if not self.gated:
            return self.intermediate_act_fn(projected)
        value, gate = projected.chunk(2, dim=-1)
        out: Tensor = self.intermediate_act_fn(value) * gate
        return out


class BertLayer(nn.Module):
    """One encoder layer: post-norm (BERT) or pre-norm (``attn_norm`` before the attention,
    none in layer 0 as in ModernBERT, ``mlp_norm`` before the feed-forward)."""

    def __init__(self, config: BertConfig, index: int = 0) -> None:
        super().__init__()
        self.pre_norm = config.norm_position == "pre"
        if self.pre_norm:
            self.attn_norm = make_norm(config) if index > 0 else nn.Identity()
            self.mlp_norm = make_norm(config)
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = ResidualOutput(config, config.intermediate_size)

    def forward(
        self,
        hidden_states: Tensor,
        attend: Attend,
        queries: Tensor | None = None,
        rotary: Rotary | None = None,
    ) -> Tensor:
        """``[B,S,H]``, or ``[B,Q,H]`` for the query rows ``queries`` only (``[1,T,H]`` /
        ``[1,Q,H]`` on the unpadded stream)."""
        if not self.pre_norm:
            attended = self.attention(hidden_states, attend, queries, rotary)
            return self.output(self.intermediate(attended), attended)
        residual = hidden_states if queries is None else queries
        normed_queries = None if queries is None else self.attn_norm(queries)
        attended = self.attention(
            self.attn_norm(hidden_states), attend, normed_queries, rotary, residual
        )
        return self.output(self.intermediate(self.mlp_norm(attended)), attended)
