"""CPU twins of ``tests/e2e/test_gpu.py`` (default suite, no CUDA needed): the GPU tests' inputs
(the same overrides, data, shapes and ids) through the CPU path, with what the CPU runs of it.

``test_resume_is_bitwise_under_deterministic_algorithms`` (``-m gpu``) trains with
``trainer.deterministic=true``: Lightning calls ``torch.use_deterministic_algorithms(True)``,
and on CUDA every op that only has a nondeterministic kernel then raises ``RuntimeError``. On
the CPU those ops run, so the same run here would pass whatever the training and validation
steps call. Here the GPU test's run (``experiment=smoke`` on the CPU) goes through a
``TorchDispatchMode`` that notes every aten call that ``torch.use_deterministic_algorithms``'
docstring lists as raising on a CUDA tensor (:data:`RAISES_ON_CUDA`), and it is resumed from
step 2 and compared bitwise, as the GPU test does.

The other twins: compiled training without recompiles (attention and packing as the GPU test
has them; the aot_eager backend, fp32), one-process DDP, fused AdamW against foreach.
tests/e2e/test_gpu.py's docstrings name each test's twin, or why it has none.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dynamo_counts
import pytest
import torch
from test_gpu import GPU_SMOKE, MODERN_TINY, TESTS, _trajectory
from torch.utils._python_dispatch import TorchDispatchMode
from training_state import assert_same_training_state, load_state

from omnibert.apps.train import run_or_exit

aten = torch.ops.aten


def _float_result(args: tuple, kwargs: dict, out: Any) -> bool:
    return isinstance(out, torch.Tensor) and (out.is_floating_point() or out.is_complex())


#: aten calls that raise under ``torch.use_deterministic_algorithms(True)`` on a CUDA tensor,
#: as its docstring lists them ("The following normally-nondeterministic operations will throw
#: a RuntimeError when mode=True"; torch 2.13): (the docstring's words, overloads, whether a
#: call is one of them given its arguments and result). A short list of the ops a model or a
#: metric might call, not the pooling / padding / interpolation backward kernels.
RAISES_ON_CUDA: list[tuple[str, tuple[Any, ...], Callable[[tuple, dict, Any], bool]]] = [
    (
        ":func:`torch.bincount` when called on a CUDA tensor and ``weights``",
        (aten.bincount.default,),
        lambda args, kwargs, out: (args[1] if len(args) > 1 else kwargs.get("weights")) is not None,
    ),
    (
        ":func:`torch.histc` when called on a CUDA tensor",
        (aten.histc.default, aten.histc.out),
        lambda args, kwargs, out: True,
    ),
    (
        ":func:`torch.median` with indices output when called on a CUDA tensor",
        (aten.median.dim, aten.median.dim_values, aten.nanmedian.dim, aten.nanmedian.dim_values),
        lambda args, kwargs, out: True,
    ),
    (
        ":func:`torch.Tensor.put_` when ``accumulate=False``",  # and with True on CUDA
        (aten.put_.default, aten.put.default),
        lambda args, kwargs, out: True,
    ),
    (
        ":func:`torch.cumsum` when called on a CUDA tensor when dtype is floating point",
        (aten.cumsum.default, aten.cumsum_.default, aten.cumsum.out),
        _float_result,
    ),
    (
        ":func:`torch.Tensor.scatter_reduce` when ``reduce='prod'``",
        (aten.scatter_reduce.two, aten.scatter_reduce_.two, aten.scatter_reduce.two_out),
        lambda args, kwargs, out: (args[3] if len(args) > 3 else kwargs.get("reduce")) == "prod",
    ),
    (
        # the spatial (2-D target) kernel sums with atomics when it reduces; 1-D targets
        # (the masked-LM and NSP losses) take another kernel
        ":class:`torch.nn.NLLLoss` when called on a CUDA tensor",
        (aten.nll_loss2d_forward.default, aten.nll_loss2d_forward.output),
        lambda args, kwargs, out: (args[3] if len(args) > 3 else kwargs.get("reduction")) != 0,
    ),
]


class RaisesOnCudaUnderDeterminism(TorchDispatchMode):
    """Notes (``self.seen``: op and the docstring's words) every call of :data:`RAISES_ON_CUDA`
    made while the mode is active, on any device; the call itself runs as usual."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, str]] = []
        self._rules = {op: (words, hit) for words, ops, hit in RAISES_ON_CUDA for op in ops}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        rule = self._rules.get(func)
        if rule is not None and rule[1](args, kwargs, out):
            self.seen.append((str(func), rule[0]))
        return out


@pytest.fixture
def deterministic_flag_restored(monkeypatch) -> Iterator[None]:
    """``trainer.deterministic=true`` switches deterministic algorithms on for the process
    (and sets CUBLAS_WORKSPACE_CONFIG): both back as they were after the test."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])


#: the GPU test's overrides, on the CPU (experiment=smoke: validation after step 3 and at the end)
DETERMINISTIC = (
    "experiment=smoke",
    "accelerator=cpu",
    "accelerator.threads=1",
    "trainer.deterministic=true",
    "accelerator.compile=false",
    "optimizer.impl=foreach",
    "phase.max_steps=4",
    "callbacks.checkpoint.every_n_train_steps=1",
    "callbacks.checkpoint.keep_last=null",
)


def _train(compose_config, root: Path, *overrides: str) -> dict[str, Any]:
    return run_or_exit(compose_config(*DETERMINISTIC, *overrides, root=root), root / "out")


def test_the_listed_ops_are_the_docstrings_and_the_mode_sees_them():
    """Each rule quotes torch's docstring (so the list follows torch), and the mode notes a
    call of each kind it is meant to catch, and not its deterministic neighbours."""
    doc = " ".join(str(torch.use_deterministic_algorithms.__doc__).split())
    for words, _, _ in RAISES_ON_CUDA:
        assert " ".join(words.split()) in doc, words
    labels, weights = torch.tensor([0, 2, 2]), torch.tensor([1.0, 0.5, 1.0])
    with RaisesOnCudaUnderDeterminism() as mode:
        torch.bincount(labels)  # integer counts: deterministic everywhere
        torch.cumsum(labels, 0)
        torch.nn.functional.cross_entropy(torch.randn(3, 4), labels)
    assert mode.seen == []
    with RaisesOnCudaUnderDeterminism() as mode:
        torch.bincount(labels, weights=weights)
        torch.histc(weights, bins=4)
        weights.median(0)
        weights.cumsum(0)
    assert [op for op, _ in mode.seen] == [
        "aten.bincount.default",
        "aten.histc.default",
        "aten.median.dim",
        "aten.cumsum.default",
    ]


def test_the_label_histogram_counts_what_bincount_counts():
    """The validation's label histogram (no bincount: it raises on CUDA under deterministic
    algorithms) gives bincount's numbers: exactly for 0/1 weights, ids outside the labels left
    out; to float32 rounding for fractional weights."""
    from omnibert.tasks.pretraining import weighted_label_counts

    gen = torch.Generator().manual_seed(0)
    for slots, labels in [(0, 5), (7, 2), (500, 128), (3000, 30522)]:
        ids = torch.randint(0, labels + 3, (slots,), generator=gen)
        binary = (torch.rand(slots, generator=gen) > 0.3).float()
        want = torch.bincount(ids, weights=binary, minlength=labels + 3)[:labels].float()
        got = weighted_label_counts(ids.view(-1, 1), binary, labels)
        assert got.dtype == torch.float32 and torch.equal(got, want), (slots, labels)
        fractional = torch.rand(slots, generator=gen)
        want = torch.bincount(ids, weights=fractional, minlength=labels + 3)[:labels].float()
        torch.testing.assert_close(weighted_label_counts(ids, fractional, labels), want)


def test_deterministic_training_and_validation_call_nothing_that_raises_on_cuda(
    tmp_path, compose_config, deterministic_flag_restored
):
    """The GPU test's run (training steps, validation after step 3 and at the end, the task's
    metrics) through the app, watched op by op: none of them may raise on CUDA."""
    with RaisesOnCudaUnderDeterminism() as mode:
        summary = _train(compose_config, tmp_path, "run_name=watched")
    assert summary["steps"] == 4 and summary["validation"] is not None
    assert torch.are_deterministic_algorithms_enabled()  # the run did switch them on
    assert mode.seen == [], sorted(set(mode.seen))


def test_resume_is_bitwise_under_deterministic_algorithms_on_the_cpu(
    tmp_path, compose_config, deterministic_flag_restored
):
    """The GPU test's resume (straight 4 steps, then resumed from step 2's checkpoint) on the
    CPU with the same overrides; the GPU test adds bf16 autocast and CUDA's kernels."""
    _train(compose_config, tmp_path, "run_name=straight")
    ckpts = tmp_path / "straight" / "checkpoints"
    _train(
        compose_config,
        tmp_path,
        "run_name=resumed",
        f"ckpt_path={ckpts / 'step-00000002.ckpt'}",
    )
    want = load_state(ckpts / "last.ckpt")
    got = load_state(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    assert_same_training_state(want, got, 4)


# ----------------------------------------------------------------------------- training
#: GPU_SMOKE's run on the CPU: its accelerator swapped, one thread (fp32: trainer.precision=auto
#: is bf16 on a GPU only)
CPU_SMOKE = (
    *(o for o in GPU_SMOKE if o != "accelerator=gpu"),
    "accelerator=cpu",
    "accelerator.threads=1",
)


@pytest.mark.parametrize(
    ("packing", "attention"), [("online", "auto"), ("none", "varlen"), ("online", "varlen")]
)
def test_training_compiled_without_recompiles_on_the_cpu(
    tmp_path, compose_config, packing, attention, fresh_dynamo
):
    """``test_training_bf16_compiled_by_default_without_recompiles``'s run on the CPU, to its
    first validation (step 3): compiled with aot_eager (AOT autograd as inductor traces it,
    without inductor's C++ build; tests/e2e/test_kernels.py's choice), training never compiles
    again. Graph breaks: none, except varlen's on the CPU, which indexes its length buckets
    on the host, eagerly between graphs (on CUDA its stream needs no host reads: the GPU test
    asserts no break). The fourth case (packing none, attention auto) is test_kernels.py's."""
    summary = run_or_exit(
        compose_config(
            *CPU_SMOKE,
            "phase.max_steps=3",
            "accelerator.compile=true",
            "+accelerator.compile_options.backend=aot_eager",
            "+accelerator.compile_options.dynamic=false",
            f"model.config.attention={attention}",
            f"data.packing={packing}",
            "data.pack.buffer_size=64",
            "+callbacks.dynamo={_target_:dynamo_counts.DynamoCounts}",
            root=tmp_path,
        ),
        tmp_path / "out",
    )
    plan = summary["plan"]
    assert plan["precision"] == "32-true"
    assert plan["kernels"]["compile"].startswith("torch.compile, mode default")
    assert summary["steps"] == 3
    validation = summary["validation"]
    assert validation is not None and math.isfinite(validation["val/loss"])
    train = [s for s in dynamo_counts.SEEN if s["event"] == "train"]
    assert train[0]["graphs"] >= 1
    assert (train[0]["breaks"] == 0) is (attention != "varlen"), train[0]
    first_validation = next(i for i, s in enumerate(dynamo_counts.SEEN) if s["event"] != "train")
    assert first_validation == 6  # 3 steps of 2 micro-batches
    assert all(s == train[0] for s in dynamo_counts.SEEN[:first_validation])
    if packing == "online":
        assert plan["batch"]["sequences_per_row"] > 1.0


def test_one_process_ddp_on_the_cpu(tmp_path):
    """``test_one_gpu_ddp``'s run (``python -m omnibert.apps.train``, strategy ddp, one
    device) on the CPU: gloo instead of nccl, fp32 instead of bf16."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *CPU_SMOKE, f"paths.output_root={tmp_path}",
         "accelerator.strategy=ddp", "accelerator.devices=1"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "strategy ddp" in done.stdout
    (summary_file,) = tmp_path.glob("smoke/hydra/*/summary.json")
    summary = json.loads(summary_file.read_text())
    assert summary["steps"] == 6 and summary["plan"]["precision"] == "32-true"
    assert math.isfinite(summary["validation"]["val/loss"])


# ----------------------------------------------------------------------------- kernels


def test_fused_adamw_on_the_cpu_matches_foreach():
    """``test_fused_adamw_on_cuda_matches_foreach``'s parameters and gradients: torch's fused
    AdamW runs on the CPU too (chosen explicitly: ``fused="auto"`` takes it on CUDA only)."""
    from omnibert.optim import AdamW

    fused, opt = _trajectory(lambda n: AdamW(n, lr=1e-2, fused=True), "cpu", torch.float32)
    assert opt.impl == "fused"
    foreach, opt = _trajectory(lambda n: AdamW(n, lr=1e-2, foreach=True), "cpu", torch.float32)
    assert opt.impl == "foreach"
    for a, b in zip(foreach, fused, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- modern
@pytest.mark.parametrize(
    ("attention", "local_window"), [("sdpa", 64), ("varlen", 64), ("varlen", 0)]
)
def test_modern_tiny_trains_on_the_cpu(tmp_path, compose_config, attention, local_window):
    """``test_modern_tiny_trains_on_cuda``'s run on the CPU (fp32, eager, one thread): the
    window's band on the dense mask, varlen's re-padded buckets with the band, and varlen
    without a window (on CUDA: its fused kernel)."""
    summary = run_or_exit(
        compose_config(*MODERN_TINY, "accelerator=cpu", "accelerator.threads=1",
                       "accelerator.compile=false", f"model.config.attention={attention}",
                       f"model.config.local_window={local_window}", root=tmp_path),
        tmp_path / "out",
    )  # fmt: skip
    plan = summary["plan"]
    assert plan["precision"] == "32-true" and plan["attention"] == attention
    assert plan["objective"] == "MLM only" and summary["steps"] == 2
    validation = summary["validation"]
    assert validation is not None and math.isfinite(validation["val/loss"])
    assert validation["val/loss"] == validation["val/mlm_loss"]
