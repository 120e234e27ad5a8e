"""``omnibert-predict``'s steps for every fine-tuned task: turn the inputs into a dataset with
the task's Hub columns, check that they and the checkpoint belong to the same task, run the
task's own features and post-processing (its :class:`~omnibert.finetune.spec.TaskData`, from
the checkpoint's recipe), one JSON record per input.

Inputs by the checkpoint's task:

* SQuAD v1.1 / v2.0: ``question=`` + ``context=``, or ``input_file=`` a SQuAD JSON file,
  JSON Lines with ``question``, ``context`` (and ``id``) or Parquet with the Hub's columns;
  a record is ``{"id", "answer", "probability", "score", "start"}`` (+ ``"null_score_diff"`` for v2.0, whose ``answer`` is
  ``""`` when the null answer wins);
* GLUE (one sentence: SST-2, CoLA; pairs: MRPC, QQP, STS-B, MNLI, ...): ``text=`` (+
  ``text_pair=`` for a pair task), or ``input_file=`` the task's GLUE TSV, a TSV whose header
  names the task's columns (or ``text``/``text_pair``), JSON Lines with those keys, or Parquet
  with the Hub's columns (``nyu-mll/glue``'s split files); a record
  is ``{"index", "label", "probability", "probabilities"}`` with the task's label names, or
  ``{"index", "score"}`` for a regression task (STS-B).

``input_file=-`` reads standard input (UTF-8): JSON Lines with the keys above (the first
non-blank line starting with ``{`` says so), or plain lines for GLUE, one text per line (a
pair task's two texts separated by one TAB); SQuAD reads JSON Lines only (a question needs
its context). Blank lines are skipped; a record's ``index`` counts the others.

Every problem is one sentence naming the key or file and the fix, before the model runs.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.config.finetune import Recipe
from omnibert.config.tools import PredictConfig
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["STDIN", "PredictInputs", "check_task", "predict_records", "read_inputs"]

ALIASES = ("text", "text_pair")  # generic names for a task's one or two text columns
STDIN = "-"  # input_file=-: standard input
STDIN_NAME = "input_file=- (standard input)"


@dataclass
class PredictInputs:
    """What to predict: ``dataset`` in the task's Hub columns; ``labelled``: metrics apply."""

    dataset: Any
    from_file: bool
    labelled: bool


def _is_squad(data: Any) -> bool:
    from omnibert.finetune.squad import SquadData

    return isinstance(data, SquadData)


def check_task(cfg: PredictConfig, data: Any, ckpt: str) -> None:
    """A checkpoint of one task asked to predict another (``task_name=``, or inputs of
    another kind): one sentence."""
    name = data.task
    wanted = cfg.task_name
    if wanted and wanted != name:
        raise FineTuneInputError(
            f"ckpt={ckpt} is a task={name} model and cannot predict task_name={wanted}; pass "
            f"the run directory of an omnibert-finetune task={wanted} run (or drop task_name=)."
        )
    squad_keys = [k for k in ("question", "context") if cfg.given(k) is not None]
    text_keys = [k for k in ALIASES if cfg.given(k) is not None]
    if _is_squad(data) and text_keys:
        raise FineTuneInputError(
            f"ckpt={ckpt} is a task={name} model: it answers question= over context=, not "
            f"{'/'.join(text_keys)}=; pass a run of a GLUE task for those."
        )
    if not _is_squad(data):
        if squad_keys:
            raise FineTuneInputError(
                f"ckpt={ckpt} is a task={name} model: it classifies text=, not "
                f"{'/'.join(squad_keys)}=; pass a SQuAD run (task=squad or squad_v2) for those."
            )
        if cfg.text_pair is not None and len(data.text_columns) == 1:
            raise FineTuneInputError(
                f"ckpt={ckpt} is a task={name} model, which reads one sentence: drop "
                "text_pair= (or pass a run of a sentence-pair task)."
            )


#: JSON Lines records, each with its line number in the file (for messages)
Records = list[tuple[int, dict[str, Any]]]


def jsonl_file(path: Path) -> Records:
    """The records of a JSON Lines file (``input_file=path``)."""
    with path.open(encoding="utf-8") as handle:
        return json_records(handle, f"input_file={path}")


