"""Pretraining instances exactly as Google's ``create_pretraining_data.py`` makes them.

One input file + vocab + settings + seed gives the reference's instances in the reference's
order (the reference run on that file alone, as MLPerf runs it on each part file).  Reading
follows TensorFlow's ``GFile.readline`` (lines end at ``\\n``; ``\\r`` bytes are dropped; strict
UTF-8), each line is ``.strip()``-ed, a blank line starts a new document, lines without
tokens are dropped and so are empty documents.  The random part runs in compiled code
(:mod:`omnibert.prepare.instance_kernel`); this module holds the data types and the I/O.

Instances are kept as flat arrays (a file's worth, not Python objects), so memory is
bounded by one file's instances.

``next_sentence=False`` (not in the reference) makes instances without sentence pairs for an
MLM-only model: ``[CLS] A [SEP]`` with ``A`` a contiguous run of one document's tokens filling
the row, segment 0, next-sentence label 0, masked by the same rules
(:func:`~omnibert.prepare.instance_kernel.create_single_segment_kernel`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from omnibert.errors import UserError
from omnibert.prepare.instance_kernel import (
    create_instances_kernel,
    create_single_segment_kernel,
)
from omnibert.prepare.python_random import check_against_stdlib, state_from_seed
from omnibert.tokenization.vocab import Vocab

LINE_BATCH = 4096


class InputFileError(UserError):
    """An input text file that cannot be read, with the file named and the fix."""


@dataclass(frozen=True)
class InstanceSettings:
    """The reference's flags that shape instances (same names, same defaults), and
    ``next_sentence`` (ours: ``False`` for single-segment instances without NSP pairs)."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_whole_word_mask: bool = False
    next_sentence: bool = True

    #: settings added after the format was fixed, with the value that means the earlier
    #: behaviour: recorded (metadata.json, the fingerprint) only when they differ from it,
    #: so the data of every earlier version and of the defaults keeps its identity
    LATER: ClassVar[dict[str, Any]] = {"next_sentence": True}

    def record(self) -> dict[str, Any]:
        """The settings as ``metadata.json`` and the fingerprint record them (``LATER``'s
        keys only where they differ from the earlier behaviour; absent reads as it)."""
        record = dataclasses.asdict(self)
        for key, earlier in self.LATER.items():
            if record[key] == earlier:
                del record[key]
        return record

    @classmethod
    def from_config(cls, cfg: Any) -> InstanceSettings:
        """The settings named by ``omnibert-prepare``'s keys of the same names (a config node
        or any object with those attributes)."""
        return cls(
            **{
                f.name: getattr(cfg, f.name)
                for f in dataclasses.fields(cls)
                if f.name not in cls.LATER or hasattr(cfg, f.name)
            }
        )

    def validate(self) -> None:
        """Raise ``ValueError`` naming the key when the settings cannot work."""
        if self.max_seq_length < 5:
            raise ValueError(
                f"max_seq_length={self.max_seq_length} leaves no room for two segments "
                "([CLS] a [SEP] b [SEP]); use at least 5 (BERT uses 128 and 512)."
            )
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor={self.dupe_factor} must be at least 1.")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob={self.short_seq_prob} must be within [0, 1].")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob={self.masked_lm_prob} must be within (0, 1).")
        if self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq} must be at least 1."
            )
        # The reference masks min(max_predictions, round(len * prob)) tokens; a cap below
        # floor(max_seq_length * prob) silently lowers the masking rate of full sequences
        # (BERT's own recipes sit at or just under the product: 20 at 128, 76 at 512).
        wanted = int(self.max_seq_length * self.masked_lm_prob)
        if self.max_predictions_per_seq < wanted:
            raise ValueError(
                f"max_predictions_per_seq={self.max_predictions_per_seq} is too small for "
                f"masked_lm_prob={self.masked_lm_prob} at max_seq_length={self.max_seq_length} "
                f"(full sequences would get fewer than the {wanted} masks asked for); raise "
                f"max_predictions_per_seq to at least {wanted} (BERT: 20 at 128, 76 at 512)."
            )


@dataclass
class TokenizedDocuments:
    """A file's documents: ``tokens[seg_offsets[s]:seg_offsets[s+1]]`` is segment ``s``;
    document ``d`` is segments ``doc_offsets[d]:doc_offsets[d+1]``."""

    tokens: np.ndarray
    seg_offsets: np.ndarray
    doc_offsets: np.ndarray

    @property
    def num_documents(self) -> int:
        return int(self.doc_offsets.shape[0] - 1)

    @property
    def num_segments(self) -> int:
        return int(self.seg_offsets.shape[0] - 1)

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.shape[0])


