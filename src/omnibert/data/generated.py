"""Synthetic pretraining rows (``data=generated``): no files, same batches as real data.

Each row is drawn from counter-based random numbers keyed by (seed, split, index), so row i
is the same in every run, batch, worker and rank, and the resumable sampler makes a generated run
resume exactly like a real one. Rows look like ``create_pretraining_data.py`` output: mostly
full-length (10% shorter, as ``short_seq_prob``), ``[CLS] A [SEP] B [SEP]`` with segment ids,
15% of the tokens (``masked_lm_prob``; at most ``max_predictions_per_seq``) masked at sorted
positions that are never special tokens (80% ``[MASK]``, 10% random, 10% kept), random
next-sentence labels. With ``next_sentence=False`` a row is one segment, ``[CLS] A [SEP]``
(segment 0, label 0), as ``omnibert-prepare next_sentence=false`` writes for an MLM-only model.

Special ids follow Google's uncased BERT vocab (``[PAD]`` 0, ``[CLS]`` 101, ``[SEP]`` 102,
``[MASK]`` 103, words from 104) when ``vocab_size`` > 1000, else ids 0-4 as
``omnibert-prepare``'s trained vocabs number them (words from 5).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import torch

from omnibert.data.rows import RowBlock, flatten_packs
from omnibert.data.sources import DataConfigError, RowSource, RowSpec

__all__ = ["GeneratedRows", "GeneratedSource"]

MIN_SEQ_LENGTH = 5  # [CLS] a [SEP] b [SEP]
FloatArray = npt.NDArray[np.float64]


def _mix(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """SplitMix64's finalizer: a bijective 64-bit hash (wrapping uint64 arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


