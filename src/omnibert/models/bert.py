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

The layers it stacks (embeddings, self-attention, feed-forward, norms, rotary tables, the
weight init) are :mod:`omnibert.models.layers`.

Everything stays on the device: no ``.item()``, no data-dependent Python branches.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor, nn

from omnibert.models.attention import DenseAttention, Unpadded, alibi_slopes
from omnibert.models.attention_choice import resolve_attention
from omnibert.models.config import BertConfig
from omnibert.models.layers import (
    Attend,
    BertEmbeddings,
    BertLayer,
    LayerInputs,
    Rotary,
    make_norm,
    rotary_tables,
)

__all__ = [
    "BATCH_KEYS",
    "OUTPUT_KEYS",
    "BertEncoder",
    "BertModel",
    "BertPooler",
    "gather_rows",
]


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


class BertEncoder(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, i) for i in range(config.num_hidden_layers))

    def forward(
        self,
        hidden_states: Tensor,
        inputs: Sequence[LayerInputs],
        last: tuple[LayerInputs, Callable[[Tensor], Tensor]] | None = None,
    ) -> Tensor:
        """Layer i with ``inputs[i]``; with ``last = (inputs_last, select)`` the last layer
        runs only the rows ``select(hidden)`` (queries over all keys): the others are unread."""
        if last is None:
            for layer, step in zip(self.layer, inputs, strict=True):
                hidden_states = layer(hidden_states, step.attend, None, step.rotary)
            return hidden_states
        for layer, step in zip(self.layer[:-1], inputs, strict=False):
            hidden_states = layer(hidden_states, step.attend, None, step.rotary)
        final, select = last
        out: Tensor = self.layer[-1](
            hidden_states, final.attend, select(hidden_states), final.rotary
        )
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
    """The encoder: ``forward`` returns the last hidden states ``[B,S,H]``.

    Without the next-sentence head (``config.next_sentence_head`` false) there is no
    ``pooler``; with pre-norm a ``final_norm`` follows the last layer.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.embeddings = BertEmbeddings(config)
        self.encoder = BertEncoder(config)
        self.pooler: BertPooler | None = BertPooler(config) if config.next_sentence_head else None
        self.final_norm = make_norm(config) if config.norm_position == "pre" else nn.Identity()

    @property
    def _positional_attention(self) -> bool:
        """Whether attention itself reads positions (alibi or sliding-window layers)."""
        return self.config.position_encoding == "alibi" or self.config.has_local_layers

    def _kind_inputs(
        self,
        local: bool,
        build: Callable[[int, Tensor | None], Attend],
        key_positions: Tensor,
        query_positions: Tensor | None = None,
    ) -> LayerInputs:
        """The :class:`LayerInputs` of the global or the local layers: ``build(half_window,
        slopes)`` makes the kernel (half window 0: global; alibi slopes or None), the rotary
        tables come from the key rows' and the query rows' positions."""
        config = self.config
        slopes = None
        if config.position_encoding == "alibi":
            slopes = alibi_slopes(config.num_attention_heads).to(key_positions.device)
        rotary = None
        if config.position_encoding == "rope":
            theta = config.rope_theta_local if local else config.rope_theta
            cos, sin = rotary_tables(key_positions, config.head_dim, theta)
            cos_q, sin_q = (
                (cos, sin)
                if query_positions is None
                else rotary_tables(query_positions, config.head_dim, theta)
            )
            rotary = Rotary(cos, sin, cos_q, sin_q)
        half = config.local_window // 2 if local else 0
        return LayerInputs(build(half, slopes), rotary)

    def _layer_inputs(
        self, build: Callable[[int, Tensor | None], Attend], positions: Tensor
    ) -> list[LayerInputs]:
        """One :class:`LayerInputs` per layer, one object per kind of layer (global, local)."""
        config = self.config
        kinds: dict[bool, LayerInputs] = {}
        for local in sorted({config.is_local(i) for i in range(config.num_hidden_layers)}):
            kinds[local] = self._kind_inputs(local, build, positions)
        return [kinds[config.is_local(i)] for i in range(config.num_hidden_layers)]

    def _last_inputs(
        self,
        build: Callable[[int, Tensor | None], Attend],
        positions: Tensor,
        query_positions: Tensor,
    ) -> LayerInputs:
        local = self.config.is_local(self.config.num_hidden_layers - 1)
        return self._kind_inputs(local, build, positions, query_positions)

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
                    # sliding windows and alibi run on the re-padded buckets on every device:
                    # torch 2.13's fused fp32 kernel (memory-efficient attention) has only a
                    # one-sided window and no alibi, and CUDA cannot be tested here
                    fused=not self._positional_attention,
                ),
                (input_ids, segment_ids, position_ids),
                output_positions,
            )
        hidden = self.embeddings(input_ids, segment_ids, position_ids)

        def dense(
            query_ids: Tensor | None, query_positions: Tensor | None
        ) -> Callable[[int, Tensor | None], Attend]:
            def build(half: int, slopes: Tensor | None) -> Attend:
                return DenseAttention.build(
                    backend,
                    sequence_ids,
                    query_ids,
                    key_positions=position_ids,
                    query_positions=query_positions,
                    half_window=half,
                    slopes=slopes,
                )

            return build

        inputs = self._layer_inputs(dense(None, None), position_ids)
        if output_positions is None:
            full: Tensor = self.final_norm(self.encoder(hidden, inputs))
            return full
        query_ids = torch.gather(sequence_ids, 1, output_positions)
        query_positions = torch.gather(position_ids, 1, output_positions)
        last = self._last_inputs(dense(query_ids, query_positions), position_ids, query_positions)
        rows: Tensor = self.encoder(
            hidden, inputs, (last, lambda h: gather_rows(h, output_positions))
        )
        out: Tensor = self.final_norm(rows)
        return out

    def _forward_unpadded(
        self,
        unpadded: Unpadded,
        inputs: tuple[Tensor, Tensor, Tensor],
        output_positions: Tensor | None,
    ) -> Tensor:
        """The encoder on the real tokens: ``[1,T,H]`` from embeddings to the last layer."""
        hidden = self.embeddings(*(unpadded.gather(x) for x in inputs))
        positions = unpadded.gather(inputs[2])  # [1,T]
        layers = self._layer_inputs(
            lambda half, slopes: unpadded.attention.restricted(positions, None, half, slopes),
            positions,
        )
        if output_positions is None:
            return unpadded.scatter(self.final_norm(self.encoder(hidden, layers)))
        assert unpadded.last is not None and unpadded.queries is not None
        queries = unpadded.queries
        last_attention = unpadded.last
        query_positions = positions[:, queries]
        last = self._last_inputs(
            lambda half, slopes: last_attention.restricted(
                positions, query_positions, half, slopes
            ),
            positions,
            query_positions,
        )
        rows = self.encoder(hidden, layers, (last, lambda h: h[:, queries]))
        return unpadded.scatter(self.final_norm(rows), output_positions.shape[1])
