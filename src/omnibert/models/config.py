"""``BertConfig``: the architecture of a BERT model, and its mapping to Hugging Face's config.json."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omnibert.errors import UserError

#: the integer fields of original BERT that fix the parameters' shapes (every Google / Hugging
#: Face BERT config holds them)
BERT_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "type_vocab_size",
)
#: the modern-encoder options (ModernBERT / MosaicBERT style; docs/modern.md): their defaults
#: are original BERT, so a default config builds exactly BERT's modules and parameter names
MODERN_FIELDS = (
    "position_encoding",
    "rope_theta",
    "rope_theta_local",
    "feed_forward",
    "norm_position",
    "norm",
    "bias",
    "decoder_bias",
    "embedding_norm",
    "local_window",
    "global_every",
    "tie_word_embeddings",
    "next_sentence_head",
)
#: every field that changes the parameters or their meaning: weights of another architecture
#: are refused (init_from, Hugging Face import)
ARCHITECTURE_FIELDS = (*BERT_SHAPE_FIELDS, *MODERN_FIELDS)
POSITION_ENCODINGS = ("learned", "rope", "alibi")
FEED_FORWARDS = ("mlp", "geglu", "swiglu")
NORM_POSITIONS = ("post", "pre")
NORMS = ("layernorm", "rmsnorm")
POOLINGS = ("cls", "mean")
#: Activations the encoder implements (Hugging Face names). ``gelu`` is the exact (erf) GELU.
ACTIVATIONS = ("gelu", "gelu_new", "gelu_pytorch_tanh", "relu")
#: how the encoder computes attention (omnibert.models.attention); all give the same maths
ATTENTION_BACKENDS = ("auto", "math", "sdpa", "flex", "varlen")
#: fields that choose how the model computes, not what: a checkpoint resumes, loads and exports
#: whatever they are set to, and Hugging Face's config.json neither holds nor sets them
RUNTIME_FIELDS = ("attention",)
#: fields that only fine-tuning heads read (what they pool): weights load whatever they are
FINETUNE_FIELDS = ("pooling",)


class BertConfigError(UserError):
    """A model configuration that cannot describe a BERT model."""


@dataclass(frozen=True)
class BertConfig:
    """Shape and regularisation of a BERT encoder with the pretraining heads.

    Field names equal Hugging Face ``BertConfig``'s, so a ``config.json`` maps one to one.
    ``vocab_size`` is the real vocabulary (lines of vocab.txt); the embedding matrix and the MLM
    decoder hold :attr:`padded_vocab_size` rows, a multiple of ``pad_vocab_size_multiple``.
    """

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_vocab_size_multiple: int = 8
    #: attention kernel (``ATTENTION_BACKENDS``): ``auto`` picks by device, dropout and sequence
    #: length (omnibert.models.attention_choice.resolve_attention); ``varlen`` drops the padding
    attention: str = "auto"
    # --- modern-encoder options (docs/modern.md); the defaults are original BERT
    #: ``learned`` (BERT's position embedding), ``rope`` (rotary on queries and keys, by the
    #: batch's position_ids) or ``alibi`` (MosaicBERT's symmetric -slope * |i - j| bias)
    position_encoding: str = "learned"
    #: rotary base of the global layers, and of the local (sliding-window) layers
    rope_theta: float = 10000.0
    rope_theta_local: float = 10000.0
    #: ``mlp`` (BERT: Linear, hidden_act, Linear) or a gated ``geglu`` (GELU) / ``swiglu`` (SiLU)
    feed_forward: str = "mlp"
    #: ``post`` (BERT: norm after each residual sum) or ``pre`` (norm before attention and
    #: feed-forward, none before the first attention, one final norm: ModernBERT)
    norm_position: str = "post"
    #: ``layernorm`` or ``rmsnorm`` (weight only); ``layer_norm_eps`` is the eps of either
    norm: str = "layernorm"
    #: biases of the encoder's Linear layers, of the norms and of the MLM head's transform
    bias: bool = True
    #: the MLM decoder's bias (separately from ``bias``)
    decoder_bias: bool = True
    #: a norm after the embedding sum
    embedding_norm: bool = True
    #: sliding window (tokens in all) of the local layers; 0: every layer global
    local_window: int = 0
    #: layer i is global iff i % global_every == 0 (local otherwise, when local_window > 0)
    global_every: int = 1
    #: the MLM decoder's weight is the word embedding (else its own parameter)
    tie_word_embeddings: bool = True
    #: the NSP head (pooler + seq_relationship); without it the NSP loss is 0
    next_sentence_head: bool = True
    #: what fine-tuning heads pool: ``cls`` (the first token) or ``mean`` (over real tokens)
    pooling: str = "cls"

    def __post_init__(self) -> None:
        for name in (*BERT_SHAPE_FIELDS, "pad_vocab_size_multiple"):
            value = getattr(self, name)
            least = 0 if name == "type_vocab_size" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                kind = "non-negative" if least == 0 else "positive"
                raise BertConfigError(
                    f"model config {name}={value!r} must be a {kind} integer; set "
                    f"model.config.{name} to one."
                )
        self._check_modern()
        if self.hidden_size % self.num_attention_heads:
            raise BertConfigError(
                f"model config hidden_size={self.hidden_size} is not a multiple of "
                f"num_attention_heads={self.num_attention_heads}; choose a head count that "
                "divides the hidden size."
            )
        if self.hidden_act not in ACTIVATIONS:
            raise BertConfigError(
                f"model config hidden_act={self.hidden_act!r} is not supported; use one of "
                f"{', '.join(ACTIVATIONS)}."
            )
        if self.attention not in ATTENTION_BACKENDS:
            raise BertConfigError(
                f"model config attention={self.attention!r} is not a backend; set "
                f"model.config.attention to one of {', '.join(ATTENTION_BACKENDS)}."
            )
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise BertConfigError(
                    f"model config {name}={value!r} must lie in [0, 1); fix model.config.{name}."
                )

    def _check_modern(self) -> None:
        choices = (
            ("position_encoding", POSITION_ENCODINGS),
            ("feed_forward", FEED_FORWARDS),
            ("norm_position", NORM_POSITIONS),
            ("norm", NORMS),
            ("pooling", POOLINGS),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise BertConfigError(
                    f"model config {name}={getattr(self, name)!r} is not supported; set "
                    f"model.config.{name} to one of {', '.join(allowed)}."
                )
        flags = ("bias", "decoder_bias", "embedding_norm", "tie_word_embeddings")
        for name in (*flags, "next_sentence_head"):
            if not isinstance(getattr(self, name), bool):
                raise BertConfigError(
                    f"model config {name}={getattr(self, name)!r} must be true or false; set "
                    f"model.config.{name} to one."
                )
        for name, least in (("local_window", 0), ("global_every", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise BertConfigError(
                    f"model config {name}={value!r} must be an integer of at least {least}; set "
                    f"model.config.{name} to one."
                )
        for name in ("rope_theta", "rope_theta_local"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 1.0:
                raise BertConfigError(
                    f"model config {name}={value!r} must be a number above 1 (the rotary base, "
                    f"e.g. 10000.0); fix model.config.{name}."
                )
        if self.position_encoding == "rope" and self.head_dim % 2:
            raise BertConfigError(
                f"model config position_encoding=rope needs an even head size, and "
                f"hidden_size / num_attention_heads is {self.head_dim}; change the head count."
            )

    def is_local(self, layer: int) -> bool:
        """Whether layer ``layer`` (0-based) attends within the sliding window only."""
        return self.local_window > 0 and layer % self.global_every != 0

    @property
    def has_local_layers(self) -> bool:
        return any(self.is_local(i) for i in range(self.num_hidden_layers))

    @property
    def is_bert(self) -> bool:
        """Whether every modern option is at its default: original BERT (HF ``BertForPreTraining``)."""
        defaults = BertConfig(vocab_size=self.vocab_size)
        return self.type_vocab_size > 0 and all(
            getattr(self, name) == getattr(defaults, name) for name in MODERN_FIELDS
        )

    @property
    def padded_vocab_size(self) -> int:
        """``vocab_size`` rounded up to a multiple of ``pad_vocab_size_multiple``."""
        multiple = self.pad_vocab_size_multiple
        return math.ceil(self.vocab_size / multiple) * multiple

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes: Any) -> BertConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the fields (what checkpoints store as ``model_config``)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BertConfig:
        """Build from a dict of exactly the dataclass fields (unknown keys are refused)."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise BertConfigError(
                f"model config has unknown key(s) {', '.join(unknown)}; the fields are "
                f"{', '.join(sorted(known))}."
            )
        return cls(**dict(values))

    def to_hf_dict(self) -> dict[str, Any]:
        """A Hugging Face ``config.json`` for ``BertForPreTraining`` (real, unpadded vocab; the
        runtime fields such as ``attention`` are ours, not Hugging Face's, and stay out)."""
        if not self.is_bert:
            raise BertConfigError(
                "this model.config is not original BERT (a modern option or type_vocab_size=0 "
                "is set), so it has no Hugging Face BertForPreTraining config: it is exported as "
                "ModernBERT where its options are ModernBERT's, otherwise it has no Hugging Face "
                "class."
            )
        return {
            "architectures": ["BertForPreTraining"],
            "model_type": "bert",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "hidden_act": self.hidden_act,
            "hidden_dropout_prob": self.hidden_dropout_prob,
            "attention_probs_dropout_prob": self.attention_probs_dropout_prob,
            "max_position_embeddings": self.max_position_embeddings,
            "type_vocab_size": self.type_vocab_size,
            "initializer_range": self.initializer_range,
            "layer_norm_eps": self.layer_norm_eps,
            "pad_token_id": 0,
            "position_embedding_type": "absolute",
            "tie_word_embeddings": True,
        }

    @classmethod
    def from_hf_dict(
        cls, values: Mapping[str, Any], *, pad_vocab_size_multiple: int = 8
    ) -> BertConfig:
        """Read a Hugging Face BERT ``config.json`` dict (HF defaults for absent keys; the
        runtime fields, which config.json does not hold, keep their defaults)."""
        model_type = values.get("model_type", "bert")
        if model_type != "bert":
            raise BertConfigError(
                f"config.json has model_type={model_type!r}; only BERT checkpoints "
                "(model_type 'bert') can be loaded."
            )
        position_type = values.get("position_embedding_type", "absolute")
        if position_type != "absolute":
            raise BertConfigError(
                f"config.json has position_embedding_type={position_type!r}; only 'absolute' "
                "position embeddings (original BERT) are supported."
            )
        if "vocab_size" not in values:
            raise BertConfigError("config.json has no vocab_size; add the checkpoint's vocab size.")
        defaults = cls(vocab_size=int(values["vocab_size"]))
        fields = {
            f.name: values.get(f.name, getattr(defaults, f.name))
            for f in dataclasses.fields(cls)
            if f.name not in ("pad_vocab_size_multiple", *RUNTIME_FIELDS, *MODERN_FIELDS)
            and f.name not in FINETUNE_FIELDS
        }
        return cls(**fields, pad_vocab_size_multiple=pad_vocab_size_multiple)

    def architecture_mismatches(self, other: BertConfig) -> list[str]:
        """``key=ours vs theirs`` for every field that changes the parameters or their meaning."""
        return [
            f"{key}={getattr(self, key)} vs {getattr(other, key)}"
            for key in ARCHITECTURE_FIELDS
            if getattr(self, key) != getattr(other, key)
        ]


#: BertConfig fields that may differ between a run and the weights it starts from
REGULARISATION_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def architecture_diffs(saved: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    """``key=saved (this model: ours)`` for every field of ``model`` (a BertConfig as a dict)
    that differs in ``saved``, regularisation, runtime and fine-tuning fields left out: what
    initial weights must match. A field ``saved`` lacks (a checkpoint written before the field
    existed) counts as its default."""
    defaults = {f.name: f.default for f in dataclasses.fields(BertConfig)}
    left_out = (*REGULARISATION_FIELDS, *RUNTIME_FIELDS, *FINETUNE_FIELDS)
    return [
        f"{k}={saved.get(k, defaults.get(k))!r} (this model: {v!r})"
        for k, v in model.items()
        if k not in left_out and saved.get(k, defaults.get(k)) != v
    ]
