"""The memory estimate of a GPU run counts what CUDA's kernels keep, on the CPU.

``omnibert.run.sizing.activation_memory.estimate`` runs the forward on the meta device; for a
CUDA run it counts SDPA as the fused kernel CUDA runs (q, k, v, output, logsumexp: no ``[B,H,S,S]``
probabilities), autocast's casts (bf16 matmul outputs) and dropout's one-byte masks. Counted
like a CPU step instead, BERT-large at seq 512 and micro batch 32 in bf16-mixed came to
144 GiB, and ``micro_batch_size=32`` was refused on an 80 GB H100 and on a 141 GB H200.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from omnibert.apps.compose import compose
from omnibert.config import TrainConfig
from omnibert.data.collate import PretrainingCollator
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.generated import GeneratedSource
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.run.pretraining.job import prepare
from omnibert.run.sizing import activation_memory
from omnibert.run.sizing.activation_memory import (
    Target,
    estimate,
    meta_batch,
    saved_activation_bytes,
    target_kernels,
)

GiB = 2**30
LARGE = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24,
                   num_attention_heads=16, intermediate_size=4096)  # fmt: skip
BASE = BertConfig(vocab_size=30522)
TINY = BertConfig(vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                  intermediate_size=64, max_position_embeddings=64)  # fmt: skip


def _shapes(batch: int, seq: int, masks: int) -> dict[str, list[int]]:
    return {
        "input_ids": [batch, seq],
        "masked_lm_positions": [batch, masks],
        "nsp_labels": [batch, 1],
    }


def test_bert_large_and_base_on_cuda_are_estimated_near_the_h200_measurement():
    """Measured peaks (``torch.cuda.max_memory_allocated``): NVIDIA H200, torch 2.11,
    scripts/bench_gpu.py --lease, 2026-11-26, docs/benchmarks/gpu-h200-lease.json: 24.68 GiB
    during omnibert's BERT-large steps at seq 512, micro batch 32 (bf16-mixed, layers
    compiled, SDPA with the block-diagonal mask, attention dropout 0.1, LAMB), with Hugging
    Face's model of the same size and its LAMB state also resident (~3.75-5 GiB): omnibert's
    step alone needs about 19.7-21 GiB. BERT-base at seq 128, micro batch 128: 9.27 GiB, about
    7.6-8 GiB alone. Counted as on the CPU (probabilities and dropout masks kept, fp32) the
    estimates were 144 and 31 GiB."""
    large = estimate(LARGE, _shapes(32, 512, 76), "bf16-mixed", None, "cuda")
    memory = large["memory"]
    assert 12 * GiB < memory["total"] < 32 * GiB, memory["total"] / GiB
    # the fixed part is what it was: fp32 weights and gradients, LAMB's two fp32 moments
    params = large["parameters"]
    assert memory["parameters"] == memory["gradients"] == 4 * params
    assert memory["optimizer_state"] == 8 * params
    assert "fused SDPA" in large["counted_as"] and "bf16 autocast" in large["counted_as"]
    assert large["counted_as"].startswith("cuda kernels")

    base = estimate(BASE, _shapes(128, 128, 20), "bf16-mixed", None, "cuda", flops=False)
    assert 4 * GiB < base["memory"]["total"] < 12 * GiB, base["memory"]["total"] / GiB
    assert base["flops_per_micro_batch"] is None  # not counted when not asked for

    # the same BERT-base step on the CPU keeps the probabilities: far more
    cpu = estimate(BASE, _shapes(128, 128, 20), "32-true", None, "cpu", flops=False)
    assert cpu["memory"]["total"] > 2.5 * base["memory"]["total"]
    assert "math" in cpu["counted_as"]


def test_the_kernels_counted_follow_the_device_the_backend_and_the_precision():
    cuda = target_kernels(TINY, "cuda", "bf16-mixed", 128)
    assert cuda == Target("cuda", "sdpa", fused_sdpa=True, autocast=torch.bfloat16)
    for backend in ("sdpa", "flex", "varlen"):  # one fused kernel each on CUDA
        config = dataclasses.replace(TINY, attention=backend)
        assert target_kernels(config, "cuda", "32-true", 512).fused_sdpa
    math = target_kernels(dataclasses.replace(TINY, attention="math"), "cuda", "16-mixed", 128)
    assert math == Target("cuda", "math", autocast=torch.float16)
    # CPU training with attention dropout: auto runs the math kernel (seq 128) or varlen
    # re-padded per bucket with the math kernel (seq 512): the probabilities are kept
    assert target_kernels(TINY, "cpu", "32-true", 128) == Target("cpu", "math")
    assert target_kernels(TINY, "cpu", "32-true", 512) == Target("cpu", "math")
    # without dropout the CPU's SDPA is its flash kernel
    quiet = dataclasses.replace(TINY, attention_probs_dropout_prob=0.0)
    assert target_kernels(quiet, "cpu", "bf16-true", 128) == Target("cpu", "sdpa", True)
    # devices whose kernels are not known here: SDPA's math decomposition, as before
    assert target_kernels(TINY, "hpu", "bf16-mixed", 128).fused_sdpa is False


def _real_batch(batch: int, seq: int, masks: int) -> dict[str, torch.Tensor]:
    data = PretrainingDataModule(source=GeneratedSource, vocab_size=128, max_seq_length=seq,
                                 max_predictions_per_seq=masks, micro_batch_size=batch)  # fmt: skip
    data.check()
    rows = data.source.rows("train")
    return PretrainingCollator(seq, masks)(rows.__getitems__(list(range(batch))))  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("attention", "dropout", "precision"),
    [("math", 0.1, "bf16-mixed"), ("math", 0.1, "32-true"), ("sdpa", 0.0, "bf16-mixed"),
     ("sdpa", 0.0, "32-true"), ("sdpa", 0.1, "bf16-mixed")],
)  # fmt: skip
def test_the_meta_count_equals_a_real_cpu_forward_with_autocast(attention, dropout, precision):
    """The stand-ins are checked where the real kernels run here: the CPU's autocast policy
    (layer norm and softmax in bf16) and its fused SDPA (flash, without dropout)."""
    config = dataclasses.replace(TINY, attention=attention, attention_probs_dropout_prob=dropout)
    target = target_kernels(config, "cpu", precision, 32)
    assert target.fused_sdpa == (attention == "sdpa" and dropout == 0.0)
    torch.manual_seed(0)
    real_model = BertForPreTraining(config)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16-mixed")
    with autocast:
        real = saved_activation_bytes(real_model, _real_batch(4, 32, 5))
    with torch.device("meta"):
        meta_model = BertForPreTraining(config)
    meta = saved_activation_bytes(meta_model, meta_batch(_shapes(4, 32, 5)), target)
    assert abs(meta - real) / real < 0.02, (meta, real)


def _saved(target: Target, forward: Callable[[], None]) -> list[torch.Tensor]:
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
    with hooks, activation_memory._TargetMode(target):
        forward()
    return saved


def test_cuda_autocast_casts_and_the_fused_attention_stand_in():
    x = torch.empty(2, 3, 8, device="meta", requires_grad=True)
    weight = torch.empty(5, 8, device="meta", requires_grad=True)
    cuda = Target("cuda", "sdpa", fused_sdpa=True, autocast=torch.bfloat16)
    outputs: dict[str, torch.Tensor] = {}

    def forward() -> None:
        outputs["linear"] = F.linear(x, weight)
        outputs["again"] = F.linear(x, weight)
        outputs["norm"] = F.layer_norm(outputs["linear"], (5,))
        outputs["softmax"] = torch.softmax(outputs["linear"], -1)
        outputs["dropout"] = F.dropout(outputs["linear"], 0.1, training=True)

    saved = _saved(cuda, forward)
    assert outputs["linear"].dtype == torch.bfloat16
    # CUDA's autocast runs layer norm and softmax in fp32 (the CPU's in bf16)
    assert outputs["norm"].dtype == outputs["softmax"].dtype == torch.float32
    # each parameter is cast once per forward, and the cast is what the matmul keeps
    casts = {t.untyped_storage()._cdata for t in saved if t.shape in ((5, 8), (8, 5))}
    assert len(casts) == 1 and all(t.dtype == torch.bfloat16 for t in saved[:2])
    # CUDA's dropout keeps a one-byte mask
    assert saved[-1].dtype == torch.bool and outputs["dropout"].dtype == torch.bfloat16
    cpu = Target("cpu", "math", autocast=torch.bfloat16)
    assert _saved(cpu, forward)[-1].dtype == torch.bfloat16
    assert outputs["norm"].dtype == outputs["softmax"].dtype == torch.bfloat16

    q, k, v = (torch.empty(2, 4, 16, 8, device="meta", requires_grad=True) for _ in range(3))
    mask = torch.empty(2, 1, 16, 16, dtype=torch.bool, device="meta")
    saved = _saved(
        cuda,
        lambda: outputs.update(out=F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                  dropout_p=0.1)),
    )  # fmt: skip
    shapes = [(tuple(t.shape), t.dtype) for t in saved]
    assert shapes == [
        *[((2, 4, 16, 8), torch.bfloat16)] * 4,  # q, k, v (cast by autocast) and the output
        ((2, 4, 16), torch.float32),  # logsumexp
        ((2, 1, 16, 16), torch.bfloat16),  # the mask as a bias
    ]
    # written [B,Q,H,D] as the kernels do: the output projection's input is a view of it
    assert outputs["out"].transpose(1, 2).is_contiguous()


class _H100:
    """``torch.cuda`` answering as a host with one 80 GB H100 would (tests/e2e/test_kernels.py)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H100 80GB HBM3")
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *a: (80 * 2**30, 80 * 2**30))


