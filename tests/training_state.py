"""Checkpoints of two training runs compared bit for bit (the resume tests of
test_train_resume.py, test_gpu_twins.py and, on CUDA, test_gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def load_state(path: Path) -> dict[str, Any]:
    """A Lightning checkpoint on the CPU (weights only)."""
    return torch.load(path, map_location="cpu", weights_only=True)


def assert_same_training_state(want: dict[str, Any], got: dict[str, Any], steps: int) -> None:
    """Both at ``steps`` with bitwise equal weights, optimiser state and schedule."""
    assert want["global_step"] == got["global_step"] == steps
    assert want["state_dict"].keys() == got["state_dict"].keys()
    for name, tensor in want["state_dict"].items():
        assert torch.equal(got["state_dict"][name], tensor), name
    for a, b in zip(
        want["optimizer_states"][0]["state"].values(),
        got["optimizer_states"][0]["state"].values(),
        strict=True,
    ):
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert want["lr_schedulers"] == got["lr_schedulers"]
