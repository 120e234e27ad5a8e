"""Where a step's time goes: ``scripts/bench_gpu.py --profile``.

:func:`profile_pass` runs one more pass of a side's steps under ``torch.profiler``: on CUDA the
kernels' device time by kind (:data:`PROFILE_CATEGORIES`: matmul, attention, normalisation,
optimiser, copies, elementwise), how busy the device was over the pass's wall time and the top
kernels; on a CPU the operators' own host time.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch
from benchharness import Turn, timed_region

#: kernel or operator names -> where a step's time goes (the first match wins)
PROFILE_CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|varlen", re.I)),
    ("optimizer", re.compile(r"lamb|adam|multi_tensor", re.I)),
    (
        "matmul",
        re.compile(r"gemm|matmul|cutlass|xmma|nvjet|cublas|aten::(mm|addmm|bmm|linear)$", re.I),
    ),
    ("normalization", re.compile(r"norm", re.I)),
    ("copy and fill", re.compile(r"copy|memcpy|memset|fill|aten::cat$", re.I)),
    ("elementwise and reductions", re.compile(r"^triton_|elementwise|vectorized|reduce", re.I)),
)


def profile_pass(run: Callable[[Turn], object], plugin: Any, top: int = 10) -> dict[str, Any]:
    """One more pass of a side's steps under ``torch.profiler``, timed as a round's region
    (between the plugin's synchronisations): where its time goes.

    On CUDA it counts the kernels' device time; elsewhere the operators' own host time.
    ``busy`` is that time over the pass's wall time: well under 1 on a GPU means the device
    waits for the host (kernel launches, eager Python)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = plugin.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    with profile(activities=activities):  # the profiler's own start-up, outside the pass
        torch.ones(1, device=plugin.device).add_(1)
    with profile(activities=activities) as prof:
        wall = timed_region("profile", run, Turn(0), plugin.synchronize).seconds
    times: dict[str, tuple[float, int]] = {}
    for event in prof.key_averages():
        if event.device_type != (DeviceType.CUDA if cuda else DeviceType.CPU):
            continue
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds > 0:
            times[event.key] = (seconds, event.count)
    total = sum(seconds for seconds, _ in times.values())
    shares = dict.fromkeys([name for name, _ in PROFILE_CATEGORIES] + ["other"], 0.0)
    for key, (seconds, _) in times.items():
        found = (name for name, pattern in PROFILE_CATEGORIES if pattern.search(key))
        shares[next(found, "other")] += seconds
    ranked = sorted(times.items(), key=lambda item: -item[1][0])[:top]
    return {
        "what": "CUDA kernels, device time" if cuda else "operators, own host time",
        "wall_seconds": round(wall, 6),
        "counted_seconds": round(total, 6),
        "busy": total / wall if wall > 0 else None,
        "shares": {k: round(v / total, 4) for k, v in shares.items() if v > 0} if total else {},
        "top": [
            {"name": key[:160], "seconds": round(s, 6), "share": round(s / total, 4), "calls": n}
            for key, (s, n) in ranked
        ],
    }


def profile_lines(name: str, prof: Mapping[str, Any], top: int = 5) -> list[str]:
    shares = ", ".join(
        f"{k} {v:.0%}" for k, v in sorted(prof["shares"].items(), key=lambda kv: -kv[1])
    )
    busy = "n/a" if prof["busy"] is None else f"{prof['busy']:.0%}"
    lines = [
        f"  profile {name}: {prof['what']} {prof['counted_seconds'] * 1e3:.1f} ms of "
        f"{prof['wall_seconds'] * 1e3:.1f} ms wall (busy {busy}); {shares}"
    ]
    lines += [
        f"    {item['share']:6.1%} {item['calls']:5d}x {item['name'][:110]}"
        for item in prof["top"][:top]
    ]
    return lines
