"""The compiled training step is one graph: embeddings, encoder, heads and loss.

Training compiles the pretraining model's forward in place (``compat.compile_in_place``, the
plugins' entry point); its output is the loss, so one graph holds the embeddings, every
encoder layer, the MLM and NSP heads and the loss terms, and its backward is one graph too.
Checked through ``torch._dynamo``'s counters for BERT and for the modern encoder options
(rotary or ALiBi positions, gated feed-forward, pre-norm, RMSNorm, no biases, alternating
local/global layers, MLM only), on the static-shape kernels (``sdpa``, ``math``) on the CPU,
and with ``varlen``'s fused path, traced on the CPU with test_varlen_compile.py's stand-in
kernel and on CUDA with the real one (``-m gpu``). Not one graph, by design: ``varlen`` where
it indexes its stream on the host (the CPU, and windows or ALiBi on any device), which runs
between compiled graphs (docs/accelerators/gpu.md, "One compiled step").
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from test_attention import TINY, batch_of
from test_varlen_compile import math_varlen

from omnibert.compat import compile_in_place
from omnibert.models import BertConfig, BertForPreTraining, varlen

#: the modern encoder options, ModernBERT's way (modern_tiny's): rotary, GeGLU, pre-norm,
#: no biases, a local layer after a global one, MLM only
MODERN = {"position_encoding": "rope", "feed_forward": "geglu", "norm_position": "pre",
          "bias": False, "type_vocab_size": 0, "local_window": 8, "global_every": 2,
          "next_sentence_head": False}  # fmt: skip
#: MosaicBERT's way, with RMSNorm and SwiGLU: ALiBi, post-norm, biases
ALIBI = {"position_encoding": "alibi", "feed_forward": "swiglu", "norm": "rmsnorm",
         "next_sentence_head": False}  # fmt: skip
CASES = {
    "bert-sdpa": ("sdpa", {}),
    "modern-sdpa": ("sdpa", MODERN),
    "alibi-math": ("math", ALIBI),
}


def _counts() -> tuple[int, int, int]:
    from torch._dynamo.utils import counters

    breaks = sum(counters["graph_break"].values())
    return counters["frames"]["total"], counters["stats"]["unique_graphs"], breaks


def compiled_counts(
    config: BertConfig, backend: dict[str, Any], device: str = "cpu", dtype: Any = None
) -> list[tuple[int, int, int]]:
    """(frames, graphs, graph breaks) after each of two training passes of ``config``
    compiled in place as the plugins compile it (static shapes), on two batches of the same
    shapes and other token counts (packed rows, a row of padding only in the second)."""
    torch.manual_seed(0)
    model = BertForPreTraining(config).to(device).train()
    compile_in_place(model, {**backend, "dynamic": False})
    seen = []
    for padding_rows in (False, True):
        batch = {k: v.to(device) for k, v in batch_of(True, padding_rows).items()}
        with torch.autocast(device, dtype=dtype, enabled=dtype is not None):
            out = model(batch)
        out["loss"].backward()
        assert torch.isfinite(out["loss"])
        seen.append(_counts())
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_the_pretraining_step_is_one_graph_on_the_cpu(case: str, fresh_dynamo: None) -> None:
    attention, options = CASES[case]
    config = TINY.replace(attention=attention, **options)
    assert compiled_counts(config, {"backend": "eager"}) == [(1, 1, 0)] * 2


def test_the_fused_varlen_step_is_one_graph_with_the_modern_options(
    monkeypatch: pytest.MonkeyPatch, fresh_dynamo: None
) -> None:
    """Rotary positions without a window (ModernBERT's global layers) keep varlen on its fused
    kernel: the whole step, index included, is one graph over changing token counts."""
    monkeypatch.setitem(varlen.FUSED_KERNELS, "cpu", math_varlen)
    rope_only = {**MODERN, "local_window": 0}
    config = TINY.replace(attention="varlen", **rope_only)
    assert compiled_counts(config, {"backend": "eager"}) == [(1, 1, 0)] * 2


# ------------------------------------------------------------------------------------ CUDA


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("attention", "options"),
    [
        ("sdpa", {}),
        ("varlen", {}),
        ("sdpa", MODERN),
        ("varlen", {**MODERN, "local_window": 0}),
        ("sdpa", ALIBI),
    ],
    ids=["bert-sdpa", "bert-varlen", "modern-sdpa", "modern-rope-varlen", "alibi-sdpa"],
)
def test_the_pretraining_step_is_one_graph_on_cuda(
    attention: str, options: dict[str, Any], fresh_dynamo: None
) -> None:
    """The GPU plugin's compile (inductor, static shapes) under bf16 autocast, attention
    dropout on (BERT's 0.1; varlen's flash kernel takes it): one graph, no break, no
    recompile over two token counts."""
    if not torch.cuda.is_available():
        pytest.fail("the gpu marker needs a CUDA device")
    config = TINY.replace(attention=attention, attention_probs_dropout_prob=0.1, **options)
    assert compiled_counts(config, {}, "cuda", torch.bfloat16) == [(1, 1, 0)] * 2