def json_records(lines: Any, where: str) -> Records:
    """The JSON objects of JSON Lines with their line numbers (``where``: the source, for
    messages); blank lines are skipped."""
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise FineTuneInputError(
                f"{where} line {number} is not JSON ({err.msg}); JSON Lines hold "
                "one JSON object per line."
            ) from err
        if not isinstance(record, dict):
            raise FineTuneInputError(
                f"{where} line {number} is not a JSON object; write one per line."
            )
        records.append((number, record))
    if not records:
        raise FineTuneInputError(f"{where} holds no records; pass a non-empty file.")
    return records


def refuse_empty(where: str, number: int, record: dict[str, Any], keys: Any) -> None:
    """One sentence when a record's text key holds no text (as ``text=""`` is refused)."""
    for key in keys:
        if not record[key].strip():
            raise FineTuneInputError(
                f'{where} line {number} has an empty "{key}"; put the text in it (or drop the '
                "line)."
            )


def _squad_rows(records: Records, where: str, data: Any) -> list[dict[str, Any]]:
    rows = []
    for position, (number, record) in enumerate(records, start=1):
        if not isinstance(record.get("question"), str) or not isinstance(
            record.get("context"), str
        ):
            raise FineTuneInputError(
                f'{where} line {number} lacks a string "question" or "context"; '
                f'task={data.task} reads those keys (and "id").'
            )
        refuse_empty(where, number, record, ("question", "context"))
        rows.append({"id": str(record.get("id", position)), "question": record["question"],
                     "context": record["context"]})  # fmt: skip
    return rows


def _squad_dataset(rows: list[dict[str, Any]], from_file: bool) -> PredictInputs:
    import datasets

    columns: dict[str, list[Any]] = {k: [r[k] for r in rows] for k in ("id", "question", "context")}
    columns["title"] = [""] * len(rows)
    columns["answers"] = [{"text": [], "answer_start": []} for _ in rows]
    return PredictInputs(datasets.Dataset.from_dict(columns), from_file, False)


def _squad_inputs(cfg: PredictConfig, data: Any) -> PredictInputs:
    file = cfg.input_file
    if not file:
        if not cfg.question or not cfg.context:
            raise FineTuneInputError(
                'pass question="..." and context="..." (or input_file=<SQuAD JSON or JSON Lines>).'
            )
        rows = [{"id": "question", "question": str(cfg.question),
                 "context": str(cfg.context)}]  # fmt: skip
        return _squad_dataset(rows, False)
    path = Path(str(file))
    if not path.is_file():
        raise FineTuneInputError(f"input_file={path} does not exist; pass a SQuAD JSON or JSONL.")
    if path.suffix != ".jsonl":
        dataset = data.read_file(path, "input_file")
        return PredictInputs(dataset, True, data.has_labels(dataset))
    return _squad_dataset(_squad_rows(jsonl_file(path), f"input_file={path}", data), True)


def _text_dataset(data: Any, texts: list[list[str]]) -> Any:
    import datasets

    columns: dict[str, list[Any]] = dict(zip(data.text_columns, texts, strict=True))
    columns["idx"] = list(range(len(texts[0])))
    return datasets.Dataset.from_dict(columns)


def _named_columns(names: list[str], data: Any, path: Path | str) -> list[str]:
    """The task's text columns as ``names`` has them (or their aliases text/text_pair);
    ``path``: the file, or the source's name for messages (standard input)."""
    wanted = data.text_columns
    for candidate in (wanted, list(ALIASES[: len(wanted)])):
        if all(c in names for c in candidate):
            return list(candidate)
    where = path if isinstance(path, str) else f"input_file={path}"
    raise FineTuneInputError(
        f"{where} has the columns ({', '.join(names) or 'none'}); task={data.task} "
        f"reads {' and '.join(wanted)} (or {' and '.join(ALIASES[: len(wanted)])}): name them so."
    )


def _glue_records(records: Records, where: str, data: Any) -> PredictInputs:
    names = _named_columns(list(records[0][1]), data, where)
    for number, record in records:
        if not all(isinstance(record.get(n), str) for n in names):
            raise FineTuneInputError(
                f"{where} line {number} lacks a string "
                f"{' or '.join(repr(n) for n in names)}; give every record each."
            )
        refuse_empty(where, number, record, names)
    texts = [[r[n] for _, r in records] for n in names]
    return PredictInputs(_text_dataset(data, texts), True, False)


