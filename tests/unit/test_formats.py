"""MLPerf TFRecord and NVIDIA HDF5 readers/writers: byte layout, round trips, bad input."""

from __future__ import annotations

import gzip
import json
import random
import struct
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from omnibert.data.conversion import arrow_features, convert_to_arrow
from omnibert.formats.example_proto import (
    ExampleDecodeError,
    decode_example,
    decode_varints,
    encode_example,
    encode_varints,
)
from omnibert.formats.hdf5 import HDF5FormatError, read_hdf5, write_hdf5
from omnibert.formats.records import iter_records
from omnibert.formats.tfrecord import (
    TFRecordError,
    _table_crc32c,
    crc32c,
    iter_tfrecord_payloads,
    masked_crc32c,
    read_tfrecord,
    write_tfrecord,
    write_tfrecord_payloads,
)

SEQ, PREDS = 32, 5


def make_records(n: int, seed: int = 0, seq: int = SEQ, preds: int = PREDS) -> list[dict[str, Any]]:
    """Records shaped like create_pretraining_data.py's: [CLS] at 0, sorted masked positions."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(4, seq)
        count = rng.randint(0, min(preds, length - 2))
        positions = sorted(rng.sample(range(1, length - 1), count))
        cut = rng.randint(1, length - 1)
        out.append(
            {
                "input_ids": [rng.randrange(30522) for _ in range(length)],
                "segment_ids": [0] * cut + [1] * (length - cut),
                "masked_lm_positions": positions,
                "masked_lm_ids": [rng.randrange(30522) for _ in positions],
                "next_sentence_label": rng.randint(0, 1),
            }
        )
    return out


def bitwise_crc32c(data: bytes) -> int:
    """Reference CRC-32C, bit by bit (reflected polynomial 0x82F63B78), independent of ours."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def decoded(buf: bytes) -> dict[str, np.ndarray]:
    """decode_example with every feature as an array (these tests use numeric features)."""
    return {name: np.asarray(v) for name, v in decode_example(buf).items()}


def spec_masked(data: bytes) -> int:
    crc = bitwise_crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# --------------------------------------------------------------------- independent byte checks

# RFC 3720 (iSCSI) appendix B.4 test vectors and the common "123456789" check value.
CRC_VECTORS = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
]


@pytest.mark.parametrize(("data", "expected"), CRC_VECTORS)
def test_crc32c_matches_published_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected
    assert _table_crc32c()(data) == expected  # the no-dependency fallback too
    assert bitwise_crc32c(data) == expected  # and the test's own reference


def test_masked_crc_follows_the_tfrecord_formula() -> None:
    for data in (b"", b"\x10" + bytes(7), b"hello tfrecord", bytes(range(256))):
        assert masked_crc32c(data) == spec_masked(data)


def test_example_encoding_matches_hand_computed_bytes() -> None:
    # Example{features{feature{key:"a" value{int64_list{value:[1,300]}}}}}, packed int64
    ints = bytes.fromhex("0a0e 0a0c 0a0161 1207 1a05 0a03 01ac02")
    assert encode_example({"a": [1, 300]}) == ints
    # FloatList [1.0, 0.0] is packed little-endian float32
    floats = bytes.fromhex("0a13 0a11 0a0177 120c 120a 0a08 0000803f 00000000")
    assert encode_example({"w": np.array([1.0, 0.0], np.float32)}) == floats
    both = encode_example({"a": [1, 300], "w": np.array([1.0, 0.0])})
    assert both == b"\x0a\x21" + ints[2:] + floats[2:]  # two map entries, in order
    assert decoded(ints)["a"].tolist() == [1, 300]


def test_tfrecord_framing_matches_hand_built_file(tmp_path: Path) -> None:
    payloads = [b"", b"abc", bytes(300)]
    path = tmp_path / "frames.tfrecord"
    assert write_tfrecord_payloads(path, payloads) == 3
    expected = b""
    for p in payloads:
        header = struct.pack("<Q", len(p))
        expected += header + struct.pack("<I", spec_masked(header))
        expected += p + struct.pack("<I", spec_masked(p))
    assert path.read_bytes() == expected
    assert list(iter_tfrecord_payloads(path)) == [(0, b""), (16, b"abc"), (35, bytes(300))]


