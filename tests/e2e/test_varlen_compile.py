"""``varlen``'s fused path (CUDA's) traced by ``torch.compile`` on the CPU.

On CUDA the unpadded stream is indexed without host reads (``omnibert.models.varlen.
traced_index``) and attended by one fused kernel call, so a compiled training step is one
graph whose token count ``T`` is a size known only at run time. Here the CUDA kernel is
replaced by :func:`math_varlen`, a CPU stand-in with the same signature (cumulative lengths,
length bounds, dropout) registered as one opaque op with a fake implementation, as the aten
flash op is to Dynamo, and added to ``FUSED_KERNELS`` for the CPU: the model then runs the
CUDA path's code, compiled through the plugins' entry point (``compat.compile_in_place``).

Checked: no graph break and no recompile over batches of different ``T`` (forward and
backward), the loss and gradients of the ``math`` backend, the index equal to the host
index's (minus its empty segments), and that a host read in the index would be caught. The
``gpu``-marked twins run the same step on CUDA with its real kernels (flash in bf16,
memory-efficient in fp32) and inductor.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_attention import (
    BF16,
    FP32,
    TINY,
    assert_same_pretraining,
    batch_of,
    loss_and_grads,
    model_of,
)
from torch import Tensor

from omnibert.compat import compile_in_place
from omnibert.models import varlen
from omnibert.models.attention import Unpadded

# ------------------------------------------------------------------- the CPU stand-in kernel


def _probabilities(
    q: Tensor, k: Tensor, cu_q: Tensor, cu_k: Tensor, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """``[heads,Tq,Tk]`` softmax over the keys of each query's segment (``-inf`` elsewhere;
    a row without keys is zero) and the dropout's scaled keep mask (a fixed draw, so that
    the backward sees the forward's)."""
    seg_q = torch.searchsorted(cu_q, torch.arange(q.shape[0], dtype=cu_q.dtype), right=True)
    seg_k = torch.searchsorted(cu_k, torch.arange(k.shape[0], dtype=cu_k.dtype), right=True)
    scores = torch.einsum("qhd,khd->hqk", q, k) * q.shape[-1] ** -0.5
    outside = seg_q.unsqueeze(1) != seg_k.unsqueeze(0)
    probs = torch.softmax(scores.masked_fill(outside, float("-inf")), -1).nan_to_num()
    keep = torch.ones_like(probs)
    if dropout_p > 0.0:
        draw = torch.rand(probs.shape, generator=torch.Generator().manual_seed(0))
        keep = (draw >= dropout_p) / (1.0 - dropout_p)
    return probs, keep


@torch.library.custom_op("omnibert_test::math_varlen", mutates_args=())
def math_varlen(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    max_q: int,
    max_k: int,
    dropout_p: float,
) -> Tensor:
    """The fused kernel's contract written out: segment i of the queries over segment i of
    the keys (empty segments allowed, ``max_q``/``max_k`` bounds)."""
    assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.shape == cu_k.shape
    assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0]
    assert bool((cu_q.diff() <= max_q).all() & (cu_k.diff() <= max_k).all())
    probs, keep = _probabilities(q, k, cu_q, cu_k, dropout_p)
    return torch.einsum("hqk,khd->qhd", probs * keep, v).contiguous()


@math_varlen.register_fake
def _(q: Tensor, k: Tensor, v: Tensor, *args: Any) -> Tensor:
    return torch.empty_like(q)


@torch.library.custom_op("omnibert_test::math_varlen_backward", mutates_args=())
def math_varlen_backward(
    grad: Tensor, q: Tensor, k: Tensor, v: Tensor, cu_q: Tensor, cu_k: Tensor, dropout_p: float
) -> tuple[Tensor, Tensor, Tensor]:
    probs, keep = _probabilities(q, k, cu_q, cu_k, dropout_p)
    grad_v = torch.einsum("hqk,qhd->khd", probs * keep, grad)
    grad_p = torch.einsum("qhd,khd->hqk", grad, v) * keep
    grad_s = probs * (grad_p - (grad_p * probs).sum(-1, keepdim=True)) * q.shape[-1] ** -0.5
    grad_q = torch.einsum("hqk,khd->qhd", grad_s, k)
    grad_k = torch.einsum("hqk,qhd->khd", grad_s, q)
    return grad_q.contiguous(), grad_k.contiguous(), grad_v.contiguous()


