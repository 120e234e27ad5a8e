"""SQuAD questions as :class:`SquadExample`: read from the official JSON (v1.1 and v2.0
layout) or from a dataset in the Hub's columns (``rajpurkar/squad``), and written back as the
official JSON's ``data`` list the evaluate scripts read."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = [
    "SquadExample",
    "check_squad_file",
    "examples_from_rows",
    "official_rows",
    "read_squad",
    "squad_json_columns",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SquadExample:
    """One question over its context; ``answers`` are (text, character start) pairs."""

    qid: str
    question: str
    context: str
    answers: tuple[tuple[str, int], ...] = ()


def check_squad_file(path: str | Path, key: str) -> list[dict[str, Any]]:
    """The ``data`` list of a SQuAD v1.1 JSON file; one sentence naming ``key`` and the fix
    when it is missing, not JSON or not SQuAD-shaped."""
    path = Path(path)
    if not path.is_file():
        raise FineTuneInputError(
            f"{key}={path} does not exist; download it (docs/finetuning.md) "
            "or point it at a SQuAD v1.1 JSON file."
        )
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise FineTuneInputError(
            f"{key}={path} is not JSON ({type(err).__name__}); task=squad reads the official "
            "SQuAD v1.1 JSON (train-v1.1.json / dev-v1.1.json); a GLUE TSV needs task=mrpc."
        ) from err
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list):
        raise FineTuneInputError(
            f'{key}={path} has no top-level "data" list; task=squad reads the official '
            'SQuAD v1.1 JSON ({"version": ..., "data": [{"paragraphs": [...]}]}).'
        )
    for article in data:
        paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
        if not isinstance(paragraphs, list) or not all(
            isinstance(p, dict) and isinstance(p.get("context"), str) and "qas" in p
            for p in paragraphs
        ):
            raise FineTuneInputError(
                f'{key}={path}: every "data" entry needs "paragraphs" with "context" and '
                '"qas" (the SQuAD v1.1 layout); fix or re-download the file.'
            )
    return data


def read_squad(path: str | Path, key: str, training: bool) -> list[SquadExample]:
    """The questions of a SQuAD v1.1 file. In training every question needs an answer whose
    ``answer_start`` points at its text in the context (one that does not is skipped with a
    warning, as Google's reader does)."""
    examples = []
    skipped = 0
    for article in check_squad_file(path, key):
        for paragraph in article["paragraphs"]:
            context = paragraph["context"]
            for qa in paragraph["qas"]:
                if not isinstance(qa, dict) or "id" not in qa or "question" not in qa:
                    raise FineTuneInputError(
                        f'{key}={path}: a "qas" entry lacks "id" or "question"; fix the file.'
                    )
                answers = tuple(
                    (str(a["text"]), int(a["answer_start"])) for a in qa.get("answers", [])
                )
                if training:
                    if not answers:
                        raise FineTuneInputError(
                            f"{key}={path}: question {qa['id']} has no answer; training needs "
                            "one per question (SQuAD v1.1, not v2.0's unanswerable ones)."
                        )
                    text, start = answers[0]
                    if context[start : start + len(text)] != text:
                        skipped += 1
                        continue
                examples.append(SquadExample(str(qa["id"]), qa["question"], context, answers))
    if skipped:
        log.warning("%s: skipped %d question(s) whose answer_start misses the text", path, skipped)
    if not examples:
        raise FineTuneInputError(f"{key}={path} holds no questions; pass a non-empty SQuAD file.")
    return examples


def squad_json_columns(data: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The official JSON's ``data`` list as the Hub's columns (``rajpurkar/squad``): ``id``,
    ``title``, ``context``, ``question``, ``answers`` ``{text: [...], answer_start: [...]}``."""
    out: dict[str, list[Any]] = {k: [] for k in ("id", "title", "context", "question", "answers")}
    for article in data:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                out["id"].append(str(qa.get("id")))
                out["title"].append(str(article.get("title", "")))
                out["context"].append(paragraph["context"])
                out["question"].append(qa.get("question"))
                answers = qa.get("answers", [])
                out["answers"].append({
                    "text": [str(a["text"]) for a in answers],
                    "answer_start": [int(a["answer_start"]) for a in answers],
                })  # fmt: skip
    return out


def examples_from_rows(
    dataset: Any, where: str, training: bool, unanswerable: bool = False
) -> list[SquadExample]:
    """The questions of a dataset in the Hub's columns. In training every question needs an
    answer whose ``answer_start`` points at its text (one that does not is skipped with a
    warning, as Google's reader does); ``unanswerable`` allows questions without one."""
    examples, skipped = [], 0
    for row in dataset:
        answers = tuple(
            (str(t), int(s))
            for t, s in zip(row["answers"]["text"], row["answers"]["answer_start"], strict=True)
        )
        if training and answers:
            text, start = answers[0]
            if row["context"][start : start + len(text)] != text:
                skipped += 1
                continue
        elif training and not unanswerable:
            raise FineTuneInputError(
                f"{where}: question {row['id']} has no answer; training needs one per question "
                "(SQuAD v1.1); for v2.0's unanswerable questions use task=squad_v2."
            )
        examples.append(SquadExample(str(row["id"]), row["question"], row["context"], answers))
    if skipped:
        log.warning("%s: skipped %d question(s) whose answer_start misses the text", where, skipped)
    if not examples:
        raise FineTuneInputError(f"{where} holds no questions; pass a non-empty SQuAD file.")
    return examples


def official_rows(dataset: Any) -> list[dict[str, Any]]:
    """A split's questions and answers in the official JSON's ``data`` shape (one paragraph
    holding every question), as the evaluate scripts read it."""
    return [{"paragraphs": [{"qas": [
        {"id": str(i), "answers": [{"text": t} for t in a["text"]]}
        for i, a in zip(dataset["id"], dataset["answers"], strict=True)
    ]}]}]  # fmt: skip
