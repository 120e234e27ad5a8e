"""Hugging Face ModernBERT in and out: the modern-encoder options that equal
``transformers.ModernBertForMaskedLM`` (docs/modern.md, "Interop").

A :class:`~omnibert.models.BertConfig` is of the ModernBERT family when it has rotary
positions, a gated feed-forward (``geglu``: Hugging Face's ``hidden_activation="gelu"``;
``swiglu``: ``"silu"``), pre-norm LayerNorm with the embedding norm, no token types and no
next-sentence head. Its other options map one to one: ``bias`` is Hugging Face's
``norm_bias`` = ``attention_bias`` = ``mlp_bias`` = ``classifier_bias`` (the MLM head's
dense), ``decoder_bias``, ``tie_word_embeddings``, ``rope_theta`` / ``rope_theta_local`` the
full / sliding layers' ``rope_theta``, ``local_window`` is ``local_attention`` (keys within
``local_window // 2`` positions either side, Hugging Face's ``sliding_window``) and layer i is
global iff ``i % global_every == 0`` (``layer_types``, ``global_attn_every_n_layers``),
``hidden_act`` is the MLM head's ``classifier_activation``, ``pooling`` its
``classifier_pooling``.

Parameters: our separate ``query``/``key``/``value`` are Hugging Face's fused ``attn.Wqkv``
(rows in that order), ``attention.output.dense`` is ``attn.Wo``, ``intermediate.dense`` /
``output.dense`` are ``mlp.Wi`` / ``mlp.Wo``, the MLM transform is ``head``, the decoder
``decoder`` (its weight not written when tied, as ``save_pretrained`` does). Vocabulary rows
past ``vocab_size`` (our padding) are stripped on export and stay zero on import.

Anything else (alibi, RMSNorm, post-norm, learned positions, token types, the NSP head, an
embedding without its norm) has no Hugging Face class and is refused in one sentence before
any file is written; a ModernBERT ``config.json`` whose options omnibert cannot express
(another rope type, an activation other than GELU / SiLU in the GLU, biases that differ
between norms and Linear layers, a layer pattern that is not one global layer every n) is
refused the same way before the model changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omnibert.models import BertConfig, BertConfigError
from omnibert.models.config import ACTIVATIONS

__all__ = [
    "ARCHITECTURE",
    "MODEL_TYPE",
    "check_exportable",
    "from_modernbert_dict",
    "modernbert_blockers",
    "modernbert_export_dict",
    "modernbert_from_tensors",
    "modernbert_parameter_pairs",
    "modernbert_tensors",
    "special_token_ids",
]

MODEL_TYPE = "modernbert"
ARCHITECTURE = "ModernBertForMaskedLM"
#: what ModernBertForMaskedLM fixes, as (field, the value it needs)
_FAMILY = (
    ("position_encoding", "rope"),
    ("norm_position", "pre"),
    ("norm", "layernorm"),
    ("embedding_norm", True),
    ("type_vocab_size", 0),
    ("next_sentence_head", False),
)
#: our gated feed-forward <-> Hugging Face's ``hidden_activation`` (the GLU's activation)
_GLU_ACTIVATION = {"geglu": "gelu", "swiglu": "silu"}
_GLU_FROM_HF = {"gelu": "geglu", "silu": "swiglu", "swish": "swiglu"}
#: the Hugging Face keys whose tensors hold one row per vocabulary entry
_VOCAB_HF_KEYS = ("model.embeddings.tok_embeddings.weight", "decoder.weight", "decoder.bias")
#: the special tokens config.json names by id (Hugging Face key -> vocab.txt token)
_SPECIAL_IDS = {
    "pad_token_id": "[PAD]",
    "cls_token_id": "[CLS]",
    "sep_token_id": "[SEP]",
    "mask_token_id": "[MASK]",
    "bos_token_id": "[CLS]",
    "eos_token_id": "[SEP]",
}


def _show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def modernbert_blockers(config: BertConfig) -> list[str]:
    """``field=value`` for every option of ``config`` that ModernBertForMaskedLM cannot hold
    (empty: it exports as ModernBERT)."""
    blockers = [
        f"{name}={_show(getattr(config, name))}"
        for name, needed in _FAMILY
        if getattr(config, name) != needed
    ]
    if config.feed_forward not in _GLU_ACTIVATION:
        blockers.append(f"feed_forward={config.feed_forward}")
    return blockers


def check_exportable(config: BertConfig) -> None:
    """One sentence (:class:`BertConfigError`) when ``config`` is neither BERT nor ModernBERT."""
    if config.is_bert:
        return
    blockers = modernbert_blockers(config)
    if not blockers:
        return
    needs = ", ".join(f"{name}={_show(value)}" for name, value in _FAMILY)
    raise BertConfigError(
        f"model.config has no Hugging Face class: it is not original BERT (BertForPreTraining) "
        f"and {', '.join(blockers)} has no equivalent in ModernBertForMaskedLM (which needs "
        f"{needs}, feed_forward=geglu or swiglu), so nothing was exported."
    )


def special_token_ids(vocab_file: Path | None) -> dict[str, int | None]:
    """config.json's ``pad_token_id`` ... ``eos_token_id`` from the vocab file's lines (None
    for a token it lacks; pad 0 and the others None without a vocab file)."""
    if vocab_file is None:
        return {key: 0 if key == "pad_token_id" else None for key in _SPECIAL_IDS}
    ids: dict[str, int] = {}
    with vocab_file.open(encoding="utf-8") as handle:
        for index, line in enumerate(handle):
            ids.setdefault(line.rstrip("\n").strip(), index)
    return {key: ids.get(token) for key, token in _SPECIAL_IDS.items()}


def modernbert_export_dict(config: BertConfig, vocab_file: Path | None) -> dict[str, Any]:
    """The ``config.json`` of ``ModernBertForMaskedLM`` for ``config`` (real vocab size, the
    special tokens' ids from ``vocab_file``); refuses, before anything is written, a config
    that has no Hugging Face class."""
    check_exportable(config)
    layers = range(config.num_hidden_layers)
    types = ["sliding_attention" if config.is_local(i) else "full_attention" for i in layers]
    ids = special_token_ids(vocab_file)
    if ids["pad_token_id"] is None:  # HF's embedding needs a padding row; BERT's is 0
        ids["pad_token_id"] = 0
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "hidden_activation": _GLU_ACTIVATION[config.feed_forward],
        "max_position_embeddings": config.max_position_embeddings,
        "initializer_range": config.initializer_range,
        "norm_eps": config.layer_norm_eps,
        "norm_bias": config.bias,
        "attention_bias": config.bias,
        "mlp_bias": config.bias,
        "classifier_bias": config.bias,
        "classifier_activation": config.hidden_act,
        "classifier_pooling": config.pooling,
        "decoder_bias": config.decoder_bias,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_dropout": config.attention_probs_dropout_prob,
        "embedding_dropout": config.hidden_dropout_prob,
        "mlp_dropout": config.hidden_dropout_prob,
        "classifier_dropout": config.hidden_dropout_prob,
        "layer_types": types,
        # the window of the local layers (unused without them: every layer is global)
        "local_attention": config.local_window or config.max_position_embeddings,
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta},
            "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_theta_local},
        },
        # the keys transformers 4.x reads instead of layer_types / rope_parameters
        "global_attn_every_n_layers": config.global_every if config.local_window else 1,
        "global_rope_theta": config.rope_theta,
        "local_rope_theta": config.rope_theta_local,
        **ids,
    }


def _global_every(layer_types: list[Any], key: str) -> int:
    """``n`` such that layer i is ``full_attention`` iff ``i % n == 0`` (1: all global)."""
    full = [t == "full_attention" for t in layer_types]
    unknown = sorted({str(t) for t in layer_types} - {"full_attention", "sliding_attention"})
    if not unknown:
        for every in range(1, len(full) + 1):
            if all(f == (i % every == 0) for i, f in enumerate(full)):
                return every
    raise BertConfigError(
        f"config.json has {key}={layer_types}, which is not one full_attention layer every n "
        "layers starting at layer 0 (omnibert's global_every); only that pattern can be loaded."
    )


def _rope_thetas(values: Mapping[str, Any]) -> tuple[float, float]:
    """(global, local) rotary bases: ``rope_parameters`` (transformers 5) or the
    ``global_rope_theta`` / ``local_rope_theta`` keys (4.x), else Hugging Face's defaults."""
    thetas = [float(values.get("global_rope_theta", 160000.0))]
    thetas.append(float(values.get("local_rope_theta", 10000.0)))
    params = values.get("rope_parameters")
    if isinstance(params, Mapping):
        for i, kind in enumerate(("full_attention", "sliding_attention")):
            entry = params.get(kind)
            if not isinstance(entry, Mapping):
                continue
            rope_type = entry.get("rope_type", "default")
            if rope_type != "default":
                raise BertConfigError(
                    f"config.json has rope_parameters.{kind}.rope_type={rope_type!r}; omnibert's "
                    "rotary embedding is the default (unscaled) one only."
                )
            if "rope_theta" in entry:
                thetas[i] = float(entry["rope_theta"])
    return thetas[0], thetas[1]


def from_modernbert_dict(
    values: Mapping[str, Any], *, pad_vocab_size_multiple: int = 8
) -> BertConfig:
    """The :class:`BertConfig` of a Hugging Face ModernBERT ``config.json`` dict (Hugging
    Face's ModernBertConfig defaults for absent keys); one sentence for an option omnibert
    cannot express."""
    if "vocab_size" not in values:
        raise BertConfigError("config.json has no vocab_size; add the checkpoint's vocab size.")
    glu = str(values.get("hidden_activation", "gelu"))
    if glu not in _GLU_FROM_HF:
        raise BertConfigError(
            f"config.json has hidden_activation={glu!r}; omnibert's gated feed-forward is GeGLU "
            "with exact GELU ('gelu') or SwiGLU ('silu') only."
        )
    head_act = str(values.get("classifier_activation", "gelu"))
    if head_act not in ACTIVATIONS:
        raise BertConfigError(
            f"config.json has classifier_activation={head_act!r}; the MLM head's activation "
            f"must be one of {', '.join(ACTIVATIONS)}."
        )
    flags = ("norm_bias", "attention_bias", "mlp_bias", "classifier_bias")
    biases = {name: bool(values.get(name, False)) for name in flags}
    if len(set(biases.values())) > 1:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in biases.items())
        raise BertConfigError(
            f"config.json has {shown}; omnibert's one bias option sets them all alike, so only "
            "checkpoints where they agree can be loaded."
        )
    layers = int(values.get("num_hidden_layers", 22))
    if values.get("layer_types") is not None:
        every = _global_every(list(values["layer_types"]), "layer_types")
    else:
        every = values.get("global_attn_every_n_layers", 3)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise BertConfigError(
                f"config.json has global_attn_every_n_layers={every!r}; it must be a positive "
                "integer (or give layer_types)."
            )
    local = every > 1 and layers > 1
    global_theta, local_theta = _rope_thetas(values)
    hidden_dropout = float(values.get("mlp_dropout", values.get("embedding_dropout", 0.0)))
    return BertConfig(
        vocab_size=int(values["vocab_size"]),
        hidden_size=int(values.get("hidden_size", 768)),
        num_hidden_layers=layers,
        num_attention_heads=int(values.get("num_attention_heads", 12)),
        intermediate_size=int(values.get("intermediate_size", 1152)),
        hidden_act=head_act,
        hidden_dropout_prob=hidden_dropout,
        attention_probs_dropout_prob=float(values.get("attention_dropout", 0.0)),
        max_position_embeddings=int(values.get("max_position_embeddings", 8192)),
        type_vocab_size=0,
        layer_norm_eps=float(values.get("norm_eps", 1e-5)),
        initializer_range=float(values.get("initializer_range", 0.02)),
        pad_vocab_size_multiple=pad_vocab_size_multiple,
        position_encoding="rope",
        rope_theta=global_theta,
        rope_theta_local=local_theta,
        feed_forward=_GLU_FROM_HF[glu],
        norm_position="pre",
        norm="layernorm",
        bias=biases["norm_bias"],
        decoder_bias=bool(values.get("decoder_bias", True)),
        embedding_norm=True,
        local_window=int(values.get("local_attention", 128)) if local else 0,
        global_every=every if local else 1,
        tie_word_embeddings=bool(values.get("tie_word_embeddings", True)),
        next_sentence_head=False,
        pooling=str(values.get("classifier_pooling", "cls")),
    )


