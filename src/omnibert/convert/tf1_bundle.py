"""TensorFlow checkpoints (format V2, "tensor bundles") read without TensorFlow.

A checkpoint ``<prefix>`` is ``<prefix>.index`` plus ``<prefix>.data-SSSSS-of-NNNNN`` shards
(``<prefix>.meta``, the graph, is not needed for weights). The index is an SSTable in
LevelDB's table format:

* a 48-byte footer: the metaindex and index block handles (two varints each: offset, size),
  zero padding to 40 bytes, then the magic number ``0xdb4775248b80fb57`` (little-endian);
* blocks of entries, each ``shared, non_shared, value_length`` (varints), the key's
  unshared suffix and the value; keys are prefix-compressed against the previous key and
  restart from scratch at the restart points listed (uint32) at the block's end, followed by
  their count; every block is followed by a 5-byte trailer: the compression type (0 none,
  1 snappy) and the masked crc32c of the block and that byte;
* the index block maps the last key of each data block to its handle; the metaindex is empty.

TensorFlow's ``BundleWriter`` writes the index uncompressed (``table::kNoCompression``, since
TF 1.2: "compressed tables cannot be read by TensorFlow releases prior to 1.1"), so a snappy
block is refused with a sentence saying so. Keys are tensor names; the value is a
``BundleEntryProto`` (``dtype = 1``, ``shape = 2`` as ``TensorShapeProto { repeated Dim dim
= 2 { int64 size = 1 } }``, ``shard_id = 3``, ``offset = 4``, ``size = 5``, ``fixed32 crc32c
= 6``, ``repeated slices = 7``); the empty key holds the ``BundleHeaderProto``
(``num_shards = 1``, ``endianness = 2`` (0 little), ``version = 3``). A tensor's bytes are
``data[offset:offset + size]`` of its shard, in C order, and ``crc32c`` is their masked
CRC-32C (``((c >> 15 | c << 17) + 0xa282ead8) mod 2**32``), verified on every read.

Read lazily: opening parses the index (kilobytes) and checks that every shard exists;
:meth:`TF1Checkpoint.read` reads one tensor, so the optimiser slots of a 4 GB MLPerf
checkpoint are never touched. Supported dtypes: float16/32/64, bfloat16 (returned as float32,
exactly), int8/16/32/64, uint8/16/32/64 and bool. Strings, resources, partitioned variables
(``slices``) and big-endian bundles are refused with a sentence naming the tensor or file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import google_crc32c
import numpy as np
import numpy.typing as npt

from omnibert.convert.hf import ConversionError
from omnibert.formats.example_proto import (
    ExampleDecodeError,
    message_fields,
    read_varint,
)

__all__ = [
    "BundleEntry",
    "TF1Checkpoint",
    "TF1CheckpointError",
    "data_filename",
    "is_tf1_checkpoint",
    "masked_crc32c",
    "read_tf1_checkpoint",
]

MAGIC = 0xDB4775248B80FB57
FOOTER_SIZE = 48
BLOCK_TRAILER_SIZE = 5
_VARINT, _FIXED32, _LEN = 0, 5, 2
_CHUNK = 1 << 24  # bytes read (and checksummed) at a time

#: TensorFlow ``DataType`` enum -> (name, numpy dtype of the stored bytes, little-endian)
DTYPES: dict[int, tuple[str, str]] = {
    1: ("float32", "<f4"),
    2: ("float64", "<f8"),
    3: ("int32", "<i4"),
    4: ("uint8", "u1"),
    5: ("int16", "<i2"),
    6: ("int8", "i1"),
    9: ("int64", "<i8"),
    10: ("bool", "?"),
    14: ("bfloat16", "<u2"),
    17: ("uint16", "<u2"),
    19: ("float16", "<f2"),
    22: ("uint32", "<u4"),
    23: ("uint64", "<u8"),
}
_UNSUPPORTED = {7: "string", 20: "resource", 21: "variant"}


class TF1CheckpointError(ConversionError):
    """A TensorFlow checkpoint that is missing, corrupt or holds what cannot be read."""


def masked_crc32c(data: bytes) -> int:
    """TensorFlow's (and LevelDB's) masked CRC-32C of ``data``."""
    return _mask(google_crc32c.value(data))


def _mask(crc: int) -> int:
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def data_filename(prefix: str | Path, shard: int, num_shards: int) -> Path:
    """``<prefix>.data-SSSSS-of-NNNNN``."""
    return Path(f"{prefix}.data-{shard:05d}-of-{num_shards:05d}")


def is_tf1_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is the prefix of a TensorFlow checkpoint (``<path>.index`` exists)."""
    return Path(f"{path}.index").is_file()


@dataclass(frozen=True)
class BundleEntry:
    """Where one tensor lives: ``BundleEntryProto`` decoded (``crc32c`` as stored, masked)."""

    name: str
    dtype: int
    shape: tuple[int, ...]
    shard_id: int = 0
    offset: int = 0
    size: int = 0
    crc32c: int = 0
    slices: int = 0

    @property
    def dtype_name(self) -> str:
        known = DTYPES.get(self.dtype) or (_UNSUPPORTED.get(self.dtype, f"DataType {self.dtype}"),)
        return known[0]


