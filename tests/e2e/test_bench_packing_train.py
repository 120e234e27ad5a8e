"""scripts/bench_packing_train.py on the tiny model, so the packed-against-unpacked benchmark
cannot rot: both sides train on the same weights, the record holds each side's rates, the
fill and a note naming the attention that ran with what a packed row cost."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_benchmark_writes_both_sides_and_names_the_attention(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_packing_train.py"), "--model", "tiny",
         "--seq", "512", "--predictions", "76", "--batch", "2", "--rounds", "1", "--steps", "1",
         "--samples", "64", "--buffer", "64", "--precision", "fp32", "--threads", "1",
         "--results-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    record = json.loads((tmp_path / "packing-train-tiny-seq512.json").read_text())
    measured = record["measurements"]
    assert set(measured["rates"]) == {"packed", "unpacked"}
    assert measured["fill"]["online"] > measured["fill"]["none"]
    assert measured["sequences_per_step"]["none"] == 2.0
    assert measured["sequences_per_step"]["online"] > 2.0
    slots = measured["slots_per_s"]
    cost = slots["none"] / slots["online"]
    (note,) = record["notes"]
    assert note.startswith(f"slots/s unpacked {slots['none']:.1f}, packed {slots['online']:.1f}: "
                           f"a packed row took {cost:.2f}x an unpacked row's time (attention "
                           "varlen)")  # fmt: skip
    assert record["machine"]["torch"]