def test_varints_known_bytes_and_round_trip() -> None:
    assert encode_varints([0, 1, 127, 128, 300]) == bytes.fromhex("00 01 7f 8001 ac02")
    assert encode_varints([-1]) == b"\xff" * 9 + b"\x01"
    values = np.array([0, 1, 127, 128, 16383, 16384, 2**31, 2**62, -1, -(2**63)], np.int64)
    assert decode_varints(encode_varints(values)).tolist() == values.tolist()
    assert decode_varints(b"").tolist() == []
    with pytest.raises(ExampleDecodeError, match="middle of a varint"):
        decode_varints(b"\x01\xac")  # the second varint never ends
    with pytest.raises(ExampleDecodeError, match="middle of a varint"):  # via the Example parser
        decode_example(bytes.fromhex("0a0d 0a0b 0a0161 1206 1a04 0a02 01ac"))


def test_unpacked_repeated_fields_decode_like_packed() -> None:
    # Int64List [1, 300] unpacked: each value tagged 0x08; FloatList [0.5] unpacked: tag 0x0D
    int_list = bytes.fromhex("0801 08ac02")
    float_list = bytes.fromhex("0d 0000003f")
    feature_i = b"\x1a" + bytes([len(int_list)]) + int_list
    feature_f = b"\x12" + bytes([len(float_list)]) + float_list
    entries = b""
    for key, feat in ((b"a", feature_i), (b"w", feature_f)):
        entry = b"\x0a\x01" + key + b"\x12" + bytes([len(feat)]) + feat
        entries += b"\x0a" + bytes([len(entry)]) + entry
    example = b"\x0a" + bytes([len(entries)]) + entries
    unpacked = decoded(example)
    packed = decoded(encode_example({"a": [1, 300], "w": np.array([0.5], np.float32)}))
    assert unpacked["a"].tolist() == packed["a"].tolist() == [1, 300]
    assert unpacked["w"].tolist() == packed["w"].tolist() == [0.5]


def _unpacked_bert_example(padded: dict[str, list[Any]]) -> bytes:
    """A BERT Example written with unpacked repeated fields, built by hand."""
    entries = b""
    for name, values in padded.items():
        if name == "masked_lm_weights":
            body = b"".join(b"\x0d" + struct.pack("<f", v) for v in values)
            feat = b"\x12" + encode_varints([len(body)]) + body
        else:
            body = b"".join(b"\x08" + encode_varints([v]) for v in values)
            feat = b"\x1a" + encode_varints([len(body)]) + body
        entry = b"\x0a" + bytes([len(name)]) + name.encode() + b"\x12"
        entry += encode_varints([len(feat)]) + feat
        entries += b"\x0a" + encode_varints([len(entry)]) + entry
    return b"\x0a" + encode_varints([len(entries)]) + entries


def test_read_tfrecord_accepts_unpacked_examples(tmp_path: Path) -> None:
    records = make_records(3, seed=5)
    payloads = []
    for r in records:
        n, k = len(r["input_ids"]), len(r["masked_lm_positions"])
        payloads.append(
            _unpacked_bert_example(
                {
                    "input_ids": r["input_ids"] + [0] * (SEQ - n),
                    "input_mask": [1] * n + [0] * (SEQ - n),
                    "segment_ids": r["segment_ids"] + [0] * (SEQ - n),
                    "masked_lm_positions": r["masked_lm_positions"] + [0] * (PREDS - k),
                    "masked_lm_ids": r["masked_lm_ids"] + [0] * (PREDS - k),
                    "masked_lm_weights": [1.0] * k + [0.0] * (PREDS - k),
                    "next_sentence_labels": [r["next_sentence_label"]],
                }
            )
        )
    path = tmp_path / "unpacked.tfrecord"
    write_tfrecord_payloads(path, payloads)
    assert list(read_tfrecord(path)) == records


# --------------------------------------------------------------------- TFRecord round trips


