"""Google / MLPerf TensorFlow 1 BERT checkpoints into omnibert's model, without TensorFlow.

The tensors come from :mod:`omnibert.convert.tf1_bundle`; this module maps Google's
``modeling.py`` variable names to our (Hugging Face) parameter names:

=====================================================  =========================================
Google (TF1)                                           omnibert / Hugging Face
=====================================================  =========================================
``bert/embeddings/{word,position,token_type}_emb...``  ``bert.embeddings.*_embeddings.weight``
``.../LayerNorm/gamma``, ``.../LayerNorm/beta``        ``.../LayerNorm.weight``, ``.bias``
``bert/encoder/layer_N/.../kernel``, ``bias``          ``bert.encoder.layer.N....weight`` (``.T``)
``bert/pooler/dense``, ``cls/predictions/transform``   the same modules
``cls/predictions/output_bias``                        ``cls.predictions.bias``
``cls/seq_relationship/output_weights`` ``[2, H]``     ``cls.seq_relationship.weight`` (as is)
``cls/seq_relationship/output_bias``                   ``cls.seq_relationship.bias``
=====================================================  =========================================

Dense ``kernel``s are stored ``[in, out]`` and transposed to ``[out, in]``; the MLM decoder is
the word embedding (tied, as in Google's graph). The checkpoint holds ``vocab_size`` rows; our
embedding and MLM bias hold ``padded_vocab_size`` and the padding rows are set to zero (they
are never looked up nor scored).

Ignored, because they are training state and not weights (the optimiser and schedule start
fresh, as they do for every ``init_from``):

* optimiser slots, any name whose last component is in :data:`SLOT_NAMES`: ``adam_m`` /
  ``adam_v`` (Google's AdamWeightDecay and the LAMB of Google's and MLPerf's
  ``optimization.py``), ``LAMB`` / ``LAMB_1``, ``Adam`` / ``Adam_1``,
  ``AdamWeightDecayOptimizer[_1]``, ``Momentum``;
* step and loss-scale counters, any name whose last component is in :data:`COUNTER_NAMES`:
  ``global_step``, ``beta1_power`` / ``beta2_power`` (TF Adam), ``loss_scale``,
  ``current_loss_scale``, ``good_steps``, ``bad_steps`` (mixed-precision loss scaling).

Any other name that is not a weight of the configured BERT is refused, as is a shape that does
not match ``bert_config.json``: both in one sentence naming the variable, before the model
changes. Google's ``bert_config.json`` is read by :meth:`BertConfig.from_hf_dict` (its keys are
Hugging Face's); note that Google's ``modeling.py`` ``gelu`` is the tanh approximation while
``hidden_act: gelu`` means the exact erf GELU here, as in Hugging Face's and NVIDIA's MLPerf
PyTorch ports of the same checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from omnibert.convert.hf import TIED_KEYS, VOCAB_KEYS
from omnibert.convert.tf1_bundle import TF1Checkpoint, TF1CheckpointError, is_tf1_checkpoint
from omnibert.models import BertConfig, BertConfigError, BertForPreTraining
from omnibert.models.config import BERT_SHAPE_FIELDS

__all__ = [
    "COUNTER_NAMES",
    "SLOT_NAMES",
    "check_tf1_checkpoint",
    "checkpoint_hint",
    "find_next_to",
    "google_names",
    "is_ignored",
    "load_tf1_into",
    "model_from_tf1",
    "read_bert_config",
    "resolve_bert_config",
]

SLOT_NAMES = frozenset(
    {
        "adam_m",
        "adam_v",
        "LAMB",
        "LAMB_1",
        "Adam",
        "Adam_1",
        "AdamWeightDecayOptimizer",
        "AdamWeightDecayOptimizer_1",
        "Momentum",
    }
)
COUNTER_NAMES = frozenset(
    {
        "global_step",
        "beta1_power",
        "beta2_power",
        "loss_scale",
        "current_loss_scale",
        "good_steps",
        "bad_steps",
    }
)
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
_SPECIAL = {
    "cls.predictions.bias": ("cls/predictions/output_bias", False),
    "cls.seq_relationship.weight": ("cls/seq_relationship/output_weights", False),
    "cls.seq_relationship.bias": ("cls/seq_relationship/output_bias", False),
}


def is_ignored(name: str) -> bool:
    """Whether a checkpoint variable is optimiser or step state (module docstring)."""
    last = name.rsplit("/", 1)[-1]
    return last in SLOT_NAMES or last in COUNTER_NAMES


def google_name(param: str) -> tuple[str, bool]:
    """``(Google variable name, transposed?)`` of one of our parameter names."""
    if param in _SPECIAL:
        return _SPECIAL[param]
    parts = param.split(".")
    *path, leaf = parts
    scope: list[str] = []
    for i, part in enumerate(path):
        if part.isdigit() and i and path[i - 1] == "layer":
            scope[-1] = f"layer_{part}"
        else:
            scope.append(part)
    owner = scope[-1]
    if owner == "LayerNorm":
        return "/".join([*scope, {"weight": "gamma", "bias": "beta"}[leaf]]), False
    if owner.endswith("_embeddings"):
        return "/".join(scope), False
    return "/".join([*scope, "kernel" if leaf == "weight" else leaf]), leaf == "weight"


def google_names(config: BertConfig) -> dict[str, tuple[str, bool]]:
    """``{Google name: (our parameter name, transposed?)}`` for every weight of ``config``."""
    with torch.device("meta"):  # names only
        params = BertForPreTraining(config).state_dict()
    out = {}
    for param in params:
        if param not in TIED_KEYS:
            name, transpose = google_name(param)
            out[name] = (param, transpose)
    return out


def read_bert_config(path: str | Path, *, pad_vocab_size_multiple: int = 8) -> BertConfig:
    """The :class:`BertConfig` of a Google ``bert_config.json`` (every size key required)."""
    path = Path(path)
    if not path.is_file():
        raise TF1CheckpointError(
            f"bert_config file {path} does not exist; pass the bert_config.json that came with "
            "the TensorFlow checkpoint."
        )
    try:
        values = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise TF1CheckpointError(f"{path} is not JSON ({err}); pass a bert_config.json.") from err
    if not isinstance(values, dict):
        raise TF1CheckpointError(f"{path} is not a JSON object; pass a bert_config.json.")
    absent = [key for key in BERT_SHAPE_FIELDS if key not in values]
    if absent:
        raise TF1CheckpointError(
            f"{path} lacks {', '.join(absent)}; pass the Google-format bert_config.json of the "
            "checkpoint."
        )
    try:
        return BertConfig.from_hf_dict(values, pad_vocab_size_multiple=pad_vocab_size_multiple)
    except (BertConfigError, TypeError) as err:
        raise TF1CheckpointError(f"{path} is not a usable BERT config: {err}") from err


def find_next_to(prefix: str | Path, filename: str) -> Path | None:
    """``<the checkpoint's directory>/<filename>`` if that file exists."""
    candidate = Path(prefix).parent / filename
    return candidate if candidate.is_file() else None


