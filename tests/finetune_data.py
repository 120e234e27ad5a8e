"""Small fine-tuning data sets in the official formats, from templates over made-up facts:
SQuAD v1.1 JSON (questions about invented countries) and GLUE MRPC TSV (paraphrase pairs).
Deterministic for a seed; the entities of different seeds differ, so a train and an eval
file made with different seeds share no answer."""

from __future__ import annotations

import json
import random
from pathlib import Path

SYLLABLES = ["zor", "bel", "quel", "ton", "var", "mar", "bek", "lis", "tra", "von", "dri",
             "pal", "gor", "sen", "ulm", "kai", "rho", "fen", "dax", "mir", "sol", "tek"]  # fmt: skip
FILLERS = [
    "{c} is a small nation known for its quiet hills and long winters.",
    "Travellers often describe {c} as a calm and orderly place.",
    "Many old songs are sung in {c} during the harvest festival.",
]
FACTS = {
    "capital": ("The capital of {c} is {x}.", "What is the capital of {c}?"),
    "river": ("The longest river in {c} is the {x}.", "What is the longest river in {c}?"),
    "animal": ("The national animal of {c} is the {x}.", "What is the national animal of {c}?"),
    "founder": ("{c} was founded by {x}.", "Who founded {c}?"),
}


def name(rng: random.Random, parts: int = 2) -> str:
    word = "".join(rng.choice(SYLLABLES) for _ in range(parts))
    return word.capitalize()


def squad_file(
    path: Path,
    countries: int,
    seed: int,
    odd_text: bool = False,
    facts: int = 3,
    unanswerable: int = 0,
) -> Path:
    """``countries`` paragraphs, one question per fact; a filler sentence first (so the
    first-sentence baseline never holds an answer), ``facts`` facts in random order. With
    ``odd_text`` some answers carry accents and the context non-breaking spaces. With
    ``unanswerable`` (at most ``4 - facts``) a SQuAD v2.0 file: as many more questions per
    paragraph ask about facts it does not state (``is_impossible``, no answers)."""
    rng = random.Random(seed)
    data = []
    for i in range(countries):
        country = name(rng, 2) + "ia"
        answers = {key: name(rng, 2) for key in FACTS}
        answers["founder"] = f"{name(rng, 2)} {name(rng, 1)}"
        if odd_text and i % 3 == 0:
            answers["capital"] = answers["capital"][:-1] + "é"
        order = list(FACTS)
        rng.shuffle(order)
        order = order[:facts]
        sentences = [rng.choice(FILLERS).format(c=country)]
        sentences += [FACTS[key][0].format(c=country, x=answers[key]) for key in order]
        separator = "\u00a0 " if odd_text and i % 2 else " "
        context = separator.join(sentences)
        qas = []
        for key in order:
            text = answers[key]
            qas.append({
                "id": f"{seed}-{i}-{key}",
                "question": FACTS[key][1].format(c=country),
                "answers": [{"text": text, "answer_start": context.index(text)}],
            })  # fmt: skip
        for key in [k for k in FACTS if k not in order][:unanswerable]:
            qas.append({
                "id": f"{seed}-{i}-{key}", "question": FACTS[key][1].format(c=country),
                "answers": [], "is_impossible": True,
            })  # fmt: skip
        data.append({"title": country, "paragraphs": [{"context": context, "qas": qas}]})
    version = "v2.0" if unanswerable else "1.1"
    path.write_text(json.dumps({"version": version, "data": data}, ensure_ascii=False))
    return path


PARAPHRASES = [
    ("The capital of {c} is {x}.", "{x} is the capital city of {c}."),
    ("{c} was founded by {x}.", "{x} founded the nation of {c}."),
    ("The longest river in {c} is the {x}.", "No river in {c} is longer than the {x}."),
]


def mrpc_file(path: Path, pairs: int, seed: int, positive: float = 0.6) -> Path:
    """GLUE MRPC TSV: a paraphrase restates the same fact; a non-paraphrase states another
    fact about another country (template chosen at random for each side)."""
    rng = random.Random(seed)
    lines = ["Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
    for i in range(pairs):
        first_t, second_t = rng.choice(PARAPHRASES)
        country, thing = name(rng, 2) + "ia", name(rng, 2)
        first = first_t.format(c=country, x=thing)
        if rng.random() < positive:
            label, second = 1, second_t.format(c=country, x=thing)
        else:
            other = rng.choice([t for t in PARAPHRASES if t[0] != first_t])
            label = 0
            second = other[1].format(c=name(rng, 2) + "ia", x=name(rng, 2))
        if i % 7 == 0:
            first = f'"{first}" he said.'  # bare quotes: QUOTE_NONE keeps them as text
        lines.append(f"{label}\t{2 * i}\t{2 * i + 1}\t{first}\t{second}")
    path.write_text("\n".join(lines) + "\n")
    return path
