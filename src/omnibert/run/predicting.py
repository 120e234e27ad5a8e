"""``omnibert-predict``'s steps for every fine-tuned task: read the inputs, check that they
and the checkpoint belong to the same task, predict in batches, one JSON record per input.

Inputs by the checkpoint's task (its recipe's ``format``):

* SQuAD v1.1 / v2.0: ``question=`` + ``context=``, or ``input_file=`` a SQuAD JSON file or
  JSON Lines with ``question``, ``context`` (and ``id``); a record is ``{"id", "answer",
  "probability", "score", "start"}`` (+ ``"null_score_diff"`` for v2.0, ``answer`` ``""``
  when the null answer wins);
* sentence pairs (GLUE MRPC): ``text=`` + ``text_pair=``, or ``input_file=`` GLUE's TSV, a
  TSV with a header naming ``sentence1``/``sentence2`` (or ``text``/``text_pair``), or JSON
  Lines with those keys; a record is ``{"index", "label", "probability", "probabilities"}``
  with the task's label names (``recipe['label_names']``); a regression task (one output,
  e.g. STS-B) gives ``{"index", "score"}``.

Every problem is one sentence naming the key or file and the fix, before the model runs.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["Inputs", "check_task", "predict_records", "read_inputs"]

SQUAD_FORMATS = ("squad", "squad_v2")
PAIR_COLUMNS = (("sentence1", "sentence2"), ("text", "text_pair"))


@dataclass
class Inputs:
    """What to predict: ``examples`` of the checkpoint's task; ``from_file`` for the bar."""

    examples: list[Any]
    from_file: bool
    labelled: bool


def _kind(recipe: Mapping[str, Any]) -> str:
    return "squad" if recipe.get("format") in SQUAD_FORMATS else "pairs"


def check_task(cfg: Mapping[str, Any], recipe: Mapping[str, Any], ckpt: str) -> None:
    """A checkpoint of one task asked to predict another (``task_name=``, or inputs of
    another kind): one sentence."""
    name = recipe.get("name")
    wanted = cfg.get("task_name")
    if wanted and wanted != name:
        raise FineTuneInputError(
            f"ckpt={ckpt} is a task={name} model and cannot predict task_name={wanted}; pass "
            f"the run directory of an omnibert-finetune task={wanted} run (or drop task_name=)."
        )
    squad_keys = [k for k in ("question", "context") if cfg.get(k) is not None]
    text_keys = [k for k in ("text", "text_pair") if cfg.get(k) is not None]
    if _kind(recipe) == "squad" and text_keys:
        raise FineTuneInputError(
            f"ckpt={ckpt} is a task={name} model: it answers question= over context=, not "
            f"{'/'.join(text_keys)}=; pass a run of a classification task for those."
        )
    if _kind(recipe) == "pairs" and squad_keys:
        raise FineTuneInputError(
            f"ckpt={ckpt} is a task={name} model: it classifies text= and text_pair=, not "
            f"{'/'.join(squad_keys)}=; pass a SQuAD run (task=squad or squad_v2) for those."
        )


def _jsonl(path: Path, key: str) -> list[dict[str, Any]]:
    records = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise FineTuneInputError(
                    f"{key}={path} line {number} is not JSON ({err.msg}); JSON Lines hold one "
                    "JSON object per line."
                ) from err
            if not isinstance(record, dict):
                raise FineTuneInputError(
                    f"{key}={path} line {number} is not a JSON object; write one object per line."
                )
            records.append(record)
    if not records:
        raise FineTuneInputError(f"{key}={path} holds no records; pass a non-empty file.")
    return records


def _squad_inputs(cfg: Mapping[str, Any], recipe: Mapping[str, Any]) -> Inputs:
    from omnibert.finetune.squad import SquadExample, read_squad

    file = cfg.get("input_file")
    if not file:
        if not cfg.get("question") or not cfg.get("context"):
            raise FineTuneInputError(
                'pass question="..." and context="..." (or input_file=<SQuAD JSON or JSON Lines>).'
            )
        return Inputs([SquadExample("question", str(cfg["question"]), str(cfg["context"]))],
                      False, False)  # fmt: skip
    path = Path(str(file))
    if not path.is_file():
        raise FineTuneInputError(f"input_file={path} does not exist; pass a SQuAD JSON or JSONL.")
    if path.suffix == ".jsonl":
        examples = []
        for number, record in enumerate(_jsonl(path, "input_file"), start=1):
            if not isinstance(record.get("question"), str) or not isinstance(
                record.get("context"), str
            ):
                raise FineTuneInputError(
                    f'input_file={path} line {number} lacks a string "question" or '
                    f'"context"; task={recipe.get("name")} reads those keys (and "id").'
                )
            qid = str(record.get("id", number))
            examples.append(SquadExample(qid, record["question"], record["context"]))
        return Inputs(examples, True, False)
    version_2 = recipe.get("format") == "squad_v2"
    examples = read_squad(path, "input_file", training=False, version_2=version_2)
    # v1.1: every question answered; v2.0: some (the others are the unanswerable ones)
    labelled = any(e.answers for e in examples) if version_2 else all(e.answers for e in examples)
    return Inputs(examples, True, labelled)


