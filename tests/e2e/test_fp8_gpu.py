"""``trainer.precision=fp8`` on a CUDA GPU (``pytest -m gpu``; deselected by default): torchao's
real fp8 matmuls, compiled, on compute capability 8.9 or newer, against the same run in bf16;
the refusal below 8.9; the convergence pair's script on the device.

CPU twins: tests/e2e/test_fp8.py runs the same swap, plan, checkpoints, resume and a 20-step
comparison with torchao's emulated fp8 (``trainer.fp8.emulate=true``).

    pytest -m gpu tests/e2e/test_fp8_gpu.py -q
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dynamo_counts
import pytest
import torch
import torch._dynamo
from torch._dynamo.utils import counters

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).parents[1]
#: experiment=smoke on the GPU with its defaults (compiled, LAMB's Triton kernel), without
#: dropout (the two precisions' compiled graphs draw their dropout masks differently), a
#: CSV of each step's loss
GPU_PAIR = (
    "experiment=smoke", "accelerator=gpu", "logger=csv", "phase.max_steps=12",
    "model.config.hidden_dropout_prob=0", "model.config.attention_probs_dropout_prob=0",
)  # fmt: skip
#: every step's training loss of real fp8 within this share of bf16's (stated before the run:
#: wider than the CPU's emulated 1 %, fp8 matmuls accumulating in another order)
LOSS_RTOL = 0.02


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("pytest -m gpu needs a CUDA GPU that torch can see")


def _needs_fp8() -> None:
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):  # an older GPU: the refusal test below is what applies there
        pytest.skip(f"fp8 matmuls need compute capability 8.9, this GPU has {capability}")


def _train(root: Path, *overrides: str) -> tuple[dict[str, Any], list[float]]:
    summary = run_or_exit(compose("pretrain", [*GPU_PAIR, f"paths.output_root={root}",
                                               *overrides]), root / "out")  # fmt: skip
    (metrics,) = root.rglob("metrics.csv")
    with metrics.open() as rows:
        losses = [float(r["train/loss"]) for r in csv.DictReader(rows) if r.get("train/loss")]
    return summary, losses


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
@pytest.mark.parametrize("attention", ["auto", "varlen"])
def test_compiled_fp8_training_tracks_bf16_without_graph_breaks(
    tmp_path, recipe, attention, fresh_dynamo
) -> None:
    """CPU twin: test_fp8.py::test_an_emulated_fp8_run_tracks_the_same_run_in_bf16 (emulated
    fp8, eager). Token counts that are not multiples of 16 (the last layer's read rows,
    varlen's real tokens) go through torchao's padding of the matmuls' inner dimension."""
    _needs_fp8()
    same = (f"model.config.attention={attention}",)
    _, bf16 = _train(tmp_path / "bf16", "trainer=bf16", *same)
    torch._dynamo.reset()  # the fp8 run's graphs and breaks counted alone
    counters.clear()
    dynamo_counts.SEEN.clear()
    summary, fp8 = _train(
        tmp_path / "fp8", "trainer=fp8", f"trainer.fp8.recipe={recipe}", *same,
        "+callbacks.dynamo={_target_:dynamo_counts.DynamoCounts}",
    )  # fmt: skip
    plan = summary["plan"]
    assert plan["precision"] == "fp8" and plan["float8"]["emulate"] is False
    assert plan["kernels"]["compile"].startswith("torch.compile")
    assert dynamo_counts.SEEN and dynamo_counts.SEEN[-1]["breaks"] == 0, dynamo_counts.SEEN
    assert len(fp8) == len(bf16) == 12
    assert all(torch.isfinite(torch.tensor(fp8)))
    for step, (ours, theirs) in enumerate(zip(fp8, bf16, strict=True)):
        assert abs(ours - theirs) <= LOSS_RTOL * theirs, (step, ours, theirs)
    saved = torch.load(summary["last_checkpoint"], weights_only=True)["state_dict"]
    assert all(type(t) is torch.Tensor for t in saved.values())


def test_fp8_is_refused_on_a_gpu_below_compute_capability_8_9(tmp_path, monkeypatch, capsys):
    """CPU twin: test_fp8.py::test_fp8_is_refused_below_compute_capability_8_9 (torch.cuda
    answering as an A100); here through the app, this GPU's name in the sentence."""
    name = torch.cuda.get_device_name()
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *args: (8, 0))
    cfg = compose("pretrain", ["experiment=smoke", "accelerator=gpu", "trainer=fp8",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        run_or_exit(cfg, tmp_path / "out")
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{name}, compute capability 8.0" in message
    assert "trainer.precision=bf16-mixed" in message


def test_bench_fp8_pair_on_cuda(tmp_path) -> None:
    """CPU twin: tests/e2e/test_bench_fp8.py (emulated fp8). The convergence pair's script with
    real fp8 on this GPU, tiny and short (the lease's run is ``bench_fp8.py --lease``)."""
    _needs_fp8()
    out = tmp_path / "pair.json"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(
        [sys.executable, str(TESTS.parent / "scripts" / "bench_fp8.py"), "--smoke",
         "--device", "cuda", "--json", str(out), "--results-dir", str(tmp_path / "records")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(out.read_text())
    major, minor = map(int, results["capability"].split("."))
    assert results["status"] == "done" and (major, minor) >= (8, 9)
    assert results["emulate"] is False and results["steps_run"] == results["steps_planned"]
    assert results["comparison"]["verdict"] in ("pass", "fail", "inconclusive")
    assert results["fp8"]["real_tokens_per_sec"] > 0
