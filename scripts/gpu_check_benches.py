"""The benchmark steps of ``scripts/gpu_check.py``: each step's command line (``bench_gpu.py``
for the lease's cases, the ablation and ModernBERT; ``bench_fp8.py``; ``bench_lamb.py``), the
deadline a benchmark plans for inside its step, what each step found (its JSON as last
written, its records' headlines) and the records copied into ``OUT/records``. Standard
library only."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_check_run import RESERVE_S, SCRIPTS, Check, Command


def records_dir(check: Check) -> Path:
    """Where the benchmarks write their records (JSON and SVG): the work folder. The check
    copies the JSONs into ``OUT/records`` at its end (:func:`return_records`): a lease returns
    at most eight files."""
    return check.work / "records"


def lamb_commands(check: Check) -> list[Command]:
    argv = [check.python, str(SCRIPTS / "bench_lamb.py"), "--json", str(check.work / "bench_lamb.json"),
            "--results-dir", str(records_dir(check))]  # fmt: skip
    argv += ["--smoke"] if check.rehearse else ["--device", "cuda", "--lease"]
    probe = check.work / "probe.json"
    if not check.rehearse and probe.is_file():  # the floor at the probe's copy bandwidth
        argv += ["--bandwidth-from", str(probe)]
    return [Command("bench_lamb", argv)]


def bench_deadline(check: Check) -> float:
    """The seconds a benchmark of this step may plan for: what its cap and the check's
    deadline leave, less a margin for its record (it skips what would not fit)."""
    return max(min(check.step_cap_s, check.left() - RESERVE_S) - 10, 20)


def bench_gpu_argv(check: Check, name: str) -> list[str]:
    """``bench_gpu.py --lease --profile`` (``--smoke`` in the rehearsal) writing its JSON to
    ``bench_<name>.json`` in the work folder, within its step's time."""
    deadline = bench_deadline(check)
    argv = [check.python, str(SCRIPTS / "bench_gpu.py"), "--json", str(check.work / f"bench_{name}.json"),
            "--results-dir", str(records_dir(check)), "--deadline", f"{deadline:.0f}", "--lease",
            "--profile"]  # fmt: skip
    return argv + (["--smoke"] if check.rehearse else [])


def gpu_commands(check: Check) -> list[Command]:
    argv = bench_gpu_argv(check, "gpu")
    if check.bench_gpu_cases:
        argv += ["--cases", check.bench_gpu_cases]
    return [Command("bench_gpu", argv)]


#: ``bench-ablate``: BERT-large seq 512 packed with the Wikipedia lengths as the last lease ran
#: it (SDPA, each layer compiled) against Hugging Face on the same sequences, then one change a
#: line (omnibert alone, each against the first line), all of them together, then unpacked
#: and phase 1; most important first (the deadline skips from the end)
_PACKED = "large:512:online:wiki:attention=sdpa:scope=layers"
ABLATE_CASES = ",".join(
    [
        _PACKED,
        "large:512:online:wiki:attention=varlen:scope=layers:peer=none",
        "large:512:online:wiki:attention=sdpa:scope=model:peer=none",
        f"{_PACKED}:graphs=on:peer=none",
        f"{_PACKED}:precision=fp8:peer=none",
        f"{_PACKED}:batch=64:peer=none",
        f"{_PACKED}:batch=probe:peer=none",
        f"{_PACKED}:update=micro:peer=none",
        # all together: varlen and CUDA graphs exclude each other (data-dependent shapes)
        "large:512:online:wiki:attention=varlen:scope=model:precision=fp8:peer=none",
        "large:512:online:wiki:attention=sdpa:scope=model:graphs=on:precision=fp8:peer=none",
        "large:512:none:attention=varlen:scope=layers",
        "base:128:none:scope=layers",
        "base:128:none:scope=model:graphs=on:peer=none",
    ]
)
#: the rehearsal's: the same keys on the tiny model on a CPU (no CUDA graphs, no fp8)
REHEARSE_ABLATE_CASES = (
    "tiny:32:online,tiny:32:online:attention=varlen:batch=8:update=micro:peer=none"
)


def ablate_commands(check: Check) -> list[Command]:
    argv = bench_gpu_argv(check, "ablate")
    argv += ["--cases", REHEARSE_ABLATE_CASES if check.rehearse else ABLATE_CASES]
    return [Command("bench_ablate", argv)]


#: ``bench-modern``: ModernBERT-base (conf/model/modernbert_base.yaml) at seq 1024, packed with
#: the Wikipedia lengths, against ModernBertForMaskedLM on the same sequences
MODERN_CASES = "modernbert_base:1024:online:wiki:scope=layers"
REHEARSE_MODERN_CASES = "modern_tiny:64:online"


def modern_commands(check: Check) -> list[Command]:
    argv = bench_gpu_argv(check, "modern")
    argv += ["--cases", REHEARSE_MODERN_CASES if check.rehearse else MODERN_CASES]
    return [Command("bench_modern", argv)]


def fp8_commands(check: Check) -> list[Command]:
    """``bench_fp8.py --lease`` (``--smoke`` in the rehearsal: emulated fp8 on the CPU)."""
    deadline = bench_deadline(check)
    argv = [check.python, str(SCRIPTS / "bench_fp8.py"), "--json", str(check.work / "bench_fp8.json"),
            "--results-dir", str(records_dir(check)), "--deadline", f"{deadline:.0f}"]  # fmt: skip
    return [Command("bench_fp8", argv + (["--smoke"] if check.rehearse else ["--lease"]))]


def bench_findings(name: str, prefix: str) -> Callable[[Check, list[int]], dict[str, Any]]:
    """The benchmark's own JSON, which it rewrites after every case or stage (what finished
    before a kill at the cap is kept too), and the headline and tables of the records it
    wrote at its end whose names start with ``prefix``."""

    def collect(check: Check, codes: list[int]) -> dict[str, Any]:
        found: dict[str, Any] = {"records": {}}
        for path in sorted(records_dir(check).glob(f"{prefix}*.json")):
            record = json.loads(path.read_text())
            if record.get("command", "").find(f"bench_{name}.json") < 0:
                continue  # another step's record of the same script
            found["records"][path.stem] = {"headline": record.get("headline"),
                                           "tables": record.get("tables")}  # fmt: skip
        partial = check.work / f"bench_{name}.json"
        if partial.is_file():
            found["results"] = json.loads(partial.read_text())
        return found

    return collect


def return_records(check: Check) -> list[str]:
    """Each step's records into ``OUT/records`` as ``<step's json stem>-<record>.json``, the
    figure left behind (``"figure": null``; a lease returns at most eight files: the four of
    the check and these); the names copied."""
    dest = check.out / "records"
    copied = []
    for path in sorted(records_dir(check).glob("*.json")):
        record = json.loads(path.read_text())
        step = re.search(r"bench_(\w+)\.json", record.get("command", ""))
        name = f"{step.group(1)}-{path.stem}" if step else path.stem
        record["figure"] = None
        dest.mkdir(parents=True, exist_ok=True)
        (dest / f"{name}.json").write_text(json.dumps(record, indent=2) + "\n")
        copied.append(name)
    return copied
