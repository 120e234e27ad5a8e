"""The multi-tensor Triton LAMB against the float64 oracle of apex's rules, on CPU through
``TRITON_INTERPRET=1`` (default suite) and on CUDA (``-m gpu``).

The interpreter checks the kernels' maths, chunking and table indexing, not their speed
(``scripts/bench_lamb.py --device cuda`` measures that). Triton reads ``TRITON_INTERPRET`` when
it is first imported, so those checks (``lamb_triton_interpreted.py``) run in a subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lamb_triton_cases import check_trajectory

from omnibert.optim import Lamb

CHECKS = Path(__file__).parents[1] / "lamb_triton_interpreted.py"


def test_multi_tensor_lamb_under_the_triton_interpreter() -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    out = subprocess.run(
        [*cmd, str(CHECKS)],
        env=env,
        cwd=CHECKS.parent.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "8 passed" in out.stdout


def test_chunk_size_must_be_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="triton_chunk_size=1000 must be a power of two"):
        Lamb([torch.nn.Parameter(torch.zeros(3))], triton_chunk_size=1000)


@pytest.mark.gpu
@pytest.mark.parametrize("grad_scale", [0.01, 10.0], ids=["clip-inactive", "clip-active"])
def test_multi_tensor_lamb_on_cuda_matches_the_float64_oracle(grad_scale) -> None:
    opt = check_trajectory("cuda", grad_scale, max_grad_norm=1.0)
    assert opt.resolve_impl() == "triton"


@pytest.mark.gpu
def test_auto_picks_the_multi_tensor_kernel_on_cuda() -> None:
    assert Lamb([torch.nn.Parameter(torch.zeros(3, device="cuda"))]).resolve_impl() == "triton"