def _pair_columns(names: list[str], path: Path, task: str) -> tuple[str, str]:
    for columns in PAIR_COLUMNS:
        if all(c in names for c in columns):
            return columns
    raise FineTuneInputError(
        f"input_file={path} has columns {', '.join(names) or '(none)'}; task={task} reads "
        "sentence pairs: name them sentence1 and sentence2 (or text and text_pair)."
    )


def _pair_inputs(cfg: Mapping[str, Any], recipe: Mapping[str, Any]) -> Inputs:
    from omnibert.finetune.glue import MRPC_HEADER, TEST_HEADER, PairExample, read_mrpc

    task = str(recipe.get("name"))
    file = cfg.get("input_file")
    if not file:
        if cfg.get("text") is None or cfg.get("text_pair") is None:
            raise FineTuneInputError(
                f'task={task} classifies sentence pairs: pass text="..." and text_pair="..." '
                "(or input_file=<TSV or JSON Lines>)."
            )
        return Inputs([PairExample(0, str(cfg["text"]), str(cfg["text_pair"]), None)],
                      False, False)  # fmt: skip
    path = Path(str(file))
    if not path.is_file():
        raise FineTuneInputError(f"input_file={path} does not exist; pass a TSV or JSONL file.")
    if path.suffix == ".json":
        raise FineTuneInputError(
            f"input_file={path} is a JSON file; task={task} reads a TSV or JSON Lines (.jsonl) "
            "of sentence pairs (a SQuAD JSON needs a task=squad or squad_v2 run)."
        )
    if path.suffix == ".jsonl":
        records = _jsonl(path, "input_file")
        first, second = _pair_columns(list(records[0]), path, task)
        examples: list[PairExample] = []
        for number, record in enumerate(records, start=1):
            if not isinstance(record.get(first), str) or not isinstance(record.get(second), str):
                raise FineTuneInputError(
                    f'input_file={path} line {number} lacks a string "{first}" or "{second}"; '
                    "give every record both."
                )
            examples.append(PairExample(len(examples), record[first], record[second], None))
        return Inputs(examples, True, False)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        header = next(csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE), [])
    if tuple(header) in (MRPC_HEADER, TEST_HEADER):
        examples = read_mrpc(path, "input_file", training=False)
        return Inputs(examples, True, all(e.label is not None for e in examples))
    first, second = _pair_columns(header, path, task)
    a, b = header.index(first), header.index(second)
    examples = []
    with path.open(encoding="utf-8-sig", newline="") as handle:
        rows = csv.reader(handle, delimiter="\t", quoting=csv.QUOTE_NONE)
        next(rows)
        for number, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise FineTuneInputError(
                    f"input_file={path} line {number} has {len(row)} tab-separated fields, "
                    f"not {len(header)} as its header; fix the line."
                )
            examples.append(PairExample(len(examples), row[a], row[b], None))
    if not examples:
        raise FineTuneInputError(f"input_file={path} holds no rows; pass a non-empty file.")
    return Inputs(examples, True, False)


def read_inputs(cfg: Mapping[str, Any], recipe: Mapping[str, Any]) -> Inputs:
    """The examples to predict, from the command line or ``input_file``."""
    single = any(cfg.get(k) is not None for k in ("question", "context", "text", "text_pair"))
    if cfg.get("input_file") and single:
        raise FineTuneInputError(
            "pass either one input on the command line (question=/context= or text=/text_pair=) "
            "or input_file=, not both."
        )
    if _kind(recipe) == "squad":
        return _squad_inputs(cfg, recipe)
    return _pair_inputs(cfg, recipe)


def _softmax(row: Any) -> list[float]:
    top = max(float(x) for x in row)
    weights = [math.exp(float(x) - top) for x in row]
    total = sum(weights)
    return [w / total for w in weights]


def predict_records(
    task: Any,
    recipe: Mapping[str, Any],
    tokenizer: Any,
    inputs: Inputs,
    autocast: Any = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One record per input (module docstring), and the predictions in the task's own form
    (SQuAD: question id -> Prediction; pairs: predicted label indices) for metrics."""
    from omnibert.run.finetuning import pair_logits, predict_squad

    if _kind(recipe) == "squad":
        predictions = predict_squad(task, inputs.examples, tokenizer, recipe, autocast, progress)
        records = []
        for example in inputs.examples:
            p = predictions[example.qid]
            record: dict[str, Any] = {
                "id": example.qid,
                "answer": p.text,
                "probability": p.probability,
                "score": p.score,
                "start": None if p.char_span is None else p.char_span[0],
            }
            if p.null_score_diff is not None:
                record["null_score_diff"] = max(-1e9, min(1e9, p.null_score_diff))
            records.append(record)
        return records, {"squad": predictions}
    out = pair_logits(task, inputs.examples, tokenizer, recipe, autocast, progress)
    if out.shape[1] == 1:  # regression (STS-B): the score itself
        return [{"index": e.index, "score": float(v[0])} for e, v in zip(
            inputs.examples, out, strict=True)], {}  # fmt: skip
    names = [str(n) for n in recipe.get("label_names") or range(out.shape[1])]
    records, labels = [], []
    for example, row in zip(inputs.examples, out, strict=True):
        probabilities = _softmax(row)
        best = max(range(len(probabilities)), key=probabilities.__getitem__)
        labels.append(best)
        records.append({
            "index": example.index, "label": names[best], "probability": probabilities[best],
            "probabilities": dict(zip(names, probabilities, strict=True)),
        })  # fmt: skip
    return records, {"labels": labels}
