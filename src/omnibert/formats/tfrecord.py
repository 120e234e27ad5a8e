"""MLPerf / Google BERT TFRecord files, read and written without TensorFlow.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little endian) | uint32 masked_crc32c(length bytes)
    byte   data[length]           | uint32 masked_crc32c(data)

with ``masked_crc32c(x) = ((c >> 15) | (c << 17)) + 0xA282EAD8 (mod 2**32)``, ``c = crc32c(x)``
(CRC-32C, Castagnoli). Files whose name ends in ``.gz`` are gzip streams of the same bytes
(TensorFlow's ``compression_type="GZIP"``).

Each record is a serialized ``tf.train.Example`` as written by Google's
``create_pretraining_data.py`` (``write_instance_to_example_files``) and read by the MLPerf BERT
reference: int64 ``input_ids``, ``input_mask``, ``segment_ids`` (zero-padded to
max_seq_length), int64 ``masked_lm_positions``, ``masked_lm_ids`` and float
``masked_lm_weights`` (zero-padded to max_predictions_per_seq, weight 1.0 for a real
prediction) and int64 ``next_sentence_labels`` (one value, 1 = random next).
"""

from __future__ import annotations

import contextlib
import gzip
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from omnibert.errors import UserError
from omnibert.formats.example_proto import (
    FLOAT_LIST,
    INT64_LIST,
    ExampleDecodeError,
    RawFeature,
    decode_varints,
    encode_examples,
    parse_example_raw,
)
from omnibert.formats.padded import RecordError, pad_records, unpad_batch

__all__ = [
    "TFRecordError",
    "crc32c",
    "iter_tfrecord_payloads",
    "masked_crc32c",
    "read_tfrecord",
    "write_tfrecord",
    "write_tfrecord_payloads",
]

INT_FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "next_sentence_labels",
)
_FEATURE_ORDER = (*INT_FEATURES[:5], "masked_lm_weights", "next_sentence_labels")
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")
_FOOTER = struct.Struct("<I")


class TFRecordError(UserError):
    """A TFRecord file is truncated, corrupt or does not hold BERT pretraining examples."""


# --------------------------------------------------------------------------- CRC-32C


def _table_crc32c() -> Callable[[bytes], int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)

    def crc(data: bytes) -> int:  # slow pure Python: only used when no compiled CRC is installed
        c = 0xFFFFFFFF
        for byte in data:
            c = table[(c ^ byte) & 0xFF] ^ (c >> 8)
        return c ^ 0xFFFFFFFF

    return crc


def _pick_crc32c() -> Callable[[bytes], int]:
    # imported here to try them in turn: either package may be missing, and google-crc32c
    # may be its slow pure-Python build
    with contextlib.suppress(ImportError):
        import google_crc32c

        if google_crc32c.implementation == "c":
            return google_crc32c.value
    with contextlib.suppress(ImportError):
        import crc32c as crc32c_pkg

        return crc32c_pkg.crc32c
    return _table_crc32c()


crc32c: Callable[[bytes], int] = _pick_crc32c()
"""CRC-32C of ``data`` (google-crc32c when installed, else a pure-Python table)."""


def masked_crc32c(data: bytes) -> int:
    """TFRecord's masked CRC-32C: rotate right by 15 bits and add 0xA282EAD8."""
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + _MASK_DELTA) & 0xFFFFFFFF


# --------------------------------------------------------------------------- framing


def _is_gzip(path: str | os.PathLike[str], compression: str | None) -> bool:
    if compression is None:
        return str(path).endswith(".gz")
    if compression.lower() not in ("gzip", "none", ""):
        raise ValueError(f"unknown TFRecord compression {compression!r}; use 'gzip' or None")
    return compression.lower() == "gzip"


def _open_read(path: str | os.PathLike[str], compression: str | None) -> IO[bytes] | gzip.GzipFile:
    if _is_gzip(path, compression):
        return gzip.open(path, "rb")
    return open(path, "rb", buffering=1 << 20)


