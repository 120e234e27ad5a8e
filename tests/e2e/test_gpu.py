"""The GPU path on a CUDA device (``pytest -m gpu``; deselected by default, no CUDA here).

Each test goes through the app's wiring (``omnibert-train`` with ``accelerator=gpu``) or the
public classes, with the GPU defaults: ``trainer.precision=auto`` (bf16 autocast on Ampere
and newer), ``torch.compile`` on, LAMB's Triton kernel (``optimizer.impl=auto``). Their inputs
run through the CPU path in the default suite, each test's docstring says where (mostly
tests/e2e/test_gpu_twins.py: the same overrides, data and shapes on ``accelerator=cpu``), or why
a test is CUDA-only; tests/e2e/test_kernels.py checks the GPU plugin's defaults and CUDA graphs
settings with ``torch.cuda`` answering as an H100 would.

    pytest -m gpu tests/e2e/test_gpu.py -q
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import dynamo_counts
import pytest
import torch
from training_state import assert_same_training_state, load_state

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit

pytestmark = pytest.mark.gpu

TESTS = Path(__file__).parents[1]
ROOT = TESTS.parent
#: experiment=smoke (1-layer 32-wide BERT, generated rows, global batch 8 = 2 micro-batches of
#: 4, 6 steps, validation every 3) on the GPU with its defaults
GPU_SMOKE = ("experiment=smoke", "accelerator=gpu")


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("pytest -m gpu needs a CUDA GPU that torch can see")


def _train_in_process(root: Path, *overrides: str) -> dict[str, Any]:
    cfg = compose("pretrain", [*GPU_SMOKE, f"paths.output_root={root}", *overrides])
    return run_or_exit(cfg, root / "out")


def _train(root: Path, *overrides: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    """``python -m omnibert.apps.train`` in a fresh process (fresh CUDA context, so the
    cuBLAS workspace setting of deterministic mode applies from the start)."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *GPU_SMOKE, f"paths.output_root={root}",
         *overrides],
        cwd=root, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


# ----------------------------------------------------------------------------- training


@pytest.mark.parametrize("attention", ["auto", "varlen"])
@pytest.mark.parametrize("packing", ["none", "online"])
def test_training_bf16_compiled_by_default_without_recompiles(
    tmp_path, packing, attention, fresh_dynamo
):
    """CPU twin: test_gpu_twins.py::test_training_compiled_without_recompiles_on_the_cpu (fp32,
    aot_eager; bf16 autocast, inductor's kernels and the Triton LAMB are the GPU's own)."""
    summary = _train_in_process(
        tmp_path,
        f"model.config.attention={attention}",
        f"data.packing={packing}",
        "data.pack.buffer_size=64",
        "+callbacks.dynamo={_target_:dynamo_counts.DynamoCounts}",
    )
    plan = summary["plan"]
    assert plan["precision"] == "bf16-mixed"  # auto on a GPU with bf16
    assert plan["kernels"]["compile"].startswith("torch.compile, mode default")
    assert plan["kernels"]["CUDA graphs"] == "off"
    assert plan["kernels"]["optimizer"].startswith("LAMB triton")
    assert dynamo_counts.OPTIMIZER["impl"] == "triton"  # what the optimiser really ran
    assert summary["steps"] == 6
    validation = summary["validation"]
    assert validation is not None and math.isfinite(validation["val/loss"])
    train = [s for s in dynamo_counts.SEEN if s["event"] == "train"]
    assert train[0]["graphs"] >= 1 and train[0]["breaks"] == 0
    # between validations (which compile their own graph) training never compiles again
    first_validation = next(i for i, s in enumerate(dynamo_counts.SEEN) if s["event"] != "train")
    assert all(s == train[0] for s in dynamo_counts.SEEN[:first_validation])
    if packing == "online":
        assert plan["batch"]["sequences_per_row"] > 1.0


def test_training_with_cuda_graphs(tmp_path, fresh_dynamo):
    """CUDA-only: CUDA graphs are captured and replayed on a CUDA stream; no CPU counterpart
    (test_kernels.py checks the settings: reduce-overhead mode, a step mark per batch, the
    refusal under FSDP). One micro-batch of the whole global batch per step; with gradient
    accumulation: test_gpu_step.py."""
    summary = _train_in_process(tmp_path, "accelerator.cuda_graphs=true", "micro_batch_size=8")
    assert summary["plan"]["kernels"]["CUDA graphs"] == "on (torch.compile mode reduce-overhead)"
    assert summary["steps"] == 6
    assert math.isfinite(summary["validation"]["val/loss"])


