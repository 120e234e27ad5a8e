"""The environment report: versions, devices found and SDKs present, printed at start and
saved as ``<output_dir>/environment.json`` by ``omnibert-train``.

SDK presence is read from the installed distributions and import specs, never by importing
an SDK: only the selected plugin imports its vendor modules (in ``devices_found``).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import sys
from collections.abc import Mapping
from importlib import metadata
from typing import Any

#: import name -> distributions that may provide it (first installed one gives the version)
SDKS: dict[str, tuple[str, ...]] = {
    "triton": ("triton",),
    "omnibert_kernels": ("omnibert",),
    "habana_frameworks": ("habana-torch-plugin", "habana_frameworks"),
    "lightning_habana": ("lightning-habana", "lightning_habana"),
    "poptorch": ("poptorch",),
}
VERSIONS = ("torch", "lightning", "hydra-core", "omegaconf", "torchmetrics", "numpy", "omnibert")


def _version(*dists: str) -> str | None:
    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def sdk_present(module: str) -> bool:
    """Whether ``module`` is importable here, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def sdk_report() -> dict[str, dict[str, Any]]:
    return {
        name: {
            "present": sdk_present(name),
            "version": _version(*dists) if sdk_present(name) else None,
        }
        for name, dists in SDKS.items()
    }


def host_report() -> dict[str, Any]:
    import torch

    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "cuda_version": torch.version.cuda,
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
    }


def environment_report(
    accelerator: Mapping[str, Any], devices_found: Mapping[str, Any], launch: Any = None
) -> dict[str, Any]:
    """Everything about where this run runs: the plugin's settings (its ``describe()``), the
    devices it found (its ``devices_found()``), the launcher that started this process
    (:func:`omnibert.accelerators.launchers.detect_launcher`), library versions, SDKs and the
    host."""
    launcher = None
    if launch is not None:
        devices, nodes = int(accelerator["devices"]), int(accelerator["num_nodes"])
        launcher = {**launch.to_dict(), "text": launch.describe(devices, nodes)}
    return {
        "accelerator": dict(accelerator),
        "devices_found": dict(devices_found),
        "launcher": launcher,
        "versions": {name: _version(name) for name in VERSIONS},
        "sdks": sdk_report(),
        "host": host_report(),
    }


def format_report(report: dict[str, Any]) -> str:
    """A few lines for the console."""
    acc = report["accelerator"]
    found = report["devices_found"]
    versions = ", ".join(f"{k} {v}" for k, v in report["versions"].items() if v)
    sdks = ", ".join(
        f"{k} {v['version'] or ''}".strip() for k, v in report["sdks"].items() if v["present"]
    )
    lines = [
        f"  accelerator   {acc['accelerator']} × {acc['devices']} device(s) × "
        f"{acc['num_nodes']} node(s), strategy {acc['strategy']}",
        f"  launcher      {(report.get('launcher') or {}).get('text', 'single process')}",
        f"  devices found {found.get('count')} {found.get('kind', '')}: "
        + ", ".join(str(n) for n in found.get("names", [])[:4]),
        f"  versions      {versions}",
        f"  SDKs present  {sdks or 'none'}",
    ]
    return "\n".join(lines)
