"""The BERT encoder in pure torch, parameter for parameter Hugging Face's layout.

Module and parameter names equal ``transformers.BertModel``'s (under ``bert.`` in
:class:`~omnibert.models.pretraining.BertForPreTraining`, as in
``transformers.BertForPreTraining``), so its state dict loads key for key (our embedding
holds ``padded_vocab_size`` rows). The encoder takes the row tensors of the static-shape
batch of the data contract (docs/design.md, :data:`BATCH_KEYS`):

* attention is block-diagonal over ``sequence_ids``: query i sees key j iff both carry the same
  id, so packed sequences never see each other and real tokens never see padding (padding sees
  padding, so no row of the mask is empty and nothing turns into NaN); ``config.attention``
  picks the kernel (:mod:`omnibert.models.attention`), ``varlen`` runs the encoder on the
  real tokens only;
* with ``output_positions`` the last encoder layer computes only those rows per row of the
  batch (queries at the read positions, keys and values everywhere): the pretraining heads
  (:mod:`omnibert.models.pretraining`) read no other.

Everything stays on the device: no ``.item()``, no data-dependent Python branches.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omnibert.models.attention import DenseAttention, Unpadded, resolve_attention
from omnibert.models.config import BertConfig

__all__ = [
    "BATCH_KEYS",
    "OUTPUT_KEYS",
    "BertLayer",
    "BertModel",
    "gather_rows",
    "hidden_activation",
    "init_bert_weights_",
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

    About 20x faster on CPU than ``nn.init.trunc_normal_``'s inverse-CDF sampling, which
    matters for the 23M-entry embedding of BERT-base.
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


@torch.no_grad()
def init_bert_weights_(model: nn.Module, std: float, skip: nn.Module | None = None) -> None:
    """Google BERT's init of every submodule of ``model`` but ``skip``: truncated normal (±2
    std) Linear/Embedding weights, zero Linear biases, LayerNorm weight 1 and bias 0."""
    for module in model.modules():
        if module is skip:
            continue
        if isinstance(module, (nn.Linear, nn.Embedding)):
            truncated_normal_(module.weight, std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                module.bias.zero_()
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()


#: the static-shape batch ``BertForPreTraining.forward`` takes (docs/design.md: the batch contract), in
#: the order tuple-only runtimes (poptorch) pass it: [B,S] row tensors, [B,P] masked-LM
#: slots, [B,K] next-sentence slots
BATCH_KEYS = (
    "input_ids",
    "segment_ids",
    "position_ids",
    "sequence_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "nsp_positions",
    "nsp_labels",
    "nsp_weights",
)
#: what ``BertForPreTraining.forward`` returns (without ``return_logits``), in this order
OUTPUT_KEYS = (
    "loss", "mlm_loss", "nsp_loss", "mlm_correct", "mlm_count", "nsp_correct", "nsp_count",
)  # fmt: skip


def gather_rows(hidden: Tensor, positions: Tensor) -> Tensor:
    """``[B,N,H]``: ``hidden[b, positions[b, n]]`` for every (b, n)."""
    return torch.gather(hidden, 1, positions.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))


class BertEmbeddings(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, position_ids: Tensor) -> Tensor:
        embeddings = (
            self.word_embeddings(input_ids)
            + self.token_type_embeddings(segment_ids)
            + self.position_embeddings(position_ids)
        )
        return self.dropout(self.LayerNorm(embeddings))


class BertSelfAttention(nn.Module):
    """Multi-head attention on HF's separate ``query``/``key``/``value`` parameters.

    Q, K and V run as one GEMM on the concatenated weights (fewer, larger GEMMs; measured
    neutral on a 2-core CPU, where the GEMMs are large anyway). With ``queries`` (the hidden states
    of a subset of rows) only those rows attend, over all keys: the last layer of the
    pretraining forward needs no other row.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.dropout_prob = config.attention_probs_dropout_prob

    def _heads(self, projected: Tensor, parts: int) -> tuple[Tensor, ...]:
        batch, rows, _ = projected.shape
        split = projected.view(batch, rows, parts, self.num_heads, self.head_dim)
        # each [B, heads, rows, head_dim]; tuple(): torch 2.0's stubs type unbind as a list
        return tuple(split.permute(2, 0, 3, 1, 4).unbind(0))

    def forward(
        self, hidden_states: Tensor, attend: Attend, queries: Tensor | None = None
    ) -> Tensor:
        q, k, v = self.query, self.key, self.value
        if queries is None:
            qkv = F.linear(
                hidden_states,
                torch.cat((q.weight, k.weight, v.weight)),
                torch.cat((q.bias, k.bias, v.bias)),
            )
            query, key, value = self._heads(qkv, 3)
        else:
            (query,) = self._heads(q(queries), 1)
            kv = F.linear(
                hidden_states, torch.cat((k.weight, v.weight)), torch.cat((k.bias, v.bias))
            )
            key, value = self._heads(kv, 2)
        dropout_p = self.dropout_prob if self.training else 0.0
        context = attend(query, key, value, dropout_p)
        batch, heads, rows, width = context.shape
        # no -1: rows may be 0 (varlen's stream of a batch without real tokens)
        return context.transpose(1, 2).reshape(batch, rows, heads * width)


class BertSelfOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertAttention(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.self = BertSelfAttention(config)
        self.output = BertSelfOutput(config)

    def forward(
        self, hidden_states: Tensor, attend: Attend, queries: Tensor | None = None
    ) -> Tensor:
        residual = hidden_states if queries is None else queries
        return self.output(self.self(hidden_states, attend, queries), residual)


class BertIntermediate(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = hidden_activation(config.hidden_act)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.intermediate_act_fn(self.dense(hidden_states))


class BertOutput(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: Tensor, residual: Tensor) -> Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)) + residual)


class BertLayer(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.attention = BertAttention(config)
        self.intermediate = BertIntermediate(config)
        self.output = BertOutput(config)

    def forward(
        self, hidden_states: Tensor, attend: Attend, queries: Tensor | None = None
    ) -> Tensor:
        """``[B,S,H]``, or ``[B,Q,H]`` for the query rows ``queries`` only (``[1,T,H]`` /
        ``[1,Q,H]`` on the unpadded stream)."""
        attended = self.attention(hidden_states, attend, queries)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config) for _ in range(config.num_hidden_layers))

    def forward(
        self,
        hidden_states: Tensor,
        attend: Attend,
        last: tuple[Attend, Callable[[Tensor], Tensor]] | None = None,
    ) -> Tensor:
        """Every layer with ``attend``; with ``last = (attend_last, select)`` the last layer
        runs only the rows ``select(hidden)`` (queries over all keys): the others are unread."""
        if last is None:
            for layer in self.layer:
                hidden_states = layer(hidden_states, attend)
            return hidden_states
        for layer in self.layer[:-1]:
            hidden_states = layer(hidden_states, attend)
        attend_last, select = last
        out: Tensor = self.layer[-1](hidden_states, attend_last, select(hidden_states))
        return out


class BertPooler(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = nn.Tanh()

    def forward(self, cls_states: Tensor) -> Tensor:
        """Pool the given [CLS] hidden states (any leading shape, last dim hidden)."""
        return self.activation(self.dense(cls_states))


class BertModel(nn.Module):
    """The encoder: ``forward`` returns the last hidden states ``[B,S,H]``."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler = BertPooler(config)

    def forward(
        self,
        input_ids: Tensor,
        segment_ids: Tensor,
        position_ids: Tensor,
        sequence_ids: Tensor,
        output_positions: Tensor | None = None,
        sequences_per_row: int | None = None,
    ) -> Tensor:
        """Last hidden states ``[B,S,H]``; with ``output_positions [B,N]`` only those rows
        ``[B,N,H]`` (equal to ``full[b, output_positions[b]]``, computed without the rest;
        with ``varlen``, read rows at padding positions are not computed and hold zeros).
        ``sequences_per_row`` (the batch's ``K``) bounds the sequences of a row: ``varlen``'s
        fused path sizes its segment table with it (default: the row length, always enough)."""
        config = self.config
        dropout = self.training and config.attention_probs_dropout_prob > 0.0
        device = input_ids.device.type
        backend = resolve_attention(config.attention, device, dropout, input_ids.shape[1])
        if backend == "varlen":
            # the re-padded buckets' kernel where no fused one runs: the dense path's choice
            # (math with dropout on the CPU, where SDPA's dropout path is slow; SDPA otherwise)
            kernel = "math" if dropout and device == "cpu" else "sdpa"
            return self._forward_unpadded(
                Unpadded.build(
                    sequence_ids,
                    output_positions,
                    kernel,
                    keep_padding=output_positions is None,
                    sequences_per_row=sequences_per_row,
                ),
                (input_ids, segment_ids, position_ids),
                output_positions,
            )
        hidden = self.embeddings(input_ids, segment_ids, position_ids)
        attend = DenseAttention.build(backend, sequence_ids)
        if output_positions is None:
            full: Tensor = self.encoder(hidden, attend)
            return full
        query_ids = torch.gather(sequence_ids, 1, output_positions)
        last = DenseAttention.build(backend, sequence_ids, query_ids)
        rows: Tensor = self.encoder(
            hidden, attend, (last, lambda h: gather_rows(h, output_positions))
        )
        return rows

    def _forward_unpadded(
        self,
        unpadded: Unpadded,
        inputs: tuple[Tensor, Tensor, Tensor],
        output_positions: Tensor | None,
    ) -> Tensor:
        """The encoder on the real tokens: ``[1,T,H]`` from embeddings to the last layer."""
        hidden = self.embeddings(*(unpadded.gather(x) for x in inputs))
        if output_positions is None:
            return unpadded.scatter(self.encoder(hidden, unpadded.attention))
        assert unpadded.last is not None and unpadded.queries is not None
        queries = unpadded.queries
        rows = self.encoder(hidden, unpadded.attention, (unpadded.last, lambda h: h[:, queries]))
        return unpadded.scatter(rows, output_positions.shape[1])