def stdin_lines() -> list[str]:
    """Standard input as UTF-8 lines (a BOM dropped; only ``\\n`` ends a line, so a text
    keeps any other separator Unicode has)."""
    if sys.stdin is None:
        raise FineTuneInputError(f"{STDIN_NAME} is closed; pipe the inputs in, or pass a file.")
    if sys.stdin.isatty():
        print(
            "omnibert-predict: reading input_file=- from the terminal; end with Ctrl-D",
            file=sys.stderr,
            flush=True,
        )
    stream = getattr(sys.stdin, "buffer", None)
    raw = stream.read() if stream is not None else sys.stdin.read().encode("utf-8")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise FineTuneInputError(
            f"{STDIN_NAME} is not UTF-8 text (byte {err.start}); pipe UTF-8 text."
        ) from err
    return [line.removesuffix("\r") for line in text.split("\n")]


def _stdin_inputs(data: Any) -> PredictInputs:
    """The inputs of ``input_file=-``: JSON Lines, or for GLUE plain lines (module docstring)."""
    lines = stdin_lines()
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        raise FineTuneInputError(
            f"{STDIN_NAME} holds no inputs; pipe JSON Lines or one input per line into it."
        )
    if first.lstrip().startswith("{"):
        records = json_records(lines, STDIN_NAME)
        if _is_squad(data):
            return _squad_dataset(_squad_rows(records, STDIN_NAME, data), True)
        return _glue_records(records, STDIN_NAME, data)
    if _is_squad(data):
        raise FineTuneInputError(
            f"{STDIN_NAME} holds plain lines, but task={data.task} answers a question from "
            'its context: pipe JSON Lines, one {"question": ..., "context": ...} per line.'
        )
    width = len(data.text_columns)
    texts: list[list[str]] = [[] for _ in range(width)]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != width:
            need = (
                "two texts separated by one TAB"
                if width == 2
                else "one text and no TAB (a pair task's lines hold two)"
            )
            raise FineTuneInputError(
                f"{STDIN_NAME} line {number} has {len(fields)} TAB-separated fields; "
                f"task={data.task} reads {need} per line."
            )
        refuse_empty(STDIN_NAME, number, dict(zip(ALIASES, fields, strict=False)), ALIASES[:width])
        for column, value in zip(texts, fields, strict=True):
            column.append(value)
    return PredictInputs(_text_dataset(data, texts), True, False)


def _glue_inputs(cfg: PredictConfig, data: Any) -> PredictInputs:
    width = len(data.text_columns)
    file = cfg.input_file
    if not file:
        given = [cfg.given(k) for k in ALIASES[:width]]
        if any(g is None for g in given):
            need = ' text="..." text_pair="..."' if width == 2 else ' text="..."'
            raise FineTuneInputError(
                f"task={data.task} reads {'sentence pairs' if width == 2 else 'one sentence'}: "
                f"pass{need} (or input_file=<TSV or JSON Lines>)."
            )
        return PredictInputs(_text_dataset(data, [[str(g)] for g in given]), False, False)
    path = Path(str(file))
    if not path.is_file():
        raise FineTuneInputError(f"input_file={path} does not exist; pass a TSV or JSONL file.")
    if path.suffix == ".json":
        raise FineTuneInputError(
            f"input_file={path} is a JSON file; task={data.task} reads a TSV or JSON Lines "
            "(.jsonl) (a SQuAD JSON needs a task=squad or squad_v2 run)."
        )
    if path.suffix == ".jsonl":
        return _glue_records(jsonl_file(path), f"input_file={path}", data)
    try:  # the task's own GLUE TSV (dev or test layout)
        dataset = data.read_file(path, "input_file")
        return PredictInputs(dataset, True, data.has_labels(dataset))
    except FineTuneInputError as own_format:
        with path.open(encoding="utf-8-sig", newline="") as handle:
            rows = list(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE))
        header = rows[0] if rows else []
        if not (all(c in header for c in data.text_columns) or
                all(c in header for c in ALIASES[:width])):  # fmt: skip
            raise own_format
        names = _named_columns(header, data, path)
        picks = [header.index(n) for n in names]
        body = [r for r in rows[1:] if r]
        for number, row in enumerate(body, start=2):
            if len(row) != len(header):
                raise FineTuneInputError(
                    f"input_file={path} line {number} has {len(row)} tab-separated fields, "
                    f"not {len(header)} as its header; fix the line."
                ) from own_format
        if not body:
            raise FineTuneInputError(
                f"input_file={path} holds no rows; pass a non-empty file."
            ) from own_format
        texts = [[row[i] for row in body] for i in picks]
        return PredictInputs(_text_dataset(data, texts), True, False)