def test_bert_large_at_seq_512_and_micro_batch_32_fits_an_h100(monkeypatch, tmp_path):
    """Through the app's wiring (``omnibert-train accelerator=gpu model=bert_large
    phase.max_seq_length=512 micro_batch_size=32``): the micro-batch check passes, and an
    unset micro batch is not chosen far too small."""
    _H100(monkeypatch)
    overrides = [
        "accelerator=gpu", "model=bert_large", "data=generated", "data.num_workers=0",
        "phase.max_seq_length=512", "phase.max_predictions_per_seq=76",
        "phase.global_batch_size=256", "data.num_train_samples=512", "data.num_eval_samples=8",
        f"paths.output_root={tmp_path}",
    ]  # fmt: skip
    prepared = prepare(TrainConfig.of(compose("pretrain", [*overrides, "micro_batch_size=32"])))
    plan = prepared.plan
    assert plan.precision == "bf16-mixed" and plan.batch.micro_batch_size == 32
    assert plan.micro_batch_choice.startswith("set by micro_batch_size; estimate ")
    estimated = float(plan.micro_batch_choice.split("estimate ")[1].split(" GiB")[0])
    assert 12 < estimated < 32, plan.micro_batch_choice

    chosen = prepare(TrainConfig.of(compose("pretrain", overrides))).plan
    # 80 % of 80 GiB holds micro batch 64 (the largest divisor of 256 within it): counted as
    # on the CPU it was 8
    assert chosen.batch.micro_batch_size >= 32, chosen.micro_batch_choice
    assert "80.00 GiB (torch.cuda.mem_get_info (total))" in chosen.micro_batch_choice


