"""The fine-tuning tokenizer: WordPiece from the checkpoint's own ``vocab.txt`` through
Hugging Face ``tokenizers`` (``BertWordPieceTokenizer``), whose offsets point into the
original text (answers are cut from the context as written, accents and odd spaces kept).

Lower-casing follows the vocab: a vocab with upper-case ASCII word pieces (outside the
``[...]`` special tokens) is cased, any other is uncased (Google's uncased vocabs hold none).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omnibert.errors import UserError

__all__ = ["FineTuneInputError", "build_tokenizer", "vocab_is_uncased"]


class FineTuneInputError(UserError):
    """A fine-tuning input (data file, vocab, checkpoint) that cannot be used as given."""


def vocab_is_uncased(vocab_file: str | Path) -> bool:
    """True when no word piece of the vocab holds an upper-case ASCII letter."""
    with Path(vocab_file).open(encoding="utf-8") as handle:
        for line in handle:
            token = line.rstrip("\n")
            if token.startswith("[") and token.endswith("]"):
                continue
            if any("A" <= ch <= "Z" for ch in token):
                return False
    return True


def build_tokenizer(vocab_file: str | Path) -> Any:
    """A ``tokenizers.BertWordPieceTokenizer`` for ``vocab_file`` (lower-casing and accent
    stripping as the vocab says), with no truncation or padding set."""
    # lazy: the apps import this module (FineTuneInputError) before their preflight
    from tokenizers import BertWordPieceTokenizer

    path = Path(vocab_file)
    if not path.is_file():
        raise FineTuneInputError(
            f"vocab file {path} does not exist; the vocab comes from the checkpoint: pass a "
            "model.init_from that has a vocab.txt beside it."
        )
    lower = vocab_is_uncased(path)
    return BertWordPieceTokenizer(str(path), lowercase=lower, strip_accents=lower)
