"""A minimal protobuf wire-format codec for ``tf.train.Example``, without protobuf or TensorFlow.

Only the messages that TFRecord pretraining data uses are covered (field numbers from
TensorFlow's ``example.proto`` / ``feature.proto``)::

    Example   { Features features = 1; }
    Features  { map<string, Feature> feature = 1; }        # entry: key = 1, value = 2
    Feature   { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
                             Int64List int64_list = 3; } }
    BytesList { repeated bytes value = 1; }
    FloatList { repeated float value = 1 [packed = true]; }
    Int64List { repeated int64 value = 1 [packed = true]; }

The encoder writes the packed form (what TensorFlow writes); the decoder accepts packed and
unpacked repeated scalars alike, as the protobuf specification requires of every parser.
Varints are encoded and decoded with numpy, one vectorised pass per list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from omnibert.errors import UserError

__all__ = [
    "BYTES_LIST",
    "FLOAT_LIST",
    "INT64_LIST",
    "ExampleDecodeError",
    "FeatureValue",
    "RawFeature",
    "decode_example",
    "decode_raw",
    "decode_varints",
    "encode_example",
    "encode_examples",
    "encode_varints",
    "message_fields",
    "parse_example_raw",
    "read_varint",
]

# Field numbers of the ``Feature.kind`` oneof; used as the "kind" of a decoded feature.
BYTES_LIST = 1
FLOAT_LIST = 2
INT64_LIST = 3

_VARINT = 0
_FIXED64 = 1
_LEN = 2
_FIXED32 = 5

FeatureValue = npt.NDArray[np.int64] | npt.NDArray[np.float32] | list[bytes]
"""Decoded feature: int64 array (Int64List), float32 array (FloatList) or list of bytes."""

RawFeature = tuple[int, bytes | list[bytes]]
"""(kind, payload): for INT64_LIST the concatenated varint bytes, for FLOAT_LIST the
concatenated little-endian float32 bytes, for BYTES_LIST the list of values."""


class ExampleDecodeError(UserError):
    """The bytes are not a well-formed serialized ``tf.train.Example``."""


# --------------------------------------------------------------------------- varints (numpy)


def _encode_varints(values: npt.ArrayLike) -> tuple[bytes, npt.NDArray[np.int64]]:
    """Concatenated varints of ``values`` and the byte length of each one."""
    v = np.asarray(values, dtype=np.int64).reshape(-1).view(np.uint64)
    lengths = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        lengths += v >= np.uint64(1 << (7 * k))
    if v.size == 0 or int(lengths.max()) == 1:  # the common case for small ids: one byte each
        return v.astype(np.uint8).tobytes(), lengths
    starts = np.cumsum(lengths) - lengths
    out = np.empty(int(lengths.sum()), dtype=np.uint8)
    for k in range(int(lengths.max())):
        sel = lengths > k
        byte = (v[sel] >> np.uint64(7 * k)) & np.uint64(0x7F)
        more = np.where(lengths[sel] > k + 1, np.uint64(0x80), np.uint64(0))
        out[starts[sel] + k] = (byte | more).astype(np.uint8)
    return out.tobytes(), lengths


def encode_varints(values: npt.ArrayLike) -> bytes:
    """Encode integers as concatenated base-128 varints (negatives as 10-byte two's complement)."""
    return _encode_varints(values)[0]


def decode_varints(data: bytes | bytearray | memoryview) -> npt.NDArray[np.int64]:
    """Decode concatenated base-128 varints (a packed repeated int64 payload) to int64."""
    arr = np.frombuffer(data, dtype=np.uint8)
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    last = arr < 0x80
    if not last[-1]:
        raise ExampleDecodeError("a packed varint list ends in the middle of a varint")
    if last.all():
        return arr.astype(np.int64)
    ends = np.flatnonzero(last)
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    if int((ends - starts).max()) >= 10:
        raise ExampleDecodeError("a varint is longer than 10 bytes")
    group = np.repeat(np.arange(ends.size), ends - starts + 1)
    shift = (np.arange(arr.size) - starts[group]) * 7
    parts = (arr & 0x7F).astype(np.uint64) << shift.astype(np.uint64)
    return np.add.reduceat(parts, starts).view(np.int64)


# --------------------------------------------------------------------------- wire primitives


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _len_field(field: int, payload: bytes) -> bytes:
    return _varint((field << 3) | _LEN) + _varint(len(payload)) + payload


def read_varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    """One base-128 varint of ``buf[pos:end]``: ``(value, position after it)`` (also used by
    :mod:`omnibert.convert.tf1_bundle`)."""
    result = 0
    shift = 0
    while True:
        if pos >= end:
            raise ExampleDecodeError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise ExampleDecodeError("a varint is longer than 10 bytes")


def message_fields(buf: bytes, pos: int, end: int) -> list[tuple[int, int, int, int]]:
    """Split a message into (field, wire_type, start, stop) spans; unknown fields are kept.

    For a length-delimited field the span is its payload, for a varint the varint's bytes,
    for fixed32/fixed64 the 4/8 little-endian bytes."""
    out = []
    while pos < end:
        key = buf[pos]
        if key < 0x80:
            pos += 1
        else:
            key, pos = read_varint(buf, pos, end)
        field, wire = key >> 3, key & 7
        if wire == _LEN:
            length = buf[pos] if pos < end else 0x80
            if length < 0x80:
                pos += 1
            else:
                length, pos = read_varint(buf, pos, end)
            start, pos = pos, pos + length
        elif wire == _VARINT:
            start = pos
            _, pos = read_varint(buf, pos, end)
        elif wire == _FIXED32:
            start, pos = pos, pos + 4
        elif wire == _FIXED64:
            start, pos = pos, pos + 8
        else:
            raise ExampleDecodeError(f"unsupported protobuf wire type {wire} (field {field})")
        if pos > end:
            raise ExampleDecodeError(f"field {field} runs past the end of its message")
        out.append((field, wire, start, pos))
    return out


# --------------------------------------------------------------------------- Example codec


def _encode_feature(value: object) -> bytes:
    if isinstance(value, (list, tuple)) and all(isinstance(x, bytes) for x in value):
        items = b"".join(_len_field(1, x) for x in value)
        return _len_field(BYTES_LIST, items)
    arr = np.asarray(value)
    if arr.dtype.kind in "iub":
        payload = encode_varints(arr)
        kind = INT64_LIST
    elif arr.dtype.kind == "f":
        payload = arr.astype("<f4").reshape(-1).tobytes()
        kind = FLOAT_LIST
    else:
        raise TypeError(f"cannot encode a feature of dtype {arr.dtype}; use ints, floats or bytes")
    inner = _len_field(1, payload) if payload else b""  # proto3 omits an empty packed list
    return _len_field(kind, inner)


def encode_example(features: Mapping[str, object]) -> bytes:
    """Serialize ``{name: values}`` as a ``tf.train.Example``, features in mapping order.

    Integer arrays/lists become Int64List, floating ones FloatList (float32), and lists of
    ``bytes`` BytesList. Repeated numbers are written packed, as TensorFlow writes them.
    """
    entries = []
    for name, value in features.items():
        entry = _len_field(1, name.encode("utf-8")) + _len_field(2, _encode_feature(value))
        entries.append(_len_field(1, entry))
    return _len_field(1, b"".join(entries))


def _row_payloads(values: npt.NDArray[Any]) -> tuple[int, list[bytes]]:
    """Split a [rows, width] numeric array into one packed payload per row."""
    rows = values.shape[0]
    if values.dtype.kind in "iub":
        data, lengths = _encode_varints(values)
        row_bytes = lengths.reshape(rows, -1).sum(axis=1)
        kind = INT64_LIST
    elif values.dtype.kind == "f":
        data = values.astype("<f4").tobytes()
        row_bytes = np.full(rows, 4 * (values.size // max(rows, 1)), dtype=np.int64)
        kind = FLOAT_LIST
    else:
        raise TypeError(f"cannot encode a feature of dtype {values.dtype}; use ints or floats")
    ends = np.cumsum(row_bytes).tolist()
    starts = [0, *ends[:-1]]
    return kind, [data[a:b] for a, b in zip(starts, ends, strict=True)]


def encode_examples(columns: Mapping[str, npt.NDArray[Any]]) -> list[bytes]:
    """Serialize many Examples at once: ``columns[name][i]`` is feature ``name`` of Example i.

    Each column is a numeric array ``[rows, width]``; the result equals
    ``[encode_example({name: col[i] for name, col in columns.items()}) for i in range(rows)]``
    but varints are encoded for the whole block in one numpy pass.
    """
    prepared = []
    rows = 0
    for name, values in columns.items():
        values = np.asarray(values)
        rows = values.shape[0]
        kind, payloads = _row_payloads(values.reshape(rows, -1))
        prepared.append((_len_field(1, name.encode("utf-8")), kind, payloads))
    out = []
    for i in range(rows):
        entries = []
        for key, kind, payloads in prepared:
            payload = payloads[i]
            feature = _len_field(kind, _len_field(1, payload) if payload else b"")
            entries.append(_len_field(1, key + _len_field(2, feature)))
        out.append(_len_field(1, b"".join(entries)))
    return out


def _parse_list(buf: bytes, start: int, stop: int, kind: int) -> RawFeature:
    if kind == BYTES_LIST:
        return kind, [
            buf[a:b] for f, w, a, b in message_fields(buf, start, stop) if f == 1 and w == _LEN
        ]
    parts: list[bytes] = []
    scalar_wire = _VARINT if kind == INT64_LIST else _FIXED32
    for field, wire, a, b in message_fields(buf, start, stop):
        if field != 1:
            continue
        if wire not in (_LEN, scalar_wire):
            raise ExampleDecodeError(f"value of wire type {wire} in a numeric list")
        if kind == INT64_LIST and wire == _LEN and b > a and buf[b - 1] >= 0x80:
            raise ExampleDecodeError("a packed varint list ends in the middle of a varint")
        parts.append(buf[a:b])  # packed payload or one unpacked scalar: same byte layout
    payload = b"".join(parts)
    if kind == FLOAT_LIST and len(payload) % 4:
        raise ExampleDecodeError("a packed float list is not a multiple of 4 bytes")
    return kind, payload


def _read_length(buf: bytes, p: int, b: int) -> tuple[int, int]:
    """The length after the tag at ``p`` and where its payload starts (1- and 2-byte lengths
    inline, longer ones through :func:`read_varint`)."""
    size = buf[p + 1] if p + 1 < b else 0x80
    if size < 0x80:
        return size, p + 2
    if p + 2 < b and buf[p + 2] < 0x80:  # two-byte lengths: lists of 128+ bytes
        return (size & 0x7F) | (buf[p + 2] << 7), p + 3
    return read_varint(buf, p + 1, b)


def _entry_fast(buf: bytes, a: int, b: int) -> tuple[str, RawFeature] | None:
    """Parse a map entry in TensorFlow's canonical layout, or return None to take the slow path.

    Canonical: ``0A len key 12 len Feature``, Feature ``(0A|12|1A) len List``, numeric List
    ``0A len payload``; every length must end exactly where its enclosing message ends.
    """
    if b - a < 4 or buf[a] != 0x0A or buf[a + 1] >= 0x80:
        return None
    p = a + 2 + buf[a + 1]
    if p >= b or buf[p] != 0x12:
        return None
    name = buf[a + 2 : p].decode("utf-8")
    size, p = _read_length(buf, p, b)
    if p + size != b or p == b:
        return None
    tag = buf[p]
    kind = tag >> 3
    if tag & 7 != _LEN or kind not in (FLOAT_LIST, INT64_LIST):
        return None
    size, p = _read_length(buf, p, b)
    if p + size != b:
        return None
    if p == b:
        return name, (kind, b"")
    if buf[p] != 0x0A:
        return None
    size, p = _read_length(buf, p, b)
    if (
        p + size != b
        or (kind == INT64_LIST and buf[b - 1] >= 0x80)
        or (kind == FLOAT_LIST and size % 4)
    ):
        return None
    return name, (kind, buf[p:b])


def parse_example_raw(buf: bytes) -> dict[str, RawFeature]:
    """Parse an Example to ``{name: (kind, payload)}`` without decoding the numbers.

    Decoding is left to the caller so that many records can be decoded in one numpy pass.
    Entries in TensorFlow's canonical layout take a fast path; anything else (unpacked
    lists, unknown fields, bytes lists) goes through the general wire-format walk.
    """
    buf = bytes(buf)
    out: dict[str, RawFeature] = {}
    for field, wire, a, b in message_fields(buf, 0, len(buf)):
        if field != 1 or wire != _LEN:
            continue
        for efield, ewire, ea, eb in message_fields(buf, a, b):  # Features.feature map entries
            if efield != 1 or ewire != _LEN:
                continue
            fast = _entry_fast(buf, ea, eb)
            if fast is not None:
                out[fast[0]] = fast[1]
                continue
            name = ""
            raw: RawFeature | None = None
            for kfield, kwire, ka, kb in message_fields(buf, ea, eb):
                if kwire != _LEN:
                    continue
                if kfield == 1:
                    name = buf[ka:kb].decode("utf-8")
                elif kfield == 2:
                    raw = (INT64_LIST, b"")  # a Feature with no list set decodes as empty
                    for ffield, fwire, fa, fb in message_fields(buf, ka, kb):
                        if fwire == _LEN and ffield in (BYTES_LIST, FLOAT_LIST, INT64_LIST):
                            raw = _parse_list(buf, fa, fb, ffield)  # last one wins (oneof)
            out[name] = raw if raw is not None else (INT64_LIST, b"")
    return out


def decode_raw(raw: RawFeature) -> FeatureValue:
    """Decode one ``(kind, payload)`` from :func:`parse_example_raw`."""
    kind, payload = raw
    if kind == BYTES_LIST:
        assert isinstance(payload, list)
        return payload
    assert isinstance(payload, bytes)
    if kind == FLOAT_LIST:
        return np.frombuffer(payload, dtype="<f4").astype(np.float32)
    return decode_varints(payload)


def decode_example(buf: bytes) -> dict[str, FeatureValue]:
    """Deserialize a ``tf.train.Example`` to ``{name: int64 array | float32 array | [bytes]}``."""
    return {name: decode_raw(raw) for name, raw in parse_example_raw(buf).items()}
