"""The fast bf16 step on a CUDA device (``pytest -m gpu``; no CUDA where the suite runs).

* CUDA graphs with gradient accumulation train as the same run without graphs does (the
  mechanism: omnibert.accelerators.cuda_graphs; its CPU test: test_cuda_graph_gradients.py);
* no host sync inside a micro-batch: forward, loss, backward and the callbacks' per-micro-batch
  work run under ``torch.cuda.set_sync_debug_mode("error")`` (CPU test of what was moved off
  the host: test_mlperf.py, test_task.py's metric values);
* a run without ``micro_batch_size`` times its candidate micro batches on the GPU and the plan
  says which won and why (CPU tests of the selection: test_speed_probe_cuda.py).

Every run goes through ``omnibert-train``'s wiring in-process (experiment=smoke on
``accelerator=gpu`` with its defaults: bf16 autocast, torch.compile, LAMB's Triton kernel).

    pytest -m gpu tests/unit/test_gpu_step.py -q
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig

pytestmark = pytest.mark.gpu

#: experiment=smoke on the GPU, 16 sequences a step in micro-batches of 4: 4 accumulated
ACCUMULATED = ("experiment=smoke", "accelerator=gpu", "phase.global_batch_size=16",
               "micro_batch_size=4", "val_every_n_steps=null")  # fmt: skip


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("pytest -m gpu needs a CUDA GPU that torch can see")


def _train(root: Path, *overrides: str) -> dict[str, Any]:
    cfg = compose("pretrain", [*ACCUMULATED, f"paths.output_root={root}", *overrides])
    return run_or_exit(cfg, root / "out")


def _weights(path: str | Path) -> torch.Tensor:
    state = torch.load(path, map_location="cpu", weights_only=True)["state_dict"]
    return torch.cat([v.double().flatten() for v in state.values() if v.is_floating_point()])


# ------------------------------------------------------------------ CUDA graphs, accumulation


def test_cuda_graphs_with_accumulation_train_as_the_run_without_them(tmp_path, fresh_dynamo):
    """3 steps of 4 accumulated micro-batches, dropout off (the graphs' random streams are
    their own), with and without CUDA graphs: the same compiled kernels, so the weights after
    step 3 agree to 1 % of how far steps 2 and 3 moved them (global L2 norms); a lost or
    overwritten micro-batch changes the direction of the update, a difference of its order."""
    common = ("model.config.hidden_dropout_prob=0.0", "model.config.attention_probs_dropout_prob=0.0",
              "phase.max_steps=3", "callbacks.checkpoint.every_n_train_steps=1",
              "callbacks.checkpoint.keep_last=null")  # fmt: skip
    plain = _train(tmp_path / "plain", *common, "run_name=plain")
    graphs = _train(tmp_path / "graphs", *common, "run_name=graphs", "accelerator.cuda_graphs=true")
    assert graphs["plan"]["kernels"]["CUDA graphs"] == "on (torch.compile mode reduce-overhead)"
    assert graphs["plan"]["batch"]["accumulate_grad_batches"] == 4
    assert plain["steps"] == graphs["steps"] == 3
    want, got = _weights(plain["last_checkpoint"]), _weights(graphs["last_checkpoint"])
    step_1 = Path(plain["checkpoint_dir"]) / "step-00000001.ckpt"
    moved = float((want - _weights(step_1)).norm())
    assert moved > 0
    assert float((got - want).norm()) <= 0.01 * moved, (float((got - want).norm()), moved)


# ------------------------------------------------------------------------- host syncs

#: micro-batches SyncGuard watched, with their step
GUARDED: list[int] = []


class SyncGuard(Callback):
    """``torch.cuda.set_sync_debug_mode("error")`` from each micro-batch's start (its batch is
    already on the GPU) through its forward, loss, backward and every callback's and the
    loop's per-micro-batch work, until the next batch is moved to the GPU or the optimiser
    step begins (whose boundary reads values on purpose). Step 1 compiles and is not
    watched."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        strategy = trainer.strategy
        to_device = strategy.batch_to_device

        def unguarded_copy(*args: Any, **kwargs: Any) -> Any:
            torch.cuda.set_sync_debug_mode(0)  # a pageable host-to-device copy waits
            return to_device(*args, **kwargs)

        strategy.batch_to_device = unguarded_copy

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, idx: int) -> None:
        if trainer.global_step >= 1:
            GUARDED.append(trainer.global_step)
            torch.cuda.set_sync_debug_mode("error")

    def on_before_optimizer_step(self, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode(0)

    def on_train_end(self, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode(0)

    def on_exception(self, *args: Any) -> None:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("graphs", [False, True], ids=["compiled", "cuda-graphs"])
def test_no_host_sync_inside_a_micro_batch(tmp_path, graphs, fresh_dynamo):
    """4 steps of 4 micro-batches, the default callbacks (throughput, progress lines),
    attention sdpa (varlen reads its token count on the host by design, two reads per
    forward): steps 2 to 4 run their 12 micro-batches with every synchronising CUDA call an
    error."""
    GUARDED.clear()
    try:
        summary = _train(tmp_path, "phase.max_steps=4", "callbacks=default",
                         "model.config.attention=sdpa",
                         "+callbacks.sync={_target_:test_gpu_step.SyncGuard}",
                         f"accelerator.cuda_graphs={str(graphs).lower()}")  # fmt: skip
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert summary["steps"] == 4 and summary["plan"]["attention"] == "sdpa"
    assert GUARDED == [1] * 4 + [2] * 4 + [3] * 4
    assert math.isfinite(summary["validation"]["val/loss"])


# ------------------------------------------------------------------------- the probe


def test_a_run_without_a_micro_batch_times_candidates_on_the_gpu(tmp_path, monkeypatch):
    """``micro_batch_size`` unset (the tests' environment turns the probe off: on here): the
    plan's micro batch is the probe's choice among 4, 16 and 64 rows (64 sequences a step,
    tiny model: all fit), timed with CUDA events; plan.json records it and a second run
    reads it from the cache."""
    from omnibert.run.pretraining.job import prepare
    from omnibert.run.sizing.speed_probe import CUDA_TIMING

    monkeypatch.setenv("OMNIBERT_CACHE_DIR", str(tmp_path / "cache"))
    overrides = ["experiment=smoke", "accelerator=gpu", "micro_batch_size=null",
                 "micro_batch_probe=true", "phase.global_batch_size=64", "phase.max_steps=1",
                 "val_every_n_steps=null", f"paths.output_root={tmp_path}"]  # fmt: skip
    plan = prepare(TrainConfig.of(compose("pretrain", overrides))).plan
    probe = plan.micro_batch_probe
    assert probe is not None and probe["timing"] == CUDA_TIMING
    timed = [size for size, _ in probe["rates"]]
    assert timed == [4, 16, 64][: len(timed)] and probe["size"] in timed
    assert plan.batch.micro_batch_size == probe["size"]
    assert plan.micro_batch_choice.startswith("the fastest measured (rows/s: 4 → ")
    assert probe["why"] in plan.micro_batch_choice and CUDA_TIMING in plan.micro_batch_choice
    assert "timed eagerly (compile is on)" in plan.micro_batch_choice
    (entry,) = json.loads((tmp_path / "cache" / "micro_batch_probe.json").read_text()).values()
    assert entry["key"]["device"] == f"cuda {torch.cuda.get_device_name()}"
    assert entry["size"] == probe["size"]
    summary = run_or_exit(compose("pretrain", overrides), tmp_path / "out")
    recorded = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert recorded["micro_batch_probe"]["size"] == probe["size"] == summary["plan"][
        "batch"]["micro_batch_size"]  # fmt: skip
    assert "cached in" in recorded["micro_batch_choice"]
