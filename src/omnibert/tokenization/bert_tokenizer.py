"""Fast BERT WordPiece tokenisation that gives exactly the reference's tokens.

Google's ``tokenization.FullTokenizer`` is pure Python and slow; Hugging Face ``tokenizers``
(Rust) implements nearly the same pipeline but differs on some inputs: its cleaning drops
every ``C*`` character (the reference keeps unassigned and private-use ones), its Unicode
tables are older than Python's, it strips accents *before* lower-casing and lower-cases one
character at a time (no final sigma), and its WordPiece defaults to 100 characters a word
where the reference uses 200.  :class:`BertTokenizer` is a hybrid that is exact:

* A line is sent whole through HF (normaliser, pre-tokeniser, WordPiece) only when every
  character in it is *safe*.  Everything else goes through the pure-Python
  :class:`~omnibert.tokenization.basic_tokenizer.BasicTokenizer`, and its words through HF WordPiece
  (the same greedy algorithm; no normaliser, pre-split input).
* Why per-character safety implies equality on whole lines.  Without lower-casing, both
  pipelines act character by character (drop / space / isolate / keep, then split on
  whitespace and punctuation), so a line's words are fixed by what each of its characters
  does next to its neighbours.  With lower-casing, three steps could look across characters:
  (1) ``str.lower`` (only U+03A3, the final-sigma rule, is context-sensitive in Python, so
  U+03A3 is unsafe); (2) NFD's canonical reordering, which only permutes a run of
  non-starters (combining class ≠ 0) — a safe character's decomposition (of it and of its
  lower case) must begin with a starter, or else consist of ``Mn`` characters only, which both
  pipelines delete after NFD (deleting after a stable sort keeps the others' order), so every
  reordering that survives stays inside one character's own, already ordered, decomposition;
  (3) dropping ``Mn`` is per character.  Hence both pipelines map a line of safe characters
  to the concatenation of per-character pieces, and a character is accepted only when the
  two pipelines give the same words for it alone and in a set of contexts (beside letters,
  upper-case letters, spaces, punctuation, CJK, accents, digits and itself).
* Lone surrogates cannot enter Rust and are never safe.  ASCII lines skip the per-character
  look-up once all 128 ASCII characters have been found safe at construction (they are, on
  every tokenizers version tested; if not, ASCII lines take the checked route like others).

* ASCII lines (most of English text) take a shorter exact route that is measured faster
  than HF's ``encode_batch`` (which spends most of its time building ``Encoding`` objects):
  once the reference's deleted ASCII controls are removed, an ASCII line holds only spaces,
  letters/digits and punctuation (every other printable ASCII character is punctuation to
  the reference), so its words are the alphanumeric runs and the single punctuation
  characters; each distinct word goes once through HF's WordPiece model and is cached.

Safety is computed lazily per character and cached per instance (the answer depends on
``do_lower_case`` and on the Python and ``tokenizers`` versions, never on the vocab).
"""

from __future__ import annotations

import functools
import re
import unicodedata

from tokenizers import Encoding, Tokenizer, models, normalizers, pre_tokenizers

from omnibert.tokenization.basic_tokenizer import (
    MAX_INPUT_CHARS_PER_WORD,
    SUBWORD_PREFIX,
    UNK_TOKEN,
    BasicTokenizer,
    WordpieceTokenizer,
)
from omnibert.tokenization.vocab import Vocab

