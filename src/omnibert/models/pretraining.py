"""BERT with the pretraining heads: :class:`BertForPreTraining`, Hugging Face's layout.

Module and parameter names equal ``transformers.BertForPreTraining``'s, so its state dict
loads key for key (our decoder holds ``padded_vocab_size`` rows). ``forward`` takes the
static-shape batch of the data contract (docs/design.md,
:data:`~omnibert.models.bert.BATCH_KEYS`) and returns the losses
(:data:`~omnibert.models.bert.OUTPUT_KEYS`):

* the encoder (:class:`~omnibert.models.bert.BertModel`) computes only the rows the heads
  read: the ``P`` masked positions and the ``K`` [CLS] positions of each row;
* the MLM head (transform + tied decoder) runs only on the ``P`` gathered masked positions;
* NSP runs the pooler on the hidden state of each sequence's [CLS] (``nsp_positions``).

Everything stays on the device: no ``.item()``, no data-dependent Python branches.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omnibert.models.bert import BertModel
from omnibert.models.config import BertConfig
from omnibert.models.layers import hidden_activation, init_bert_weights_, make_norm

__all__ = ["BertForPreTraining", "BertLMPredictionHead", "BertPreTrainingHeads"]


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size, bias=config.bias)
        self.transform_act_fn = hidden_activation(config.hidden_act)
        self.LayerNorm = make_norm(config)

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden_states)))


class BertLMPredictionHead(nn.Module):
    """Transform + decoder; ``decoder.weight`` is the word embedding (``tie_word_embeddings``,
    else its own), ``decoder.bias`` is ``bias`` (absent without ``decoder_bias``)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        vocab = config.padded_vocab_size
        # tied: built on the meta device, its parameters are replaced by shared ones below
        device = "meta" if config.tie_word_embeddings else None
        self.decoder = nn.Linear(config.hidden_size, vocab, bias=config.decoder_bias, device=device)
        self.bias: nn.Parameter | None = None
        if config.decoder_bias:
            self.bias = nn.Parameter(torch.zeros(vocab))
        # the same Parameter objects: tying survives load_state_dict, .to() and deepcopy
        if config.tie_word_embeddings:
            self.decoder.weight = word_embeddings.weight
        if self.bias is not None:
            self.decoder.bias = self.bias

    def forward(self, hidden_states: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden_states))


class BertPreTrainingHeads(nn.Module):
    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding) -> None:
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)
        self.seq_relationship: nn.Linear | None = None
        if config.next_sentence_head:
            self.seq_relationship = nn.Linear(config.hidden_size, 2)


def _weighted_mean(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    count = weights.sum()
    return (values * weights).sum() / count.clamp(min=1.0), count


class BertForPreTraining(nn.Module):
    """BERT with the MLM and NSP heads; ``forward(batch)`` returns the losses and counts."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Google BERT's init (:func:`init_bert_weights_`); the decoder's weight is the word
        embedding (untied: its own, same init), its bias ``cls.predictions.bias`` (zero)."""
        config = self.config
        decoder = self.cls.predictions.decoder
        init_bert_weights_(
            self, config.initializer_range, skip=decoder if config.tie_word_embeddings else None
        )
        if self.cls.predictions.bias is not None:
            self.cls.predictions.bias.zero_()
        # rows past the real vocabulary are never looked up nor scored: keep them at zero
        self.bert.embeddings.word_embeddings.weight[config.vocab_size :].zero_()
        if not config.tie_word_embeddings:
            decoder.weight[config.vocab_size :].zero_()

    def forward(
        self, batch: Mapping[str, Tensor], *, return_logits: bool = False
    ) -> dict[str, Tensor]:
        """Losses of one batch (the data contract's keys).

        Returns 0-dim float32 tensors ``loss`` (= ``mlm_loss + nsp_loss``), ``mlm_loss`` and
        ``nsp_loss`` (weighted means over the real slots), ``mlm_correct``/``mlm_count`` and
        ``nsp_correct``/``nsp_count`` (weight sums); with ``return_logits`` also
        ``mlm_logits [B,P,padded_vocab_size]`` (columns from ``vocab_size`` on are vocab
        padding, never scored) and ``nsp_logits [B,K,2]``.
        """
        mlm_positions = batch["masked_lm_positions"]
        nsp_positions = batch["nsp_positions"]
        seq_relationship, pooler = self.cls.seq_relationship, self.bert.pooler
        nsp = seq_relationship is not None and pooler is not None
        # only the rows the heads read: P masked positions and K [CLS] positions per row
        # (without the NSP head the masked positions only)
        hidden = self.bert(
            batch["input_ids"],
            batch["segment_ids"],
            batch["position_ids"],
            batch["sequence_ids"],
            output_positions=(
                torch.cat((mlm_positions, nsp_positions), dim=1) if nsp else mlm_positions
            ),
            sequences_per_row=nsp_positions.shape[1],  # one NSP slot per sequence
        )
        predictions = mlm_positions.shape[1]
        mlm_hidden = hidden[:, :predictions].reshape(-1, hidden.shape[-1])
        mlm_logits = self.cls.predictions(mlm_hidden)
        if seq_relationship is not None and pooler is not None:
            nsp_hidden = hidden[:, predictions:].reshape(-1, hidden.shape[-1])
            nsp_logits = seq_relationship(pooler(nsp_hidden))
        else:
            nsp_logits = None

        vocab = self.config.vocab_size
        mlm_scores = mlm_logits[:, :vocab].float()
        mlm_labels = batch["masked_lm_ids"].reshape(-1)
        mlm_weights = batch["masked_lm_weights"].reshape(-1).float()
        mlm_ce = F.cross_entropy(mlm_scores, mlm_labels, reduction="none")
        mlm_loss, mlm_count = _weighted_mean(mlm_ce, mlm_weights)
        mlm_hits = (mlm_scores.argmax(-1) == mlm_labels).float()

        if nsp_logits is not None:
            nsp_scores = nsp_logits.float()
            nsp_labels = batch["nsp_labels"].reshape(-1)
            nsp_weights = batch["nsp_weights"].reshape(-1).float()
            nsp_ce = F.cross_entropy(nsp_scores, nsp_labels, reduction="none")
            nsp_loss, nsp_count = _weighted_mean(nsp_ce, nsp_weights)
            nsp_hits = (nsp_scores.argmax(-1) == nsp_labels).float()
            nsp_correct = (nsp_hits * nsp_weights).sum()
            loss = mlm_loss + nsp_loss
        else:
            # no NSP head: the same keys, NSP terms a zero on the device (no graph, no grad)
            nsp_loss = mlm_loss.new_zeros(())
            nsp_correct, nsp_count = nsp_loss.clone(), nsp_loss.clone()
            loss = mlm_loss

        out = {
            "loss": loss,
            "mlm_loss": mlm_loss,
            "nsp_loss": nsp_loss,
            "mlm_correct": (mlm_hits * mlm_weights).sum(),
            "mlm_count": mlm_count,
            "nsp_correct": nsp_correct,
            "nsp_count": nsp_count,
        }
        if return_logits:
            out["mlm_logits"] = mlm_logits.view(*mlm_positions.shape, -1)
            # without the NSP head: zeros (nsp_count is 0, nothing reads them)
            out["nsp_logits"] = (
                nsp_logits.view(*nsp_positions.shape, 2)
                if nsp_logits is not None
                else mlm_logits.new_zeros(*nsp_positions.shape, 2)
            )
        return out
