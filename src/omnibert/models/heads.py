"""Fine-tuning heads on the BERT encoder, with Hugging Face's module and parameter names.

* :class:`BertForQuestionAnswering`: ``bert`` + ``qa_outputs = Linear(hidden, 2)`` giving start
  and end logits per token (``transformers.BertForQuestionAnswering``, whose ``bert`` has no
  pooler: ours keeps the encoder's pooler, unused, so that any BERT checkpoint loads as is;
  the export leaves it out).
* :class:`BertForSequenceClassification`: ``bert`` + pooler on [CLS] + dropout +
  ``classifier = Linear(hidden, num_labels)`` (``transformers.BertForSequenceClassification``).
  ``config.pooling`` picks what is pooled: ``cls`` (the first token, BERT) or ``mean`` (the
  mean over each row's real tokens); an encoder without the next-sentence head has no pooler,
  and the classifier reads the pooled hidden state itself.

Both take ``input_ids``, ``segment_ids`` and ``attention_mask`` ``[B,S]`` (1 real, 0 padding).
The encoder's attention is block-diagonal over the mask: real tokens see real tokens only, as
in Hugging Face; padding rows see padding only, so their outputs differ from Hugging Face's.
Nobody reads them: the QA loss masks padding out of its softmax (Hugging Face's does not) and
post-processing looks at context tokens only, so a batch's loss and answers do not depend on
how far it is padded (:mod:`omnibert.finetune.batching`).
The heads start from N(0, 0.02²) weights (``initializer_range``) and zero biases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from omnibert.models.bert import BertModel
from omnibert.models.config import BertConfig
from omnibert.models.layers import init_bert_weights_

__all__ = ["HEAD_KEYS", "BertForQuestionAnswering", "BertForSequenceClassification"]

#: the parameters each head adds to the encoder (freshly initialised when fine-tuning starts)
HEAD_KEYS = {
    "question_answering": ("qa_outputs.weight", "qa_outputs.bias"),
    "classification": ("classifier.weight", "classifier.bias"),
}


def _encode(bert: BertModel, input_ids: Tensor, segment_ids: Tensor, mask: Tensor) -> Tensor:
    positions = torch.arange(input_ids.shape[1], device=input_ids.device).expand_as(input_ids)
    hidden: Tensor = bert(input_ids, segment_ids, positions, mask.long())
    return hidden


def pool(hidden: Tensor, attention_mask: Tensor, pooling: str) -> Tensor:
    """``[B,H]``: the first token's hidden state (``cls``) or the mean over the real tokens of
    ``attention_mask`` (``mean``; a row without real tokens pools to zeros)."""
    if pooling == "cls":
        return hidden[:, 0]
    weights = attention_mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)


def _init_linear(layer: nn.Linear, std: float) -> None:
    with torch.no_grad():
        layer.weight.normal_(0.0, std)
        if layer.bias is not None:
            layer.bias.zero_()


class BertForQuestionAnswering(nn.Module):
    """Extractive QA: start and end logits ``[B,S]`` (float32)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        self.bert = BertModel(config)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        init_bert_weights_(self, config.initializer_range)
        _init_linear(self.qa_outputs, config.initializer_range)

    def reset_head(self) -> None:
        _init_linear(self.qa_outputs, self.config.initializer_range)

    def forward(
        self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        hidden = _encode(self.bert, input_ids, segment_ids, attention_mask)
        logits = self.qa_outputs(hidden).float()
        start, end = logits.unbind(-1)
        return start, end

    @staticmethod
    def loss(
        start: Tensor,
        end: Tensor,
        start_positions: Tensor,
        end_positions: Tensor,
        attention_mask: Tensor | None = None,
    ) -> Tensor:
        """Mean of the start and end cross-entropies (Hugging Face's QA loss), over the real
        tokens of ``attention_mask`` when given: padding columns take no probability, so the
        loss of a batch is the same whether it is padded to its longest row or to
        ``max_seq_length`` (Hugging Face's softmax also spans the padding)."""
        if attention_mask is not None:
            padding = attention_mask == 0
            start = start.masked_fill(padding, torch.finfo(start.dtype).min)
            end = end.masked_fill(padding, torch.finfo(end.dtype).min)
        return (F.cross_entropy(start, start_positions) + F.cross_entropy(end, end_positions)) / 2


class BertForSequenceClassification(nn.Module):
    """Sentence(-pair) classification on the pooled [CLS]: logits ``[B,num_labels]``."""

    def __init__(self, config: BertConfig, num_labels: int = 2) -> None:
        super().__init__()
        self.config = config
        self.num_labels = num_labels
        self.bert = BertModel(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        init_bert_weights_(self, config.initializer_range)
        _init_linear(self.classifier, config.initializer_range)

    def reset_head(self) -> None:
        _init_linear(self.classifier, self.config.initializer_range)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, attention_mask: Tensor) -> Tensor:
        hidden = _encode(self.bert, input_ids, segment_ids, attention_mask)
        pooled = pool(hidden, attention_mask, self.config.pooling)
        if self.bert.pooler is not None:
            pooled = self.bert.pooler(pooled)
        logits: Tensor = self.classifier(self.dropout(pooled)).float()
        return logits

    @staticmethod
    def loss(logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits, labels)