def modernbert_parameter_pairs(config: BertConfig) -> list[tuple[str, tuple[str, ...]]]:
    """``(Hugging Face name, our names)`` of every ModernBertForMaskedLM tensor; several of
    ours are concatenated along dim 0 (``Wqkv``). The tied decoder weight is not listed."""
    suffixes = ("weight", "bias") if config.bias else ("weight",)
    pairs: list[tuple[str, tuple[str, ...]]] = [
        ("model.embeddings.tok_embeddings.weight", ("bert.embeddings.word_embeddings.weight",))
    ]

    def add(hf: str, *ours: str) -> None:
        for suffix in suffixes:
            pairs.append((f"{hf}.{suffix}", tuple(f"{name}.{suffix}" for name in ours)))

    add("model.embeddings.norm", "bert.embeddings.LayerNorm")
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}", f"bert.encoder.layer.{i}"
        if i > 0:  # layer 0 has no norm before its attention
            add(f"{hf}.attn_norm", f"{ours}.attn_norm")
        qkv = (f"{ours}.attention.self.{part}" for part in ("query", "key", "value"))
        add(f"{hf}.attn.Wqkv", *qkv)
        add(f"{hf}.attn.Wo", f"{ours}.attention.output.dense")
        add(f"{hf}.mlp_norm", f"{ours}.mlp_norm")
        add(f"{hf}.mlp.Wi", f"{ours}.intermediate.dense")
        add(f"{hf}.mlp.Wo", f"{ours}.output.dense")
    add("model.final_norm", "bert.final_norm")
    add("head.dense", "cls.predictions.transform.dense")
    add("head.norm", "cls.predictions.transform.LayerNorm")
    if config.decoder_bias:
        pairs.append(("decoder.bias", ("cls.predictions.bias",)))
    if not config.tie_word_embeddings:
        pairs.append(("decoder.weight", ("cls.predictions.decoder.weight",)))
    return pairs