class GeneratedRows(torch.utils.data.Dataset[dict[str, Any]]):
    """``num_samples`` synthetic unpadded rows; row i depends only on (seed, split, i).

    Random numbers are counter-based (a SplitMix64 hash of the row key and the draw's
    number), so a whole batch is generated with array operations and any row comes out the
    same whatever batch, worker or rank asks for it.
    """

    def __init__(
        self,
        num_samples: int,
        *,
        vocab_size: int,
        max_seq_length: int,
        max_predictions_per_seq: int,
        seed: int,
        split: int = 0,
        length_histogram: Sequence[int] | None = None,
        masked_lm_prob: float = 0.15,
        next_sentence: bool = True,
    ) -> None:
        self.num_samples = num_samples
        self._length_cdf: FloatArray | None = None
        if length_histogram is not None:
            counts = np.asarray(length_histogram, dtype=np.float64)[:max_seq_length]
            counts[: MIN_SEQ_LENGTH - 1] = 0.0  # [CLS] a [SEP] b [SEP] needs 5 tokens
            if counts.sum() <= 0:
                raise ValueError(
                    f"length_histogram has no sequences of {MIN_SEQ_LENGTH}..{max_seq_length} "
                    "tokens."
                )
            self._length_cdf = np.cumsum(counts) / counts.sum()
        self.vocab_size = vocab_size
        self.max_seq_length = max_seq_length
        self.max_predictions_per_seq = max_predictions_per_seq
        self.seed = seed
        self.split = split
        self.masked_lm_prob = float(masked_lm_prob)
        self.next_sentence = bool(next_sentence)
        bert = vocab_size > 1000
        self.cls_id, self.sep_id, self.mask_id = (101, 102, 103) if bert else (2, 3, 4)
        self.first_word = 104 if bert else 5

    def __len__(self) -> int:
        return self.num_samples

    def _uniform(self, keys: npt.NDArray[np.uint64], stream: int, width: int) -> FloatArray:
        """[rows, width] uniforms in [0, 1) for draw ``stream`` of each row key."""
        counter = np.arange(width, dtype=np.uint64) + np.uint64((stream + 1) << 32)
        bits = _mix(keys[:, None] + counter[None, :] * np.uint64(0x9E3779B97F4A7C15))
        return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53

    def _keys(self, idx: npt.NDArray[np.int64]) -> npt.NDArray[np.uint64]:
        base = _mix(np.array([self.seed & (2**64 - 1)], dtype=np.uint64) + np.uint64(self.split))
        return _mix(base + idx.astype(np.uint64) * np.uint64(0xD1B54A32D192ED03))

    def _sizes(
        self, keys: npt.NDArray[np.uint64]
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Tokens and masked positions of the rows with these keys."""
        s, p = self.max_seq_length, self.max_predictions_per_seq
        short = self._uniform(keys, 0, 2)
        if self._length_cdf is not None:  # drawn from the histogram (inverse CDF)
            length = 1 + np.searchsorted(self._length_cdf, short[:, 1], side="right")
            length = np.minimum(length, s).astype(np.int64)
        else:  # full, or uniform in [MIN_SEQ_LENGTH, s] for 10% of the rows
            span = np.floor(short[:, 1] * (s - MIN_SEQ_LENGTH + 1)).astype(np.int64)
            length = np.where(short[:, 0] < 0.1, MIN_SEQ_LENGTH + span, s)
        count = np.rint(length * self.masked_lm_prob).astype(np.int64)
        count = np.minimum(np.maximum(1, count), p)
        return length, count

    def row_lengths(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Tokens and masked positions of every row (what packing needs), in row order."""
        parts = [
            self._sizes(self._keys(np.arange(a, min(a + 65536, self.num_samples))))
            for a in range(0, self.num_samples, 65536)
        ]
        return np.concatenate([t for t, _ in parts]), np.concatenate([m for _, m in parts])

    def __getitems__(self, indices: Sequence[Any]) -> RowBlock:
        idx, pack_sizes = flatten_packs(indices)
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_samples):
            raise IndexError(f"rows {indices} reach outside [0, {self.num_samples})")
        n, s, p = idx.size, self.max_seq_length, self.max_predictions_per_seq
        keys = self._keys(idx)
        col = np.arange(s)[None, :]
        length, count = self._sizes(keys)
        len_a = 1 + np.floor(self._uniform(keys, 1, 1)[:, 0] * (length - 4)).astype(np.int64)
        words = self.vocab_size - self.first_word
        tokens = self.first_word + np.floor(self._uniform(keys, 2, s) * words).astype(np.int64)
        last = length - 1
        # one segment without sentence pairs: the first [SEP] is the last one
        sep_a = len_a + 1 if self.next_sentence else last
        tokens[:, 0] = self.cls_id
        tokens[np.arange(n), sep_a] = self.sep_id
        tokens[np.arange(n), last] = self.sep_id
        segment_ids = (col > sep_a[:, None]).astype(np.int64)
        # masks: the `count` maskable positions with the smallest random keys, then sorted
        maskable = (col > 0) & (col < last[:, None]) & (col != sep_a[:, None])
        order = np.argsort(np.where(maskable, self._uniform(keys, 3, s), 2.0), axis=1)
        chosen = np.zeros((n, s), dtype=bool)
        k = min(p, s)
        np.put_along_axis(chosen, order[:, :k], np.arange(k)[None, :] < count[:, None], axis=1)
        how = self._uniform(keys, 4, s)
        swap = self.first_word + np.floor(self._uniform(keys, 5, s) * words).astype(np.int64)
        input_ids = np.where(chosen & (how < 0.8), self.mask_id, tokens)
        input_ids = np.where(chosen & (how >= 0.8) & (how < 0.9), swap, input_ids)
        real = col < length[:, None]
        label = (self._uniform(keys, 6, 1)[:, 0] < 0.5).astype(np.int8)
        if not self.next_sentence:
            label[:] = 0

        def ragged(values: npt.NDArray[Any], lengths: npt.NDArray[np.int64]) -> pa.Array:
            offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
            return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))

        table = pa.table(
            {
                "input_ids": ragged(input_ids[real], length),
                "segment_ids": ragged(segment_ids[real], length),
                "masked_lm_positions": ragged(np.nonzero(chosen)[1], count),
                "masked_lm_ids": ragged(tokens[chosen], count),
                "next_sentence_label": pa.array(label),
            }
        )
        return RowBlock(idx, table, pack_sizes)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row: dict[str, Any] = self.__getitems__([index]).table.to_pylist()[0]
        return row


