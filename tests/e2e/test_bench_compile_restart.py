"""scripts/bench_compile_restart.py --smoke, so the measurement of a restart's time to its
first step cannot rot: the cold start compiles into its run directory's compile cache, the
same command started again in a fresh process (a restart) loads its step from there, and the
record holds both. The suite's only test that compiles with Inductor from an empty cache: the
smoke model's two graphs, one C++ file each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_restart_loads_the_step_its_first_start_compiled(tmp_path: Path) -> None:
    results, work = tmp_path / "results", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_compile_restart.py"), "--smoke",
         "--results-dir", str(results), "--work", str(work)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((results / "compile-restart-cpu.json").read_text())
    assert record["machine"]["cpu"] and record["machine"]["torch"]
    assert record["command"].endswith(
        "--smoke --results-dir " + str(results) + " --work " + str(work)
    )
    measured = record["measurements"]
    (cold,), (warm,) = measured["runs"]["cold"], measured["runs"]["warm"]
    cache = work / "runs" / "cold-round0" / "compile_cache"  # the run directory's, not /tmp's
    assert cold["cache_dir"] == warm["cache_dir"] == str(cache)
    assert any(path.is_file() for path in (cache / "fxgraph").rglob("*"))
    assert (
        cold["compile_cache"]
        == f"{cache} (the run directory; cold: empty, the first steps compile)"
    )
    assert (
        warm["compile_cache"]
        == f"{cache} (the run directory; warm: it holds an earlier compile's code)"
    )
    # the cold start compiled the forward and backward graphs; the restart read both
    assert cold["counters"]["inductor"] == {"fxgraph_cache_hit": 0, "fxgraph_cache_miss": 2}
    assert warm["counters"]["inductor"] == {"fxgraph_cache_hit": 2, "fxgraph_cache_miss": 0}
    assert cold["counters"]["aot_autograd"]["autograd_cache_miss"] == 1
    assert warm["counters"]["aot_autograd"] == {"autograd_cache_hit": 1, "autograd_cache_miss": 0}
    medians = measured["median_time_to_first_step_s"]
    assert medians == {"cold": cold["time_to_first_step_s"], "warm": warm["time_to_first_step_s"]}
    for run in (cold, warm):
        assert 0 < run["time_to_first_step_s"] < run["process_s"]
    assert measured["cold_over_warm"] == round(medians["cold"] / medians["warm"], 2)
    assert [row[0] for row in record["tables"][0]["rows"]] == ["cold", "warm"]
    assert (results / str(record["figure"])).is_file()
    assert f"({measured['cold_over_warm']:.2f}x)" in proc.stdout
