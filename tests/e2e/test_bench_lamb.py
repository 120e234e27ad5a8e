"""``scripts/bench_lamb.py`` on the CPU with the tiny parameter set: an implementation that
fails (one that cannot be built, the Triton kernel without a GPU) is recorded with its error
while the others are timed; the JSON is rewritten after every stage; each implementation's
time is set against the 44 B/param floor at the copy bandwidth measured in the run."""

from __future__ import annotations

import json

import pytest
import torch


def test_bench_lamb_records_failures_and_writes_after_every_stage(tmp_path, monkeypatch):
    import bench_lamb

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the kernel must not run on the CPU
    out = tmp_path / "lamb.json"
    seen = []

    def bandwidth(device, numel=0, repeats=0):  # a fixed 10 GB/s; what is on disk by then
        seen.append(json.loads(out.read_text()))
        return 10e9

    monkeypatch.setattr(bench_lamb, "copy_bandwidth", bandwidth)
    results = bench_lamb.main(
        ["--smoke", "--impls", "foreach", "bogus", "triton", "--steps", "1", "--json", str(out),
         "--results-dir", str(tmp_path / "records")]
    )  # fmt: skip
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["status"] == "done"
    assert (results["model"], results["device"], results["rounds"]) == ("tiny", "cpu", 2)  # smoke
    errors = results["errors"]
    assert set(errors) == {"bogus", "triton"}
    assert errors["bogus"].startswith("building it: ValueError")
    assert errors["triton"].startswith("in its first step: ")  # no GPU: the kernel cannot run
    # one bandwidth measurement before the first steps, one before each round
    assert len(seen) == 3 and all(s["status"] == "running" for s in seen)
    assert seen[1]["errors"] == errors and list(seen[1]["first_step_seconds"]) == ["foreach"]
    assert len(seen[2]["ms_per_step"]["foreach"]) == 1  # the first round, written
    assert list(results["summary"]) == ["foreach"]
    foreach = results["summary"]["foreach"]
    floor_ms = 44 * results["parameters"] / 10e9 * 1e3
    assert results["floor_ms"] == pytest.approx(floor_ms)
    assert foreach["x_floor"] == pytest.approx(foreach["ms_per_step"] / floor_ms)
    assert len(results["ms_per_step"]["foreach"]) == 2
    record = json.loads((tmp_path / "records" / "lamb-tiny.json").read_text())
    assert "failed: bogus, triton" in record["headline"]


def test_the_floor_takes_the_probes_bandwidth_when_given(tmp_path, monkeypatch):
    """``--bandwidth-from``: the floor at the GPU probe's copy bandwidth (what the lease's
    other records are read against), its own measurement still recorded; a probe JSON
    without a measured bandwidth is refused in one sentence."""
    import bench_lamb

    monkeypatch.setattr(bench_lamb, "copy_bandwidth", lambda device, numel=0, repeats=0: 10e9)
    probe = tmp_path / "probe.json"
    probe.write_text(json.dumps({"ceilings": {"status": "ok", "detail": {
        "copy_GBps_read_plus_write": 3010.0, "bf16_matmul_TFLOPs": 796.0}}}))  # fmt: skip
    results = bench_lamb.main(
        ["--smoke", "--impls", "foreach", "--steps", "1", "--json", str(tmp_path / "l.json"),
         "--bandwidth-from", str(probe), "--results-dir", str(tmp_path / "records")]
    )  # fmt: skip
    assert results["copy_bandwidth_bytes_per_s"] == 3010e9
    assert results["copy_bandwidths_bytes_per_s"] == [10e9] * 3  # its own, recorded beside
    assert results["floor_ms"] == pytest.approx(44 * results["parameters"] / 3010e9 * 1e3)
    assert results["floor_bandwidth_source"].startswith(f"gpu_probe ({probe}")
    record = json.loads((tmp_path / "records" / "lamb-tiny.json").read_text())
    assert record["measurements"]["floor_bandwidth_source"] == results["floor_bandwidth_source"]
    probe.write_text(json.dumps({"ceilings": {"status": "skipped", "detail": "no CUDA device"}}))
    with pytest.raises(SystemExit, match="holds no measured copy bandwidth"):
        bench_lamb.main(["--smoke", "--bandwidth-from", str(probe)])


def test_bench_lamb_per_rank_mode_times_unsharded_and_zero1_updates(tmp_path):
    """``--ranks 2``: two real processes (gloo), each timing its share of the tiny set's LAMB
    update against the whole update; the shares cover the set, the state per rank is smaller
    than the whole, and the record says it is a CPU measurement."""
    import bench_lamb
    from bench_lamb import bert_shapes

    out = tmp_path / "ranks.json"
    results = bench_lamb.main(
        ["--smoke", "--ranks", "2", "--rounds", "1", "--steps", "1", "--json", str(out),
         "--results-dir", str(tmp_path / "records")]
    )  # fmt: skip
    assert json.loads(out.read_text())["status"] == "done"
    (row,) = results["ranks"].values()
    raw = results["raw"]["2"]
    total = sum(torch.Size(shape).numel() for shape in bert_shapes("tiny"))
    assert sum(raw["elements_per_rank"]) == total and row["max_elements_per_rank"] < total
    assert row["max_state_bytes_per_rank"] < row["unsharded_state_bytes"] == 8 * total
    assert len(raw["zero1_update"][0]) == 2  # both ranks timed, one at a time
    for key in ("unsharded_update_ms", "zero1_update_ms", "zero1_step_ms", "broadcast_ms"):
        assert row[key] > 0, key
    record = json.loads((tmp_path / "records" / "lamb-ranks-tiny-cpu.json").read_text())
    assert [r[0] for r in record["tables"][0]["rows"]] == ["2"]
    assert any("A CPU measurement" in note for note in record["notes"])