def iter_tfrecord_payloads(
    path: str | os.PathLike[str], *, verify_crc: bool = True, compression: str | None = None
) -> Iterator[tuple[int, bytes]]:
    """Stream ``(byte_offset, payload)`` for each record, checking both CRCs by default.

    Offsets count bytes of the uncompressed stream. Raises :class:`TFRecordError` for a
    truncated file, a CRC mismatch or a broken gzip stream.
    """
    offset = 0
    try:
        with _open_read(path, compression) as f:
            while True:
                header = f.read(12)
                if not header:
                    return
                if len(header) < 12:
                    raise TFRecordError(
                        f"{path}: truncated TFRecord file, the record header at byte offset "
                        f"{offset} has only {len(header)} of 12 bytes; re-create or re-copy "
                        "the file (an interrupted write or copy leaves this)."
                    )
                length, length_crc = _HEADER.unpack(header)
                if verify_crc and masked_crc32c(header[:8]) != length_crc:
                    raise TFRecordError(
                        f"{path}: the length CRC of the record at byte offset {offset} does "
                        "not match, so the file is corrupt or not a TFRecord file; re-create "
                        "or re-copy it (pass compression='gzip' if it is gzip-compressed)."
                    )
                body = f.read(length + 4)
                if len(body) < length + 4:
                    raise TFRecordError(
                        f"{path}: truncated TFRecord file, the record at byte offset {offset} "
                        f"declares {length} data bytes but the file ends first; re-create or "
                        "re-copy the file (an interrupted write or copy leaves this)."
                    )
                payload = body[:length]
                if verify_crc and masked_crc32c(payload) != _FOOTER.unpack(body[length:])[0]:
                    raise TFRecordError(
                        f"{path}: the data CRC of the record at byte offset {offset} does not "
                        "match, so the file is corrupt; re-create or re-copy it."
                    )
                yield offset, payload
                offset += 16 + length
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise TFRecordError(
            f"{path}: broken gzip stream after byte offset {offset} ({err}); re-create or "
            "re-copy the file, or pass compression=None if it is not gzip-compressed."
        ) from err


def write_tfrecord_payloads(
    path: str | os.PathLike[str], payloads: Iterable[bytes], *, compression: str | None = None
) -> int:
    """Frame and write raw payloads as a TFRecord file (atomically); returns the count."""
    final = Path(path)
    tmp = final.with_name(final.name + ".partial")
    count = 0
    opener: Any = gzip.open if _is_gzip(path, compression) else open
    try:
        with opener(tmp, "wb") as f:
            for payload in payloads:
                header = struct.pack("<Q", len(payload))
                f.write(header + _FOOTER.pack(masked_crc32c(header)))
                f.write(payload + _FOOTER.pack(masked_crc32c(payload)))
                count += 1
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return count


# --------------------------------------------------------------------------- BERT examples


def _encode_examples(
    path: str | os.PathLike[str],
    records: Iterable[dict[str, Any]],
    max_seq_length: int,
    max_predictions_per_seq: int,
    block: int = 1024,
) -> Iterator[bytes]:
    buffer: list[dict[str, Any]] = []
    done = 0

    def flush() -> Iterator[bytes]:
        try:
            padded = pad_records(buffer, max_seq_length, max_predictions_per_seq)
        except RecordError as err:
            raise TFRecordError(
                f"{path}: cannot write record {done + err.index}: {err.problem}; fix the "
                "record or raise max_seq_length / max_predictions_per_seq."
            ) from err
        padded["next_sentence_labels"] = padded["next_sentence_labels"][:, None]
        yield from encode_examples({name: padded[name] for name in _FEATURE_ORDER})

    for rec in records:
        buffer.append(rec)
        if len(buffer) == block:
            yield from flush()
            done += len(buffer)
            buffer = []
    if buffer:
        yield from flush()


def write_tfrecord(
    path: str | os.PathLike[str],
    records: Iterable[dict[str, Any]],
    max_seq_length: int,
    max_predictions_per_seq: int,
    *,
    compression: str | None = None,
) -> int:
    """Write omnibert records as Google/MLPerf BERT ``tf.train.Example`` TFRecords.

    The layout is that of ``create_pretraining_data.py`` (features in its order, lists
    zero-padded, weights 1.0/0.0). ``.gz`` paths (or ``compression="gzip"``) are gzip
    compressed. The file appears only when complete. Returns the number of records.
    """
    examples = _encode_examples(path, records, max_seq_length, max_predictions_per_seq)
    return write_tfrecord_payloads(path, examples, compression=compression)


