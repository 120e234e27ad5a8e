"""``scripts/bench_gpu.py --smoke`` runs end to end (tiny model, CPU, a few steps) so the GPU
benchmark cannot rot while no GPU runs it; the peak table names the published devices."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[1] / "scripts" / "bench_gpu.py"


def test_bench_gpu_smoke_runs_both_layouts_and_writes_its_json(tmp_path):
    out = tmp_path / "bench.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--json", str(out), "--results-dir",
         str(tmp_path / "records")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "ratio omnibert/hf (median of rounds)" in done.stdout
    results = json.loads(out.read_text())
    cases = {case["packing"]: case for case in results["cases"]}
    assert set(cases) == {"none", "online"}
    for case in cases.values():
        assert case["seq"] == 32 and case["precision"] == "32-true" and case["device"] == "cpu"
        assert case["kernels"]["optimizer"].startswith("LAMB ")  # omnibert's, for both
        for name in ("omnibert", "hf"):
            speed = case[name]
            assert speed["sequences_per_sec"] > 0 and speed["real_tokens_per_sec"] > 0
            assert len(speed["rounds_seconds"]) == 2
            assert speed["mfu"] is None and speed["peak_memory_bytes"] is None  # CPU
        assert case["ratio_sequences_per_sec"] > 0
        assert case["hf"]["sequences_per_step"] == case["micro_batch"]  # unpacked rows
    # uniform lengths 5..32: packed rows hold more than one sequence each
    assert cases["online"]["omnibert"]["sequences_per_step"] > cases["online"]["micro_batch"]
    assert cases["none"]["omnibert"]["sequences_per_step"] == cases["none"]["micro_batch"]
    assert "published" not in cases["none"]  # the published figures are for seq 512
    record = json.loads((tmp_path / "records" / "gpu-tiny-smoke.json").read_text())
    assert [row[0] for row in record["tables"][0]["rows"]] == ["seq 32, none", "seq 32, online"]
    assert record["measurements"]["cases"] == results["cases"]


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("Some Future GPU", None),
    ],
)
def test_peak_table(name, peak):
    from bench_gpu import peak_for_name

    assert peak_for_name(name) == peak