def resolve_bert_config(
    prefix: str | Path, bert_config: str | Path | None, key: str = "bert_config"
) -> Path:
    """The ``bert_config.json`` of a TF1 checkpoint: ``bert_config`` if given, else the one
    next to the checkpoint; ``key`` is the config key named in the error."""
    if bert_config is not None:
        path = Path(str(bert_config))
        if not path.is_file():
            raise TF1CheckpointError(
                f"{key}={bert_config} does not exist; pass the bert_config.json that came with "
                "the TensorFlow checkpoint."
            )
        return path
    found = find_next_to(prefix, "bert_config.json")
    if found is None:
        raise TF1CheckpointError(
            f"the TensorFlow checkpoint {prefix} has no bert_config.json next to it; pass "
            f"{key}=<path to its bert_config.json>."
        )
    return found


def checkpoint_hint(path: str | Path) -> str | None:
    """For a path that is not a TF1 prefix but close to one (its directory, its ``.index`` or
    ``.data-*`` file, a prefix without the step): "pass ..." with the prefix(es) it meant."""
    path = Path(str(path))
    if path.is_dir():
        prefixes = sorted(p.with_suffix("") for p in path.glob("*.index"))
    elif path.name.endswith(".index") or ".data-" in path.name:
        prefixes = [path.parent / path.name.split(".index")[0].split(".data-")[0]]
    else:
        prefixes = sorted(p.with_suffix("") for p in path.parent.glob(f"{path.name}-*.index"))
    prefixes = [p for p in prefixes if is_tf1_checkpoint(p)]
    if not prefixes:
        return None
    shown = ", ".join(str(p) for p in prefixes[:3]) + (" ..." if len(prefixes) > 3 else "")
    return f"pass the checkpoint prefix (the path without .index), e.g. {shown}"