def modernbert_tensors(state: Mapping[str, torch.Tensor], config: BertConfig) -> dict[str, Any]:
    """Our state dict as ModernBertForMaskedLM's tensors (vocab padding rows stripped)."""
    tensors: dict[str, torch.Tensor] = {}
    for hf, ours in modernbert_parameter_pairs(config):
        parts = [state[name].detach().to("cpu") for name in ours]
        tensor = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
        if hf in _VOCAB_HF_KEYS:
            tensor = tensor[: config.vocab_size]
        tensors[hf] = tensor.contiguous().clone()
    return tensors


def modernbert_from_tensors(
    tensors: Mapping[str, torch.Tensor], config: BertConfig, params: Mapping[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], list[str], list[str], str | None]:
    """Map a ModernBERT checkpoint's tensors onto our names: ``(updates, missing, ignored,
    problem)``. A bare ``ModernBertModel`` (no ``model.`` prefix) loads its encoder; the
    keys of a task model's head (``head.*`` and ``classifier.*`` next to a ``classifier``)
    are ignored. ``updates`` hold the real vocabulary rows; ``problem`` is the first tensor
    whose shape is wrong (then nothing may be loaded)."""
    bare = not any(key.startswith("model.") for key in tensors)
    named = {(f"model.{key}" if bare else key): value for key, value in tensors.items()}
    task_model = any(key.startswith("classifier.") for key in named)
    if task_model:  # its head.* is the classifier's dense + norm, not the MLM transform
        named = {k: v for k, v in named.items() if not k.startswith(("head.", "classifier."))}
    updates: dict[str, torch.Tensor] = {}
    missing: list[str] = []
    used: set[str] = set()
    for hf, ours in modernbert_parameter_pairs(config):
        tensor = named.get(hf)
        if tensor is None:
            missing.extend(ours)
            continue
        used.add(hf)
        shapes = [params[name].shape for name in ours]
        if hf in _VOCAB_HF_KEYS:
            shapes = [torch.Size((config.vocab_size, *s[1:])) for s in shapes]
        rows = [s[0] for s in shapes]
        expected = torch.Size((sum(rows), *shapes[0][1:]))
        if tensor.shape != expected:
            return {}, [], [], f"{hf} of shape {tuple(tensor.shape)} (needs {tuple(expected)})"
        for name, part in zip(ours, torch.split(tensor, rows, dim=0), strict=True):
            updates[name] = part
    ignored = sorted(k for k in tensors if (f"model.{k}" if bare else k) not in used)
    return updates, missing, ignored, None