@pytest.mark.parametrize("impl", ["foreach", "triton"])
def test_resume_is_bitwise_under_deterministic_algorithms(tmp_path, impl):
    """Eager, deterministic algorithms (Lightning sets torch.use_deterministic_algorithms and
    the cuBLAS workspace), LAMB's foreach kernel and the multi-tensor Triton kernel (its norms
    are sums of chunk sums in a fixed order, no atomics: omnibert_kernels.lamb_triton).
    CPU twins (test_gpu_twins.py): the same run resumed bitwise, and watched op by op for
    anything that raises on CUDA under deterministic algorithms."""
    common = (
        "trainer.deterministic=true",
        "accelerator.compile=false",
        f"optimizer.impl={impl}",
        "phase.max_steps=4",
        "callbacks.checkpoint.every_n_train_steps=1",
        "callbacks.checkpoint.keep_last=null",
    )
    straight = _train(tmp_path, *common, "run_name=straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    ckpts = tmp_path / "straight" / "checkpoints"
    resumed = _train(
        tmp_path, *common, "run_name=resumed", f"ckpt_path={ckpts / 'step-00000002.ckpt'}"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    want = load_state(ckpts / "last.ckpt")
    got = load_state(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert_same_training_state(want, got, 4)


def test_one_gpu_ddp(tmp_path):
    """CPU twin: test_gpu_twins.py::test_one_process_ddp_on_the_cpu (gloo instead of nccl)."""
    done = _train(tmp_path, "accelerator.strategy=ddp", "accelerator.devices=1")
    assert done.returncode == 0, done.stderr[-3000:]
    (summary_file,) = tmp_path.glob("smoke/hydra/*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["steps"] == 6 and summary["plan"]["precision"] == "bf16-mixed"
    assert math.isfinite(summary["validation"]["val/loss"])


# ----------------------------------------------------------------------------- modern
#: model=modern_tiny (layer 0 global, layer 1 local with a 64-token window, rope, GeGLU,
#: pre-norm, no biases, MLM only) on generated single-segment rows of 128 tokens, so that the
#: window restricts the local layer; 2 steps, validated at the end, the GPU's defaults
MODERN_TINY = (
    "model=modern_tiny", "data=generated", "data.next_sentence=false", "data.vocab_size=128",
    "data.num_train_samples=64", "data.num_eval_samples=8", "data.num_workers=0",
    "phase.max_seq_length=128", "phase.max_predictions_per_seq=20", "phase.global_batch_size=8",
    "micro_batch_size=4", "phase.max_steps=2", "val_every_n_steps=2", "logger=none",
    "callbacks=minimal",
)  # fmt: skip
#: local_window=64: varlen attends per re-padded bucket (the band); 0: rope only, varlen's
#: fused kernel (omnibert.models.bert.BertModel.forward)
MODERN_WINDOWS = pytest.mark.parametrize("local_window", [64, 0], ids=["local", "rope_only"])


@MODERN_WINDOWS
@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_modern_tiny_trains_on_cuda(tmp_path, attention, local_window, fresh_dynamo):
    """CPU twin: test_gpu_twins.py::test_modern_tiny_trains_on_the_cpu (fp32, eager)."""
    cfg = compose("pretrain", [*MODERN_TINY, "accelerator=gpu", f"paths.output_root={tmp_path}",
                               f"model.config.attention={attention}",
                               f"model.config.local_window={local_window}"])  # fmt: skip
    summary = run_or_exit(cfg, tmp_path / "out")
    plan = summary["plan"]
    assert plan["precision"] == "bf16-mixed" and plan["attention"] == attention
    assert plan["kernels"]["compile"].startswith("torch.compile")
    assert plan["objective"] == "MLM only" and summary["steps"] == 2
    validation = summary["validation"]
    assert validation is not None and math.isfinite(validation["val/loss"])
    assert validation["val/loss"] == validation["val/mlm_loss"]


@MODERN_WINDOWS
@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_modern_tiny_forward_on_cuda_matches_the_cpu_math_backend(attention, local_window):
    """The modern_tiny preset's encoder, the same perturbed weights and packed rows longer
    than the window: CUDA fp32 (no TF32) against the CPU's math backend, whole rows and the
    pretraining forward's read rows (its queries-only last layer is the local one), at the
    fp32 tolerance every backend meets against the reference in test_modern_arch.py (1e-5).
    CPU twin: test_modern_arch.py checks math, sdpa and varlen on the CPU against that
    reference."""
    from omegaconf import OmegaConf
    from test_modern_arch import FP32, model_of, rows_of

    from omnibert.models import BertConfig

    preset = compose("pretrain", ["model=modern_tiny", "data=generated"]).model.config
    config = BertConfig.from_dict(
        {**OmegaConf.to_container(preset, resolve=True), "vocab_size": 128,
         "local_window": local_window}
    )  # fmt: skip
    assert config.has_local_layers is (local_window > 0)
    batch = rows_of([[128], [90, 30], [70, 40, 10], [100]], seq=128)  # [100]: 28 padding slots
    reads = torch.stack([torch.randperm(128, generator=torch.Generator().manual_seed(r))[:20]
                         for r in range(4)])  # fmt: skip
    cpu = model_of(config, "math").eval()
    cuda = model_of(config, attention).eval().cuda()
    real = batch["sequence_ids"] != 0
    inputs = [batch[k] for k in ("input_ids", "segment_ids", "position_ids", "sequence_ids")]
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")  # fp32 GEMMs, not TF32
    try:
        with torch.no_grad():
            want = cpu.bert(*inputs)
            got = cuda.bert(*(x.cuda() for x in inputs)).cpu()
            want_rows = cpu.bert(*inputs, output_positions=reads)
            got_rows = cuda.bert(*(x.cuda() for x in inputs), output_positions=reads.cuda())
    finally:
        torch.set_float32_matmul_precision(precision)
    torch.testing.assert_close(got[real], want[real], **FP32)
    read_real = torch.gather(real, 1, reads)  # varlen leaves read padding slots at zero
    torch.testing.assert_close(got_rows.cpu()[read_real], want_rows[read_real], **FP32)


# ----------------------------------------------------------------------------- kernels


def _named_parameters(device: str, dtype: torch.dtype) -> list[tuple[str, torch.nn.Parameter]]:
    gen = torch.Generator().manual_seed(0)
    shapes = {"layer.weight": (300, 257), "layer.bias": (257,), "LayerNorm.weight": (64,),
              "big.weight": (4099, 3)}  # fmt: skip
    return [
        (name, torch.nn.Parameter(torch.randn(shape, generator=gen, dtype=dtype).to(device)))
        for name, shape in shapes.items()
    ]


def _trajectory(
    optimizer_factory: Any, device: str, dtype: torch.dtype, steps: int = 5
) -> tuple[list[torch.Tensor], Any]:
    named = _named_parameters(device, dtype)
    optimizer = optimizer_factory(named)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for _, p in named:
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype).to(device)
        optimizer.step()
    return [p.detach().cpu().double() for _, p in named], optimizer


def test_triton_lamb_on_cuda_follows_the_reference_implementation():
    """CUDA-only as it stands: impl=auto picks Triton on CUDA alone, and these tensors
    interpreted on the CPU take ~25 s; the kernel runs under the Triton interpreter on
    chunk-stressing tensors in test_lamb_triton.py."""
    from omnibert_kernels.lamb_triton import triton_available

    from omnibert.optim import Lamb

    assert triton_available(torch.device("cuda"))

    def lamb(impl: str) -> Any:
        return lambda named: Lamb(named, lr=1e-2, impl=impl, no_weight_decay=["bias", "LayerNorm"])

    want, _ = _trajectory(lamb("reference"), "cpu", torch.float32)
    got, optimizer = _trajectory(lamb("auto"), "cuda", torch.float32)
    assert optimizer.resolve_impl() == "triton"
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


def test_fused_adamw_on_cuda_matches_foreach():
    """CPU twin: test_gpu_twins.py::test_fused_adamw_on_the_cpu_matches_foreach."""
    from omnibert.optim import AdamW

    fused, opt = _trajectory(lambda n: AdamW(n, lr=1e-2, fused="auto"), "cuda", torch.float32)
    assert opt.impl == "fused"
    foreach, opt = _trajectory(lambda n: AdamW(n, lr=1e-2, foreach=True), "cuda", torch.float32)
    assert opt.impl == "foreach"
    for a, b in zip(foreach, fused, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- benchmark


def test_bench_gpu_smoke_on_cuda(tmp_path):
    """CPU twin: test_bench_gpu.py runs the same ``--smoke`` on the CPU (fp32, no peak memory)."""
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_gpu.py"), "--smoke", "--device", "cuda",
         "--json", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for case in json.loads(out.read_text())["cases"]:
        assert case["precision"] == "bf16-mixed"
        assert case["kernels"]["compile"].startswith("torch.compile")
        for name in ("omnibert", "hf"):
            assert case[name]["sequences_per_sec"] > 0
            assert case[name]["peak_memory_bytes"] > 0