def check_tf1_checkpoint(
    prefix: str | Path, config: BertConfig
) -> tuple[TF1Checkpoint, dict[str, tuple[str, bool]], list[str]]:
    """Open the checkpoint and check it holds exactly ``config``'s weights (names, shapes,
    float dtypes; every data shard present) without reading any tensor.

    Returns the opened checkpoint, ``{Google name: (our name, transposed?)}`` and the
    ignored optimiser/step variables; raises :class:`TF1CheckpointError` otherwise.
    """
    checkpoint = TF1Checkpoint(prefix)
    wanted = google_names(config)
    ignored = sorted(n for n in checkpoint.names() if n not in wanted and is_ignored(n))
    unknown = [n for n in checkpoint.names() if n not in wanted and not is_ignored(n)]
    if unknown:
        raise TF1CheckpointError(
            f"{checkpoint.index_file} holds {len(unknown)} variable(s) that are neither "
            f"weights of this BERT nor optimiser/step state, e.g. {unknown[0]}; it is not a "
            "Google BERT pretraining checkpoint (or its bert_config.json has fewer layers)."
        )
    missing = [n for n in wanted if n not in checkpoint]
    if missing:
        raise TF1CheckpointError(
            f"{checkpoint.index_file} lacks {len(missing)} variable(s) of this BERT, e.g. "
            f"{missing[0]}; pass the bert_config.json that belongs to this checkpoint."
        )
    with torch.device("meta"):
        params = BertForPreTraining(config).state_dict()
    for name, (param, transpose) in wanted.items():
        needed = tuple(params[param].shape)
        if param in VOCAB_KEYS:
            needed = (config.vocab_size, *needed[1:])
        if transpose:
            needed = needed[::-1]
        dtype = checkpoint.entries[name].dtype_name
        if dtype not in FLOAT_DTYPES:
            raise TF1CheckpointError(
                f"{checkpoint.index_file} has {name} of dtype {dtype}, not a float; it is not a "
                "Google BERT pretraining checkpoint."
            )
        if checkpoint.shape(name) != needed:
            raise TF1CheckpointError(
                f"{checkpoint.index_file} has {name} of shape {checkpoint.shape(name)} but the "
                f"model needs {needed}; pass the bert_config.json that belongs to this "
                "checkpoint (or set the model's sizes to the checkpoint's)."
            )
    return checkpoint, wanted, ignored


def load_tf1_into(model: BertForPreTraining, prefix: str | Path) -> str:
    """Load the TF1 checkpoint ``prefix`` into ``model`` (in place); a one-line report.

    Everything :func:`check_tf1_checkpoint` checks is checked before ``model`` changes;
    tensors are then read (crc32c verified) and copied one at a time, so the peak memory is
    the model plus its largest tensor, and optimiser slots are never read.
    """
    config = model.config
    checkpoint, wanted, ignored = check_tf1_checkpoint(prefix, config)
    params = model.state_dict()
    with torch.no_grad():
        for name, (param, transpose) in wanted.items():
            array = checkpoint.read(name)
            tensor = torch.from_numpy(array.T if transpose else array)
            target = params[param]
            if param in VOCAB_KEYS:
                target[config.vocab_size :].zero_()
                target = target[: config.vocab_size]
            target.copy_(tensor)
    vocab = config.vocab_size
    padding = f", padded to {config.padded_vocab_size}" if config.padded_vocab_size > vocab else ""
    return (
        f"TensorFlow checkpoint {prefix}: {len(wanted)} tensors of BERT "
        f"L{config.num_hidden_layers}-H{config.hidden_size} (vocab {vocab}{padding}) loaded, "
        f"{len(ignored)} optimiser/step variable(s) ignored"
    )


def model_from_tf1(
    prefix: str | Path, bert_config: str | Path | None = None, *, pad_vocab_size_multiple: int = 8
) -> BertForPreTraining:
    """A :class:`BertForPreTraining` built from the checkpoint's ``bert_config.json`` (``None``:
    the one next to the checkpoint) holding the checkpoint's weights."""
    config_file = resolve_bert_config(prefix, bert_config)
    config = read_bert_config(config_file, pad_vocab_size_multiple=pad_vocab_size_multiple)
    model = BertForPreTraining(config)
    load_tf1_into(model, prefix)
    return model
