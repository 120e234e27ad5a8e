"""A BERT ``vocab.txt`` loaded with the reference's semantics.

The reference (Google's ``tokenization.load_vocab``) reads the file line by line (lines end
at ``\\n`` only), strips surrounding whitespace from each line and assigns it the line's
index.  A token that appears twice keeps the position of its *first* appearance in the key
order but the index of its *last* appearance.  Random replacement in masking draws
``vocab_words[rng.randint(0, len(vocab_words) - 1)]`` from that key order, so both orders
matter for bit-exact reproduction; :class:`Vocab` keeps them as arrays.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from omnibert.errors import UserError

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(UserError):
    """A vocab file that cannot be used, with the file named and the fix."""


def sha256_file(path: str | Path, chunk_size: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Vocab:
    """Token → id mapping of a ``vocab.txt`` plus the arrays instance creation needs."""

    path: str
    token_to_id: dict[str, int]
    sha256: str
    #: ids of ``list(vocab.keys())`` in the reference's key order (random replacement).
    word_ids: np.ndarray = field(repr=False)
    #: ``is_subword[id]`` is True when the token at ``id`` starts with ``##``.
    is_subword: np.ndarray = field(repr=False)
    #: number of lines (the largest id + 1); the model's vocab size before padding.
    size: int = 0

    @classmethod
    def from_file(cls, path: str | Path) -> Vocab:
        path = Path(path)
        if not path.is_file():
            raise VocabError(
                f"vocab file {str(path)!r} does not exist; set vocab_file to a BERT vocab.txt "
                "(or let omnibert-prepare train one with train_vocab.enabled=true)."
            )
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise VocabError(
                f"vocab file {str(path)!r} is not valid UTF-8 (byte {err.start}); "
                "re-save it as UTF-8."
            ) from err
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        token_to_id: dict[str, int] = {}
        for index, line in enumerate(lines):
            token_to_id[line.strip()] = index
        missing = [tok for tok in SPECIAL_TOKENS if tok not in token_to_id]
        if missing:
            raise VocabError(
                f"vocab file {str(path)!r} lacks the special tokens {missing}; "
                "a BERT vocab.txt needs [PAD], [UNK], [CLS], [SEP] and [MASK]."
            )
        size = len(lines)
        is_subword = np.zeros(size, dtype=bool)
        for token, index in token_to_id.items():
            if token.startswith("##"):
                is_subword[index] = True
        word_ids = np.fromiter(token_to_id.values(), dtype=np.int64, count=len(token_to_id))
        return cls(
            path=str(path),
            token_to_id=token_to_id,
            sha256=hashlib.sha256(raw).hexdigest(),
            word_ids=word_ids,
            is_subword=is_subword,
            size=size,
        )

    def __len__(self) -> int:
        return self.size

    def id(self, token: str) -> int:
        return self.token_to_id[token]

    @property
    def pad_id(self) -> int:
        return self.token_to_id["[PAD]"]

    @property
    def unk_id(self) -> int:
        return self.token_to_id["[UNK]"]

    @property
    def cls_id(self) -> int:
        return self.token_to_id["[CLS]"]

    @property
    def sep_id(self) -> int:
        return self.token_to_id["[SEP]"]

    @property
    def mask_id(self) -> int:
        return self.token_to_id["[MASK]"]

    def id_to_token(self) -> list[str]:
        """Inverse mapping (for ids that several lines share, the token of the last line)."""
        inverse = [""] * self.size
        for token, index in self.token_to_id.items():
            inverse[index] = token
        return inverse