def test_tfrecord_example_has_googles_layout(tmp_path: Path) -> None:
    rec = make_records(1, seed=3)[0]
    path = tmp_path / "one.tfrecord"
    write_tfrecord(path, [rec], SEQ, PREDS)
    ((_, payload),) = list(iter_tfrecord_payloads(path))
    ex = decoded(payload)
    assert list(ex) == [
        "input_ids",
        "input_mask",
        "segment_ids",
        "masked_lm_positions",
        "masked_lm_ids",
        "masked_lm_weights",
        "next_sentence_labels",
    ]
    n, k = len(rec["input_ids"]), len(rec["masked_lm_positions"])
    assert ex["input_ids"].tolist() == rec["input_ids"] + [0] * (SEQ - n)
    assert ex["input_mask"].tolist() == [1] * n + [0] * (SEQ - n)
    assert ex["masked_lm_positions"].tolist() == rec["masked_lm_positions"] + [0] * (PREDS - k)
    assert ex["masked_lm_weights"].dtype == np.float32
    assert ex["masked_lm_weights"].tolist() == [1.0] * k + [0.0] * (PREDS - k)
    assert ex["next_sentence_labels"].tolist() == [rec["next_sentence_label"]]


@pytest.mark.parametrize("block_size", [1, 7, 1024])
def test_tfrecord_round_trip(tmp_path: Path, block_size: int) -> None:
    records = make_records(40)
    path = tmp_path / "data.tfrecord"
    assert write_tfrecord(path, records, SEQ, PREDS) == 40
    assert list(read_tfrecord(path, block_size=block_size)) == records
    got = read_tfrecord(path, max_seq_length=SEQ, max_predictions_per_seq=PREDS)
    assert list(got) == records


def test_gzip_tfrecord(tmp_path: Path) -> None:
    records = make_records(25, seed=1)
    plain, packed = tmp_path / "a.tfrecord", tmp_path / "a.tfrecord.gz"
    write_tfrecord(plain, records, SEQ, PREDS)
    write_tfrecord(packed, records, SEQ, PREDS)
    assert packed.read_bytes()[:2] == b"\x1f\x8b"
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert list(iter_records(packed)) == records


# --------------------------------------------------------------------- TFRecord bad input


def test_crc_corruption_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "bad.tfrecord"
    write_tfrecord(path, make_records(3), SEQ, PREDS)
    offsets = [off for off, _ in iter_tfrecord_payloads(path)]
    data = bytearray(path.read_bytes())
    data[offsets[1] + 12 + 5] ^= 0x01  # one bit inside the second record's data
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordError, match=rf"bad\.tfrecord.*data CRC.*offset {offsets[1]}\b"):
        list(read_tfrecord(path))
    data[offsets[1] + 12 + 5] ^= 0x01
    data[offsets[2]] ^= 0x01  # the third record's length field
    path.write_bytes(bytes(data))
    with pytest.raises(TFRecordError, match=rf"length CRC.*offset {offsets[2]}\b"):
        list(read_tfrecord(path))


@pytest.mark.parametrize("cut", [1, 5, 30])
def test_truncated_tfrecord_is_detected(tmp_path: Path, cut: int) -> None:
    path = tmp_path / "cut.tfrecord"
    write_tfrecord(path, make_records(4), SEQ, PREDS)
    last = [off for off, _ in iter_tfrecord_payloads(path)][-1]
    path.write_bytes(path.read_bytes()[:-cut])
    with pytest.raises(TFRecordError, match=rf"cut\.tfrecord: truncated.*offset {last}\b"):
        list(read_tfrecord(path))
    head = tmp_path / "head.tfrecord"
    head.write_bytes(path.read_bytes()[: last + 7])  # inside the last header
    with pytest.raises(TFRecordError, match=r"truncated.*7 of 12 bytes"):
        list(read_tfrecord(head))


def test_truncated_gzip_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "cut.tfrecord.gz"
    write_tfrecord(path, make_records(30), SEQ, PREDS)
    path.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(TFRecordError, match=r"cut\.tfrecord\.gz"):
        list(read_tfrecord(path))


