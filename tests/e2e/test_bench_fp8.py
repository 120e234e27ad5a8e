"""``scripts/bench_fp8.py`` (the fp8 convergence pair) runs end to end on the CPU with
torchao's emulated fp8 (``--smoke``), so the lease's command cannot rot: both curves, the
tolerance printed before anything runs, the JSON, the record and its figure; ``--deadline``
stops both sides at the same step; the verdict's arithmetic."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
import bench_fp8

#: a tiny model gains nothing from more intra-op threads on a shared CPU
ONE_THREAD = ("--override", "accelerator.threads=1")


def run_smoke(tmp_path: Path, *flags: str) -> dict:
    threads = torch.get_num_threads()
    try:
        return bench_fp8.main(["--smoke", "--json", str(tmp_path / "pair.json"), "--results-dir",
                               str(tmp_path / "records"), *ONE_THREAD, *flags])  # fmt: skip
    finally:
        torch.set_num_threads(threads)


def test_the_smoke_pair_runs_both_sides_on_the_same_batches_and_writes_its_record(
    tmp_path, capsys
) -> None:
    results = run_smoke(tmp_path)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("bench_fp8: tolerance (stated before the run): fp8's mean")
    saved = json.loads((tmp_path / "pair.json").read_text())
    assert saved["status"] == "done" and saved["steps_run"] == saved["steps_planned"] == 16
    assert saved["device"] == "cpu" and saved["emulate"] is True
    assert saved["torch"] == torch.__version__ and saved["torchao"].startswith("0.18")
    assert saved["tolerance"]["relative"] == bench_fp8.TOLERANCE
    bf16, fp8 = saved["bf16"], saved["fp8"]
    assert bf16["precision"] == "bf16-mixed" and fp8["precision"] == "fp8"
    assert len(bf16["loss"]) == len(fp8["loss"]) == 16
    # the same weights and batches: the first step's losses differ by fp8's rounding only
    assert fp8["loss"][0] == pytest.approx(bf16["loss"][0], rel=0.01)
    assert fp8["loss"] != bf16["loss"]  # but fp8 did run
    assert bf16["real_tokens_per_sec"] > 0 and fp8["real_tokens_per_sec"] > 0
    assert (
        saved["float8"]["fp8_layers"]
        and "cls.predictions.decoder" in saved["float8"]["bf16_layers"]
    )
    comparison = saved["comparison"]
    assert (
        comparison["verdict"] in ("pass", "fail", "inconclusive") and comparison["tail_steps"] == 6
    )
    assert comparison == results["comparison"]
    record = json.loads((tmp_path / "records" / "fp8-tiny-seq32-smoke.json").read_text())
    assert record["headline"].startswith(comparison["verdict"])
    assert (tmp_path / "records" / "fp8-tiny-seq32-smoke.svg").read_text().startswith("<?xml")


def test_a_deadline_stops_both_sides_at_the_same_step(tmp_path) -> None:
    results = run_smoke(tmp_path, "--deadline", "0.001")  # after the first chunk pair
    assert results["stopped_by_deadline"] is True
    assert len(results["bf16"]["loss"]) == len(results["fp8"]["loss"]) == results["steps_run"] == 4
    assert results["comparison"]["verdict"] == "inconclusive"  # 4 steps: no tail


def test_the_verdict() -> None:
    falling = [10.0 - 0.05 * i for i in range(100)]
    close = [x * 1.005 for x in falling]
    far = [x * 1.03 for x in falling]
    assert bench_fp8.compare(falling, close, warmup=20, tail=50)["verdict"] == "pass"
    failed = bench_fp8.compare(falling, far, warmup=20, tail=50)
    assert failed["verdict"] == "fail" and failed["relative_difference"] == pytest.approx(0.03)
    flat = [10.0] * 100
    assert bench_fp8.compare(flat, flat, warmup=20, tail=50)["verdict"] == "inconclusive"
    assert bench_fp8.compare(falling, [float("nan")] * 100, 20, 50)["verdict"] == "fail"
    short = bench_fp8.compare(falling[:30], close[:30], warmup=20, tail=50)
    assert short["tail_steps"] == 10 and short["verdict"] == "pass"


def test_the_lease_preset_refuses_a_cpu() -> None:
    with pytest.raises(SystemExit, match=r"--lease is the GPU's run.*--smoke"):
        bench_fp8.parse(["--lease", "--device", "cpu"])
    lease = bench_fp8.parse(["--lease", "--device", "cuda"])
    assert (lease.model, lease.seq, lease.packing, lease.steps) == ("large", 512, "online", 200)
    assert lease.phase == "phase2" and lease.emulate is False and lease.tail == 50


def test_the_lease_text_is_prepared_by_omnibert_prepare_and_both_sides_read_it(
    tmp_path, monkeypatch
) -> None:
    """``--text stdlib`` (the lease's data): the corpus is prepared into shards at the pair's
    sequence length by omnibert-prepare, with masks enough for 15 % of a full sequence, and
    both sides train on those shards (the model's vocab is the one trained on the text). The
    corpus here is this repository's docs, one sentence per line, for seconds instead of the
    standard library's docstrings."""
    from omnibert.prepare import corpus as corpus_module

    root = Path(__file__).parents[2] / "docs"
    sentences = [
        line.strip()
        for page in sorted(root.rglob("*.md"))
        for line in page.read_text().splitlines()
        if len(line.split()) >= 6 and not line.lstrip().startswith(("|", "`", "<", "#"))
    ]

    class Corpus:
        def __init__(self, path: Path, documents: int) -> None:
            self.python_version, self.train_files, self.num_train_documents = (
                "docs",
                [path],
                documents,
            )

    def build(out_dir: Path, num_train_files: int = 2) -> Corpus:
        out_dir.mkdir(parents=True)
        docs = [sentences[i : i + 4] for i in range(0, len(sentences), 4)]
        path = out_dir / "train.txt"
        path.write_text("\n\n".join("\n".join(doc) for doc in docs) + "\n")
        return Corpus(path, len(docs))

    monkeypatch.setattr(corpus_module, "build_embedded_corpus", build)
    results = run_smoke(tmp_path, "--text", "stdlib")
    text = results["text"]
    assert text["seq"] == 32 and text["max_predictions_per_seq"] == 5 >= 0.15 * 32
    assert text["instances"] > 16 * 4 and text["documents"] > 100
    assert results["steps_run"] == 16 and results["status"] == "done"
    bf16, fp8 = results["bf16"]["loss"], results["fp8"]["loss"]
    assert all(map(math.isfinite, bf16 + fp8)) and fp8[0] == pytest.approx(bf16[0], rel=0.01)
