"""``omnibert-predict``'s masked-word mode: the top-k tokens (with their probabilities) for
each ``[MASK]`` of a text, from a pretrained model.

The model: an ``omnibert-train`` run (its directory: ``checkpoints/last.ckpt``, or a
``.ckpt``), an ``omnibert-export`` directory or another Hugging Face BERT / ModernBERT
directory with its masked-LM head (:func:`omnibert.checkpoints.reading.load_pretrained`), or a
TensorFlow 1 checkpoint prefix. Its tokenizer: a directory's own ``tokenizer.json``, else
BERT's WordPiece over its ``vocab.txt`` (:func:`omnibert.convert.hub_tokenizer.
wordpiece_tokenizer`), lower-casing as trained (:func:`omnibert.run.tools.exporting.lower_casing`).

Inputs: ``text=`` (one text), ``input_file=`` JSON Lines (``{"text": ...}`` per line) or
plain text (one text per line), ``input_file=-`` standard input in either form. Each text
holds at least one ``[MASK]``; texts longer than the model's positions are cut to them (a
``[MASK]`` past the cut is refused). A record: ``{"index", "text", "masks"}``, ``masks``
one list per ``[MASK]`` (in order) of ``top_k`` predictions ``{"score", "token",
"token_str", "sequence"}`` as Hugging Face's ``pipeline("fill-mask")`` gives them (the
softmax over the vocabulary; ``sequence`` the text with that prediction in place).

The model code (torch, Lightning) is imported when a model is loaded, after the path and the
inputs are checked: a refused command answers at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.checkpoints.files import FINETUNED_CKPT, checkpoint_kind
from omnibert.config.recorded import RecordedTraining
from omnibert.config.tools import PredictConfig
from omnibert.convert.hub_tokenizer import SPECIAL_TOKENS, wordpiece_tokenizer
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.run.tools.predicting import STDIN, STDIN_NAME, json_records, stdin_lines
from omnibert.tokenization.vocab import sha256_file

__all__ = [
    "PREDICTABLE",
    "MaskedLM",
    "fill_mask_records",
    "load_masked_lm",
    "masked_lm_path",
    "read_texts",
]

MASK = SPECIAL_TOKENS["mask_token"]


@dataclass
class MaskedLM:
    """A pretrained model (:class:`~omnibert.models.BertForPreTraining`, eval mode) and the
    ``tokenizers.Tokenizer`` it was trained with."""

    model: Any
    tokenizer: Any
    source: str

    @property
    def max_length(self) -> int:
        return int(self.model.config.max_position_embeddings)


#: what omnibert-predict takes, for the sentence that refuses anything else
PREDICTABLE = (
    "an omnibert-finetune run (its directory or .ckpt), an omnibert-train run (its directory or "
    "a .ckpt) or a Hugging Face directory such as an omnibert-export"
)


def masked_lm_path(ckpt: str) -> Path | None:
    """Where a pretrained model lies when ``ckpt`` names one (a pretraining run directory
    means its ``checkpoints/last.ckpt``); None for an ``omnibert-finetune`` run."""
    path = Path(ckpt)
    if not path.exists() and not Path(f"{path}.index").is_file():
        raise FineTuneInputError(f"ckpt={path} does not exist; pass {PREDICTABLE}.")
    if path.is_dir() and not (path / "config.json").is_file():
        last = path / "checkpoints" / "last.ckpt"
        if last.is_file() and checkpoint_kind(last) == "omnibert":
            return last
        if not (path / FINETUNED_CKPT).is_file():
            raise FineTuneInputError(f"ckpt={path} holds no checkpoint; pass {PREDICTABLE}.")
    return None if checkpoint_kind(path) == "finetuned" else path


def _omnibert_vocab(ckpt: Path, hparams: RecordedTraining) -> str:
    vocab, sha = hparams.vocab_file, hparams.vocab_sha256
    fix = (
        "export it with omnibert-export ckpt=<it> vocab_file=<its vocab.txt> out=<dir> and pass "
        "ckpt=<dir>"
    )
    if vocab is None or not Path(vocab).is_file():
        what = (
            "records no vocab.txt" if vocab is None else f"names vocab file {vocab}, which is gone"
        )
        raise FineTuneInputError(f"ckpt={ckpt} {what}; {fix}.")
    if sha is not None and sha256_file(vocab) != sha:
        raise FineTuneInputError(
            f"vocab file {vocab} changed since ckpt={ckpt} was trained with it; {fix}."
        )
    return str(vocab)


def _directory_tokenizer(path: Path, vocab: str) -> Any:
    """A Hugging Face directory's ``tokenizer.json``, else WordPiece over its vocab.txt with
    its ``tokenizer_config.json``'s lower-casing (else the vocab's)."""
    import json

    from tokenizers import Tokenizer

    from omnibert.run.tools.exporting import lower_casing

    if (path / "tokenizer.json").is_file():
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        tokenizer.no_truncation()
        tokenizer.no_padding()
        return tokenizer
    try:
        recorded = json.loads((path / "tokenizer_config.json").read_text()).get("do_lower_case")
    except (OSError, ValueError, AttributeError):
        recorded = None
    return wordpiece_tokenizer(vocab, lower_casing(None, recorded, vocab)[0])


def load_masked_lm(path: Path, bert_config: str | None = None) -> MaskedLM:
    """The model and tokenizer at ``path`` (:func:`masked_lm_path`'s answer)."""
    from omnibert.checkpoints.reading import load_pretrained, model_from_pretraining_checkpoint
    from omnibert.run.tools.exporting import lower_casing

    kind = checkpoint_kind(path)
    if kind == "omnibert":
        model, saved = model_from_pretraining_checkpoint(path, "ckpt")
        hparams = RecordedTraining(saved)
        vocab = _omnibert_vocab(path, hparams)
        lower = lower_casing(None, hparams.do_lower_case, vocab)[0]
        return MaskedLM(model.eval(), wordpiece_tokenizer(vocab, lower), str(path))
    loaded = load_pretrained(path, bert_config, require_heads=False)
    if "cls.predictions" in loaded.fresh_heads:
        raise FineTuneInputError(
            f"ckpt={path} has no masked-LM head (a bare encoder or a fine-tuned model), so it "
            "cannot fill masked words; pass a pretraining checkpoint or its export."
        )
    if loaded.vocab_file is None:
        raise FineTuneInputError(
            f"ckpt={path} has no vocab.txt beside it; put the vocab.txt it was trained with there."
        )
    if kind == "huggingface":
        tokenizer = _directory_tokenizer(path, loaded.vocab_file)
    else:  # a TF1 checkpoint: Google's vocabs tell their case by their word pieces
        lower = lower_casing(None, None, loaded.vocab_file)[0]
        tokenizer = wordpiece_tokenizer(loaded.vocab_file, lower)
    return MaskedLM(loaded.model.eval(), tokenizer, str(path))


def _check_text(text: str, where: str) -> str:
    if not text.strip():
        raise FineTuneInputError(f"{where} is empty; put a text with {MASK} in it.")
    if MASK not in text:
        raise FineTuneInputError(
            f"{where} has no {MASK}; mark the word to predict with {MASK}, e.g. "
            f'text="Paris is the {MASK} of France".'
        )
    return text


def _lines(lines: list[str], where: str, json_lines: bool) -> list[str]:
    """Plain lines (blank ones skipped) or JSON Lines with ``"text"``."""
    if not any(line.strip() for line in lines):
        raise FineTuneInputError(f"{where} holds no texts; give one text with {MASK} per line.")
    if not json_lines:
        return [
            _check_text(line, f"{where} line {number}")
            for number, line in enumerate(lines, start=1)
            if line.strip()
        ]
    texts = []
    for number, record in json_records(lines, where):
        if not isinstance(record.get("text"), str):
            raise FineTuneInputError(
                f'{where} line {number} lacks a string "text"; fill-mask reads that key.'
            )
        texts.append(_check_text(record["text"], f'{where} line {number}\'s "text"'))
    return texts


def read_texts(config: PredictConfig) -> tuple[list[str], bool]:
    """The texts to fill and whether they came from a file (or standard input): JSON Lines
    for a ``.jsonl`` file, or standard input whose first non-blank line starts with ``{``."""
    others = [k for k in ("question", "context", "text_pair") if config.given(k) is not None]
    if others:
        raise FineTuneInputError(
            f"ckpt={config.ckpt} is a pretrained (masked-LM) model: it fills {MASK} in text=, "
            f"not {' or '.join(f'{k}=' for k in others)}; pass a fine-tuned run for those."
        )
    if config.input_file and config.text is not None:
        raise FineTuneInputError("pass either text= or input_file=, not both.")
    if config.input_file == STDIN:
        lines = stdin_lines()
        first = next((line for line in lines if line.strip()), "")
        return _lines(lines, STDIN_NAME, first.lstrip().startswith("{")), True
    if config.input_file:
        path = Path(config.input_file)
        if not path.is_file():
            raise FineTuneInputError(
                f"input_file={path} does not exist; pass a text or JSON Lines (.jsonl) file."
            )
        with path.open(encoding="utf-8-sig") as handle:
            lines = [line.removesuffix("\r") for line in handle.read().split("\n")]
        return _lines(lines, f"input_file={path}", path.suffix == ".jsonl"), True
    if config.text is None:
        raise FineTuneInputError(
            f'pass text="... {MASK} ..." (or input_file=<text or JSON Lines file>).'
        )
    return [_check_text(config.text, "text=")], False


def _encode(masked: MaskedLM, text: str, index: int, from_file: bool) -> list[int]:
    ids = list(masked.tokenizer.encode(text).ids)
    mask_id = masked.tokenizer.token_to_id(MASK)
    limit = masked.max_length
    if len(ids) > limit:  # keep [CLS] ... and the final [SEP], as truncation=True does
        ids = [*ids[: limit - 1], ids[-1]]
        if mask_id not in ids:
            where = f"input {index}" if from_file else "text="
            raise FineTuneInputError(
                f"{where}: every {MASK} lies past the model's first {limit} tokens; shorten the "
                f"text around the {MASK}."
            )
    return ids


def fill_mask_records(
    masked: MaskedLM, texts: list[str], top_k: int, batch_size: int, autocast: Any,
    device: Any, from_file: bool,
) -> list[dict[str, Any]]:  # fmt: skip
    """One record per text (module docstring)."""
    import torch

    model = masked.model.to(device)
    vocab = model.config.vocab_size
    if top_k > vocab:
        raise FineTuneInputError(f"top_k={top_k} exceeds the model's {vocab} tokens; lower it.")
    mask_id = masked.tokenizer.token_to_id(MASK)
    pad_id = masked.tokenizer.token_to_id(SPECIAL_TOKENS["pad_token"]) or 0
    encoded = [_encode(masked, t, i, from_file) for i, t in enumerate(texts)]
    records = []
    for first in range(0, len(encoded), batch_size):
        rows = encoded[first : first + batch_size]
        width = max(len(r) for r in rows)
        masks = [[i for i, t in enumerate(r) if t == mask_id] for r in rows]
        slots = max(len(m) for m in masks)
        ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
        real = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        positions = torch.tensor([m + [0] * (slots - len(m)) for m in masks])
        batch = {
            "input_ids": ids, "segment_ids": torch.zeros_like(ids),
            "position_ids": torch.arange(width).expand(len(rows), width),
            "sequence_ids": real, "masked_lm_positions": positions,
            "masked_lm_ids": torch.zeros_like(positions),
            "masked_lm_weights": torch.zeros(positions.shape),
            "nsp_positions": torch.zeros(len(rows), 1, dtype=torch.long),
            "nsp_labels": torch.zeros(len(rows), 1, dtype=torch.long),
            "nsp_weights": torch.zeros(len(rows), 1),
        }  # fmt: skip
        with torch.inference_mode(), autocast:
            out = model({k: v.to(device) for k, v in batch.items()}, return_logits=True)
        probs = out["mlm_logits"][..., :vocab].float().softmax(-1).cpu()
        for row, (tokens, where) in enumerate(zip(rows, masks, strict=True)):
            records.append({
                "index": first + row, "text": texts[first + row],
                "masks": [_top(masked, tokens, probs[row, slot], pos, top_k, len(where) == 1)
                          for slot, pos in enumerate(where)],
            })  # fmt: skip
    return records


def _top(
    masked: MaskedLM, tokens: list[int], probs: Any, position: int, top_k: int, single: bool
) -> list[dict[str, Any]]:
    """The ``top_k`` predictions at one ``[MASK]``, as Hugging Face's fill-mask gives them."""
    values, ids = probs.topk(top_k)
    predictions = []
    for value, token in zip(values.tolist(), ids.tolist(), strict=True):
        filled = list(tokens)
        filled[position] = token
        predictions.append({
            "score": value, "token": token,
            "token_str": masked.tokenizer.decode([token]),
            "sequence": masked.tokenizer.decode(filled, skip_special_tokens=single),
        })  # fmt: skip
    return predictions
