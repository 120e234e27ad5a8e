"""Compiled core of instance creation: the reference's algorithm on flat integer arrays.

This is Google's ``create_training_instances`` for one input file, rewritten on token ids
with the generator of :mod:`omnibert.prepare.python_random`, making the reference's random
calls in the reference's order:

1. ``shuffle(all_documents)``;
2. ``dupe_factor`` passes over the shuffled documents; for each document
   ``random() < short_seq_prob`` → ``randint(2, max_num_tokens)``; per chunk
   ``randint(1, len(chunk) - 1)`` (chunks of ≥ 2 segments), ``random() < 0.5`` (only when the
   chunk has ≥ 2 segments), the random document ``randint(0, n_docs - 1)`` (up to 10 tries
   until it differs) and its start segment ``randint(0, n_segments - 1)``; one ``random()``
   per token removed by ``truncate_seq_pair``; then the masking: ``shuffle(cand_indexes)``,
   per masked token ``random() < 0.8`` → ``[MASK]``, else ``random() < 0.5`` → keep, else a
   random vocab word ``randint(0, len(vocab_words) - 1)``;
3. ``shuffle(instances)``.

Inputs are a file's tokens as ``tokens`` (all segments concatenated), ``seg_offsets``
(segment ``s`` is ``tokens[seg_offsets[s]:seg_offsets[s + 1]]``) and ``doc_offsets``
(document ``d`` is segments ``doc_offsets[d]:doc_offsets[d + 1]``, none empty).  Outputs are
flat arrays with offsets, in creation order, plus the permutation of the final shuffle.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from omnibert.prepare.python_random import randbelow, randint, random_float, shuffle_inplace


@njit(cache=True)
def _grow(buffer: np.ndarray, needed: int) -> np.ndarray:
    if needed <= buffer.shape[0]:
        return buffer
    size = buffer.shape[0] * 2
    while size < needed:
        size *= 2
    bigger = np.empty(size, dtype=buffer.dtype)
    bigger[: buffer.shape[0]] = buffer
    return bigger


@njit(cache=True)
def _append_segments(
    tokens: np.ndarray,
    seg_offsets: np.ndarray,
    first_seg: int,
    end_seg: int,
    out: np.ndarray,
    length: int,
) -> int:
    for s in range(first_seg, end_seg):
        start = seg_offsets[s]
        stop = seg_offsets[s + 1]
        out[length : length + stop - start] = tokens[start:stop]
        length += stop - start
    return length


@njit(cache=True)
def _mask_instance(
    state: np.ndarray,
    ids: np.ndarray,
    n: int,
    len_a: int,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    do_whole_word_mask: bool,
    is_subword: np.ndarray,
    word_ids: np.ndarray,
    mask_id: int,
    positions: np.ndarray,
    labels: np.ndarray,
    cand: np.ndarray,
    group_starts: np.ndarray,
    order: np.ndarray,
) -> int:
    """Mask ``ids[:n]`` in place; write sorted positions/labels; return their count."""
    sep_a = len_a + 1
    # Candidate groups: every position except [CLS] (0) and the two [SEP]s, grouped by whole
    # word when asked (a ``##`` piece joins the previous group, even across the [SEP]).
    n_cand = 0
    n_groups = 0
    for i in range(1, n - 1):
        if i == sep_a:
            continue
        cand[n_cand] = i
        if not (do_whole_word_mask and n_groups >= 1 and is_subword[ids[i]]):
            group_starts[n_groups] = n_cand
            n_groups += 1
        n_cand += 1
    group_starts[n_groups] = n_cand
    for g in range(n_groups):
        order[g] = g
    shuffle_inplace(state, order[:n_groups])

    num_to_predict = int(np.rint(n * masked_lm_prob))
    num_to_predict = min(max_predictions_per_seq, max(1, num_to_predict))

    count = 0
    for k in range(n_groups):
        if count >= num_to_predict:
            break
        g = order[k]
        first = group_starts[g]
        size = group_starts[g + 1] - first
        if count + size > num_to_predict:
            continue
        for c in range(first, first + size):
            index = cand[c]
            original = ids[index]
            if random_float(state) < 0.8:
                ids[index] = mask_id
            elif random_float(state) < 0.5:
                pass
            else:
                ids[index] = word_ids[randbelow(state, word_ids.shape[0])]
            # insertion keeps positions sorted (the reference sorts by index at the end)
            j = count
            while j > 0 and positions[j - 1] > index:
                positions[j] = positions[j - 1]
                labels[j] = labels[j - 1]
                j -= 1
            positions[j] = index
            labels[j] = original
            count += 1
    return count


@njit(cache=True)
def create_instances_kernel(
    state: np.ndarray,
    tokens: np.ndarray,
    seg_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    dupe_factor: int,
    do_whole_word_mask: bool,
    word_ids: np.ndarray,
    is_subword: np.ndarray,
    cls_id: int,
    sep_id: int,
    mask_id: int,
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
]:
    n_docs = doc_offsets.shape[0] - 1
    max_num_tokens = max_seq_length - 3
    max_seg = 0
    for s in range(seg_offsets.shape[0] - 1):
        max_seg = max(max_seg, seg_offsets[s + 1] - seg_offsets[s])
    scratch = max_num_tokens + max_seg + 1
    buf_a = np.empty(scratch, dtype=tokens.dtype)
    buf_b = np.empty(scratch, dtype=tokens.dtype)
    ids = np.empty(max_seq_length, dtype=tokens.dtype)
    positions = np.empty(max_predictions_per_seq + 1, dtype=np.int64)
    labels = np.empty(max_predictions_per_seq + 1, dtype=tokens.dtype)
    cand = np.empty(max_seq_length, dtype=np.int64)
    group_starts = np.empty(max_seq_length + 1, dtype=np.int64)
    order = np.empty(max_seq_length, dtype=np.int64)

    docs = np.arange(n_docs)
    shuffle_inplace(state, docs)

    capacity = 1024
    out_ids = np.empty(capacity * max_seq_length, dtype=tokens.dtype)
    out_offsets = np.zeros(capacity + 1, dtype=np.int64)
    out_len_a = np.empty(capacity, dtype=np.int32)
    out_random_next = np.empty(capacity, dtype=np.int8)
    out_positions = np.empty(capacity * max_predictions_per_seq, dtype=np.int32)
    out_labels = np.empty(capacity * max_predictions_per_seq, dtype=tokens.dtype)
    out_mlm_offsets = np.zeros(capacity + 1, dtype=np.int64)
    n_inst = 0

    for _dupe in range(dupe_factor):
        for document_index in range(n_docs):
            doc = docs[document_index]
            doc_first = doc_offsets[doc]
            doc_segments = doc_offsets[doc + 1] - doc_first
            target_seq_length = max_num_tokens
            if random_float(state) < short_seq_prob:
                target_seq_length = randint(state, 2, max_num_tokens)
            chunk_first = 0
            chunk_count = 0
            current_length = 0
            i = 0
            while i < doc_segments:
                if chunk_count == 0:
                    chunk_first = i
                chunk_count += 1
                seg = doc_first + i
                current_length += seg_offsets[seg + 1] - seg_offsets[seg]
                if i == doc_segments - 1 or current_length >= target_seq_length:
                    a_end = 1
                    if chunk_count >= 2:
                        a_end = randint(state, 1, chunk_count - 1)
                    base = doc_first + chunk_first
                    len_a = _append_segments(tokens, seg_offsets, base, base + a_end, buf_a, 0)
                    len_b = 0
                    is_random_next = False
                    if chunk_count == 1 or random_float(state) < 0.5:
                        is_random_next = True
                        target_b_length = target_seq_length - len_a
                        random_index = 0
                        for _ in range(10):
                            random_index = randint(state, 0, n_docs - 1)
                            if random_index != document_index:
                                break
                        rdoc = docs[random_index]
                        r_first = doc_offsets[rdoc]
                        r_segments = doc_offsets[rdoc + 1] - r_first
                        random_start = randint(state, 0, r_segments - 1)
                        for j in range(random_start, r_segments):
                            len_b = _append_segments(
                                tokens, seg_offsets, r_first + j, r_first + j + 1, buf_b, len_b
                            )
                            if len_b >= target_b_length:
                                break
                        i -= chunk_count - a_end
                    else:
                        len_b = _append_segments(
                            tokens, seg_offsets, base + a_end, base + chunk_count, buf_b, 0
                        )
                    # truncate_seq_pair: one random() per removed token, front or back.
                    a0 = 0
                    a1 = len_a
                    b0 = 0
                    b1 = len_b
                    while (a1 - a0) + (b1 - b0) > max_num_tokens:
                        if (a1 - a0) > (b1 - b0):
                            if random_float(state) < 0.5:
                                a0 += 1
                            else:
                                a1 -= 1
                        elif random_float(state) < 0.5:
                            b0 += 1
                        else:
                            b1 -= 1
                    len_a = a1 - a0
                    len_b = b1 - b0
                    n = len_a + len_b + 3
                    ids[0] = cls_id
                    ids[1 : 1 + len_a] = buf_a[a0:a1]
                    ids[1 + len_a] = sep_id
                    ids[2 + len_a : 2 + len_a + len_b] = buf_b[b0:b1]
                    ids[n - 1] = sep_id
                    count = _mask_instance(
                        state,
                        ids,
                        n,
                        len_a,
                        masked_lm_prob,
                        max_predictions_per_seq,
                        do_whole_word_mask,
                        is_subword,
                        word_ids,
                        mask_id,
                        positions,
                        labels,
                        cand,
                        group_starts,
                        order,
                    )
                    if n_inst == out_len_a.shape[0]:
                        capacity = 2 * n_inst
                        out_offsets = _grow(out_offsets, capacity + 1)
                        out_len_a = _grow(out_len_a, capacity)
                        out_random_next = _grow(out_random_next, capacity)
                        out_mlm_offsets = _grow(out_mlm_offsets, capacity + 1)
                    start = out_offsets[n_inst]
                    out_ids = _grow(out_ids, start + n)
                    out_ids[start : start + n] = ids[:n]
                    out_offsets[n_inst + 1] = start + n
                    out_len_a[n_inst] = len_a
                    out_random_next[n_inst] = 1 if is_random_next else 0
                    m0 = out_mlm_offsets[n_inst]
                    out_positions = _grow(out_positions, m0 + count)
                    out_labels = _grow(out_labels, m0 + count)
                    out_positions[m0 : m0 + count] = positions[:count]
                    out_labels[m0 : m0 + count] = labels[:count]
                    out_mlm_offsets[n_inst + 1] = m0 + count
                    n_inst += 1
                    chunk_count = 0
                    current_length = 0
                i += 1

    final_order = np.arange(n_inst)
    shuffle_inplace(state, final_order)
    n_tokens = out_offsets[n_inst]
    n_masked = out_mlm_offsets[n_inst]
    return (
        out_ids[:n_tokens].copy(),
        out_offsets[: n_inst + 1].copy(),
        out_len_a[:n_inst].copy(),
        out_random_next[:n_inst].copy(),
        out_positions[:n_masked].copy(),
        out_labels[:n_masked].copy(),
        out_mlm_offsets[: n_inst + 1].copy(),
        final_order,
    )


@njit(cache=True)
def create_single_segment_kernel(
    state: np.ndarray,
    tokens: np.ndarray,
    seg_offsets: np.ndarray,
    doc_offsets: np.ndarray,
    max_seq_length: int,
    short_seq_prob: float,
    masked_lm_prob: float,
    max_predictions_per_seq: int,
    dupe_factor: int,
    do_whole_word_mask: bool,
    word_ids: np.ndarray,
    is_subword: np.ndarray,
    cls_id: int,
    sep_id: int,
    mask_id: int,
) -> tuple[
    np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray
]:
    """Instances without sentence pairs (``next_sentence=false``): ``[CLS] A [SEP]``, ``A`` a
    contiguous run of one document's tokens (sentence boundaries ignored), as RoBERTa's
    and ModernBERT's MLM-only data.

    The same inputs, outputs and random generator as :func:`create_instances_kernel`:
    ``shuffle(documents)``; ``dupe_factor`` passes; per document ``random() <
    short_seq_prob`` → its chunks hold ``randint(2, max_seq_length - 2)`` tokens, else
    ``max_seq_length - 2``; the document's tokens cut into chunks of that size (the last one
    the remainder), each masked as the reference masks (``len_a`` = the chunk, so no
    ``[SEP]`` in the middle); ``shuffle(instances)``. Labels are 0."""
    n_docs = doc_offsets.shape[0] - 1
    max_num_tokens = max_seq_length - 2
    ids = np.empty(max_seq_length, dtype=tokens.dtype)
    positions = np.empty(max_predictions_per_seq + 1, dtype=np.int64)
    labels = np.empty(max_predictions_per_seq + 1, dtype=tokens.dtype)
    cand = np.empty(max_seq_length, dtype=np.int64)
    group_starts = np.empty(max_seq_length + 1, dtype=np.int64)
    order = np.empty(max_seq_length, dtype=np.int64)

    docs = np.arange(n_docs)
    shuffle_inplace(state, docs)

    capacity = 1024
    out_ids = np.empty(capacity * max_seq_length, dtype=tokens.dtype)
    out_offsets = np.zeros(capacity + 1, dtype=np.int64)
    out_len_a = np.empty(capacity, dtype=np.int32)
    out_labels_nsp = np.zeros(capacity, dtype=np.int8)
    out_positions = np.empty(capacity * max_predictions_per_seq, dtype=np.int32)
    out_labels = np.empty(capacity * max_predictions_per_seq, dtype=tokens.dtype)
    out_mlm_offsets = np.zeros(capacity + 1, dtype=np.int64)
    n_inst = 0

    for _dupe in range(dupe_factor):
        for document_index in range(n_docs):
            doc = docs[document_index]
            first = seg_offsets[doc_offsets[doc]]
            stop = seg_offsets[doc_offsets[doc + 1]]
            chunk = max_num_tokens
            if random_float(state) < short_seq_prob:
                chunk = randint(state, 2, max_num_tokens)
            start = first
            while start < stop:
                len_a = min(chunk, stop - start)
                n = len_a + 2
                ids[0] = cls_id
                ids[1 : 1 + len_a] = tokens[start : start + len_a]
                ids[n - 1] = sep_id
                start += len_a
                count = _mask_instance(
                    state,
                    ids,
                    n,
                    len_a,
                    masked_lm_prob,
                    max_predictions_per_seq,
                    do_whole_word_mask,
                    is_subword,
                    word_ids,
                    mask_id,
                    positions,
                    labels,
                    cand,
                    group_starts,
                    order,
                )
                if n_inst == out_len_a.shape[0]:
                    capacity = 2 * n_inst
                    out_offsets = _grow(out_offsets, capacity + 1)
                    out_len_a = _grow(out_len_a, capacity)
                    out_labels_nsp = _grow(out_labels_nsp, capacity)
                    out_mlm_offsets = _grow(out_mlm_offsets, capacity + 1)
                begin = out_offsets[n_inst]
                out_ids = _grow(out_ids, begin + n)
                out_ids[begin : begin + n] = ids[:n]
                out_offsets[n_inst + 1] = begin + n
                out_len_a[n_inst] = len_a
                out_labels_nsp[n_inst] = 0
                m0 = out_mlm_offsets[n_inst]
                out_positions = _grow(out_positions, m0 + count)
                out_labels = _grow(out_labels, m0 + count)
                out_positions[m0 : m0 + count] = positions[:count]
                out_labels[m0 : m0 + count] = labels[:count]
                out_mlm_offsets[n_inst + 1] = m0 + count
                n_inst += 1

    final_order = np.arange(n_inst)
    shuffle_inplace(state, final_order)
    n_tokens = out_offsets[n_inst]
    n_masked = out_mlm_offsets[n_inst]
    return (
        out_ids[:n_tokens].copy(),
        out_offsets[: n_inst + 1].copy(),
        out_len_a[:n_inst].copy(),
        out_labels_nsp[:n_inst].copy(),
        out_positions[:n_masked].copy(),
        out_labels[:n_masked].copy(),
        out_mlm_offsets[: n_inst + 1].copy(),
        final_order,
    )
