"""scripts/bench_time_to_accuracy.py in its smoke mode, so the benchmark cannot rot: both sides
train bert-tiny a few steps on real prepared shards, at equal sequences per step, and the JSON
holds what the printed lines say."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = Path(__file__).parent / "fixtures" / "reference"


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    """`make demo`'s layout (train/, eval/, vocab.txt) from the reference fixture texts."""
    out = tmp_path_factory.mktemp("demo")
    settings = InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)
    prepare([str(REFERENCE / "wiki_like.txt")], bert_vocab_file, out / "train", settings,
            progress=False)  # fmt: skip
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out / "eval",
            InstanceSettings(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=1),
            progress=False)  # fmt: skip
    shutil.copy(bert_vocab_file, out / "vocab.txt")
    return out


def test_smoke_runs_both_sides_at_equal_sequences_per_step(demo_like, tmp_path):
    out = tmp_path / "results" / "time_to_accuracy.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_time_to_accuracy.py"), "--smoke",
         "--data", str(demo_like), "--results-dir", str(out.parent), "--batch", "16", "--threads", "1"],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "batch: 16 sequences a step on both sides" in proc.stdout
    report = json.loads(out.read_text())["measurements"]
    assert (out.parent / "time_to_accuracy.svg").read_text().startswith("<?xml")
    assert report["batch_unit"] == "sequences" and report["batch"] == 16
    (size,) = report["sizes"]
    assert size["size"] == "tiny"
    ours, theirs = size["omnibert"]["rounds"][0], size["huggingface"]["rounds"][0]
    # packed rows hold several sequences: fewer rows, about the peer's 16 sequences a step
    assert ours["rows_per_step"] < 16
    per_row = ours["sequences_per_step"] / ours["rows_per_step"]
    assert abs(ours["sequences_per_step"] - 16) <= per_row / 2 + 1e-6
    assert theirs["rows_per_step"] == theirs["sequences_per_step"] == 16
    # smoke mode evaluates at step 8 against a 1e-6 target: a side that got any token right
    # stops there, one that did not runs its 12 steps and reports its best evaluation
    for name, side in (("omnibert", ours), ("huggingface", theirs)):
        assert side["curve"], name
        accuracies = [point[3] for point in side["curve"]]
        if side["seconds"] is not None:
            assert accuracies[-1] >= 1e-6 and side["seconds"] > 0
            assert side["seconds"] == pytest.approx(side["curve"][-1][0])
            assert f"{side['seconds']:.1f} s to target" in proc.stdout
        else:
            assert max(accuracies) < 1e-6 and side["steps"] == 12
            assert f"missed the target (best {max(accuracies):.4f}" in proc.stdout
        assert side["samples"] >= report["eval_every"]
    reached = [size[s]["median_seconds"] is not None for s in ("omnibert", "huggingface")]
    if all(reached):
        assert size["ratio"] == pytest.approx(
            size["huggingface"]["median_seconds"] / size["omnibert"]["median_seconds"]
        )
        assert f"omnibert {size['ratio']:.2f}x faster" in proc.stdout
    else:
        assert size["ratio"] is None and "no ratio: omnibert reached the target in" in proc.stdout


def test_medians_ratio_and_misses_are_reported_as_measured():
    import bench_time_to_accuracy as bench

    def run(seconds, samples, steps, accuracies):
        curve = [
            (10.0 * (i + 1), 1600 * (i + 1), 50 * (i + 1), a) for i, a in enumerate(accuracies)
        ]
        return {"seconds": seconds, "samples": samples, "steps": steps, "rows_per_step": 19,
                "sequences_per_step": 32.5, "curve": curve}  # fmt: skip

    size = bench.SIZES["tiny"]
    ours = [run(30.0, 8000, 247, [0.05, 0.11]), run(20.0, 6400, 197, [0.1]),
            run(40.0, 9600, 296, [0.1])]  # fmt: skip
    theirs = [run(100.0, 8000, 250, [0.1]), run(120.0, 8000, 250, [0.1]),
              run(110.0, 8000, 250, [0.1])]  # fmt: skip
    result = bench.summarise("tiny", size, {"omnibert": ours, "huggingface": theirs})
    assert result["omnibert"]["median_seconds"] == 30.0
    assert result["huggingface"]["median_seconds"] == 110.0
    assert result["ratio"] == pytest.approx(110.0 / 30.0)
    assert result["omnibert"]["median_steps"] == 247
    assert "30.0 s to target, 8,000 sequences, 247 steps (19 rows ≈ 32.5" in bench.describe(
        "omnibert", 0, ours[0]
    )
    # one missed round: no median, no ratio, and the miss says how far it got
    missed = run(None, 32000, 1000, [0.04, 0.081, 0.07])
    result = bench.summarise("tiny", size, {"omnibert": [*ours[:2], missed], "huggingface": theirs})
    assert result["omnibert"]["median_seconds"] is None and result["ratio"] is None
    assert result["omnibert"]["reached"] == 2
    assert result["omnibert"]["best"][2] == (0.081, 100)
    assert "missed the target (best 0.0810 at step 100)" in bench.describe("omnibert", 2, missed)
