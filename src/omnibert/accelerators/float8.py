"""``trainer.precision=fp8``: torchao's float8 training of the Linear layers that carry the
compute, inside bf16 autocast (Lightning's ``bf16-mixed``).

**What runs in fp8** (:func:`select_layers`): every ``nn.Linear`` inside the encoder (each
layer's query, key and value projections, the attention output, the feed-forward input and
output: classic BERT and the gated, bias-free modern variants alike) and the MLM head's
transform dense. torchao's ``Float8Linear`` casts the input, the weight and the output
gradient to fp8 with dynamic scales (``trainer.fp8.recipe``: ``tensorwise``, one scale per
tensor; ``rowwise``, one per row with power-of-2 scales) and runs the three matmuls of a
Linear (output, input gradient, weight gradient) on fp8 tensor cores; weights, gradients
and optimiser state stay fp32, everything else runs in bf16 autocast.

**What stays bf16**, and why: the word, position and token-type embeddings and every norm
(not matmuls: nothing for fp8 to speed up, and their outputs set the scale of all that
follows); the MLM decoder (its logits over the vocabulary feed the loss directly, and its
weight is the word embedding matrix where tied; it runs only at the masked positions, a small
share of the step); the NSP pooler and classifier and the fine-tuning heads (run
on a few rows or with 2-3 outputs: no speed to gain); and any Linear whose dimensions are
not multiples of 16, which ``torch._scaled_mm`` requires. Token counts that are not
multiples of 16 (packed and unpadded rows, fine-tuning's trimmed batches) are padded inside
torchao's matmuls (``pad_inner_dim``).

**Checks before compute** (:func:`check_float8`): the device must run fp8 matmuls (CUDA
compute capability 8.9 or newer: Ada, Hopper, Blackwell), else one sentence naming the
device and ``trainer.precision=bf16-mixed``; torchao must import, else one sentence with
the install command. ``trainer.fp8.emulate=true`` lifts the device check: torchao emulates
the fp8 matmuls (fp8 rounding of the operands, the product in fp32) on any device, the CPU
included, for numerics checks; it is slower than bf16.

The swap (:func:`convert_to_float8`) replaces modules in place before ``torch.compile``; a
``Float8Linear`` holds the same ``weight`` and ``bias`` Parameters as the Linear it
replaces, so the state dict (names, shapes, dtypes) and therefore checkpoints, resume in
any precision and exports are those of a bf16 run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from omnibert.accelerators.base import AcceleratorError
from omnibert.models.bert import BertEncoder
from omnibert.models.pretraining import BertPredictionHeadTransform

__all__ = [
    "INSTALL",
    "Float8Error",
    "Float8Plan",
    "check_float8",
    "convert_to_float8",
    "import_float8",
    "plan_float8",
    "select_layers",
]

#: how to install the torchao this code was tested with (pyproject's gpu and dev extras)
INSTALL = "pip install 'torchao>=0.18,<0.19'"
#: ``torch._scaled_mm`` takes matrices whose dimensions are multiples of this
ALIGNMENT = 16
#: modules whose Linear layers carry the compute: they run in fp8
COMPUTE_MODULES = (BertEncoder, BertPredictionHeadTransform)
#: the Linear layers outside them, by the end of their name: (what, why it stays bf16)
KEPT: dict[str, tuple[str, str]] = {
    "predictions.decoder": (
        "MLM decoder",
        "its vocabulary logits feed the loss directly; its weight is the word embeddings' "
        "where tied",
    ),
    "pooler.dense": ("pooler", "NSP / classification pooler: one [CLS] row per sequence"),
    "seq_relationship": ("NSP head", "2 outputs on the [CLS] rows"),
    "qa_outputs": ("QA head", "2 outputs (start, end)"),
    "classifier": ("classifier", "a few outputs on the pooled rows"),
}


class Float8Error(AcceleratorError):
    """``trainer.precision=fp8`` cannot run here: one sentence naming why and the way out."""


@dataclass(frozen=True)
class Float8Plan:
    """What ``trainer.precision=fp8`` runs: the recipe, emulation, the torchao version, the
    Linear layers swapped to fp8 (by name) and those kept in bf16 with why."""

    recipe: str
    emulate: bool
    torchao: str
    fp8_layers: list[str] = field(default_factory=list)
    bf16_layers: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the plan: ``torchao float8, tensorwise: 13 linear layers in fp8;
        embeddings, norms, MLM decoder, pooler, NSP head in bf16``."""
        kept = ["embeddings", "norms"]
        for name in self.bf16_layers:
            kept.append(next((what for end, (what, _) in KEPT.items() if name.endswith(end)), name))
        text = (
            f"torchao {self.torchao} float8, {self.recipe}: {len(self.fp8_layers)} linear "
            f"layers in fp8; {', '.join(dict.fromkeys(kept))} in bf16"
        )
        return text + (
            "; emulated (trainer.fp8.emulate=true: slow, for checks)" if self.emulate else ""
        )