def _varint_field(buf: bytes, start: int, stop: int) -> int:
    return read_varint(buf, start, stop)[0]


def _decode_shape(buf: bytes, start: int, stop: int) -> tuple[int, ...]:
    dims = []
    for field, wire, a, b in message_fields(buf, start, stop):
        if field == 2 and wire == _LEN:  # Dim { int64 size = 1; string name = 2; }
            size = 0
            for dfield, dwire, da, db in message_fields(buf, a, b):
                if dfield == 1 and dwire == _VARINT:
                    size = _varint_field(buf, da, db)
            dims.append(size - (1 << 64) if size >= 1 << 63 else size)  # -1: unknown
    return tuple(dims)


def _decode_entry(name: str, buf: bytes) -> BundleEntry:
    values: dict[str, int] = {"dtype": 0, "shard_id": 0, "offset": 0, "size": 0, "crc32c": 0}
    shape: tuple[int, ...] = ()
    slices = 0
    ints = {1: "dtype", 3: "shard_id", 4: "offset", 5: "size"}
    for field, wire, a, b in message_fields(buf, 0, len(buf)):
        if field in ints and wire == _VARINT:
            values[ints[field]] = _varint_field(buf, a, b)
        elif field == 2 and wire == _LEN:
            shape = _decode_shape(buf, a, b)
        elif field == 6 and wire == _FIXED32:
            values["crc32c"] = struct.unpack_from("<I", buf, a)[0]
        elif field == 7 and wire == _LEN:
            slices += 1
    return BundleEntry(name=name, shape=shape, slices=slices, **values)


def _decode_header(buf: bytes) -> tuple[int, int]:
    """``(num_shards, endianness)`` of a ``BundleHeaderProto``."""
    num_shards, endianness = 0, 0
    for field, wire, a, b in message_fields(buf, 0, len(buf)):
        if field == 1 and wire == _VARINT:
            num_shards = _varint_field(buf, a, b)
        elif field == 2 and wire == _VARINT:
            endianness = _varint_field(buf, a, b)
    return num_shards, endianness


