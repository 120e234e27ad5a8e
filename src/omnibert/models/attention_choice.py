"""Which attention backend runs (``model.config.attention``), decided before compute and
without torch: ``auto``'s table per device type, attention dropout and sequence length
(:func:`resolve_attention`), and the backends that cannot run a given way, refused in one
sentence naming the key to change (:func:`check_backend`). The kernels themselves are
:mod:`omnibert.models.attention`'s.
"""

from __future__ import annotations

from omnibert.models.config import ATTENTION_BACKENDS, BertConfigError

__all__ = [
    "ATTENTION_BACKENDS",
    "AUTO_CHOICES",
    "FLEX_MIN_HEAD_SIZE",
    "check_backend",
    "plan_attention",
    "resolve_attention",
]

#: ``auto``'s choice per (device type, attention dropout active): the backend for sequence
#: lengths up to each bound. CPU: from scripts/bench_attention.py (its figures are on the
#: docs page pretraining/attention.md): at seq 128 rows are nearly all real tokens and
#: unpadding does not pay; at seq 512 (Wikipedia lengths, about half padding) varlen is the
#: fastest (timed with attention dropout; without it the same rows are skipped, not timed
#: apart). CUDA: ``sdpa`` (the dense mask path): ``auto`` leaves it only where a benchmark
#: shows a faster backend, and varlen on CUDA has no timing (docs/pretraining/attention.md
#: says how to take one with ``scripts/bench_gpu.py``). Device types not listed (hpu, ipu:
#: static graphs, no host syncs) use ``sdpa``.
AUTO_CHOICES: dict[tuple[str, bool], tuple[tuple[int, str], ...]] = {
    ("cpu", False): ((128, "sdpa"), (1 << 30, "varlen")),
    ("cpu", True): ((128, "math"), (1 << 30, "varlen")),
    ("cuda", False): ((1 << 30, "sdpa"),),
    ("cuda", True): ((1 << 30, "sdpa"),),
}


def resolve_attention(backend: str, device_type: str, dropout: bool, seq_length: int) -> str:
    """The backend that runs: ``backend`` itself, or ``auto``'s choice (:data:`AUTO_CHOICES`)
    for this device type, attention dropout (on or off) and sequence length (on the meta
    device, ``varlen`` counts as ``math``)."""
    if backend == "varlen" and device_type == "meta":
        # the memory estimate's meta forward (omnibert.run.sizing.compile_only) has no data to
        # unpad: it counts the padded math path, an upper bound of what varlen keeps
        return "math"
    if backend != "auto":
        return backend
    for bound, choice in AUTO_CHOICES.get((device_type, dropout), ((1 << 30, "sdpa"),)):
        if seq_length <= bound:
            return choice
    return "sdpa"


#: the smallest head size inductor's FlexAttention kernels take on CUDA (torch 2.11 on an H200:
#: "NYI: embedding dimension of the query, key, and value must be at least 16")
FLEX_MIN_HEAD_SIZE = 16


def check_backend(
    backend: str, device_type: str, dropout: bool, *, backward: bool, head_size: int | None = None
) -> None:
    """Refuse, with the key to change, a backend that cannot run this way (before compute)."""
    small_heads = head_size is not None and head_size < FLEX_MIN_HEAD_SIZE
    if backend == "flex" and device_type == "ipu":
        raise BertConfigError(
            "model.config.attention=flex needs FlexAttention (torch >= 2.5), which the IPU's "
            "torch 2.0.1 (poptorch 3.4) does not have; use auto, sdpa or math there."
        )
    if backend == "flex" and device_type == "cuda" and small_heads:
        raise BertConfigError(
            f"model.config.attention=flex needs a head size of at least {FLEX_MIN_HEAD_SIZE} "
            f"on CUDA, and hidden_size / num_attention_heads is {head_size} here; use fewer "
            "heads, or auto, sdpa, math or varlen."
        )
    if backend == "flex" and dropout:
        raise BertConfigError(
            "model.config.attention=flex has no attention dropout; set "
            "model.config.attention_probs_dropout_prob=0.0 or use sdpa, math or varlen."
        )
    if backend == "flex" and backward and device_type == "cpu":
        raise BertConfigError(
            "model.config.attention=flex has no backward pass on the CPU in this torch; use "
            "auto, sdpa, math or varlen to train on the CPU (flex runs CPU inference only)."
        )
    if backend == "varlen" and device_type in ("hpu", "ipu"):
        raise BertConfigError(
            f"model.config.attention=varlen needs data-dependent shapes, which {device_type} "
            "graphs do not have; use auto, sdpa or math there."
        )


def plan_attention(
    backend: str,
    device_type: str,
    dropout_prob: float,
    seq_length: int,
    head_size: int | None = None,
) -> str:
    """What a training run will use, for its plan (checked first: :func:`check_backend`)."""
    dropout = dropout_prob > 0.0
    check_backend(backend, device_type, dropout, backward=True, head_size=head_size)
    if backend != "auto":
        return backend
    train = resolve_attention(backend, device_type, dropout, seq_length)
    evaluate = resolve_attention(backend, device_type, False, seq_length)
    return (
        f"auto: {train} in training, {evaluate} in evaluation ({device_type}, seq {seq_length}, "
        f"attention dropout {dropout_prob:g}; "
        "measured table omnibert.models.attention_choice.AUTO_CHOICES)"
    )