def select_layers(model: nn.Module) -> tuple[list[str], dict[str, str]]:
    """The names of ``model``'s Linear layers that run in fp8, and of those that stay bf16
    with why (module docstring). Reads names and shapes only: a model on the meta device
    will do."""
    compute: set[str] = set()
    for name, module in model.named_modules():
        if isinstance(module, COMPUTE_MODULES):
            compute.update(
                f"{name}.{inner}" if name else inner
                for inner, layer in module.named_modules()
                if isinstance(layer, nn.Linear)
            )
    fp8: list[str] = []
    kept: dict[str, str] = {}
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        rows, columns = module.weight.shape
        if name not in compute:
            why = next((why for end, (_, why) in KEPT.items() if name.endswith(end)), None)
            kept[name] = why or "outside the encoder and the MLM transform"
        elif rows % ALIGNMENT or columns % ALIGNMENT:
            kept[name] = f"{rows}x{columns}: dimensions not multiples of {ALIGNMENT}"
        else:
            fp8.append(name)
    return fp8, kept


class _DropMessages(logging.Filter):
    """Drops the log records whose message contains one of ``fragments``."""

    def __init__(self, *fragments: str) -> None:
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


@contextlib.contextmanager
def _quiet_torchao_import() -> Iterator[None]:
    """Silence what importing torchao logs on machines where its optional C++/CUDA kernels
    cannot load (a CPU, another Python's wheel tag): ``Failed to load ..._C*.so`` from the
    ``torchao`` logger, and torch's note that torchao registers an Enum as a pytree constant.
    Neither concerns float8 training; nothing else is filtered, and only during the import."""
    quiet = [
        (logging.getLogger("torchao"), _DropMessages("Failed to load ")),
        (logging.getLogger("torch.utils._pytree"), _DropMessages("is an Enum subclass")),
    ]
    for logger, dropper in quiet:
        logger.addFilter(dropper)
    try:
        yield
    finally:
        for logger, dropper in quiet:
            logger.removeFilter(dropper)


def import_float8() -> Any:
    """``torchao.float8``, imported quietly (:func:`_quiet_torchao_import`), or
    :class:`Float8Error` naming the install command. Also silences, by message and module,
    the deprecation torch warns of when torchao's ``Float8Linear`` asks for the CUDA autocast
    dtype the old way (``torch.get_autocast_gpu_dtype``), nothing wider."""
    warnings.filterwarnings(
        "ignore", message=r".*get_autocast_gpu_dtype\(\) is deprecated",
        module=r"torchao\.float8\.",
    )  # fmt: skip
    try:
        with _quiet_torchao_import():
            return importlib.import_module("torchao.float8")
    except ImportError as err:
        raise Float8Error(
            f"trainer.precision=fp8 trains through torchao's float8 training, which does not "
            f"import here ({err}); install it with {INSTALL} (the gpu extra), or use "
            "trainer.precision=bf16-mixed."
        ) from None


def torchao_version() -> str:
    import torchao

    return str(getattr(torchao, "__version__", "unknown"))


def check_float8(plugin: Any, emulate: bool) -> str:
    """Refuse (:class:`Float8Error`, one sentence) fp8 where it cannot run: a device without
    fp8 matmuls (unless ``emulate``), a backend that cannot emulate, no torchao. Returns
    torchao's version."""
    if emulate and not plugin.fp8_emulation:
        raise Float8Error(
            f"trainer.fp8.emulate=true runs torchao's emulated fp8 in torch itself, which "
            f"accelerator={plugin.name} ({plugin.device_kind}) compiles into its own graphs; "
            "use trainer.precision=bf16-mixed there."
        )
    unsupported = None if emulate else plugin.fp8_unsupported()
    if unsupported is not None:
        raise Float8Error(
            "trainer.precision=fp8 needs a CUDA GPU of compute capability 8.9 or newer (Ada, "
            f"Hopper, Blackwell) for its fp8 matmuls, and this run's device is {unsupported}; "
            "use trainer.precision=bf16-mixed (trainer.fp8.emulate=true only checks fp8's "
            "numerics, slowly)."
        )
    import_float8()
    return torchao_version()


def plan_float8(settings: Any, version: str, model: nn.Module) -> Float8Plan:
    """The fp8 plan of ``model`` (the run's model, best built on the meta device: only names
    and shapes are read) with ``settings`` (``trainer.fp8``: ``recipe``, ``emulate``) and
    torchao's ``version`` (what :func:`check_float8` returned)."""
    fp8, kept = select_layers(model)
    return Float8Plan(str(settings.recipe), bool(settings.emulate), version, fp8, kept)


def torchao_config(plan: Float8Plan) -> Any:
    """torchao's ``Float8LinearConfig`` of ``plan``'s recipe, emulated or not, padding the
    token dimension to a multiple of 16 where a matmul needs it (module docstring)."""
    float8 = import_float8()
    recipe = float8.Float8LinearConfig.from_recipe_name(plan.recipe)
    return dataclasses.replace(recipe, emulate=plan.emulate, pad_inner_dim=True)


def convert_to_float8(model: nn.Module, plan: Float8Plan) -> list[str]:
    """Swap ``plan``'s fp8 layers of ``model`` for torchao's ``Float8Linear`` in place (same
    Parameters, same state dict); returns their names. Before ``torch.compile``."""
    float8 = import_float8()
    chosen = set(plan.fp8_layers)
    float8.convert_to_float8_training(
        model, config=torchao_config(plan), module_filter_fn=lambda _, name: name in chosen
    )
    swapped = [
        name for name, module in model.named_modules() if type(module).__name__ == "Float8Linear"
    ]
    if set(swapped) != chosen:  # the plan was made for another model: a bug, not user input
        raise RuntimeError(
            f"fp8 swapped {len(swapped)} layers, the plan named {len(chosen)}: "
            f"{sorted(chosen ^ set(swapped))[:4]}"
        )
    return swapped