@dataclass
class InstanceArrays:
    """A file's instances in the reference's output order, as flat arrays with offsets."""

    input_ids: np.ndarray
    offsets: np.ndarray
    len_a: np.ndarray
    next_sentence_label: np.ndarray
    masked_lm_positions: np.ndarray
    masked_lm_ids: np.ndarray
    mlm_offsets: np.ndarray

    def __len__(self) -> int:
        return int(self.offsets.shape[0] - 1)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def segment_ids(self) -> np.ndarray:
        """Flat segment ids: 0 for ``[CLS] a [SEP]``, 1 for ``b [SEP]``."""
        runs = np.empty(2 * len(self), dtype=np.int64)
        runs[0::2] = self.len_a + 2
        runs[1::2] = self.lengths - runs[0::2]
        values = np.tile(np.array([0, 1], dtype=np.int8), len(self))
        return np.repeat(values, runs)

    def row(self, i: int) -> dict[str, object]:
        """Instance ``i`` as a dict of Python lists (for tests and debugging)."""
        start, stop = int(self.offsets[i]), int(self.offsets[i + 1])
        m0, m1 = int(self.mlm_offsets[i]), int(self.mlm_offsets[i + 1])
        len_a = int(self.len_a[i])
        return {
            "input_ids": self.input_ids[start:stop].tolist(),
            "segment_ids": [0] * (len_a + 2) + [1] * (stop - start - len_a - 2),
            "masked_lm_positions": self.masked_lm_positions[m0:m1].tolist(),
            "masked_lm_ids": self.masked_lm_ids[m0:m1].tolist(),
            "next_sentence_label": int(self.next_sentence_label[i]),
        }


def read_lines(path: str | Path) -> list[str]:
    """A text file's lines with TensorFlow ``GFile.readline`` semantics, each ``.strip()``-ed."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputFileError(f"cannot read input file {str(path)!r}: {err.strerror}.") from err
    data = data.replace(b"\r", b"")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputFileError(
            f"input file {str(path)!r} is not valid UTF-8 (byte {err.start}); "
            "convert it to UTF-8 (e.g. `iconv -t UTF-8`)."
        ) from err
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line.strip() for line in lines]


def tokenize_documents(
    lines: Sequence[str], tokenize_lines: Callable[[list[str]], list[list[int]]]
) -> TokenizedDocuments:
    """Group stripped lines into documents (blank line = boundary) and tokenize them."""
    seg_lengths: list[int] = []
    doc_sizes: list[int] = [0]
    pieces: list[np.ndarray] = []
    for start in range(0, len(lines), LINE_BATCH):
        batch = list(lines[start : start + LINE_BATCH])
        nonempty = [line for line in batch if line]
        encoded = iter(tokenize_lines(nonempty)) if nonempty else iter(())
        for line in batch:
            if not line:
                doc_sizes.append(0)
                continue
            ids = next(encoded)
            if ids:
                pieces.append(np.asarray(ids, dtype=np.int32))
                seg_lengths.append(len(ids))
                doc_sizes[-1] += 1
    sizes = np.asarray([s for s in doc_sizes if s > 0], dtype=np.int64)
    doc_offsets = np.zeros(sizes.shape[0] + 1, dtype=np.int64)
    np.cumsum(sizes, out=doc_offsets[1:])
    seg_offsets = np.zeros(len(seg_lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(seg_lengths, dtype=np.int64), out=seg_offsets[1:])
    tokens = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
    return TokenizedDocuments(tokens=tokens, seg_offsets=seg_offsets, doc_offsets=doc_offsets)


_checked = False


def create_instances(
    documents: TokenizedDocuments, vocab: Vocab, settings: InstanceSettings
) -> InstanceArrays:
    """The reference's ``create_training_instances`` for one file's documents."""
    global _checked
    settings.validate()
    if not _checked:
        check_against_stdlib()
        _checked = True
    empty = np.zeros(0, dtype=np.int32)
    if documents.num_documents == 0:
        zero = np.zeros(1, dtype=np.int64)
        return InstanceArrays(empty, zero, empty, empty.astype(np.int8), empty, empty, zero)
    state = state_from_seed(settings.random_seed)
    kernel = create_instances_kernel if settings.next_sentence else create_single_segment_kernel
    out = kernel(
        state,
        documents.tokens,
        documents.seg_offsets,
        documents.doc_offsets,
        settings.max_seq_length,
        settings.short_seq_prob,
        settings.masked_lm_prob,
        settings.max_predictions_per_seq,
        settings.dupe_factor,
        settings.do_whole_word_mask,
        vocab.word_ids,
        vocab.is_subword,
        vocab.cls_id,
        vocab.sep_id,
        vocab.mask_id,
    )
    ids, offsets, len_a, nsp, positions, labels, mlm_offsets, order = out
    return _reorder(InstanceArrays(ids, offsets, len_a, nsp, positions, labels, mlm_offsets), order)


def _gather(
    values: np.ndarray, offsets: np.ndarray, order: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)[order]
    new_offsets = np.zeros(order.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=new_offsets[1:])
    starts = offsets[:-1][order]
    # index of every element: its row's old start + its position within the row
    within = np.arange(int(new_offsets[-1]), dtype=np.int64) - np.repeat(new_offsets[:-1], lengths)
    return values[np.repeat(starts, lengths) + within], new_offsets


def _reorder(instances: InstanceArrays, order: np.ndarray) -> InstanceArrays:
    """Rows in ``order`` (the reference's final ``rng.shuffle(instances)``)."""
    ids, offsets = _gather(instances.input_ids, instances.offsets, order)
    positions, mlm_offsets = _gather(instances.masked_lm_positions, instances.mlm_offsets, order)
    labels, _ = _gather(instances.masked_lm_ids, instances.mlm_offsets, order)
    return InstanceArrays(
        input_ids=ids,
        offsets=offsets,
        len_a=instances.len_a[order],
        next_sentence_label=instances.next_sentence_label[order],
        masked_lm_positions=positions,
        masked_lm_ids=labels,
        mlm_offsets=mlm_offsets,
    )