def _parquet_inputs(path: Path, data: Any) -> PredictInputs:
    """A Parquet file with the task's Hub columns (a split as ``datasets`` writes it)."""
    from omnibert.finetune.sources import load_file

    dataset = load_file(data, path, "input_file", None)
    data.check(dataset, f"input_file={path}", labelled=False)
    if len(dataset) == 0:
        raise FineTuneInputError(f"input_file={path} holds no rows; pass a non-empty file.")
    return PredictInputs(dataset, True, data.has_labels(dataset))


def read_inputs(cfg: PredictConfig, data: Any) -> PredictInputs:
    """The inputs to predict, from the command line or ``input_file``."""
    given = [k for k in ("question", "context", *ALIASES) if cfg.given(k) is not None]
    if cfg.input_file and given:
        raise FineTuneInputError(
            "pass either one input on the command line (question=/context= or text=/text_pair=) "
            "or input_file=, not both."
        )
    for key in given:
        if not str(cfg.given(key)).strip():
            raise FineTuneInputError(
                f'{key}= is empty; put the text after the = ({key}="..." in the shell).'
            )
    if cfg.input_file == STDIN:
        return _stdin_inputs(data)
    file = Path(str(cfg.input_file or ""))
    if cfg.input_file and file.suffix == ".parquet" and file.is_file():
        return _parquet_inputs(file, data)
    return _squad_inputs(cfg, data) if _is_squad(data) else _glue_inputs(cfg, data)


def _softmax(row: Any) -> list[float]:
    top = max(float(x) for x in row)
    weights = [math.exp(float(x) - top) for x in row]
    total = sum(weights)
    return [w / total for w in weights]


def predict_records(
    data: Any,
    task: Any,
    inputs: PredictInputs,
    tokenizer: Any,
    recipe: Mapping[str, Any],
    autocast: Any,
    progress: bool | None = None,
) -> tuple[list[dict[str, Any]], list[Any]]:
    """One record per input (module docstring), and the task's own predictions (for its
    metrics). ``progress`` (None: for a file) shows the forward passes' progress over the
    features: a bar on a terminal, lines in a log."""
    from omnibert.logs import progress_bar
    from omnibert.run.finetuning.outputs import predict_outputs

    dataset = inputs.dataset
    show = inputs.from_file if progress is None else progress
    bars: list[Any] = []  # made at the first batch, when the number of features is known

    def advance(done: int, total: int) -> None:
        if not bars:
            bars.append(progress_bar(total, "omnibert-predict", "feature", show))
        bars[0].update(done - bars[0].n)

    try:
        predictions, outputs = predict_outputs(
            data, task, dataset, tokenizer, Recipe.of(recipe), autocast, progress=advance
        )
    finally:
        for bar in bars:
            bar.close()
    records: list[dict[str, Any]] = []
    if _is_squad(data):
        for qid, p in zip(dataset["id"], predictions, strict=True):
            record: dict[str, Any] = {
                "id": str(qid), "answer": p.text, "probability": p.probability,
                "score": p.score, "start": None if p.char_span is None else p.char_span[0],
            }  # fmt: skip
            if p.null_score_diff is not None:
                record["null_score_diff"] = max(-1e9, min(1e9, p.null_score_diff))
            records.append(record)
        return records, predictions
    indices = [int(i) for i in dataset["idx"]] if "idx" in dataset.column_names else None
    for position, (value, row) in enumerate(zip(predictions, outputs, strict=True)):
        index = position if indices is None else indices[position]
        if data.regression:
            records.append({"index": index, "score": float(value)})
            continue
        probabilities = _softmax(row)
        names = data.label_names
        records.append({
            "index": index, "label": names[int(value)],
            "probability": probabilities[int(value)],
            "probabilities": dict(zip(names, probabilities, strict=True)),
        })  # fmt: skip
    return records, predictions
