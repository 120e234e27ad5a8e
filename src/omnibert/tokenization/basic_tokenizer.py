"""Pure-Python BERT tokenisation with the semantics of Google's reference tokenizer.

This is the slow, exact path and the oracle that :mod:`omnibert.tokenization.bert_tokenizer` is tested
against.  It re-implements the behaviour of ``tokenization.FullTokenizer`` from
google-research/bert (written from its algorithm, not copied):

1. Cleaning, character by character: NUL, U+FFFD and characters of category ``Cc`` or ``Cf``
   are dropped, except ``\\t``, ``\\n`` and ``\\r``, which become a space like every
   character of category ``Zs``.  Other categories, including unassigned (``Cn``), private use
   (``Co``) and lone surrogates (``Cs``) are *kept*.
2. A space is put on both sides of every CJK ideograph (the reference's code-point ranges).
3. Whitespace split with :meth:`str.split` (Python's notion of whitespace, which also covers
   U+001C..U+001F, U+0085, U+2028 and U+2029 when they survived cleaning).
4. Per word, when lower-casing: :meth:`str.lower` on the whole word (so a Greek capital
   sigma becomes a final sigma at the end of a word), then NFD, then characters of category
   ``Mn`` are dropped.  Without lower-casing, the word is left as it is (no NFD).
5. Every punctuation character becomes a word of its own: ASCII 33-47, 58-64, 91-96,
   123-126 and every character of a ``P*`` category.
6. WordPiece: greedy longest match first with ``##`` continuation pieces; a word that cannot
   be covered by the vocab, or that has more than 200 code points (the reference
   ``FullTokenizer`` builds its ``WordpieceTokenizer`` with that default), becomes a single
   unknown token.

All character classes come from :mod:`unicodedata`, so, like the reference, the results
depend on the Unicode version of the running Python.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Mapping

#: The reference ``FullTokenizer`` leaves ``WordpieceTokenizer`` at this default.
MAX_INPUT_CHARS_PER_WORD = 200
UNK_TOKEN = "[UNK]"
SUBWORD_PREFIX = "##"

# (first, last) code points that the reference surrounds with spaces.
_CJK_RANGES: tuple[tuple[int, int], ...] = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)
_ASCII_PUNCTUATION = frozenset(
    chr(cp) for lo, hi in ((33, 47), (58, 64), (91, 96), (123, 126)) for cp in range(lo, hi + 1)
)


def is_cjk_ideograph(char: str) -> bool:
    """True for the code points the reference treats as Chinese characters."""
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in _CJK_RANGES)


def is_removed(char: str) -> bool:
    """True when cleaning drops ``char`` (NUL, U+FFFD, ``Cc``/``Cf`` except tab/LF/CR)."""
    if char in "\t\n\r":
        return False
    if char in "\x00\ufffd":
        return True
    return unicodedata.category(char) in ("Cc", "Cf")


def is_space(char: str) -> bool:
    """True when cleaning turns ``char`` into a space (tab, LF, CR, space, ``Zs``)."""
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def is_punctuation(char: str) -> bool:
    """True for the characters that the reference splits off as words of their own."""
    return char in _ASCII_PUNCTUATION or unicodedata.category(char).startswith("P")


def _cleaned(char: str) -> str:
    """What steps 1 and 2 make of one input character."""
    if is_removed(char):
        return ""
    if is_space(char):
        return " "
    if is_cjk_ideograph(char):
        return f" {char} "
    return char


def _strip_marks(word: str) -> str:
    """Lower-case ``word`` as a whole, decompose it (NFD) and drop nonspacing marks."""
    decomposed = unicodedata.normalize("NFD", word.lower())
    return "".join(ch for ch in decomposed if unicodedata.category(ch) != "Mn")


class BasicTokenizer:
    """Cleaning, CJK spacing, whitespace and punctuation splitting, optional lower-casing."""

    def __init__(self, do_lower_case: bool) -> None:
        self.do_lower_case = do_lower_case
        # Per-character results of the context-free steps; they only depend on the
        # character, so caching them keeps this path usable on real corpora.
        self._clean_cache: dict[str, str] = {}
        self._punct_cache: dict[str, bool] = {}

    def clean(self, text: str) -> str:
        """Steps 1 and 2: drop invalid characters, normalise whitespace, space out CJK."""
        cache = self._clean_cache
        pieces = []
        for char in text:
            out = cache.get(char)
            if out is None:
                out = cache[char] = _cleaned(char)
            pieces.append(out)
        return "".join(pieces)

    def _split_punctuation(self, word: str, out: list[str]) -> None:
        cache = self._punct_cache
        start = 0
        for index, char in enumerate(word):
            punct = cache.get(char)
            if punct is None:
                punct = cache[char] = is_punctuation(char)
            if punct:
                if index > start:
                    out.append(word[start:index])
                out.append(char)
                start = index + 1
        if start < len(word):
            out.append(word[start:])

    def tokenize(self, text: str) -> list[str]:
        """The words of ``text`` (before WordPiece), exactly as the reference finds them."""
        pieces: list[str] = []
        for word in self.clean(text).split():
            if self.do_lower_case and not word.isascii():
                word = _strip_marks(word)
            elif self.do_lower_case:
                word = word.lower()  # NFD is the identity on ASCII, which has no marks
            self._split_punctuation(word, pieces)
        # The reference joins with spaces and splits again: pieces that became empty vanish
        # and whitespace created by lower-casing or NFD (none in practice) would split.
        return " ".join(pieces).split()


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece over a token → id mapping."""

    def __init__(
        self,
        vocab: Mapping[str, int],
        unk_token: str = UNK_TOKEN,
        max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD,
    ) -> None:
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize_word(self, word: str) -> list[str]:
        """Pieces of one word (no whitespace inside), or ``[unk_token]``."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces: list[str] = []
        start = 0
        while start < len(word):
            for end in range(len(word), start, -1):
                candidate = word[start:end] if start == 0 else SUBWORD_PREFIX + word[start:end]
                if candidate in self.vocab:
                    pieces.append(candidate)
                    start = end
                    break
            else:
                return [self.unk_token]
        return pieces

    def tokenize(self, words: list[str]) -> list[str]:
        return [piece for word in words for piece in self.tokenize_word(word)]


class FullTokenizer:
    """Basic tokenisation followed by WordPiece; the oracle for :class:`BertTokenizer`."""

    def __init__(self, vocab: Mapping[str, int], do_lower_case: bool) -> None:
        self.vocab = vocab
        self.basic = BasicTokenizer(do_lower_case)
        self.wordpiece = WordpieceTokenizer(vocab)

    def tokenize(self, text: str) -> list[str]:
        return self.wordpiece.tokenize(self.basic.tokenize(text))

    def tokenize_ids(self, text: str) -> list[int]:
        vocab = self.vocab
        return [vocab[piece] for piece in self.tokenize(text)]
