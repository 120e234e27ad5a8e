"""The micro-batch speed probe's cache (:mod:`omnibert.run.sizing.speed_probe`): one JSON table of
choices, keyed by a hash of everything that changes the timing, in the user's cache folder.
A second run with the same key reads the choice instead of timing again; a table that cannot
be read counts as empty, one that cannot be written is said in the plan."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from omnibert.paths import user_cache_dir

__all__ = ["CACHE_NAME", "cache_file", "cache_key", "device_name", "read_cache", "write_cache"]

#: the cache file's name under the cache folder
CACHE_NAME = "micro_batch_probe.json"


def cache_file() -> Path:
    """:data:`CACHE_NAME` in :func:`omnibert.paths.user_cache_dir` (``$OMNIBERT_CACHE_DIR``,
    else ``$XDG_CACHE_HOME/omnibert``, else ``~/.cache/omnibert``)."""
    return user_cache_dir() / CACHE_NAME


def device_name(device: torch.device) -> str:
    """The device by name, as the key holds it: ``cuda <GPU name>``, ``cpu <model name>``."""
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return device.type
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu {line.split(':', 1)[1].strip()}"
    return "cpu"


def read_cache(path: Path, key: str) -> dict[str, Any] | None:
    """The entry under ``key`` (None: none, or a table that cannot be read)."""
    try:
        entry = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("size"), int) else None


def write_cache(path: Path, key: str, entry: dict[str, Any]) -> str | None:
    """Add ``entry`` under ``key``; the reason in words when the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table[key] = entry
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        temporary.replace(path)
    except OSError as err:
        return f"not cached ({path}: {err.strerror or err})"
    return None


def cache_key(
    model_config: Any, shapes: Mapping[str, Sequence[int]], precision: str,
    device: torch.device, candidates: Sequence[int], budget_s: float,
) -> tuple[str, dict[str, Any]]:  # fmt: skip
    """The probe's cache key and the facts it hashes: everything that changes the timing
    (model, batch shapes, precision, the device by name, threads, torch, candidates, budget;
    on CUDA also how a pass is timed)."""
    facts = {
        "model": model_config.to_dict(),
        "shapes": {k: list(v)[1:] for k, v in shapes.items()},
        "precision": precision,
        "device": device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
        "candidates": sorted(set(candidates)),
        "budget_s": budget_s,
    }
    if device.type == "cuda":
        facts["timing"] = "cuda events, host overlap"
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:24], facts