def test_missing_feature_is_named(tmp_path: Path) -> None:
    path = tmp_path / "nomask.tfrecord"
    write_tfrecord_payloads(path, [encode_example({"input_ids": [101, 102]})])
    with pytest.raises(
        TFRecordError, match=r"nomask\.tfrecord.*offset 0 has no feature 'input_mask'"
    ):
        list(read_tfrecord(path))


def test_padded_lengths_must_match_declared_and_each_other(tmp_path: Path) -> None:
    path = tmp_path / "mixed.tfrecord"
    write_tfrecord(path, make_records(2), SEQ, PREDS)
    with pytest.raises(TFRecordError, match="'input_ids' but max_seq_length is 64"):
        list(read_tfrecord(path, max_seq_length=64))
    with pytest.raises(TFRecordError, match="max_predictions_per_seq is 9"):
        list(read_tfrecord(path, max_predictions_per_seq=9))
    first = path.read_bytes()
    write_tfrecord(path, make_records(1), SEQ * 2, PREDS)
    path.write_bytes(first + path.read_bytes())  # second-file record has another width
    offsets = [off for off, _ in iter_tfrecord_payloads(path)]
    with pytest.raises(TFRecordError, match=rf"offset {offsets[2]} has {SEQ * 2} values"):
        list(read_tfrecord(path))


def test_writer_rejects_records_that_do_not_fit_and_leaves_no_file(tmp_path: Path) -> None:
    records = make_records(5)
    records[3]["input_ids"] = list(range(SEQ + 1))
    path = tmp_path / "long.tfrecord"
    with pytest.raises(TFRecordError, match=r"record 3: the record has 33 tokens.*max_seq_length"):
        write_tfrecord(path, records, SEQ, PREDS)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------- HDF5


def test_hdf5_has_nvidia_layout_and_round_trips(tmp_path: Path) -> None:
    records = make_records(30, seed=2)
    path = tmp_path / "shard.hdf5"
    assert write_hdf5(path, records, SEQ, PREDS, block_rows=8) == 30
    with h5py.File(path, "r") as f:
        layout = {name: (f[name].dtype.str, f[name].shape) for name in f}
    assert layout == {
        "input_ids": ("<i4", (30, SEQ)),
        "input_mask": ("|i1", (30, SEQ)),
        "segment_ids": ("|i1", (30, SEQ)),
        "masked_lm_positions": ("<i4", (30, PREDS)),
        "masked_lm_ids": ("<i4", (30, PREDS)),
        "next_sentence_labels": ("|i1", (30,)),
    }
    assert list(read_hdf5(path)) == records


def test_hdf5_written_like_nvidia_reads_back(tmp_path: Path) -> None:
    """A shard made directly with h5py the way NVIDIA's script does (no omnibert writer)."""
    path = tmp_path / "nv.hdf5"
    with h5py.File(path, "w") as f:
        f.create_dataset("input_ids", data=[[101, 7, 8, 102, 0, 0], [101, 9, 102, 5, 102, 0]], dtype="i4", compression="gzip")  # fmt: skip
        f.create_dataset("input_mask", data=[[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]], dtype="i1")
        f.create_dataset("segment_ids", data=[[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 1, 0]], dtype="i1")
        f.create_dataset("masked_lm_positions", data=[[2, 0, 0], [1, 3, 0]], dtype="i4")
        f.create_dataset("masked_lm_ids", data=[[42, 0, 0], [11, 12, 0]], dtype="i4")
        f.create_dataset("next_sentence_labels", data=[0, 1], dtype="i1")
    assert list(read_hdf5(path)) == [
        {
            "input_ids": [101, 7, 8, 102],
            "segment_ids": [0, 0, 0, 0],
            "masked_lm_positions": [2],
            "masked_lm_ids": [42],
            "next_sentence_label": 0,
        },
        {
            "input_ids": [101, 9, 102, 5, 102],
            "segment_ids": [0, 0, 0, 1, 1],
            "masked_lm_positions": [1, 3],
            "masked_lm_ids": [11, 12],
            "next_sentence_label": 1,
        },
    ]


