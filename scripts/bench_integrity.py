"""What the data integrity checks cost, each against its peer measured in the same run.

1. ``data.verify_checksums=auto`` at start: CRC-32C of an Arrow-sized file
   (:func:`omnibert.data.integrity.crc32c_file`) against only reading its bytes the same way
   (the floor any check that looks at every byte pays), first with the file in the page
   cache, then after dropping it from the cache where the OS lets us (``posix_fadvise``).
2. The batch range checks: :class:`~omnibert.data.collate.PretrainingCollator` with
   ``vocab_size`` (every id, segment, position and label range-checked) against the same
   collator without it, on the same rows.

Each check and its peer are the two peers of the harness's rounds (:mod:`benchharness`: their
order alternates; the best round of each is kept; the file is dropped from the cache before
each region of the cold round). Writes ``integrity.json`` and ``integrity.svg`` (seconds per
GiB and milliseconds per batch, each check beside its peer) to ``--results-dir``.

    python scripts/bench_integrity.py --mib 1024 --rows 256 --seq 128 --repeat 30
"""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchplot
import numpy as np
from benchharness import run_rounds


def _read_only(path: Path, chunk: int = 8 << 20) -> int:
    total = 0
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            total += len(block)
    return total


def _drop_cache(path: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())
        os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    return True


def _best(peers: dict[str, Callable[[], Any]], repeat: int, **hooks: Any) -> dict[str, float]:
    """The best round of each of ``peers`` over ``repeat`` harness rounds (a CPU: no
    device to synchronise)."""
    rounds = run_rounds({name: (lambda turn, fn=fn: fn()) for name, fn in peers.items()},
                        rounds=repeat, sync=None, **hooks)  # fmt: skip
    return {name: min(rounds.seconds(name)) for name in peers}


def bench_checksum(mib: int, repeat: int) -> dict[str, float]:
    from omnibert.data.integrity import crc32c_file

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "data-00000-00000.arrow"
        rng = np.random.default_rng(0)
        with open(path, "wb") as handle:
            for _ in range(mib):
                handle.write(rng.integers(0, 256, 1 << 20, dtype=np.uint8).tobytes())
        gib = mib / 1024
        best = _best({"read": lambda: _read_only(path), "crc": lambda: crc32c_file(path)}, repeat)
        read, crc = best["read"], best["crc"]
        out = {"read_s_per_gib": read / gib, "crc_s_per_gib": crc / gib}
        print(f"page cache, {mib} MiB: read {read:.3f} s ({gib / read:.2f} GiB/s), CRC-32C "
              f"{crc:.3f} s ({gib / crc:.2f} GiB/s), CRC/read {crc / read:.2f}x, "
              f"{crc / gib:.3f} s per GiB")  # fmt: skip
        if _drop_cache(path):
            cold = _best({"read": lambda: _read_only(path), "crc": lambda: crc32c_file(path)},
                         1, before_region=lambda name, turn: _drop_cache(path))  # fmt: skip
            cold_read, cold_crc = cold["read"], cold["crc"]
            print(f"dropped from the cache: read {cold_read:.3f} s, CRC-32C {cold_crc:.3f} s "
                  f"({cold_crc / gib:.3f} s per GiB), CRC/read {cold_crc / cold_read:.2f}x")  # fmt: skip
            out.update(cold_read_s_per_gib=cold_read / gib, cold_crc_s_per_gib=cold_crc / gib)
        return out


def bench_collate(rows: int, seq: int, repeat: int) -> dict[str, float]:
    import pyarrow as pa

    from omnibert.data.collate import PretrainingCollator
    from omnibert.data.rows import RowBlock

    rng = np.random.default_rng(0)
    preds = max(1, round(seq * 0.15))
    columns: dict[str, list[np.ndarray]] = {k: [] for k in ("input_ids", "segment_ids",
                                            "masked_lm_positions", "masked_lm_ids")}  # fmt: skip
    for _ in range(rows):
        n = int(rng.integers(seq // 2, seq + 1))
        positions = np.sort(rng.choice(np.arange(1, n), size=min(preds, n - 1), replace=False))
        columns["input_ids"].append(rng.integers(0, 30522, n).astype(np.uint16))
        columns["segment_ids"].append((np.arange(n) > n // 2).astype(np.int8))
        columns["masked_lm_positions"].append(positions.astype(np.uint16))
        columns["masked_lm_ids"].append(rng.integers(0, 30522, positions.size).astype(np.uint16))
    table = pa.table(
        {
            **{k: pa.array(v) for k, v in columns.items()},
            "next_sentence_label": pa.array(rng.integers(0, 2, rows).astype(np.int8)),
        }
    )
    batch = RowBlock(np.arange(rows, dtype=np.int64), table)  # what ArrowRows hands over
    plain = PretrainingCollator(seq, preds)
    checked = PretrainingCollator(seq, preds, vocab_size=30522)
    for collator in (plain, checked):  # warm up
        collator(batch)
    # alternating rounds, best of each: the machine's noise hits both alike
    best = _best({"plain": lambda: plain(batch), "checked": lambda: checked(batch)}, repeat)
    a, b = best["plain"], best["checked"]
    print(f"collate {rows} rows x {seq} tokens: without the id range checks {a * 1e3:.3f} ms, "
          f"with them {b * 1e3:.3f} ms, ratio {b / a:.3f}x")  # fmt: skip
    return {"collate_ms": a * 1e3, "collate_checked_ms": b * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    crc = bench_checksum(args.mib, args.repeat)
    collate = bench_collate(args.rows, args.seq, args.repeat * 6)
    fig, (left, right) = benchplot.figure(2)
    cold = "cold_crc_s_per_gib" in crc
    groups = ["page cache", *(["dropped from the cache"] if cold else [])]
    series = {
        "CRC-32C": [crc["crc_s_per_gib"], *([crc["cold_crc_s_per_gib"]] if cold else [])],
        "read only": [crc["read_s_per_gib"], *([crc["cold_read_s_per_gib"]] if cold else [])],
    }
    benchplot.draw_bars(
        left, f"verify_checksums on a {args.mib} MiB file", "seconds per GiB", groups, series,
        ratio_of=("CRC-32C", "read only"),
    )  # fmt: skip
    benchplot.draw_bars(
        right, f"collate {args.rows} rows x {args.seq} tokens", "ms per batch", ["collate"],
        {"range-checked": [collate["collate_checked_ms"]], "unchecked": [collate["collate_ms"]]},
    )  # fmt: skip
    ratio = crc["crc_s_per_gib"] / crc["read_s_per_gib"]
    check = collate["collate_checked_ms"] / collate["collate_ms"]
    record = benchplot.Record(
        name="integrity",
        title="What the data integrity checks cost against their peers (read only; unchecked)",
        headline=f"CRC-32C {crc['crc_s_per_gib']:.3f} s per GiB ({ratio:.2f}x a plain read, "
        f"page cache); range checks {check:.3f}x an unchecked collate",
        tables=[
            benchplot.Table(
                "seconds per GiB / ms per batch",
                ["measure", "value"],
                [[k, f"{v:.3f}"] for k, v in {**crc, **collate}.items()],
            )
        ],
        measurements={**crc, **collate, "mib": args.mib, "rows": args.rows, "seq": args.seq},
    )
    benchplot.save(record, fig, args.results_dir)


if __name__ == "__main__":
    main()