@math_varlen_backward.register_fake
def _(grad: Tensor, q: Tensor, k: Tensor, v: Tensor, *args: Any) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _keep_inputs(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q, k, v, cu_q, cu_k, _, _, dropout_p = inputs
    ctx.save_for_backward(q, k, v, cu_q, cu_k)
    ctx.dropout_p = dropout_p


def _backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
    q, k, v, cu_q, cu_k = ctx.saved_tensors
    grads = math_varlen_backward(grad.contiguous(), q, k, v, cu_q, cu_k, ctx.dropout_p)
    return (*grads, None, None, None, None, None)


math_varlen.register_autograd(_backward, setup_context=_keep_inputs)


@pytest.fixture
def fused_on_cpu(monkeypatch: pytest.MonkeyPatch, fresh_dynamo: None) -> None:
    """The CPU runs varlen's fused path, with :func:`math_varlen` as its kernel."""
    monkeypatch.setitem(varlen.FUSED_KERNELS, "cpu", math_varlen)


# ----------------------------------------------------------------------------- the batches


def padding_only(packed: bool) -> dict[str, Tensor]:
    """No real token at all (evaluation padding): every slot weighs 0."""
    batch = batch_of(packed, padding_rows=False)
    for key in ("sequence_ids", "masked_lm_weights", "nsp_weights"):
        batch[key] = torch.zeros_like(batch[key])
    return batch


def batches(packed: bool, device: str = "cpu") -> list[dict[str, Tensor]]:
    """Four batches of the same shapes and four token counts: full rows, the last row all
    padding, the first row one token shorter (a token no head reads), no real token."""
    shorter = batch_of(packed, padding_rows=False)
    last = int(shorter["sequence_ids"][0].count_nonzero()) - 1
    for key in ("input_ids", "segment_ids", "position_ids", "sequence_ids"):
        shorter[key][0, last] = 0
    out = [batch_of(packed, padding_rows=False), batch_of(packed, padding_rows=True), shorter]
    out.append(padding_only(packed))
    assert len({int(b["sequence_ids"].count_nonzero()) for b in out}) == 4
    return [{key: value.to(device) for key, value in b.items()} for b in out]


def _counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]


# ----------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_compiled_step_is_one_graph_for_every_token_count_and_equals_math(
    packed: bool, fused_on_cpu: None
) -> None:
    """Forward and backward compiled as the plugins compile (static shapes), over four
    token counts (none at all the last): no graph break, no recompile, the ``math``
    backend's loss and gradients."""
    reference = model_of("math")
    model = model_of("varlen").train()
    compile_in_place(model, {"backend": "aot_eager", "dynamic": False})
    seen = []
    for batch in batches(packed):
        ours = loss_and_grads(model, batch)
        assert_same_pretraining(ours, loss_and_grads(reference, batch), FP32)
        seen.append(_counts())
    assert seen == [(0, 1)] * 4, seen  # (graph breaks, graphs) after each batch
    # the capture is scoped to the compiled model's calls
    assert not torch._dynamo.config.capture_dynamic_output_shape_ops


def test_attention_dropout_reaches_the_fused_kernel_inside_the_graph(fused_on_cpu: None) -> None:
    """With attention dropout (the GPU smoke run's 0.1) the step stays one graph; the
    stand-in's fixed draw makes the compiled loss and gradients the eager fused path's, and
    they differ from the dropout-free ones."""
    config = TINY.replace(attention_probs_dropout_prob=0.1)
    batch = batch_of(packed=True, padding_rows=True)
    eager = loss_and_grads(model_of("varlen", config).train(), batch)
    model = model_of("varlen", config).train()
    compile_in_place(model, {"backend": "aot_eager", "dynamic": False})
    assert_same_pretraining(loss_and_grads(model, batch), eager, FP32)
    assert _counts() == (0, 1)
    without = model_of("varlen").train()(batch)["loss"]
    assert not torch.equal(eager[0]["loss"], without)


def _index(ids: Tensor, positions: Tensor) -> tuple[Tensor, ...]:
    built = Unpadded.build(ids, positions, "sdpa", sequences_per_row=3)
    assert built.last is not None and built.queries is not None and built.slots is not None
    segments, last = built.attention.segments, built.last.segments
    return built.tokens, segments.cu_q, built.queries, built.slots, last.cu_q, last.cu_k