@pytest.mark.parametrize("chunk_rows", [1, 7, 30, 1000])
def test_hdf5_chunked_reading_across_boundaries(
    tmp_path: Path, chunk_rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    records = make_records(30, seed=4)
    path = tmp_path / "chunks.h5"
    write_hdf5(path, records, SEQ, PREDS)
    sizes: list[int] = []
    original = h5py.Dataset.__getitem__

    def spy(self: h5py.Dataset, key: Any) -> Any:
        out = original(self, key)
        sizes.append(len(out))
        return out

    monkeypatch.setattr(h5py.Dataset, "__getitem__", spy)
    assert list(read_hdf5(path, chunk_rows=chunk_rows)) == records
    assert max(sizes) == min(chunk_rows, 30)  # never more than one chunk in memory


def test_hdf5_bad_input(tmp_path: Path) -> None:
    records = make_records(20)
    path = tmp_path / "s.hdf5"
    write_hdf5(path, records, SEQ, PREDS)
    with pytest.raises(HDF5FormatError, match=r"s\.hdf5.*padded to 32 but max_seq_length is 128"):
        list(read_hdf5(path, max_seq_length=128))
    with pytest.raises(HDF5FormatError, match="max_predictions_per_seq is 20"):
        list(read_hdf5(path, max_predictions_per_seq=20))
    with h5py.File(path, "a") as f:
        del f["masked_lm_ids"]
    with pytest.raises(HDF5FormatError, match=r"s\.hdf5: no dataset masked_lm_ids"):
        list(read_hdf5(path))
    cut = tmp_path / "cut.hdf5"
    write_hdf5(cut, records, SEQ, PREDS)
    cut.write_bytes(cut.read_bytes()[:1000])
    with pytest.raises(HDF5FormatError, match=r"cut\.hdf5"):
        list(read_hdf5(cut))
    zero = make_records(2)
    zero[1]["masked_lm_positions"][0:1] = [0]
    zero[1]["masked_lm_ids"][0:1] = [5]
    with pytest.raises(HDF5FormatError, match="record 1: it masks position 0"):
        write_hdf5(tmp_path / "zero.hdf5", zero, SEQ, PREDS)
    assert not (tmp_path / "zero.hdf5").exists()


def test_hdf5_broken_mask_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "m.hdf5"
    write_hdf5(path, make_records(10), SEQ, PREDS)
    with h5py.File(path, "a") as f:
        mask = f["input_mask"][:]
        mask[6, 1] = 0  # a hole in the mask
        f["input_mask"][:] = mask
    with pytest.raises(HDF5FormatError, match="row 6: input_mask is not ones followed by zeros"):
        list(read_hdf5(path, chunk_rows=4))


# --------------------------------------------------------------------- both formats, Arrow


def test_cross_format_equality_and_arrow_conversion(tmp_path: Path) -> None:
    records = make_records(40, seed=7)
    tfr, h5 = tmp_path / "x.tfrecords", tmp_path / "x.h5"
    write_tfrecord(tfr, records, SEQ, PREDS)
    write_hdf5(h5, records, SEQ, PREDS)
    assert list(iter_records(tfr)) == list(iter_records(h5)) == records
    ds = convert_to_arrow([tfr, h5], tmp_path / "arrow", max_seq_length=SEQ)
    assert ds.features == arrow_features(None, SEQ)
    assert ds.features["masked_lm_positions"].feature.dtype == "uint16"
    meta = json.loads((tmp_path / "arrow" / "metadata.json").read_text())
    assert meta["counts"]["instances"] == len(ds)
    assert sum(meta["sequence_length_histogram"]) == len(ds)
    assert meta["sequence_length_histogram"][len(ds[0]["input_ids"])] >= 1
    assert ds.features["segment_ids"].feature.dtype == "int8"
    assert ds.features["input_ids"].feature.dtype == "int32"
    assert ds.to_list() == records + records
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".arrow")] == []


def test_arrow_conversion_reports_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tfrecord"
    write_tfrecord(bad, make_records(3), SEQ, PREDS)
    bad.write_bytes(bad.read_bytes()[:-3])
    with pytest.raises(TFRecordError, match=r"bad\.tfrecord: truncated"):
        convert_to_arrow([bad], tmp_path / "out")
    with pytest.raises(ValueError, match="unknown pretraining data format"):
        iter_records(tmp_path / "data.parquet")