#: Each character is checked alone and in these contexts ("{}" is the character).
SAFETY_CONTEXTS: tuple[str, ...] = (
    "{}",
    "a{}b",
    "a {} b",
    "A{}B",
    "{}{}",
    "z{}{}z",
    ".{}.",
    "({})",
    "中{}中",
    "x{}\u0301y",
    "é{}É",
    "E\u0301{}",
    "1{}2",
)
_GREEK_CAPITAL_SIGMA = "\u03a3"
#: ASCII control characters the reference deletes (category Cc, except tab, LF and CR,
#: which it treats as spaces).
_ASCII_DELETE = {cp: None for cp in (*range(0x20), 0x7F) if chr(cp) not in "\t\n\r"}
#: Words of a cleaned ASCII line: alphanumeric runs, and each punctuation character
#: (the reference's ASCII punctuation: 33-47, 58-64, 91-96, 123-126) on its own.
_ASCII_WORD = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")
#: Distinct words whose WordPiece ids are cached (a corpus part has far fewer).
_WORD_CACHE_LIMIT = 4_000_000


class _WordIds(dict[str, list[int]]):
    """word → WordPiece ids, computed on first sight by HF's WordPiece model and cached."""

    def __init__(self, model: models.WordPiece) -> None:
        super().__init__()
        self._model = model

    def __missing__(self, word: str) -> list[int]:
        ids = [token.id for token in self._model.tokenize(word)]
        if len(self) < _WORD_CACHE_LIMIT:
            self[word] = ids
        return ids


_SURROGATE = re.compile("[\ud800-\udfff]")


def _starts_with_starter_or_vanishes(text: str) -> bool:
    """True when NFD(``text``) begins with a starter or consists of ``Mn`` characters only."""
    decomposed = unicodedata.normalize("NFD", text)
    if not decomposed or unicodedata.combining(decomposed[0]) == 0:
        return True
    return all(unicodedata.category(ch) == "Mn" for ch in decomposed)


def _bert_normalizer(do_lower_case: bool) -> normalizers.BertNormalizer:
    return normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=do_lower_case,
        lowercase=do_lower_case,
    )


def _wordpiece(vocab: Vocab) -> models.WordPiece:
    return models.WordPiece(
        vocab=dict(vocab.token_to_id),
        unk_token=UNK_TOKEN,
        continuing_subword_prefix=SUBWORD_PREFIX,
        max_input_chars_per_word=MAX_INPUT_CHARS_PER_WORD,
    )


