"""The two sides of ``scripts/bench_gpu.py`` on the same sequences, and the work each does.

* :func:`unpack_batches`: the sequences of omnibert's (packed or unpacked) batches, one per row,
  in the order they were packed, re-batched into rows of the peer's micro batch. Hugging Face
  has no packed attention, so it reads exactly the sequences omnibert's packed rows hold (less
  the remainder, under one micro batch, that its fixed batch shape cannot take). The old way
  (the first rows of an unpacked stream) drew other sequences, of another mean length
  (docs/accelerators/gpu.md, the H100 lease read again).
* :func:`hf_bert_inputs` / :func:`hf_modern_inputs`: those rows as the peer's inputs.
* :func:`hf_bert` / :func:`hf_modernbert`: the peer with omnibert's initial weights.
* :func:`work`: what a side executes for the same sequences: the token rows its encoder runs,
  the positions its masked-LM head scores and the matrix-product FLOPs of a step (forward and
  backward), so a ratio says how much of it is skipped work and how much is speed.
* :func:`histogram_mean_length`: the mean sequence length of a length histogram, for
  sequences/s "at the histogram's mean": a packed row costs the same whatever it holds, so
  real tokens/s divided by the histogram's mean length is the rate a long run over the whole
  data set reaches; the few hundred sequences a bench case draws have their own mean.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

#: the keys of an unpacked contract batch, in the order the collator writes them
CONTRACT_KEYS = (
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


def split_sequences(batch: Mapping[str, Tensor]) -> list[dict[str, Tensor]]:
    """Every sequence of a contract batch (packed or not) on its own: its tokens, segments,
    masked positions (relative to its first token), masked ids and its NSP label, on the host.
    Sequences keep the order of their rows and, within a row, of their sequence ids."""
    cpu = {key: batch[key].detach().to("cpu") for key in CONTRACT_KEYS}
    out: list[dict[str, Tensor]] = []
    for row in range(cpu["input_ids"].shape[0]):
        ids = cpu["sequence_ids"][row]
        weights = cpu["masked_lm_weights"][row] > 0
        positions = cpu["masked_lm_positions"][row][weights]
        masked_ids = cpu["masked_lm_ids"][row][weights]
        for slot in range(cpu["nsp_weights"].shape[1]):
            if cpu["nsp_weights"][row, slot] <= 0:
                continue
            where = (ids == slot + 1).nonzero().flatten()
            start, length = int(where[0]), int(where.numel())
            mine = ids[positions] == slot + 1
            out.append(
                {
                    "input_ids": cpu["input_ids"][row, start : start + length],
                    "segment_ids": cpu["segment_ids"][row, start : start + length],
                    "masked_lm_positions": positions[mine] - start,
                    "masked_lm_ids": masked_ids[mine],
                    "nsp_label": cpu["nsp_labels"][row, slot],
                }
            )
    return out


def rows_of(
    sequences: Sequence[Mapping[str, Tensor]], seq: int, predictions: int
) -> dict[str, Tensor]:
    """Sequences as one unpacked contract batch of ``len(sequences)`` rows of ``seq`` tokens
    with ``predictions`` masked slots each (the collator's layout for K = 1)."""
    rows = len(sequences)
    batch = {
        "input_ids": torch.zeros(rows, seq, dtype=torch.long),
        "segment_ids": torch.zeros(rows, seq, dtype=torch.long),
        "position_ids": torch.zeros(rows, seq, dtype=torch.long),
        "sequence_ids": torch.zeros(rows, seq, dtype=torch.long),
        "masked_lm_positions": torch.zeros(rows, predictions, dtype=torch.long),
        "masked_lm_ids": torch.zeros(rows, predictions, dtype=torch.long),
        "masked_lm_weights": torch.zeros(rows, predictions, dtype=torch.float32),
        "nsp_positions": torch.zeros(rows, 1, dtype=torch.long),
        "nsp_labels": torch.zeros(rows, 1, dtype=torch.long),
        "nsp_weights": torch.ones(rows, 1, dtype=torch.float32),
    }
    for i, item in enumerate(sequences):
        length, masked = item["input_ids"].numel(), item["masked_lm_ids"].numel()
        if length > seq or masked > predictions:
            raise ValueError(
                f"a sequence of {length} tokens with {masked} masked positions does not fit a "
                f"row of {seq} tokens with {predictions} masked slots"
            )
        batch["input_ids"][i, :length] = item["input_ids"]
        batch["segment_ids"][i, :length] = item["segment_ids"]
        batch["position_ids"][i, :length] = torch.arange(length)
        batch["sequence_ids"][i, :length] = 1
        batch["masked_lm_positions"][i, :masked] = item["masked_lm_positions"]
        batch["masked_lm_ids"][i, :masked] = item["masked_lm_ids"]
        batch["masked_lm_weights"][i, :masked] = 1.0
        batch["nsp_labels"][i, 0] = item["nsp_label"]
    return batch


def unpack_batches(
    batches: Sequence[Mapping[str, Tensor]],
    rows: int,
    seq: int,
    predictions: int,
    device: torch.device,
) -> tuple[list[dict[str, Tensor]], int]:
    """The sequences of ``batches`` as unpacked batches of ``rows`` rows (``seq`` tokens,
    ``predictions`` masked slots) on ``device``, and how many sequences were left over (fewer
    than ``rows``: a fixed batch shape cannot take them)."""
    sequences = [s for batch in batches for s in split_sequences(batch)]
    whole = len(sequences) // rows
    if whole == 0:
        raise ValueError(f"{len(sequences)} sequences do not fill one batch of {rows} rows")
    out = [
        {
            k: v.to(device)
            for k, v in rows_of(sequences[i * rows : (i + 1) * rows], seq, predictions).items()
        }
        for i in range(whole)
    ]
    return out, len(sequences) - whole * rows


# ----------------------------------------------------------------------------- the peer


def mlm_labels(batch: Mapping[str, Tensor]) -> Tensor:
    """``[B,S]`` masked-LM labels: the masked ids at the weighted masked positions, -100 (what
    Hugging Face's losses ignore) elsewhere."""
    labels = torch.full_like(batch["input_ids"], -100)
    weights = batch["masked_lm_weights"] > 0
    rows = torch.arange(labels.shape[0], device=labels.device).unsqueeze(1)
    rows = rows.expand_as(batch["masked_lm_positions"])
    labels[rows[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    return labels


def hf_bert_inputs(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Unpacked rows as ``BertForPreTraining``'s inputs (the first NSP label of each row)."""
    return {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["segment_ids"],
        "position_ids": batch["position_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "labels": mlm_labels(batch),
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def hf_modern_inputs(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Unpacked rows as ``ModernBertForMaskedLM``'s inputs (no token types, no NSP head)."""
    return {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "labels": mlm_labels(batch),
    }


class HFStep(nn.Module):
    """Hugging Face's model behind omnibert's step interface: ``forward(batch)["loss"]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {"loss": self.model(**batch).loss}


def on_device(build: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    """``build()`` with its tensors created on ``device`` (initialising BERT-large on the host
    takes seconds per model), or on the host and moved where that fails."""
    if device.type != "cpu":
        try:
            with device:
                return build()
        except Exception as err:  # any failure: the host path below
            print(f"  (built on the host: on {device} it failed: {err!r:.200})", flush=True)
    return build().to(device)


def hf_bert(model: nn.Module) -> nn.Module:
    """HF ``BertForPreTraining`` (SDPA) with ``model``'s weights (the real vocab rows), on
    ``model``'s device."""
    import transformers

    config = model.config  # type: ignore[attr-defined]
    hf_config = transformers.BertConfig(**config.to_hf_dict(), attn_implementation="sdpa")
    device = next(model.parameters()).device
    theirs = on_device(lambda: transformers.BertForPreTraining(hf_config), device)
    vocab = config.vocab_size
    state = {
        k: (v[:vocab] if v.shape[0] == config.padded_vocab_size else v)
        for k, v in model.state_dict().items()
    }
    theirs.load_state_dict(state, strict=True)
    return theirs


def hf_modernbert(model: nn.Module) -> nn.Module:
    """HF ``ModernBertForMaskedLM`` (SDPA, ``sparse_prediction``: the head and decoder see the
    masked positions only, as omnibert's) with ``model``'s weights, on ``model``'s device."""
    import transformers

    from omnibert.convert.modernbert import modernbert_export_dict, modernbert_tensors

    config = model.config  # type: ignore[attr-defined]
    fields = modernbert_export_dict(config, None)
    fields.pop("architectures", None)
    fields.pop("model_type", None)
    hf_config = transformers.ModernBertConfig(
        **fields, sparse_prediction=True, attn_implementation="sdpa"
    )
    device = next(model.parameters()).device
    theirs = on_device(lambda: transformers.ModernBertForMaskedLM(hf_config), device)
    tensors = modernbert_tensors(model.state_dict(), config)
    missing, unexpected = theirs.load_state_dict(tensors, strict=False)
    tied = {"decoder.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"ModernBERT peer: missing {missing}, unexpected {unexpected}")
    return theirs


# ----------------------------------------------------------------------------- work


def _encoder_macs(
    config: Any, tokens: int, pairs: int, queries_last: int | None, pairs_last: int | None
) -> int:
    """Encoder multiply-accumulates of one forward: ``tokens`` rows through every layer,
    ``pairs`` query-key pairs of attention per layer; the last layer, where the heads read
    ``queries_last`` rows only (``None``: every row), runs keys and values for all rows and
    the rest for those."""
    h, layers = config.hidden_size, config.num_hidden_layers
    gated = getattr(config, "feed_forward", "mlp") != "mlp"
    ffn = h * config.intermediate_size * (3 if gated else 2)
    full = tokens * (4 * h * h + ffn) + 2 * pairs * h
    if queries_last is None or pairs_last is None:
        return layers * full
    last = tokens * 2 * h * h + queries_last * (2 * h * h + ffn) + 2 * pairs_last * h
    return (layers - 1) * full + last


def _lengths_at(ids: Tensor, positions: Tensor) -> Tensor:
    """``[B,Q]``: the length of the sequence each of ``positions`` lies in (0 on padding)."""
    k = int(ids.max())
    lengths = torch.stack([(ids == j).sum(dim=1) for j in range(k + 1)], dim=1)
    lengths[:, 0] = 0
    return lengths.gather(1, ids.gather(1, positions))


def work(
    batches: Sequence[Mapping[str, Tensor]], config: Any, side: str, attention: str
) -> dict[str, Any]:
    """What ``side`` executes for ``batches`` (contract batches):

    * ``omnibert``: every masked slot scored; the last layer for the rows the heads read (the
      masked slots and the [CLS] slots); with ``attention`` ``varlen`` only the real tokens
      through the encoder and attention within each sequence, else every row position and
      attention over the whole row;
    * ``hf`` (``BertForPreTraining``): every position scored, every row through every layer;
    * ``hf-modern`` (``ModernBertForMaskedLM``, sparse prediction): the masked tokens scored,
      every row through every layer, no next-sentence head.

    FLOPs count the matrix products (2 per multiply-accumulate) of forward and backward (twice
    the forward); local attention windows are not discounted."""
    h = config.hidden_size
    # omnibert's decoder has the vocab padded to a multiple of 8; Hugging Face's the real rows
    vocab = config.padded_vocab_size if side == "omnibert" else config.vocab_size
    nsp = bool(getattr(config, "next_sentence_head", True)) and side != "hf-modern"
    varlen = side == "omnibert" and attention == "varlen"
    rows = tokens = pairs = scored = queries = pairs_last = nsp_rows = 0
    for b in batches:
        ids = b["sequence_ids"].to("cpu")
        n, s = ids.shape
        p, k = b["masked_lm_positions"].shape[1], b["nsp_positions"].shape[1]
        rows += n
        if varlen:
            per_sequence = torch.stack([(ids == j + 1).sum(dim=1) for j in range(k)], dim=1)
            tokens += int((ids > 0).sum())
            pairs += int((per_sequence**2).sum())
        else:
            tokens += n * s
            pairs += n * s * s
        if side == "omnibert":
            read = torch.cat([b["masked_lm_positions"], b["nsp_positions"][:, : k * nsp]], 1)
            queries += n * (p + k * nsp)
            pairs_last += (
                int(_lengths_at(ids, read.to("cpu")).sum()) if varlen else n * (p + k * nsp) * s
            )
            scored += n * p
            nsp_rows += n * k * nsp
        else:
            scored += n * s if side == "hf" else int((b["masked_lm_weights"] > 0).sum())
            nsp_rows += n * nsp
    pruned = side == "omnibert"
    macs = _encoder_macs(config, tokens, pairs, queries if pruned else None,
                         pairs_last if pruned else None)  # fmt: skip
    macs += scored * (h * h + h * vocab)  # MLM transform and decoder at the scored positions
    macs += nsp_rows * (h * h + 2 * h)  # pooler and next-sentence classifier
    return {
        "rows": rows,
        "token_rows_through_encoder": tokens,
        "mlm_positions_scored": scored,
        "flops_executed": float(3 * 2 * macs),
    }


def histogram_mean_length(path: str | Path | None) -> float | None:
    """Mean sequence length (tokens) of a length histogram file (``counts[i]`` = sequences of
    ``i + 1`` tokens), or ``None`` without one."""
    if not path:
        return None
    counts = json.loads(Path(path).read_text()).get("counts") or []
    total = sum(counts)
    return sum((i + 1) * c for i, c in enumerate(counts)) / total if total else None