class _Decoder:
    """Decodes blocks of parsed Examples with one numpy pass per feature."""

    def __init__(self, path: str | os.PathLike[str], seq: int | None, preds: int | None):
        self.path = path
        self.seq = seq
        self.preds = preds

    def fail(self, offset: int, problem: str, fix: str) -> TFRecordError:
        return TFRecordError(f"{self.path}: the record at byte offset {offset} {problem}; {fix}.")

    def widths(self, input_ids: bytes, masked_lm_positions: bytes) -> None:
        """Fix max_seq_length / max_predictions_per_seq from the first record if not given."""
        if self.seq is None:
            self.seq = int(decode_varints(input_ids).size)
        if self.preds is None:
            self.preds = int(decode_varints(masked_lm_positions).size)

    def decode(self, block: list[tuple[int, dict[str, RawFeature]]]) -> list[dict[str, Any]]:
        columns: dict[str, list[bytes]] = {name: [] for name in (*INT_FEATURES, "weights")}
        for offset, raw in block:
            for name in (*INT_FEATURES, "masked_lm_weights"):
                kind_payload = raw.get(name)
                want = FLOAT_LIST if name == "masked_lm_weights" else INT64_LIST
                if kind_payload is None or kind_payload[0] != want:
                    problem = "has no" if kind_payload is None else "has a wrongly typed"
                    raise self.fail(
                        offset,
                        f"{problem} feature {name!r} (found {sorted(raw)})",
                        "it is not a BERT pretraining example from create_pretraining_data.py",
                    )
                payload = kind_payload[1]
                assert isinstance(payload, bytes)
                columns["weights" if name == "masked_lm_weights" else name].append(payload)
            if self.seq is None or self.preds is None:
                self.widths(columns["input_ids"][-1], columns["masked_lm_positions"][-1])
        assert self.seq is not None and self.preds is not None
        n = len(block)
        width = {"next_sentence_labels": 1, "masked_lm_positions": self.preds}
        width.update(masked_lm_ids=self.preds, weights=self.preds)
        arrays: dict[str, Any] = {}
        for name, payloads in columns.items():
            w = width.get(name, self.seq)
            if name == "weights":
                values = np.frombuffer(b"".join(payloads), dtype="<f4")
                sizes = [len(p) // 4 for p in payloads]
            else:
                values = decode_varints(b"".join(payloads))
                sizes = []
            if values.size != n * w:
                self._raise_width(block, name, payloads, sizes, w)
            arrays[name] = values.reshape(n, w)
        try:
            return unpad_batch(
                arrays["input_ids"],
                arrays["input_mask"],
                arrays["segment_ids"],
                arrays["masked_lm_positions"],
                arrays["masked_lm_ids"],
                arrays["weights"] != 0,
                arrays["next_sentence_labels"],
            )
        except RecordError as err:
            raise self.fail(block[err.index][0], err.problem, "re-create the file") from err

    def _raise_width(
        self,
        block: list[tuple[int, dict[str, RawFeature]]],
        name: str,
        payloads: list[bytes],
        sizes: list[int],
        width: int,
    ) -> None:
        per_prediction = name in ("masked_lm_positions", "masked_lm_ids", "weights")
        declared = "max_predictions_per_seq" if per_prediction else "max_seq_length"
        label = "masked_lm_weights" if name == "weights" else name
        for (offset, _), payload, size in zip(
            block, payloads, sizes or [-1] * len(block), strict=True
        ):
            got = size if size >= 0 else int(decode_varints(payload).size)
            if got != width:
                if label == "next_sentence_labels":
                    raise self.fail(offset, f"has {got} next_sentence_labels, not 1", "fix it")
                raise self.fail(
                    offset,
                    f"has {got} values of {label!r} but {declared} is {width}",
                    f"pass the {declared} the file was written with, or re-create the file",
                )
        raise AssertionError("unreachable: the block sizes add up")


def read_tfrecord(
    path: str | os.PathLike[str],
    *,
    max_seq_length: int | None = None,
    max_predictions_per_seq: int | None = None,
    verify_crc: bool = True,
    compression: str | None = None,
    block_size: int = 1024,
) -> Iterator[dict[str, Any]]:
    """Stream the unpadded omnibert records of a BERT pretraining TFRecord file.

    Records are read and decoded ``block_size`` at a time. When the max lengths are not
    given they are taken from the first record, and every record must match them. Raises
    :class:`TFRecordError` (naming the file and byte offset) on corrupt or foreign data.
    """
    decoder = _Decoder(path, max_seq_length, max_predictions_per_seq)
    block: list[tuple[int, dict[str, RawFeature]]] = []
    for offset, payload in iter_tfrecord_payloads(
        path, verify_crc=verify_crc, compression=compression
    ):
        try:
            block.append((offset, parse_example_raw(payload)))
        except ExampleDecodeError as err:
            raise decoder.fail(
                offset, f"is not a valid tf.train.Example ({err})", "re-create the file"
            ) from err
        if len(block) == block_size:
            yield from decoder.decode(block)
            block = []
    if block:
        yield from decoder.decode(block)