class BertTokenizer:
    """Reference-exact BERT tokenisation, batched through HF ``tokenizers`` where provably equal.

    ``tokenize_lines`` takes lines that are already stripped and returns their WordPiece ids;
    ``tokenize`` returns the token strings of one line.
    """

    def __init__(self, vocab: Vocab, do_lower_case: bool) -> None:
        if UNK_TOKEN not in vocab.token_to_id:
            raise ValueError(f"vocab file {vocab.path!r} has no {UNK_TOKEN} token; add it.")
        self.vocab = vocab
        self.do_lower_case = do_lower_case
        self._basic = BasicTokenizer(do_lower_case)
        self._wordpiece = WordpieceTokenizer(vocab.token_to_id)  # for lone surrogates only
        # Whole lines: the HF pipeline configured like the reference.
        model = _wordpiece(vocab)  # one model (30k-entry build) shared by the three users
        self._lines = Tokenizer(model)
        self._lines.normalizer = _bert_normalizer(do_lower_case)
        self._lines.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        # Words found by the Python basic tokenizer: WordPiece only.
        self._words = Tokenizer(model)
        # Stand-alone copies of the HF pre-processing, used to check characters.
        self._normalizer = _bert_normalizer(do_lower_case)
        self._pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self._word_ids = _WordIds(model)
        self._id_to_token = vocab.id_to_token()
        self._safe: set[str] = set()
        self._unsafe: set[str] = set()

    @functools.cached_property
    def _ascii_is_safe(self) -> bool:
        return all([self.is_safe_char(chr(cp)) for cp in range(128)])

    # -- safety -------------------------------------------------------------------------------

    def _hf_words(self, text: str) -> list[str]:
        normalized = self._normalizer.normalize_str(text)
        return [word for word, _ in self._pre_tokenizer.pre_tokenize_str(normalized)]

    def _check_char(self, char: str) -> bool:
        if 0xD800 <= ord(char) <= 0xDFFF:
            return False  # a lone surrogate is not valid UTF-8 and cannot reach Rust
        if self.do_lower_case:
            if char == _GREEK_CAPITAL_SIGMA:
                return False
            if not (
                _starts_with_starter_or_vanishes(char)
                and _starts_with_starter_or_vanishes(char.lower())
            ):
                return False
        for context in SAFETY_CONTEXTS:
            text = context.replace("{}", char)
            if self._hf_words(text) != self._basic.tokenize(text):
                return False
        return True

    def is_safe_char(self, char: str) -> bool:
        """Whether HF treats ``char`` exactly like the reference in every context (cached)."""
        if char in self._safe:
            return True
        if char in self._unsafe:
            return False
        safe = self._check_char(char)
        (self._safe if safe else self._unsafe).add(char)
        return safe

    def uses_fast_path(self, line: str) -> bool:
        """Whether ``line`` goes through HF as a whole (all its characters are safe)."""
        if line.isascii() and self._ascii_is_safe:
            return True
        if self._safe.issuperset(line):
            return True
        return all([self.is_safe_char(ch) for ch in set(line)])

    @property
    def unsafe_chars(self) -> frozenset[str]:
        """The characters found unsafe so far (their lines take the Python path)."""
        return frozenset(self._unsafe)

    # -- tokenisation -------------------------------------------------------------------------

    def _encode(self, lines: list[str]) -> list[Encoding | list[str]]:
        """HF encodings of ``lines``, or token strings for the rare lines Rust cannot take."""
        fast_at: list[int] = []
        fast_lines: list[str] = []
        slow_at: list[int] = []
        slow_words: list[list[str]] = []
        out: list[Encoding | list[str]] = [[] for _ in lines]
        for index, line in enumerate(lines):
            if self.uses_fast_path(line):
                fast_at.append(index)
                fast_lines.append(line)
            elif _SURROGATE.search(line):
                out[index] = self._wordpiece.tokenize(self._basic.tokenize(line))
            else:
                slow_at.append(index)
                slow_words.append(self._basic.tokenize(line))
        if len(fast_lines) == len(lines):
            return list(self._lines.encode_batch(lines, add_special_tokens=False))
        if fast_lines:
            fast = self._lines.encode_batch(fast_lines, add_special_tokens=False)
            for index, encoding in zip(fast_at, fast, strict=True):
                out[index] = encoding
        if slow_words:
            slow = self._words.encode_batch(
                slow_words, is_pretokenized=True, add_special_tokens=False
            )
            for index, encoding in zip(slow_at, slow, strict=True):
                out[index] = encoding
        return out

    def _ascii_ids(self, line: str) -> list[int]:
        text = line.translate(_ASCII_DELETE)
        if self.do_lower_case:
            text = text.lower()
        word_ids = self._word_ids
        return [i for word in _ASCII_WORD.findall(text) for i in word_ids[word]]

    def tokenize_lines(self, lines: list[str]) -> list[list[int]]:
        """WordPiece ids of each (already stripped) line, exactly as the reference gives them."""
        out: list[list[int]] = [[] for _ in lines]
        other_at: list[int] = []
        for index, line in enumerate(lines):
            if line.isascii():
                out[index] = self._ascii_ids(line)
            else:
                other_at.append(index)
        if other_at:
            vocab = self.vocab.token_to_id
            encoded = self._encode([lines[i] for i in other_at])
            for index, item in zip(other_at, encoded, strict=True):
                out[index] = (
                    item.ids if isinstance(item, Encoding) else [vocab[token] for token in item]
                )
        return out

    def tokenize(self, line: str) -> list[str]:
        """Token strings of one line (for tests and debugging)."""
        if line.isascii():
            return [self._id_to_token[i] for i in self._ascii_ids(line)]
        item = self._encode([line])[0]
        return item.tokens if isinstance(item, Encoding) else item