def test_zero1_counts_the_optimizer_state_one_rank_holds(tmp_path):
    """``accelerator.optimizer_sharding=zero1``: the estimate counts one rank's share of the
    optimiser state (the largest share of ZeRO-1's partition of whole tensors), everything
    else as before; the share comes from the run's config."""
    shapes = _shapes(8, 128, 20)
    whole = estimate(BASE, shapes, "bf16-mixed", None, "cuda", flops=False)["memory"]
    shard = estimate(BASE, shapes, "bf16-mixed", None, "cuda", flops=False, optimizer_ranks=8)
    shared = shard["memory"]
    sizes = [p.numel() for p in BertForPreTraining(BASE).parameters()]
    # the rank that holds the word embeddings (the largest tensor) holds the most: more than
    # the even share, less than a quarter of the whole (bf16-mixed: 8 bytes per element)
    assert max(sizes) * 8 <= shared["optimizer_state"] < whole["optimizer_state"] / 4
    assert shared["optimizer_state"] > whole["optimizer_state"] / 8
    assert {k: v for k, v in shared.items() if k not in ("optimizer_state", "total")} == {
        k: v for k, v in whole.items() if k not in ("optimizer_state", "total")
    }
    assert whole["total"] - shared["total"] == whole["optimizer_state"] - shared["optimizer_state"]

    base = ["data=generated", f"paths.output_root={tmp_path}", "accelerator.devices=2"]
    config = TrainConfig.of(compose("pretrain", [*base, "accelerator.optimizer_sharding=zero1"]))
    assert config.accelerator.optimizer_ranks == 2
    assert TrainConfig.of(compose("pretrain", base)).accelerator.optimizer_ranks == 1