class GeneratedSource(RowSource):
    """Deterministic synthetic rows with the real data's shapes and dtypes (profiling,
    compile-only runs, tests): a row source of
    :class:`~omnibert.data.datamodule.PretrainingDataModule`.

    Args:
        vocab_size: token ids are drawn below this (the model's vocab size when
            ``model.config.vocab_size`` is null).
        num_train_samples: training rows (all devices together).
        num_eval_samples: rows per validation run (0: no validation).
        length_histogram: ``None`` (like the reference generator: mostly full rows, 10%
            shorter) or a JSON file with a length histogram (``counts``, or an
            omnibert-prepare ``metadata.json``): rows then have that distribution.
        eval_samples: evaluate only the first N of the eval rows (as the file sources'
            ``data.eval_samples``); ``None``: all ``num_eval_samples``.
        masked_lm_prob: the share of a row's tokens masked (at most
            ``phase.max_predictions_per_seq``; at least one).
        next_sentence: sentence pairs with random next-sentence labels (BERT), or one
            segment per row with label 0 (``False``: for an MLM-only model).
    """

    format = "generated"

    def __init__(
        self,
        vocab_size: int = 30522,
        num_train_samples: int = 65536,
        num_eval_samples: int = 1024,
        length_histogram: str | None = None,
        eval_samples: int | None = None,
        masked_lm_prob: float = 0.15,
        next_sentence: bool = True,
    ) -> None:
        if not 0.0 < masked_lm_prob < 1.0:
            raise DataConfigError(
                f"data.masked_lm_prob={masked_lm_prob} must be between 0 and 1 (0.15: BERT, "
                "0.3: MosaicBERT and ModernBERT); fix data.masked_lm_prob."
            )
        if eval_samples is not None and eval_samples > num_eval_samples:
            raise DataConfigError(
                f"data.eval_samples={eval_samples} but data.num_eval_samples={num_eval_samples} "
                "generated eval rows; lower data.eval_samples or set it to null."
            )
        if eval_samples is not None:
            num_eval_samples = eval_samples
        self._vocab_size = vocab_size
        self._num_train_samples = num_train_samples
        self._num_eval_samples = num_eval_samples
        self.length_histogram = length_histogram
        self._masked_lm_prob = float(masked_lm_prob)
        self.next_sentence_rows = bool(next_sentence)
        self._spec: RowSpec | None = None
        self._lengths: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None

    def check(self, spec: RowSpec, train: bool = True) -> None:
        """Validate the settings; raises :class:`DataConfigError` naming the key."""
        if spec.max_seq_length is None or spec.max_predictions_per_seq is None:
            raise DataConfigError(
                "generated rows have no recorded shape; set phase.max_seq_length and "
                "phase.max_predictions_per_seq."
            )
        self._spec = spec
        self._histogram()
        for key, value, low in (
            ("data.vocab_size", self._vocab_size, 16),
            ("phase.max_seq_length", spec.max_seq_length, MIN_SEQ_LENGTH),
            ("phase.max_predictions_per_seq", spec.max_predictions_per_seq, 1),
            ("phase.max_seq_length", spec.max_seq_length, spec.max_predictions_per_seq),
            ("data.num_train_samples", self._num_train_samples, 1),
            ("data.num_eval_samples", self._num_eval_samples, 0),
        ):
            if value < low:
                raise DataConfigError(f"{key}={value} must be at least {low}; fix {key}.")

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def num_train_samples(self) -> int:
        return self._num_train_samples

    @property
    def num_eval_samples(self) -> int:
        return self._num_eval_samples

    @property
    def masked_lm_prob(self) -> float:
        return self._masked_lm_prob

    @property
    def next_sentence(self) -> bool:
        return self.next_sentence_rows

    def describe(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "train_samples": self._num_train_samples,
            "eval_samples": self._num_eval_samples,
            "vocab_size": self._vocab_size,
            "length_histogram": self.length_histogram,
            "masked_lm_prob": self._masked_lm_prob,
            "next_sentence": self.next_sentence_rows,
        }

    def _histogram(self) -> list[int] | None:
        """``data.length_histogram``: a JSON file with ``counts`` (counts[i] = sequences of
        i+1 tokens, as ../shared/data/wikipedia_seqlen_histogram_512.json) or an
        omnibert-prepare metadata.json (its ``sequence_length_histogram``)."""
        path = self.length_histogram
        if path is None:
            return None
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
            counts = data.get("counts", data.get("sequence_length_histogram"))
            if isinstance(counts, str):
                counts = json.loads(counts)
            histogram = [int(c) for c in counts]
        except (OSError, ValueError, TypeError, AttributeError) as err:
            raise DataConfigError(
                f"data.length_histogram={path} is not a readable JSON file with a 'counts' or "
                f"'sequence_length_histogram' list ({type(err).__name__}); fix the path or set "
                "it to null."
            ) from err
        assert self._spec is not None
        if sum(histogram[MIN_SEQ_LENGTH - 1 : self._spec.max_seq_length]) <= 0:
            raise DataConfigError(
                f"data.length_histogram={path} has no sequences of {MIN_SEQ_LENGTH}.."
                f"{self._spec.max_seq_length} tokens; use a histogram for this sequence length."
            )
        return histogram

    def row_lengths(self) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Tokens and masked positions of every training row."""
        if self._lengths is None:
            self._lengths = self.rows("train").row_lengths()
        return self._lengths

    def rows(self, split: str = "train") -> GeneratedRows:
        """The synthetic dataset of ``split`` ("train" or "eval")."""
        spec = self._spec
        assert spec is not None and spec.max_seq_length and spec.max_predictions_per_seq, "check()"
        return GeneratedRows(
            self._num_train_samples if split == "train" else self._num_eval_samples,
            vocab_size=self._vocab_size,
            max_seq_length=spec.max_seq_length,
            max_predictions_per_seq=spec.max_predictions_per_seq,
            seed=spec.seed,
            split=0 if split == "train" else 1,
            length_histogram=self._histogram(),
            masked_lm_prob=self._masked_lm_prob,
            next_sentence=self.next_sentence_rows,
        )
