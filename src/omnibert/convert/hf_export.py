"""A model out to a Hugging Face directory: :func:`export_hf`.

It writes ``model.safetensors`` + ``config.json`` + ``vocab.txt`` that
``transformers.BertForPreTraining.from_pretrained`` loads with no missing or unexpected key
(by default), and on request the tokenizer files (:mod:`omnibert.convert.hub_tokenizer`) and a
model card (``README.md``, :mod:`omnibert.convert.model_card`): what ``omnibert-export``
writes (:mod:`omnibert.run.tools.exporting`). The vocab padding rows are stripped (``vocab_size`` =
the real vocab). The tied decoder tensors (``cls.predictions.decoder.weight``/``.bias`` are
the word embedding and ``cls.predictions.bias``) are not written, exactly as
``save_pretrained`` does, because safetensors refuses shared tensors; ``from_pretrained``
ties them again. Another Hugging Face class goes out through the same function with its own
``config.json`` and the modules that class lacks left out: ``BertForMaskedLM`` (no pooler, no
next-sentence head), the fine-tuned task models of :mod:`omnibert.models.heads`
(:func:`omnibert.run.tools.exporting.export_hf_finetuned`). A model of the ModernBERT family is
written as ``ModernBertForMaskedLM`` (:mod:`omnibert.convert.modernbert`); one of neither
family is refused before any file.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import torch
from safetensors.torch import save_file
from torch import nn

from omnibert.convert.hf import TIED_KEYS, VOCAB_KEYS, ConversionError
from omnibert.convert.hub_tokenizer import TOKENIZER_FILES, tokenizer_problem, write_tokenizer_files
from omnibert.models import BertConfig

__all__ = ["CARD", "export_hf"]

#: the model card's file name (the Hub shows it as the model's page)
CARD = "README.md"


def _count_lines(vocab_file: Path) -> int:
    with vocab_file.open(encoding="utf-8") as handle:
        return sum(1 for _ in handle)


def _check_vocab(vocab_path: Path, config: BertConfig, lower_case: bool | None) -> None:
    if not vocab_path.is_file():
        raise ConversionError(
            f"vocab file {vocab_path} does not exist; pass vocab_file= with the vocab.txt "
            "the model was trained with."
        )
    lines = _count_lines(vocab_path)
    if lines != config.vocab_size:
        raise ConversionError(
            f"vocab file {vocab_path} has {lines} tokens but the model's vocab_size is "
            f"{config.vocab_size}; pass vocab_file= with the vocab.txt it was trained with."
        )
    problem = None if lower_case is None else tokenizer_problem(vocab_path)
    if problem is not None:
        raise ConversionError(f"no tokenizer can be written: {problem}")


def export_hf(
    model: nn.Module,
    out_dir: str | Path,
    vocab_file: str | Path | None,
    *,
    overwrite: bool = False,
    hf_config: Mapping[str, Any] | None = None,
    leave_out: tuple[str, ...] = (),
    lower_case: bool | None = None,
    card: str | None = None,
) -> list[Path]:
    """Write a Hugging Face checkpoint directory; returns the files written.

    ``model`` is a :class:`~omnibert.models.BertForPreTraining` (its ``config.json`` names
    ``BertForPreTraining``, or ``ModernBertForMaskedLM`` for the ModernBERT family), or any
    model with ``hf_config`` (the ``config.json`` to write: its ``architectures``, labels) and
    ``leave_out`` (module prefixes the Hugging Face class lacks: the pooler, the NSP head).
    ``lower_case`` (not ``None``) adds the tokenizer files, lower-casing (and stripping
    accents) exactly when the model was trained so; without them ``AutoTokenizer`` would
    lower-case any vocab, cased ones included. ``card``: the ``README.md`` to write.

    ``out_dir`` must be empty or absent unless ``overwrite`` (then the files written are
    replaced and nothing else is touched). ``vocab_file`` must have ``vocab_size`` lines.
    """
    from omnibert.convert.modernbert import (
        check_exportable,
        modernbert_export_dict,
        modernbert_tensors,
    )

    out = Path(out_dir)
    config = cast(BertConfig, model.config)
    modern = hf_config is None and not config.is_bert
    if modern:  # ModernBertForMaskedLM, or one sentence before anything is written
        check_exportable(config)
    names = ["model.safetensors", "config.json"]
    if vocab_file is not None:
        names.append("vocab.txt")
    if card is not None:
        names.append(CARD)
    if lower_case is not None:
        if vocab_file is None:
            raise ConversionError("tokenizer files need the vocab.txt; pass vocab_file=.")
        names += TOKENIZER_FILES
    if out.exists() and not out.is_dir():
        raise ConversionError(f"export directory {out} is a file; choose another out=.")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConversionError(
            f"export directory {out} is not empty; choose an empty out= or pass overwrite=true "
            f"(only {', '.join(names[:-1])} and {names[-1]} are replaced)."
        )
    vocab_path = Path(vocab_file) if vocab_file is not None else None
    if vocab_path is not None:
        _check_vocab(vocab_path, config, lower_case)
    tensors: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        if modern or name in TIED_KEYS or name.startswith(tuple(f"{m}." for m in leave_out)):
            continue
        if name in VOCAB_KEYS:
            tensor = tensor[: config.vocab_size]
        tensors[name] = tensor.detach().to("cpu").contiguous().clone()
    if modern:
        tensors = modernbert_tensors(model.state_dict(), config)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / name for name in names]
    save_file(tensors, str(written[0]), metadata={"format": "pt"})
    os.chmod(written[0], 0o666 & ~_umask())  # safetensors writes 0600; like the others
    if hf_config is not None:
        hf = dict(hf_config)
    else:
        hf = modernbert_export_dict(config, vocab_path) if modern else config.to_hf_dict()
    written[1].write_text(json.dumps(hf, indent=2) + "\n")
    if vocab_path is not None:
        shutil.copyfile(vocab_path, out / "vocab.txt")
    if card is not None:
        (out / CARD).write_text(card, encoding="utf-8")
    if lower_case is not None and vocab_path is not None:
        write_tokenizer_files(
            out,
            vocab_path,
            lower_case=lower_case,
            max_length=config.max_position_embeddings,
            token_types=config.type_vocab_size > 0,
        )
    return written


def _umask() -> int:
    """The process umask (Linux reads it without changing it; elsewhere set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