class TF1Checkpoint:
    """An opened TensorFlow V2 checkpoint: its entries now, each tensor when asked.

    Raises :class:`TF1CheckpointError` (one sentence naming the file) for a missing, truncated
    or corrupt index, a missing data shard, and (when a tensor is read) a truncated shard or a
    checksum mismatch.
    """

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = Path(prefix)
        self.index_file = Path(f"{prefix}.index")
        if not self.index_file.is_file():
            raise TF1CheckpointError(
                f"{self.index_file} does not exist; pass the checkpoint's prefix (the path "
                "without .index, e.g. <dir>/model.ckpt-28252)."
            )
        self._index = self.index_file.read_bytes()
        header: tuple[int, int] | None = None
        entries: dict[str, BundleEntry] = {}
        try:
            for key, value in self._table_entries():
                if key == b"":
                    header = _decode_header(value)
                elif not key.startswith(b"\x00"):  # "\x00..." keys are slices of partitions
                    name = key.decode("utf-8")
                    entries[name] = _decode_entry(name, value)
        except (ExampleDecodeError, UnicodeDecodeError, IndexError, struct.error) as err:
            self._corrupt(f"an entry does not decode ({err})")
        if header is None or header[0] < 1:
            self._corrupt("it has no bundle header")
        self.num_shards, endianness = header
        if endianness != 0:
            raise TF1CheckpointError(
                f"{self.index_file} was written on a big-endian machine, which this reader does "
                "not support; re-save the checkpoint on a little-endian (x86/ARM) machine."
            )
        self.entries = entries
        for name, entry in entries.items():
            if not 0 <= entry.shard_id < self.num_shards:
                self._corrupt(f"{name} names shard {entry.shard_id} of {self.num_shards}")
        for shard in range(self.num_shards):
            path = data_filename(self.prefix, shard, self.num_shards)
            if not path.is_file():
                raise TF1CheckpointError(
                    f"{path} is missing (the checkpoint {self.prefix} has {self.num_shards} "
                    "data shard(s)); copy every .data-* file next to its .index."
                )

    def _corrupt(self, detail: str) -> NoReturn:
        raise TF1CheckpointError(
            f"{self.index_file} is not a readable TensorFlow checkpoint index ({detail}); "
            "re-download or re-save the checkpoint."
        )

    # ------------------------------------------------------------------ the SSTable
    def _block(self, offset: int, size: int) -> bytes:
        buf = self._index
        end = offset + size
        if offset < 0 or end + BLOCK_TRAILER_SIZE > len(buf) - FOOTER_SIZE:
            self._corrupt(f"a block at byte {offset} runs past the end: truncated")
        kind = buf[end]
        stored = struct.unpack_from("<I", buf, end + 1)[0]
        if masked_crc32c(buf[offset : end + 1]) != stored:
            self._corrupt(f"the block at byte {offset} fails its crc32c check")
        if kind == 1:
            self._corrupt(
                "a block is snappy-compressed; TensorFlow writes checkpoint indexes "
                "uncompressed and this reader does not decompress them"
            )
        if kind != 0:
            self._corrupt(f"a block has unknown compression type {kind}")
        return buf[offset:end]

    def _block_entries(self, block: bytes) -> Iterator[tuple[bytes, bytes]]:
        if len(block) < 4:
            self._corrupt("a block is shorter than its restart count")
        restarts = struct.unpack_from("<I", block, len(block) - 4)[0]
        limit = len(block) - 4 * (restarts + 1)
        if restarts < 1 or limit < 0:
            self._corrupt("a block has an impossible restart count")
        pos, key = 0, b""
        while pos < limit:
            shared, pos = read_varint(block, pos, limit)
            unshared, pos = read_varint(block, pos, limit)
            length, pos = read_varint(block, pos, limit)
            if shared > len(key) or pos + unshared + length > limit:
                self._corrupt("a block entry runs past its block")
            key = key[:shared] + block[pos : pos + unshared]
            pos += unshared
            yield key, block[pos : pos + length]
            pos += length

    def _handle(self, buf: bytes, pos: int, end: int) -> tuple[int, int, int]:
        offset, pos = read_varint(buf, pos, end)
        size, pos = read_varint(buf, pos, end)
        return offset, size, pos

    def _table_entries(self) -> Iterator[tuple[bytes, bytes]]:
        buf = self._index
        if len(buf) < FOOTER_SIZE:
            self._corrupt(f"{len(buf)} bytes, shorter than the 48-byte footer: truncated")
        footer = len(buf) - FOOTER_SIZE
        if struct.unpack_from("<Q", buf, len(buf) - 8)[0] != MAGIC:
            self._corrupt("no table magic number at its end: truncated or not a checkpoint")
        _, _, pos = self._handle(buf, footer, footer + 40)  # the metaindex: empty, unused
        index_offset, index_size, _ = self._handle(buf, pos, footer + 40)
        for _, handle in self._block_entries(self._block(index_offset, index_size)):
            offset, size, _ = self._handle(handle, 0, len(handle))
            yield from self._block_entries(self._block(offset, size))

    # ------------------------------------------------------------------ tensors
    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def names(self) -> list[str]:
        """Every tensor name, sorted (the index order)."""
        return sorted(self.entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def data_file(self, shard: int) -> Path:
        return data_filename(self.prefix, shard, self.num_shards)

    def read(self, name: str) -> npt.NDArray[np.generic]:
        """The tensor ``name`` (crc32c verified), as a new array; bfloat16 becomes float32."""
        entry = self.entries.get(name)
        if entry is None:
            raise TF1CheckpointError(f"{self.index_file} holds no tensor named {name!r}.")
        if entry.slices:
            raise TF1CheckpointError(
                f"{name} in {self.index_file} is a partitioned variable ({entry.slices} "
                "slices), which this reader does not assemble; save it unpartitioned."
            )
        if entry.dtype not in DTYPES:
            raise TF1CheckpointError(
                f"{name} in {self.index_file} has dtype {entry.dtype_name}, which this reader "
                f"does not read (supported: {', '.join(n for n, _ in DTYPES.values())})."
            )
        kind, stored = DTYPES[entry.dtype]
        dtype = np.dtype(stored)
        count = int(np.prod(entry.shape, dtype=np.int64))
        if any(d < 0 for d in entry.shape) or count * dtype.itemsize != entry.size:
            self._corrupt(f"{name} has shape {entry.shape} but {entry.size} bytes")
        data = self._read_bytes(entry)
        array = np.frombuffer(data, dtype=dtype).reshape(entry.shape)
        if kind == "bfloat16":  # the upper half of a float32: widening is exact
            return (array.astype(np.uint32) << 16).view(np.float32)
        return array

    def _read_bytes(self, entry: BundleEntry) -> bytearray:
        path = self.data_file(entry.shard_id)
        available = path.stat().st_size
        end = entry.offset + entry.size
        if end > available:
            raise TF1CheckpointError(
                f"{path} is truncated: {entry.name} needs bytes {entry.offset}..{end} but the "
                f"file has {available}; re-download the checkpoint."
            )
        out = bytearray(entry.size)
        view = memoryview(out)
        crc = 0
        with path.open("rb") as handle:
            handle.seek(entry.offset)
            for start in range(0, entry.size, _CHUNK):
                chunk = handle.read(min(_CHUNK, entry.size - start))
                view[start : start + len(chunk)] = chunk
                crc = google_crc32c.extend(crc, chunk)
        if _mask(crc) != entry.crc32c:
            raise TF1CheckpointError(
                f"{path} is corrupt: {entry.name} fails its crc32c check; re-download the "
                "checkpoint."
            )
        return out


def read_tf1_checkpoint(
    prefix: str | Path, names: list[str] | None = None
) -> dict[str, npt.NDArray[np.generic]]:
    """``{name: array}`` of a TensorFlow checkpoint: every tensor, or only ``names``."""
    checkpoint = TF1Checkpoint(prefix)
    return {
        name: checkpoint.read(name) for name in (checkpoint.names() if names is None else names)
    }
