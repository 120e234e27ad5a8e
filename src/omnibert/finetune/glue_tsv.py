"""GLUE's original TSV files (the ``glue_data/<TASK>/{train,dev,test}.tsv`` of the GLUE
download script) read into the Hub's columns.

Each task's YAML says how (``task.data.tsv``): ``{Hub column: TSV column}``, the TSV column
named by its header (``"#1 String"``, ``gold_label``) or, for CoLA's files without a header,
by its position. A file whose first row holds the text columns' names has a header; it is a
test file when the label's column is missing. Sentences hold bare quote characters, so the
files are read with ``csv.QUOTE_NONE`` (a ``"`` is text). Labels may be written as numbers
(``0``/``1``, STS-B's scores) or names (``entailment``): names map to the Hub's label ids.

A file of another GLUE task is named in the error (``an SST-2 file given to task=cola``): the
headers below are the original files' first rows.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["guess_glue_task", "read_glue_tsv"]

#: the first fields of each original GLUE file's header -> the task it belongs to
GLUE_HEADERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("sentence", "label"), "sst2"),
    (("Quality", "#1 ID", "#2 ID"), "mrpc"),
    (("index", "#1 ID", "#2 ID"), "mrpc (test)"),
    (("id", "qid1", "qid2", "question1"), "qqp"),
    (("id", "question1", "question2"), "qqp (test)"),
    (("index", "genre", "filename", "year"), "stsb"),
    (("index", "promptID", "pairID", "genre"), "mnli"),
    (("index", "question", "sentence"), "qnli"),
    (("index", "sentence1", "sentence2"), "rte, wnli or ax"),
    (("index", "sentence"), "cola or sst2 (test)"),
)


def guess_glue_task(first_row: Sequence[str]) -> str | None:
    """The GLUE task whose original file starts with ``first_row``, if any."""
    row = tuple(first_row)
    for prefix, task in GLUE_HEADERS:
        if row[: len(prefix)] == prefix:
            return task
    if len(row) == 4 and row[1] in ("0", "1"):
        return "cola"  # CoLA's train/dev files: source, label, annotation, sentence
    return None


def _rows(path: Path, key: str) -> list[list[str]]:
    try:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            return [r for r in csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE) if r]
    except UnicodeDecodeError as err:
        raise FineTuneInputError(f"{key}={path} is not UTF-8 text; pass a GLUE TSV.") from err


def _label_value(
    value: str, label_names: Sequence[str] | None, where: str, task: str
) -> int | float:
    if label_names is None:  # regression (STS-B)
        try:
            return float(value)
        except ValueError:
            raise FineTuneInputError(
                f"{where} has the score {value!r}, not a number; task={task} is a regression "
                "task whose labels are similarity scores (0-5)."
            ) from None
    if value in label_names:
        return list(label_names).index(value)
    if value.isdigit() and int(value) < len(label_names):
        return int(value)
    allowed = ", ".join(f"{i} ({n})" for i, n in enumerate(label_names))
    raise FineTuneInputError(
        f"{where} has the label {value!r}; task={task}'s labels are {allowed}; pass "
        f"{task}'s own file."
    )


def read_glue_tsv(
    path: Path,
    key: str,
    task: str,
    columns: Mapping[str, str | int],
    text_columns: Sequence[str],
    label_names: Sequence[str] | None,
    test_columns: Mapping[str, str] | None = None,
) -> dict[str, list[Any]]:
    """The file's rows as Hub columns (``text_columns``, ``label`` (-1 when the file has
    none, as the Hub's test splits), ``idx``); one sentence naming ``key`` on a problem.
    ``test_columns``: the header names of the test file of a task whose other files have no
    header (CoLA)."""
    rows = _rows(path, key)
    if not rows:
        raise FineTuneInputError(f"{key}={path} is empty; pass {task}'s TSV.")
    header = rows[0]
    named = [c for c in text_columns if isinstance(columns[c], str)]
    guess = guess_glue_task(header)
    test_names = {str(v) for v in (test_columns or {}).values()}
    if named and all(columns[c] in header for c in named):
        positions = {c: header.index(str(v)) for c, v in columns.items() if str(v) in header}
        body, first_line = rows[1:], 2
        index_column = next((header.index(n) for n in ("index", "id") if n in header), None)
    elif test_names and set(header) - {"index", "id"} == test_names:
        # a test file of a task whose train/dev files have no header (CoLA: index, sentence)
        positions = {c: header.index(str(v)) for c, v in (test_columns or {}).items()}
        body, first_line, index_column = rows[1:], 2, header.index("index")
    elif not named and (guess is None or guess.split()[0] == task):
        positions = {c: int(v) for c, v in columns.items()}
        body, first_line, index_column = rows, 1, None
    else:
        other = guess
        looks = f"; it looks like {other}'s (task={other.split()[0]})" if other else ""
        expected = ", ".join(str(columns[c]) for c in text_columns)
        raise FineTuneInputError(
            f"{key}={path} is not task={task}'s GLUE TSV (its first row lacks the columns "
            f"{expected}{looks}); pass {task}'s file or choose the task that matches it."
        )
    width = max(positions.values()) + 1
    out: dict[str, list[Any]] = {c: [] for c in text_columns}
    out["label"], out["idx"] = [], []
    labelled = "label" in positions
    for number, row in enumerate(body, start=first_line):
        where = f"{key}={path} line {number}"
        if len(row) < width:
            raise FineTuneInputError(
                f"{where} has {len(row)} tab-separated fields, fewer than {width}; fix the line "
                "or re-download the file."
            )
        for column in text_columns:
            out[column].append(row[positions[column]])
        out["label"].append(
            _label_value(row[positions["label"]], label_names, where, task) if labelled else -1
        )
        out["idx"].append(int(row[index_column]) if index_column is not None else len(out["idx"]))
    if not out["idx"]:
        raise FineTuneInputError(f"{key}={path} holds no examples; pass a non-empty {task} TSV.")
    return out
