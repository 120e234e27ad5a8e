"""SQuAD features: each question over its context as windows of model inputs and labels.

**Features** (Google's ``run_squad.py`` parameters: ``max_seq_length`` 384, ``doc_stride``
128, ``max_query_length`` 64). The question's word pieces are cut to ``max_query_length``;
the context is tokenised once, with character offsets into the *original* context (the fast
tokenizer's alignment, so accents, non-breaking spaces and odd whitespace stay as written),
and cut into windows of ``max_seq_length - len(question) - 3`` tokens whose starts are
``doc_stride`` tokens apart (Google's meaning of the stride: the step between windows, not
HF's overlap). Each window is ``[CLS] question [SEP] window [SEP]`` padded to
``max_seq_length``. A token that sits in several windows is scored only in the one where it
has the most context on both sides (Google's ``_check_is_max_context``).

**Training labels**: the answer's first and last token (the tokens its character span
touches). A window that does not hold the whole answer is labelled ``(0, 0)``, the [CLS]
token (Hugging Face's behaviour), never dropped: every window teaches the model something
about where answers are not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from omnibert.finetune.squad_examples import SquadExample
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["SquadFeatures", "is_max_context", "squad_features", "windows"]


@dataclass
class SquadFeatures:
    """Windows of all examples: model inputs ``[N,S]``, labels ``[N]`` (training), and per
    window the example it belongs to, each token's character span in the context (``None``
    outside the context) and whether the window is that token's max-context one."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    attention_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)
    max_context: list[list[bool]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.example_index)

    def tensors(self, training: bool) -> dict[str, Any]:
        # lazy: omnibert.finetune is numpy-only until tensors are handed out (its docstring)
        import torch

        out = {
            "input_ids": torch.from_numpy(self.input_ids),
            "segment_ids": torch.from_numpy(self.segment_ids),
            "attention_mask": torch.from_numpy(self.attention_mask),
        }
        if training:
            out["start_positions"] = torch.from_numpy(self.start_positions)
            out["end_positions"] = torch.from_numpy(self.end_positions)
        return out


def windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each window over ``num_tokens`` tokens (Google's loop)."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, window)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    return spans or [(0, 0)]


def is_max_context(spans: Sequence[tuple[int, int]], current: int, position: int) -> bool:
    """Whether window ``current`` gives token ``position`` its most context: the largest
    min(left, right) context plus 0.01 × the window's length (Google's tie-break)."""
    best_score, best = -1.0, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if score > best_score:
            best_score, best = score, index
    return best == current


def _answer_tokens(
    offsets: Sequence[tuple[int, int]], char_start: int, char_end: int
) -> tuple[int, int]:
    """First and last context token that the character span ``[char_start, char_end)``
    touches."""
    first = next(i for i, (_, end) in enumerate(offsets) if end > char_start)
    last = max(i for i, (start, _) in enumerate(offsets) if start < char_end)
    return first, max(first, last)


def squad_features(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> SquadFeatures:
    """The windows of ``examples`` (module docstring); labels when ``training``."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pad_id = tokenizer.token_to_id("[PAD]")
    contexts = sorted({ex.context for ex in examples})
    context_enc = dict(
        zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False), strict=True)
    )
    questions = tokenizer.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    rows: list[list[int]] = []
    segments: list[list[int]] = []
    starts: list[int] = []
    ends: list[int] = []
    owner: list[int] = []
    lengths: list[int] = []
    all_offsets: list[list[tuple[int, int] | None]] = []
    all_max: list[list[bool]] = []
    for index, (example, question) in enumerate(zip(examples, questions, strict=True)):
        query = question.ids[:max_query_length]
        doc = context_enc[example.context]
        doc_ids, doc_offsets = doc.ids, doc.offsets
        room = max_seq_length - len(query) - 3
        if room < 1:
            raise FineTuneInputError(
                f"task.max_seq_length={max_seq_length} leaves no room for the context after a "
                f"{len(query)}-token question; raise it or lower task.max_query_length."
            )
        answer = None
        if training and example.answers and doc_ids:
            text, char_start = example.answers[0]
            answer = _answer_tokens(doc_offsets, char_start, char_start + len(text))
        spans = windows(len(doc_ids), room, doc_stride)
        for span_index, (start, length) in enumerate(spans):
            head = [cls_id, *query, sep_id]
            ids = [*head, *doc_ids[start : start + length], sep_id]
            offsets: list[tuple[int, int] | None] = [None] * len(head)
            offsets += [tuple(o) for o in doc_offsets[start : start + length]]
            offsets.append(None)
            best = [False] * len(head)
            best += [is_max_context(spans, span_index, start + i) for i in range(length)]
            best.append(False)
            label = (0, 0)
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                label = (answer[0] - start + len(head), answer[1] - start + len(head))
            pad = max_seq_length - len(ids)
            lengths.append(len(ids))
            rows.append(ids + [pad_id] * pad)
            segments.append([0] * len(head) + [1] * (length + 1) + [0] * pad)
            starts.append(label[0])
            ends.append(label[1])
            owner.append(index)
            all_offsets.append(offsets + [None] * pad)
            all_max.append(best + [False] * pad)
    input_ids = np.asarray(rows, dtype=np.int64)
    return SquadFeatures(
        input_ids=input_ids,
        segment_ids=np.asarray(segments, dtype=np.int64),
        attention_mask=(
            np.arange(max_seq_length)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]
        ).astype(np.int64),
        start_positions=np.asarray(starts, dtype=np.int64),
        end_positions=np.asarray(ends, dtype=np.int64),
        example_index=np.asarray(owner, dtype=np.int64),
        offsets=all_offsets,
        max_context=all_max,
    )
