"""The micro-batch speed probe on CUDA (omnibert.run.sizing.speed_probe), on the CPU: the selection
with injected timings (no test here times anything), the stop rules and their reasons, the
plan's words, a size that runs out of memory, and the cache key naming the GPU. The probe on
a real GPU is tests/unit/test_gpu_step.py's."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from test_fast_defaults import SHAPES, TINY, FakeClock

from omnibert.errors import UserError
from omnibert.run.sizing import speed_probe
from omnibert.run.sizing.probe_cache import cache_key
from omnibert.run.sizing.speed_probe import (
    CUDA_TIMING,
    TooLarge,
    choose_fastest,
    overlapped_seconds,
    probe_micro_batch,
)


def gpu_passes(clock: FakeClock, device_s: dict[int, float], host_s: dict[int, float],
               calls: list[int], out_of_memory: int | None = None):  # fmt: skip
    """``seconds_per_pass`` of a GPU whose passes take ``device_s[size]`` on the device and
    ``host_s[size]`` to queue; a size from ``out_of_memory`` on does not fit."""

    def seconds(size: int) -> float:
        calls.append(size)
        if out_of_memory is not None and size >= out_of_memory:
            raise TooLarge(size)
        elapsed = overlapped_seconds(device_s[size], host_s[size])
        clock.now += 2 * elapsed
        return elapsed

    return seconds


def test_a_pass_counts_the_busier_of_the_device_and_the_host():
    assert overlapped_seconds(0.050, 0.004, 0.010) == 0.050  # device-bound: the loop hides
    assert overlapped_seconds(0.005, 0.012, 0.010) == pytest.approx(0.022)  # host-bound
    assert overlapped_seconds(0.005, 0.012) == pytest.approx(0.012 + speed_probe.LOOP_SECONDS)


def test_on_a_host_bound_gpu_the_largest_size_wins_and_the_plan_says_why():
    # kernels queue in ~12 ms whatever the size; the device needs 1 ms per 16 rows
    device = {8: 0.0005, 32: 0.002, 128: 0.008, 512: 0.032}
    host = dict.fromkeys(device, 0.012)
    clock, calls = FakeClock(), []
    result = choose_fastest([8, 32, 128, 512], gpu_passes(clock, device, host, calls), 60,
                            clock, loop_seconds=0.0)  # fmt: skip
    assert calls == [8, 32, 128, 512] and result.size == 512 and result.untried == ()
    assert dict(result.rates)[8] == pytest.approx(8 / 0.022, rel=1e-3)  # host + loop
    assert dict(result.rates)[512] == pytest.approx(512 / 0.032, rel=1e-3)  # the device
    assert result.why == "512 ran the most rows/s"
    assert result.describe().startswith("the fastest measured (rows/s: 8 → 363.6, ")
    assert result.describe().endswith(": 512 ran the most rows/s")


def test_a_size_within_the_tolerance_wins_when_larger_and_stops_are_explained():
    device = {16: 0.100, 64: 0.390, 256: 1.800}  # 64: 2.5 % faster per row than 16
    host = dict.fromkeys(device, 0.0001)
    clock, calls = FakeClock(), []
    result = choose_fastest([16, 64, 256], gpu_passes(clock, device, host, calls), 60, clock,
                            loop_seconds=0.0)  # fmt: skip
    assert result.size == 64 and result.why == "64 ran the most rows/s"
    assert result.untried == () and result.stopped == ""
    flat = {16: 0.100, 64: 0.410, 256: 10.0}  # 64 is 2.4 % slower per row: still the larger
    clock, calls = FakeClock(), []
    result = choose_fastest([16, 64, 256], gpu_passes(clock, flat, host, calls), 60, clock,
                            loop_seconds=0.0)  # fmt: skip
    assert result.size == 64
    assert result.why == "64 ran within 5% of the fastest (16) and is the largest that did"
    assert result.untried == () and dict(result.rates)[256] < 30  # timed, clearly slower
    slow = {16: 0.100, 64: 0.600, 256: 0.0}  # 64 a third slower: 256 is not timed
    clock, calls = FakeClock(), []
    result = choose_fastest([16, 64, 256], gpu_passes(clock, slow, host, calls), 60, clock,
                            loop_seconds=0.0)  # fmt: skip
    assert calls == [16, 64] and result.size == 16 and result.untried == (256,)
    assert "not timed: 256 (64 ran over 10% slower than the best)" in result.describe()


def test_a_size_out_of_memory_ends_the_probe_and_the_smallest_one_stops_the_run(monkeypatch):
    device = {8: 0.004, 32: 0.010, 128: 0.0}
    host = dict.fromkeys(device, 0.001)
    clock, calls = FakeClock(), []
    result = choose_fastest([8, 32, 128], gpu_passes(clock, device, host, calls, 128), 60,
                            clock, loop_seconds=0.0)  # fmt: skip
    assert calls == [8, 32, 128] and result.size == 32 and result.untried == (128,)
    assert result.stopped == "out of memory at 128"
    assert result.to_dict()["stopped"] == "out of memory at 128"
    with pytest.raises(TooLarge):
        choose_fastest([8, 32], gpu_passes(FakeClock(), device, host, [], 8), 60)

    def never_fits(*args, **kwargs):
        def seconds(size: int) -> float:
            raise TooLarge(size)

        return seconds

    monkeypatch.setattr(speed_probe, "_timer", never_fits)
    with pytest.raises(UserError) as err:
        probe_micro_batch(TINY, SHAPES, precision="32-true", device=torch.device("cpu"),
                          candidates=[2, 8], use_cache=False)  # fmt: skip
    message = str(err.value)
    assert message.startswith("the micro-batch speed probe ran out of memory on cpu")
    assert "at micro batch 2, the smallest size the memory estimate allows here (of 2, 8)" in (
        message
    )
    assert message.endswith("set micro_batch_size to a smaller size that divides the "
                            "per-device batch, or a lower memory_fraction.")  # fmt: skip


def test_the_cache_key_names_the_gpu_and_keeps_the_cpus_facts(monkeypatch):
    args = (TINY, SHAPES, "bf16-mixed")
    key, facts = cache_key(*args, torch.device("cpu"), [4, 16], 20.0)
    # the CPU's facts as before the CUDA probe: its cached choices stay valid
    assert set(facts) == {"model", "shapes", "precision", "device", "threads", "torch",
                          "candidates", "budget_s"}  # fmt: skip
    assert key == hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24]
    assert facts["device"].startswith("cpu") and facts["threads"] == torch.get_num_threads()
    keys = {}
    for name in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a, name=name: name)
        keys[name], facts = cache_key(*args, torch.device("cuda", 0), [4, 16], 20.0)
        assert facts["device"] == f"cuda {name}" and facts["threads"] is None
        assert facts["timing"] == "cuda events, host overlap"
    assert len({key, *keys.values()}) == 3
    assert "CUDA events" in CUDA_TIMING and "host's time to queue it plus 10 ms" in CUDA_TIMING