def test_the_fused_index_is_the_host_index_with_empty_segments(fused_on_cpu: None) -> None:
    """Rows whose sequence ids are not in runs, a row of padding only: the same tokens and
    read rows in the same order as the host index, and the same cumulative lengths once the
    empty segments are left out; the host index's own checks (test_attention.py) carry over."""
    ids = torch.tensor([[1, 2, 1, 2, 0, 0], [3, 3, 3, 1, 0, 0], [0, 0, 0, 0, 0, 0]])
    positions = torch.tensor([[5, 2, 0, 3], [0, 4, 1, 3], [0, 1, 2, 3]])
    tokens, cu, queries, slots, cu_last, cu_keys = _index(ids, positions)
    varlen.FUSED_KERNELS.pop("cpu")
    host = _index(ids, positions)
    assert tokens.tolist() == host[0].tolist() == [0, 2, 1, 3, 9, 6, 7, 8]
    assert queries.tolist() == host[2].tolist() and slots.tolist() == host[3].tolist()
    # 3 rows x 3 segments; the host index keeps the non-empty ones
    assert cu.shape == cu_last.shape == (10,) and cu.dtype == cu_last.dtype == torch.int32
    assert torch.equal(cu_keys, cu)
    assert cu.unique_consecutive().tolist() == host[1].tolist() == [0, 2, 4, 5, 8]
    assert cu_last.unique_consecutive().tolist() == host[4].tolist()


def test_a_host_read_in_the_index_would_break_the_graph(fused_on_cpu: None) -> None:
    """The index traced alone: no graph break; the same with a host read of the batch added
    (``int(tensor)``, as ``.tolist()`` / ``.item()`` would be) breaks it, so the counts of
    the tests above would catch a host read coming back."""
    from omnibert.compat import capture_data_dependent_shapes

    batch = batch_of(packed=True, padding_rows=True)
    positions = torch.cat((batch["masked_lm_positions"], batch["nsp_positions"]), dim=1)

    def with_host_read(ids: Tensor, positions: Tensor) -> tuple[Tensor, ...]:
        real = int(ids.count_nonzero())
        return (*_index(ids, positions), torch.tensor(real))

    breaks = []
    for index in (_index, with_host_read):
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        compiled = torch.compile(index, backend="eager", dynamic=False)
        capture_data_dependent_shapes(compiled)(batch["sequence_ids"], positions)
        breaks.append(_counts()[0])
    assert breaks[0] == 0 and breaks[1] > 0, breaks


def test_a_batch_without_real_tokens_gives_zero_rows_and_a_zero_loss(fused_on_cpu: None) -> None:
    """An empty stream: every read row zero (the host index computes padding instead)."""
    batch = padding_only(packed=True)
    model = model_of("varlen").eval()
    positions = torch.cat((batch["masked_lm_positions"], batch["nsp_positions"]), dim=1)
    inputs = [batch[k] for k in ("input_ids", "segment_ids", "position_ids", "sequence_ids")]
    with torch.no_grad():
        rows = model.bert(*inputs, output_positions=positions, sequences_per_row=3)
        assert rows.shape == (*positions.shape, TINY.hidden_size) and torch.all(rows == 0)
        assert model(batch)["loss"] == 0


# ------------------------------------------------------------------------------------ CUDA


@pytest.fixture
def cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs a CUDA device")


@pytest.mark.gpu
@pytest.mark.parametrize("dropout", [0.0, 0.1], ids=["no-dropout", "dropout"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_cuda_compiled_bf16_step_is_one_graph_for_every_token_count(
    packed: bool, dropout: float, cuda: None, fresh_dynamo: None
) -> None:
    """The GPU plugin's compile (inductor, static shapes) under bf16 autocast with flash:
    no graph break, no recompile over four token counts; without dropout the ``math``
    backend's loss and gradients (bf16 tolerances), with it a finite loss."""
    config = TINY.replace(attention_probs_dropout_prob=dropout)
    reference = model_of("math", config, device="cuda").train()
    model = model_of("varlen", config, device="cuda").train()
    compile_in_place(model, {"dynamic": False})
    seen = []
    for batch in batches(packed, device="cuda"):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            ours = loss_and_grads(model, batch)
            want = loss_and_grads(reference, batch)
        if dropout == 0.0:
            assert_same_pretraining(ours, want, BF16)
        assert torch.isfinite(ours[0]["loss"])
        seen.append(_counts())
    assert seen == [(0, 1)] * 4, seen


@pytest.mark.gpu
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_cuda_fp32_runs_the_memory_efficient_kernel_and_equals_math(
    compiled: bool, cuda: None, fresh_dynamo: None
) -> None:
    """fp32 on CUDA (flash has no fp32): memory-efficient varlen attention, whose backward
    wants its length bounds within the streams' lengths, on packed batches down to no real
    token; compiled, one graph for all of them."""
    reference = model_of("math", device="cuda")
    model = model_of("varlen", device="cuda")
    if compiled:
        compile_in_place(model, {"dynamic": False})
    for batch in batches(packed=True, device="cuda"):
        ours = loss_and_grads(model, batch)
        assert_same_pretraining(
            ours, loss_and_grads(reference, batch), {"rtol": 1e-4, "atol": 1e-4}
        )
    assert _counts() == ((0, 1) if compiled else (0, 0))
