"""CUDA graphs with gradient accumulation (omnibert.accelerators.cuda_graphs), on the CPU.

A replayed CUDA graph writes its outputs into the same memory at every replay. The CPU has no
CUDA graphs, so :class:`ReplayedGradients` makes each parameter's gradient behave as a graph's
output does: a tensor hook copies the gradient into one buffer per parameter (the graph's
output memory) and hands autograd a new tensor over that buffer, every backward. torch's
AccumulateGrad adopts such a tensor as ``.grad`` when the parameter has none, and the next
micro-batch's copy then overwrites the sum (pytorch/pytorch#169545 on CUDA). The runs go
through ``omnibert-train``'s own path (experiment=smoke, 4 micro-batches per step), with the
GPU plugin's CUDA graph callback added as a configured callback, and their final weights are
compared with a run without the replay: equal with the callback, different without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit

#: what ReplayedGradients saw at each optimiser step: the gradient tensors' addresses and
#: whether any of them was a replay buffer
SEEN: list[dict[str, Any]] = []


def _replayed(buffer: torch.Tensor) -> Any:
    def hook(grad: torch.Tensor) -> torch.Tensor:
        buffer.copy_(grad)  # the replay writes its output where the last one was
        return buffer.view(buffer.shape)  # a new tensor over the graph's memory, as CUDA graphs

    return hook


class ReplayedGradients(Callback):
    """Every trainable parameter's incoming gradient as a CUDA graph replay's output (module
    docstring), and what ``.grad`` is at each optimiser step recorded in :data:`SEEN`."""

    def __init__(self) -> None:
        self.buffers: list[torch.Tensor] = []
        self.handles: list[Any] = []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        for param in pl_module.parameters():
            if param.requires_grad:
                self.buffers.append(torch.empty_like(param))
                self.handles.append(param.register_hook(_replayed(self.buffers[-1])))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        grads = [p.grad for p in pl_module.parameters() if p.requires_grad]
        owned = {b.untyped_storage().data_ptr() for b in self.buffers}
        SEEN.append({
            "grads": [g.data_ptr() if g is not None else None for g in grads],
            "in_replay_buffers": any(
                g is not None and g.untyped_storage().data_ptr() in owned for g in grads
            ),
        })  # fmt: skip

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        for handle in self.handles:
            handle.remove()


def test_autograd_adopts_a_missing_gradient_and_adds_into_an_existing_one():
    """What the mechanism relies on, in torch itself: four backward passes whose gradient is
    rewritten in one buffer each time sum to twice the last one when ``.grad`` starts as None
    (adopted), and to the true sum when ``.grad`` is a zero tensor of its own (in place)."""
    sums = []
    for own in (False, True):
        param = torch.nn.Parameter(torch.zeros(3))
        if own:
            param.grad = torch.zeros_like(param)
        param.register_hook(_replayed(torch.empty(3)))
        for k in (1.0, 2.0, 3.0, 4.0):
            (param * k).sum().backward()
        assert param.grad is not None
        sums.append(param.grad.tolist())
    assert sums == [[8.0] * 3, [10.0] * 3]


SMOKE = ("experiment=smoke", "phase.global_batch_size=16", "micro_batch_size=4",
         "phase.max_steps=2", "val_every_n_steps=null", "accelerator.threads=1")  # fmt: skip
REPLAY = "+callbacks.replay={_target_:test_cuda_graph_gradients.ReplayedGradients}"
GRAPHS = "+callbacks.graphs={_target_:omnibert.accelerators.cuda_graphs.cuda_graph_step_marker}"


def _weights(root: Path, *overrides: str) -> dict[str, torch.Tensor]:
    summary = run_or_exit(
        compose("pretrain", [*SMOKE, f"paths.output_root={root}", *overrides]), root / "out"
    )
    assert summary["steps"] == 2 and summary["plan"]["batch"]["accumulate_grad_batches"] == 4
    checkpoint = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)
    return dict(checkpoint["state_dict"])


@pytest.mark.parametrize(
    "clip",
    [(), ("clip_grad_per_micro_batch=1.0", "optimizer.max_grad_norm=null")],
    ids=["lamb", "clipped-per-micro-batch"],
)
def test_replayed_gradients_accumulate_exactly_with_the_cuda_graph_callback(tmp_path, clip):
    """Without the callback the replay corrupts the sum (the weights differ from a plain
    run's); with it the gradients are the task's own zeroed tensors, the same ones at every
    step, and the weights equal the plain run's. MLPerf's per-micro-batch clipping (which sets
    the gradients aside around each backward) is covered too."""
    SEEN.clear()
    plain = _weights(tmp_path / "plain", *clip)
    graphs = _weights(tmp_path / "graphs", *clip, REPLAY, GRAPHS)
    kept = list(SEEN)
    assert len(kept) == 2 and not any(s["in_replay_buffers"] for s in kept)
    assert None not in kept[0]["grads"] and kept[0]["grads"] == kept[1]["grads"]
    assert plain.keys() == graphs.keys()
    for name, value in plain.items():
        assert torch.equal(graphs[name], value), name
    if clip:
        return  # the failure without the callback is the same: shown once
    SEEN.clear()
    broken = _weights(tmp_path / "broken", REPLAY)
    assert all(s["in_replay_buffers"] for s in SEEN)
    differ = [
        n for n, v in plain.items() if v.is_floating_point() and not torch.equal(broken[n], v)
    ]
    assert "model.bert.embeddings.word_embeddings.weight" in differ, differ
