"""``scripts/benchharness.py``, the one harness of the benchmarks: the order of the peers
alternates (two) or rotates (more); the device is synchronised around every timed region and
nowhere else; warm-up passes are reported, never counted; a deadline cuts the rounds but
keeps one; a failing peer is dropped with its rounds kept; the JSON is written atomically and
a SIGTERM leaves it marked as interrupted; explicit flags win over the presets, the presets
over the defaults. No timing is asserted: a fake clock stands in where time matters."""

from __future__ import annotations

import argparse
import json
import os
import signal
from pathlib import Path

import benchharness as bh
import pytest


class Clock:
    """A clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording(events: list[str], name: str, value: object = None):
    def peer(turn: bh.Turn) -> object:
        events.append(f"{name}:{turn.tag}")
        return value if value is not None else turn.index

    return peer


def test_two_peers_alternate_and_more_rotate():
    events: list[str] = []
    two = bh.run_rounds({"a": recording(events, "a"), "b": recording(events, "b")}, rounds=4,
                        sync=None)  # fmt: skip
    assert two.orders == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert events == ["a:round0", "b:round0", "b:round1", "a:round1", "a:round2", "b:round2",
                      "b:round3", "a:round3"]  # fmt: skip
    three = bh.run_rounds({n: recording([], n) for n in "xyz"}, rounds=4, sync=None)
    assert three.orders == [list("xyz"), list("yzx"), list("zxy"), list("xyz")]
    assert three.values("y") == [0, 1, 2, 3] and len(three.seconds("z")) == 4
    assert three.rounds == 4 and not three.cut_by_deadline


def test_the_device_is_synchronised_around_every_timed_region_and_only_there():
    events: list[str] = []
    rounds = bh.run_rounds(
        {"a": recording(events, "a"), "b": recording(events, "b")},
        rounds=2,
        warmup=1,
        sync=lambda: events.append("sync"),
        before_round=lambda i: events.append(f"before{i}"),
        after_round=lambda i, r: events.append(f"after{i}"),
        before_region=lambda name, turn: events.append(f"reset {name}"),
        after_region=lambda region: events.append(f"read {region.peer}"),
    )
    region = ["reset {0}", "sync", "{0}:{1}", "sync", "read {0}"]

    def expect(name: str, tag: str) -> list[str]:
        return [e.format(name, tag) for e in region]

    assert events == [
        *expect("a", "warmup0"), *expect("b", "warmup0"),
        "before0", *expect("a", "round0"), *expect("b", "round0"), "after0",
        "before1", *expect("b", "round1"), *expect("a", "round1"), "after1",
    ]  # fmt: skip
    assert [r.turn for r in rounds.regions] == [bh.Turn(0), bh.Turn(0), bh.Turn(1), bh.Turn(1)]


def test_warm_up_passes_are_reported_and_never_counted():
    rounds = bh.run_rounds({"a": recording([], "a", "v"), "b": recording([], "b", "w")},
                           rounds=3, warmup=2, sync=None)  # fmt: skip
    assert [(w.peer, w.turn) for w in rounds.warmups] == [
        ("a", bh.Turn(0, True)), ("a", bh.Turn(1, True)),
        ("b", bh.Turn(0, True)), ("b", bh.Turn(1, True)),
    ]  # fmt: skip
    assert len(rounds.seconds("a")) == len(rounds.seconds("b")) == 3
    assert all(not r.turn.warmup for r in rounds.regions)
    assert rounds.values("a") == ["v"] * 3
    assert rounds.warmup_seconds("a") == sum(w.seconds for w in rounds.warmups if w.peer == "a")
    assert rounds.median("a") == sorted(rounds.seconds("a"))[1]


def test_a_passed_deadline_cuts_the_rounds_but_keeps_the_first():
    clock = Clock()

    def slow(turn: bh.Turn) -> None:
        clock.now += 10

    deadline = bh.Deadline(0, clock=clock)  # passed before anything ran
    rounds = bh.run_rounds({"a": slow, "b": slow}, rounds=5, sync=None, deadline=deadline)
    assert rounds.rounds == 1 and rounds.cut_by_deadline and rounds.planned == 5
    assert len(rounds.seconds("a")) == len(rounds.seconds("b")) == 1
    # 25 s: the first round (20 s) leaves 5, so the second starts, the third does not
    rounds = bh.run_rounds({"a": slow, "b": slow}, rounds=5, sync=None,
                           deadline=bh.Deadline(25, clock=clock))  # fmt: skip
    assert rounds.rounds == 2 and rounds.cut_by_deadline
    # fit_next_round: 5 s left is less than the 20 s the first round took
    rounds = bh.run_rounds({"a": slow, "b": slow}, rounds=5, sync=None, fit_next_round=True,
                           deadline=bh.Deadline(25, clock=clock))  # fmt: skip
    assert rounds.rounds == 1 and rounds.cut_by_deadline
    rounds = bh.run_rounds({"a": slow}, rounds=3, sync=None, deadline=bh.Deadline(None))
    assert rounds.rounds == 3 and not rounds.cut_by_deadline


def test_a_failing_peer_is_dropped_with_its_rounds_kept_or_its_error_propagates():
    def flaky(turn: bh.Turn) -> int:
        if turn.index == 1 and not turn.warmup:
            raise RuntimeError("broke")
        return turn.index

    def broken(turn: bh.Turn) -> None:
        raise ValueError("never runs")

    seen = []
    rounds = bh.run_rounds(
        {"ok": recording([], "ok"), "flaky": flaky, "broken": broken}, rounds=3, warmup=1,
        sync=None, on_error=lambda name, turn, err: seen.append(turn) or f"{turn.tag}: {err}",
    )  # fmt: skip
    assert rounds.errors == {"broken": "warmup0: never runs", "flaky": "round1: broke"}
    assert rounds.values("flaky") == [0] and rounds.values("ok") == [0, 1, 2]
    assert rounds.orders == [["ok", "flaky"], ["flaky", "ok"], ["ok"]]
    assert [w.peer for w in rounds.warmups] == ["ok", "flaky"]
    with pytest.raises(ValueError, match="never runs"):
        bh.run_rounds({"broken": broken}, rounds=1, sync=None)


def test_device_sync_is_none_on_a_cpu_and_the_devices_own_elsewhere(monkeypatch):
    import torch

    assert bh.device_sync("cpu") is None and bh.device_sync(torch.device("cpu")) is None
    called = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: called.append(device))
    sync = bh.device_sync(torch.device("cuda", 1))
    assert sync is not None
    sync()
    assert called == [torch.device("cuda", 1)]
    with pytest.raises(ValueError, match=r"no torch\.nosuchdevice\.synchronize"):
        bh.device_sync("nosuchdevice")


def test_the_deadline_says_what_is_left_and_whether_an_estimate_fits():
    clock = Clock()
    deadline = bh.Deadline(60, clock=clock)
    clock.now += 45
    assert deadline.left() == 15 and not deadline.passed() and deadline.elapsed() == 45
    assert deadline.fits(10) and not deadline.fits(20) and deadline.fits(None)
    assert deadline.skip_reason(None) is None and deadline.skip_reason((10, "x")) is None
    assert deadline.skip_reason((20.4, "the last case took 30 s")) == (
        "deadline: 15 s left of 60 s, estimate 20 s (the last case took 30 s)"
    )
    clock.now += 15
    assert deadline.passed() and deadline.left() == 0
    endless = bh.Deadline(None, clock=clock)
    assert endless.left() is None and not endless.passed() and endless.fits(1e9)


def test_an_atomic_write_leaves_the_old_file_and_no_partial_one(tmp_path, monkeypatch):
    path = tmp_path / "out" / "results.json"
    bh.write_json(path, {"a": 1, "where": tmp_path})  # a path is written as its str
    assert json.loads(path.read_text()) == {"a": 1, "where": str(tmp_path)}

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        bh.write_json(path, {"a": 2})
    monkeypatch.undo()
    circular: dict = {}
    circular["self"] = circular
    with pytest.raises(ValueError):
        bh.write_json(path, circular)  # fails while serialising, before any file
    assert json.loads(path.read_text())["a"] == 1
    assert sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


def test_sigterm_leaves_the_json_marked_interrupted_with_what_ran(tmp_path):
    path = tmp_path / "bench.json"
    results = bh.ResultsFile(path, {"cases": []}, name="bench_x")
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped, results.interruptible():
        results.data["cases"].append("first")
        results.save()
        results.stage = "the second case"
        os.kill(os.getpid(), signal.SIGTERM)
    assert stopped.value.code == 143
    written = json.loads(path.read_text())
    assert written["cases"] == ["first"]
    assert written["status"].startswith("interrupted (Terminated('signal 15'))")
    assert written["status"].endswith("during the second case")
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler is given back


def test_explicit_flags_win_then_the_presets_in_order_then_the_defaults():
    args = argparse.Namespace(steps=7, rounds=None, warmup=None, model=None, smoke=True)
    smoke, lease = {"rounds": 2, "model": "tiny"}, {"rounds": 3, "warmup": 1, "scope": "layers"}
    defaults = {"steps": 10, "rounds": 6, "warmup": 2, "model": "large"}
    filled = bh.apply_presets(args, smoke, lease, defaults)
    assert (args.steps, args.rounds, args.warmup, args.model) == (7, 2, 1, "tiny")
    assert args.scope == "layers"  # a preset's setting without a flag
    assert filled == {"rounds": 2, "model": "tiny", "warmup": 1, "scope": "layers"}
    args = argparse.Namespace(steps=None, rounds=None, warmup=None, model=None)
    bh.apply_presets(args, None, lease, defaults)  # --smoke off
    assert (args.steps, args.rounds, args.warmup, args.model) == (10, 3, 1, "large")


def test_the_harness_and_the_gpu_check_import_the_standard_library_only():
    """scripts/gpu_check.py starts before anything is installed and uses the harness's
    deadline and JSON writer: importing either loads no third-party package."""
    import subprocess
    import sys
    from pathlib import Path

    scripts = Path(bh.__file__).parent
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import gpu_check, benchharness; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'numpy', 'omnibert'}))"
    )
    done = subprocess.run([sys.executable, "-S", "-c", code, str(scripts)],
                          capture_output=True, text=True, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


def test_a_record_of_a_script_that_never_imports_torch_names_the_torch_it_measured():
    """bench_attention times omnibert-train processes and imports no torch itself: its
    record's machine still names the torch those processes ran (this interpreter's)."""
    import subprocess
    import sys

    scripts = Path(__file__).resolve().parents[2] / "scripts"  # benchplot is a script module
    code = "import sys, benchplot; print('torch' in sys.modules, benchplot.machine()['torch'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=scripts, check=True)  # fmt: skip
    import torch

    assert done.stdout.split() == ["False", torch.__version__]
