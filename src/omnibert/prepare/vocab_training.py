"""Train a BERT WordPiece ``vocab.txt`` from one-sentence-per-line text files.

Words come from Hugging Face ``tokenizers``' BERT normaliser (clean text, split CJK
characters, optional lower-casing with accent stripping) and pre-tokeniser (whitespace and
punctuation). The vocabulary is learnt as ``tokenizers``' ``WordPieceTrainer`` learns it:
byte-pair-style merges of the most frequent adjacent pair, ``##`` marking word-internal
pieces, an alphabet of the ``limit_alphabet`` most frequent characters.

Two engines:

- ``"omnibert"`` (default): the merge loop here, in Python, with every tie broken by the
  tokens' text, so the same input gives the same ``vocab.txt`` byte for byte. Seconds for
  the demo corpus; minutes to tens of minutes for full Wikipedia (word counting runs in
  parallel, the merge loop on one core).
- ``"tokenizers"``: ``tokenizers.trainers.WordPieceTrainer`` (Rust, fast). It is *not*
  deterministic: ids of ``##`` pieces follow hash-map order and decide ties between equally
  frequent merges (upstream issue huggingface/tokenizers#1794), so two runs can differ.

The file written has
``[PAD] [UNK] [CLS] [SEP] [MASK]`` on lines 0-4, then ``num_unused`` ``[unused*]`` slots (as in
Google's vocabularies, free for tokens added at fine-tuning), then the learnt tokens in id
order, one per line, and loads with :meth:`omnibert.tokenization.vocab.Vocab.from_file`.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
import multiprocessing
import os
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from omnibert.tokenization.vocab import SPECIAL_TOKENS, VocabError


@dataclass(frozen=True)
class VocabTrainingSummary:
    path: Path
    #: lines written (specials, unused slots and learnt tokens).
    vocab_size: int
    requested_size: int
    num_unused: int
    do_lower_case: bool
    sha256: str
    seconds: float
    min_frequency: int = 2

    def __str__(self) -> str:
        return (
            f"vocab {self.path}: {self.vocab_size} tokens (requested {self.requested_size}, "
            f"{'uncased' if self.do_lower_case else 'cased'}) in {self.seconds:.1f} s "
            f"(sha256 {self.sha256[:12]})"
        )

    @property
    def shortfall(self) -> dict[str, object] | None:
        """Why fewer tokens than asked were learnt (``None`` when the size was reached)."""
        if self.vocab_size >= self.requested_size:
            return None
        return {
            "key": "train_vocab.vocab_size",
            "requested": self.requested_size,
            "produced": self.vocab_size,
            "message": (
                f"train_vocab.vocab_size={self.requested_size:,} asked, {self.vocab_size:,} "
                f"tokens trained: no further pair of pieces occurs at least "
                f"train_vocab.min_frequency={self.min_frequency} times in the input files; "
                "more text or a lower min_frequency gives a larger vocab"
            ),
        }


def _checked_files(files: Sequence[Path | str]) -> list[str]:
    if not files:
        raise VocabError("no text files given to train the vocab on; set the training files.")
    paths = [Path(f) for f in files]
    for path in paths:
        if not path.is_file():
            raise VocabError(
                f"vocab training file {str(path)!r} does not exist; create the text first "
                "(one sentence per line) or fix the path."
            )
    return [str(path) for path in paths]


#: BERT's tokenizer maps longer words to [UNK] (``max_input_chars_per_word``); not counted.
MAX_WORD_CHARS = 100
PREFIX = "##"


def _bert_word_splitter(do_lower_case: bool) -> Callable[[str], list[str]]:
    from tokenizers import normalizers, pre_tokenizers

    normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=do_lower_case,
        lowercase=do_lower_case,
    )
    pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def words(line: str) -> list[str]:
        return [w for w, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(line))]

    return words


def _count_file(task: tuple[str, bool]) -> Counter[str]:
    path, do_lower_case = task
    words = _bert_word_splitter(do_lower_case)
    counts: Counter[str] = Counter()
    with open(path, encoding="utf-8", errors="replace") as handle:
        for line in handle:
            if line.strip():
                counts.update(w for w in words(line) if len(w) <= MAX_WORD_CHARS)
    return counts


def count_words(
    files: Sequence[Path | str], do_lower_case: bool, processes: int | None = None
) -> Counter[str]:
    """BERT-normalised, BERT-pre-tokenised word counts of ``files`` (in parallel over files)."""
    tasks = [(path, do_lower_case) for path in _checked_files(files)]
    processes = min(os.cpu_count() or 1, len(tasks)) if processes is None else processes
    total: Counter[str] = Counter()
    if processes <= 1 or len(tasks) <= 1:
        for task in tasks:
            total.update(_count_file(task))
        return total
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        for counts in pool.imap(_count_file, tasks):
            total.update(counts)
    return total


def _alphabet(word_counts: Counter[str], limit_alphabet: int) -> set[str]:
    frequency: Counter[str] = Counter()
    for word, count in word_counts.items():
        for char in word:
            frequency[char] += count
    ranked = sorted(frequency.items(), key=lambda kv: (-kv[1], kv[0]))
    return {char for char, _ in ranked[:limit_alphabet]}


def learn_wordpiece(
    word_counts: Counter[str],
    vocab_size: int,
    reserved: Sequence[str],
    min_frequency: int = 2,
    limit_alphabet: int = 1000,
) -> list[str]:
    """The vocabulary in id order: ``reserved``, characters, ``##`` characters, merges.

    Each step merges the most frequent adjacent pair (at least ``min_frequency``
    occurrences; ties to the smaller ``(left, right)`` text) until ``vocab_size`` tokens.
    """
    alphabet = _alphabet(word_counts, limit_alphabet)
    words: list[list[str]] = []
    counts: list[int] = []
    for word, count in sorted(word_counts.items()):
        chars = [c for c in word if c in alphabet]
        if chars:
            words.append([chars[0], *(PREFIX + c for c in chars[1:])])
            counts.append(count)
    vocab = list(reserved)
    known = set(vocab)
    initial = sorted({s for w in words for s in w} - known, key=lambda t: (t.startswith(PREFIX), t))
    vocab += initial
    known.update(initial)

    pair_counts: defaultdict[tuple[str, str], int] = defaultdict(int)
    where: defaultdict[tuple[str, str], set[int]] = defaultdict(set)
    for index, (symbols, count) in enumerate(zip(words, counts, strict=True)):
        for pair in itertools.pairwise(symbols):
            pair_counts[pair] += count
            where[pair].add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    while len(vocab) < vocab_size and heap:
        negative, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -negative:
            continue  # stale entry; the current count was pushed again
        if -negative < min_frequency:
            break
        left, right = pair
        merged = left + right[len(PREFIX) :] if right.startswith(PREFIX) else left + right
        if merged not in known:
            vocab.append(merged)
            known.add(merged)
        changed: set[tuple[str, str]] = set()
        for index in sorted(where.pop(pair)):
            symbols, count = words[index], counts[index]
            for old in itertools.pairwise(symbols):
                pair_counts[old] -= count
                changed.add(old)
            out: list[str] = []
            i = 0
            while i < len(symbols):
                if i + 1 < len(symbols) and symbols[i] == left and symbols[i + 1] == right:
                    out.append(merged)
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            words[index] = out
            for new in itertools.pairwise(out):
                pair_counts[new] += count
                where[new].add(index)
                changed.add(new)
        pair_counts.pop(pair, None)
        for other in changed:
            if other != pair and pair_counts.get(other, 0) > 0:
                heapq.heappush(heap, (-pair_counts[other], other))
            elif other != pair:
                pair_counts.pop(other, None)
    return vocab


def train_wordpiece_vocab(
    files: Sequence[Path | str],
    out_path: Path | str,
    vocab_size: int,
    do_lower_case: bool,
    min_frequency: int = 2,
    *,
    num_unused: int = 0,
    limit_alphabet: int = 1000,
    engine: str = "omnibert",
    processes: int | None = None,
) -> VocabTrainingSummary:
    """Train WordPiece on ``files`` and write a BERT ``vocab.txt`` to ``out_path``.

    ``vocab_size`` counts every line (special tokens and unused slots included); a small
    corpus can give fewer lines. ``min_frequency`` is the fewest occurrences a merge needs,
    ``limit_alphabet`` the most single characters kept. With ``engine="omnibert"`` the same
    files and arguments give the same file, byte for byte.
    """
    reserved = [*SPECIAL_TOKENS, *(f"[unused{i}]" for i in range(num_unused))]
    if vocab_size <= len(reserved):
        raise VocabError(
            f"vocab_size {vocab_size} leaves no room for learnt tokens after the "
            f"{len(reserved)} special and unused tokens; raise vocab_size."
        )
    paths = _checked_files(files)
    start = time.perf_counter()
    if engine == "omnibert":
        counts = count_words(paths, do_lower_case, processes)
        tokens = learn_wordpiece(counts, vocab_size, reserved, min_frequency, limit_alphabet)
    elif engine == "tokenizers":
        tokens = _train_with_tokenizers(
            paths, vocab_size, do_lower_case, reserved, min_frequency, limit_alphabet
        )
    else:
        raise VocabError(f"unknown vocab engine {engine!r}; use 'omnibert' or 'tokenizers'.")
    if tokens[: len(reserved)] != reserved:
        raise VocabError(  # pragma: no cover - a tokenizers behaviour change
            f"the trained vocab does not start with {reserved[:5]}; got {tokens[:5]}."
        )
    # Vocab.from_file strips each line, so a token with surrounding whitespace could not load.
    tokens = [t for t in tokens if t and t == t.strip() and "\n" not in t]

    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = "".join(f"{token}\n" for token in tokens).encode("utf-8")
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, out)
    return VocabTrainingSummary(
        path=out,
        vocab_size=len(tokens),
        requested_size=vocab_size,
        num_unused=num_unused,
        do_lower_case=do_lower_case,
        sha256=hashlib.sha256(payload).hexdigest(),
        seconds=time.perf_counter() - start,
        min_frequency=min_frequency,
    )


def _train_with_tokenizers(
    paths: list[str],
    vocab_size: int,
    do_lower_case: bool,
    reserved: list[str],
    min_frequency: int,
    limit_alphabet: int,
) -> list[str]:
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]", continuing_subword_prefix=PREFIX))
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True,
        handle_chinese_chars=True,
        strip_accents=do_lower_case,
        lowercase=do_lower_case,
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        show_progress=False,
        special_tokens=reserved,
        limit_alphabet=limit_alphabet,
        continuing_subword_prefix=PREFIX,
    )
    tokenizer.train(paths, trainer)
    learnt = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    return [token for token, _ in learnt]
