"""Triton LAMB kernel parity with the torch reference, on CPU through TRITON_INTERPRET=1.

This checks the kernel's maths and indexing only; speed and real-GPU behaviour need a CUDA
device (``scripts/bench_lamb.py --device cuda``). Triton reads TRITON_INTERPRET when it is
first imported, so the parity checks in ``lamb_triton_interpreted.py`` run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lamb_triton_cases import _batch, _run_triton

from omnibert.optim.lamb_math import reference_update

CHECKS = Path(__file__).with_name("lamb_triton_interpreted.py")


def test_triton_parity_under_the_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    out = subprocess.run(
        [*cmd, str(CHECKS)], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "5 passed" in out.stdout


@pytest.mark.gpu
def test_triton_on_cuda_matches_reference() -> None:
    ref = _batch()
    dev = _batch()
    for field in ("params", "grads", "exp_avgs", "exp_avg_sqs"):
        setattr(dev, field, [t.cuda() for t in getattr(dev, field)])
    reference_update(ref, torch.tensor(0.5))
    _run_triton(dev, torch.tensor(0.5, device="cuda"))
    for a, b in zip(ref.params, dev.params, strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-5, atol=1e-6)
