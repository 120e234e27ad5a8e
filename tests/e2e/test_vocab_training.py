"""WordPiece vocab training: BERT layout, loadable by Vocab, deterministic."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from omnibert.prepare.vocab_training import count_words, learn_wordpiece, train_wordpiece_vocab
from omnibert.tokenization.vocab import SPECIAL_TOKENS, Vocab, VocabError

FIXTURE_TEXT = Path(__file__).parents[1] / "fixtures" / "wiki" / "extracted"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Tokenization splits words into smaller pieces, called word-pieces.",
    "Running, runner and runs share the stem run; jumping and jumped share jump.",
    "Ünïcödé accents are stripped when lower-casing: Café becomes cafe.",
    "Numbers like 12345 and 2024 are split into digits and pieces.",
    "Chinese characters such as 中文 are split one per token.",
]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("text")
    files = []
    for index in range(2):
        path = root / f"part-{index}.txt"
        lines = [s for i, s in enumerate(SENTENCES * 20) if i % 2 == index]
        path.write_text("\n".join(lines) + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
        files.append(path)
    return files


def _greedy_wordpiece(word: str, vocab: set[str]) -> list[str]:
    """BERT's longest-match-first WordPiece tokenisation of one word."""
    pieces, start = [], 0
    while start < len(word):
        end = len(word)
        while end > start:
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                break
            end -= 1
        if end == start:
            return ["[UNK]"]
        pieces.append(piece)
        start = end
    return pieces


def test_special_tokens_first_then_unused_and_loads_with_vocab(
    corpus_files: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "vocab.txt"
    summary = train_wordpiece_vocab(corpus_files, out, 300, True, num_unused=3)
    lines = out.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and "" not in lines[:-1]
    tokens = lines[:-1]
    assert tokens[:8] == [*SPECIAL_TOKENS, "[unused0]", "[unused1]", "[unused2]"]
    assert len(tokens) == len(set(tokens)) == summary.vocab_size <= 300
    vocab = Vocab.from_file(out)
    assert len(vocab) == summary.vocab_size
    assert (vocab.pad_id, vocab.unk_id, vocab.cls_id, vocab.sep_id, vocab.mask_id) == (
        0,
        1,
        2,
        3,
        4,
    )
    assert vocab.sha256 == summary.sha256
    assert vocab.is_subword[vocab.id("##s")]


def test_vocab_covers_the_training_words(corpus_files: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "vocab.txt"
    train_wordpiece_vocab(corpus_files, out, 400, True, min_frequency=2)
    vocab = set(out.read_text(encoding="utf-8").split("\n")[:-1])
    counts = count_words(corpus_files, do_lower_case=True, processes=1)
    assert counts["cafe"] == 80 and "café" not in counts and counts["中"] == 40
    for word in counts:
        assert "[UNK]" not in _greedy_wordpiece(word, vocab), word
    # frequent words become whole tokens
    assert {"the", "and", "share", "jump"} <= vocab


def test_cased_vocab_keeps_case_and_uncased_has_none(
    corpus_files: list[Path], tmp_path: Path
) -> None:
    train_wordpiece_vocab(corpus_files, tmp_path / "cased.txt", 300, False)
    train_wordpiece_vocab(corpus_files, tmp_path / "uncased.txt", 300, True)
    cased = tmp_path.joinpath("cased.txt").read_text(encoding="utf-8").split("\n")[5:]
    uncased = tmp_path.joinpath("uncased.txt").read_text(encoding="utf-8").split("\n")[5:]
    assert "T" in cased and "##é" in cased and "Ü" in cased
    assert not any(ch.isupper() or ch in "éü" for token in uncased for ch in token)


def test_merges_pick_the_most_frequent_pair_and_break_ties_by_text() -> None:
    counts = Counter({"low": 5, "lower": 2, "newest": 6, "widest": 3})
    vocab = learn_wordpiece(counts, vocab_size=100, reserved=list(SPECIAL_TOKENS))
    learnt = vocab[len(SPECIAL_TOKENS) :]
    alphabet = ["l", "n", "w", "##d", "##e", "##i", "##o", "##r", "##s", "##t", "##w"]
    assert learnt[: len(alphabet)] == alphabet
    merges = learnt[len(alphabet) :]
    # ##e+##s and ##s+##t tie at 9: "##e" < "##s" decides; then l+##o and ##o+##w tie
    # at 7: "##o" < "l" decides.
    assert merges[:4] == ["##es", "##est", "##ow", "low"]
    # swapping the input order changes nothing
    assert learn_wordpiece(Counter(dict(reversed(counts.items()))), 100, SPECIAL_TOKENS) == vocab
    # min_frequency stops the merging
    few = learn_wordpiece(counts, 100, list(SPECIAL_TOKENS), min_frequency=9)
    assert few[len(SPECIAL_TOKENS) + len(alphabet) :] == ["##es", "##est"]


_TRAIN = """
import sys
from omnibert.prepare.vocab_training import train_wordpiece_vocab
if __name__ == "__main__":
    train_wordpiece_vocab(sys.argv[2:], sys.argv[1], 350, True, processes=2)
"""


def test_training_is_deterministic_across_processes(
    corpus_files: list[Path], tmp_path: Path
) -> None:
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"vocab-{seed}.txt"
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(
            [sys.executable, str(script), str(out), *map(str, corpus_files)], env=env, check=True
        )
        outputs.append(out.read_bytes())
    in_process = tmp_path / "vocab-here.txt"
    train_wordpiece_vocab(corpus_files, in_process, 350, True, processes=1)
    assert outputs[0] == outputs[1] == in_process.read_bytes()


def test_errors_name_the_problem(corpus_files: list[Path], tmp_path: Path) -> None:
    missing = tmp_path / "missing.txt"
    with pytest.raises(VocabError, match=r"missing\.txt"):
        train_wordpiece_vocab([missing], tmp_path / "v.txt", 100, True)
    with pytest.raises(VocabError, match="no room"):
        train_wordpiece_vocab(corpus_files, tmp_path / "v.txt", 5, True)
    with pytest.raises(VocabError, match="unknown vocab engine"):
        train_wordpiece_vocab(corpus_files, tmp_path / "v.txt", 100, True, engine="sentencepiece")
    assert not (tmp_path / "v.txt").exists()


def test_tokenizers_engine_writes_a_loadable_vocab(
    corpus_files: list[Path], tmp_path: Path
) -> None:
    out = tmp_path / "vocab.txt"
    summary = train_wordpiece_vocab(corpus_files, out, 300, True, engine="tokenizers")
    assert out.read_text(encoding="utf-8").split("\n")[:5] == list(SPECIAL_TOKENS)
    assert len(Vocab.from_file(out)) == summary.vocab_size > 100
