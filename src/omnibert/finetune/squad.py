"""SQuAD v1.1: reading the official JSON, windows of features, and answers from logits.

**Features** (Google's ``run_squad.py`` parameters: ``max_seq_length`` 384, ``doc_stride``
128, ``max_query_length`` 64). The question's word pieces are cut to ``max_query_length``;
the context is tokenised once, with character offsets into the *original* context (the fast
tokenizer's alignment, so accents, non-breaking spaces and odd whitespace stay as written),
and cut into windows of ``max_seq_length - len(question) - 3`` tokens whose starts are
``doc_stride`` tokens apart (Google's meaning of the stride: the step between windows, not
HF's overlap). Each window is ``[CLS] question [SEP] window [SEP]`` padded to
``max_seq_length``. A token that sits in several windows is scored only in the one where it
has the most context on both sides (Google's ``_check_is_max_context``).

**Training labels**: the answer's first and last token (the tokens its character span
touches). A window that does not hold the whole answer is labelled ``(0, 0)``, the [CLS]
token (Hugging Face's behaviour), never dropped: every window teaches the model something
about where answers are not.

**Post-processing**: per window the ``n_best`` highest start and end logits; pairs inside
the context, end not before start, at most ``max_answer_length`` tokens, start at a token's
max-context window; the score is start + end logit over all windows of a question; the text
is cut from the original context by the offsets (no detokenisation).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omnibert.finetune.spec import Features, TaskData
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = [
    "Prediction",
    "SquadData",
    "SquadExample",
    "SquadFeatures",
    "SquadV2Data",
    "best_answers",
    "check_squad_file",
    "read_squad",
    "squad_features",
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


@dataclass
class SquadFeatures:
    """Windows of all examples: model inputs ``[N,S]``, labels ``[N]`` (training), and per
    window the example it belongs to, each token's character span in the context (``None``
    outside the context) and whether the window is that token's max-context one."""

    input_ids: np.ndarray
    segment_ids: np.ndarray
    attention_mask: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    offsets: list[list[tuple[int, int] | None]] = field(default_factory=list)
    max_context: list[list[bool]] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.example_index)

    def tensors(self, training: bool) -> dict[str, Any]:
        import torch

        out = {
            "input_ids": torch.from_numpy(self.input_ids),
            "segment_ids": torch.from_numpy(self.segment_ids),
            "attention_mask": torch.from_numpy(self.attention_mask),
        }
        if training:
            out["start_positions"] = torch.from_numpy(self.start_positions)
            out["end_positions"] = torch.from_numpy(self.end_positions)
        return out


def windows(num_tokens: int, window: int, stride: int) -> list[tuple[int, int]]:
    """``(start, length)`` of each window over ``num_tokens`` tokens (Google's loop)."""
    spans = []
    start = 0
    while start < num_tokens:
        length = min(num_tokens - start, window)
        spans.append((start, length))
        if start + length == num_tokens:
            break
        start += min(length, stride)
    return spans or [(0, 0)]


def is_max_context(spans: Sequence[tuple[int, int]], current: int, position: int) -> bool:
    """Whether window ``current`` gives token ``position`` its most context: the largest
    min(left, right) context plus 0.01 × the window's length (Google's tie-break)."""
    best_score, best = -1.0, None
    for index, (start, length) in enumerate(spans):
        end = start + length - 1
        if position < start or position > end:
            continue
        score = min(position - start, end - position) + 0.01 * length
        if score > best_score:
            best_score, best = score, index
    return best == current


def _answer_tokens(
    offsets: Sequence[tuple[int, int]], char_start: int, char_end: int
) -> tuple[int, int]:
    """First and last context token that the character span ``[char_start, char_end)``
    touches."""
    first = next(i for i, (_, end) in enumerate(offsets) if end > char_start)
    last = max(i for i, (start, _) in enumerate(offsets) if start < char_end)
    return first, max(first, last)


def squad_features(
    examples: Sequence[SquadExample],
    tokenizer: Any,
    max_seq_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = False,
) -> SquadFeatures:
    """The windows of ``examples`` (module docstring); labels when ``training``."""
    cls_id, sep_id = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    pad_id = tokenizer.token_to_id("[PAD]")
    contexts = sorted({ex.context for ex in examples})
    context_enc = dict(
        zip(contexts, tokenizer.encode_batch(contexts, add_special_tokens=False), strict=True)
    )
    questions = tokenizer.encode_batch([ex.question for ex in examples], add_special_tokens=False)
    rows: list[list[int]] = []
    segments: list[list[int]] = []
    starts: list[int] = []
    ends: list[int] = []
    owner: list[int] = []
    lengths: list[int] = []
    all_offsets: list[list[tuple[int, int] | None]] = []
    all_max: list[list[bool]] = []
    for index, (example, question) in enumerate(zip(examples, questions, strict=True)):
        query = question.ids[:max_query_length]
        doc = context_enc[example.context]
        doc_ids, doc_offsets = doc.ids, doc.offsets
        room = max_seq_length - len(query) - 3
        if room < 1:
            raise FineTuneInputError(
                f"task.max_seq_length={max_seq_length} leaves no room for the context after a "
                f"{len(query)}-token question; raise it or lower task.max_query_length."
            )
        answer = None
        if training and example.answers and doc_ids:
            text, char_start = example.answers[0]
            answer = _answer_tokens(doc_offsets, char_start, char_start + len(text))
        spans = windows(len(doc_ids), room, doc_stride)
        for span_index, (start, length) in enumerate(spans):
            head = [cls_id, *query, sep_id]
            ids = [*head, *doc_ids[start : start + length], sep_id]
            offsets: list[tuple[int, int] | None] = [None] * len(head)
            offsets += [tuple(o) for o in doc_offsets[start : start + length]]
            offsets.append(None)
            best = [False] * len(head)
            best += [is_max_context(spans, span_index, start + i) for i in range(length)]
            best.append(False)
            label = (0, 0)
            if answer is not None and start <= answer[0] and answer[1] < start + length:
                label = (answer[0] - start + len(head), answer[1] - start + len(head))
            pad = max_seq_length - len(ids)
            lengths.append(len(ids))
            rows.append(ids + [pad_id] * pad)
            segments.append([0] * len(head) + [1] * (length + 1) + [0] * pad)
            starts.append(label[0])
            ends.append(label[1])
            owner.append(index)
            all_offsets.append(offsets + [None] * pad)
            all_max.append(best + [False] * pad)
    input_ids = np.asarray(rows, dtype=np.int64)
    return SquadFeatures(
        input_ids=input_ids,
        segment_ids=np.asarray(segments, dtype=np.int64),
        attention_mask=(
            np.arange(max_seq_length)[None, :] < np.asarray(lengths, dtype=np.int64)[:, None]
        ).astype(np.int64),
        start_positions=np.asarray(starts, dtype=np.int64),
        end_positions=np.asarray(ends, dtype=np.int64),
        example_index=np.asarray(owner, dtype=np.int64),
        offsets=all_offsets,
        max_context=all_max,
    )


@dataclass(frozen=True)
class Prediction:
    """The best answer of a question: its text, start + end logit, and its probability among
    the n-best candidates (softmax of their scores; with SQuAD v2.0 the null answer is one of
    them). ``null_score_diff`` (v2.0 only): the null score minus the best span's score, the
    question's no-answer score; ``text`` is ``""`` when it is above the threshold."""

    text: str
    score: float
    probability: float
    char_span: tuple[int, int] | None
    null_score_diff: float | None = None


def best_answers(
    examples: Sequence[SquadExample],
    features: SquadFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
    version_2: bool = False,
    null_score_diff_threshold: float = 0.0,
) -> dict[str, Prediction]:
    """Question id -> :class:`Prediction` from the windows' logits (module docstring). With
    ``version_2`` (SQuAD v2.0) a question's null score is the smallest ``[CLS]`` start + end
    logit over its windows (Google's run_squad.py), and the question is answered ``""`` when
    the null score minus the best span's score is above ``null_score_diff_threshold``.

    Spans are read from each window's ``n_best`` best starts and ends (Google's rule). Where
    none of those pairs is a valid span (the best logits all on the question, say), a SQuAD
    v1.1 question, which always has an answer, takes the best valid span over all positions
    instead of Google's ``"empty"``."""
    by_example: dict[int, list[int]] = {}
    for row, example in enumerate(features.example_index.tolist()):
        by_example.setdefault(example, []).append(row)
    out: dict[str, Prediction] = {}
    for index, example in enumerate(examples):
        rows = by_example.get(index, [])
        null_score = math.inf
        for row in rows:
            null_score = min(null_score, float(start_logits[row, 0]) + float(end_logits[row, 0]))
        candidates = _spans(features, rows, start_logits, end_logits, n_best, max_answer_length)
        if not candidates and not version_2:
            width = int(start_logits.shape[1])
            candidates = _spans(features, rows, start_logits, end_logits, width, max_answer_length)
        if version_2:
            out[example.qid] = _pick_v2(
                example.context, candidates, n_best, null_score, null_score_diff_threshold
            )
        else:
            out[example.qid] = _pick(example.context, candidates, n_best)
    return out


def _spans(
    features: SquadFeatures,
    rows: Sequence[int],
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int,
    max_answer_length: int,
) -> list[tuple[float, int, int]]:
    """``(score, char start, char end)`` of the valid spans among each window's ``n_best``
    best starts and ends: both in the context, the start in its maximal-context window, the
    end not before it, at most ``max_answer_length`` tokens."""
    candidates: list[tuple[float, int, int]] = []
    for row in rows:
        offsets, best = features.offsets[row], features.max_context[row]
        starts = np.argsort(-start_logits[row], kind="stable")[:n_best]
        ends = np.argsort(-end_logits[row], kind="stable")[:n_best]
        for s in starts.tolist():
            first = offsets[s]
            if first is None or not best[s]:
                continue
            for e in ends.tolist():
                last = offsets[e]
                if last is None or e < s or e - s + 1 > max_answer_length:
                    continue
                score = float(start_logits[row, s]) + float(end_logits[row, e])
                candidates.append((score, first[0], last[1]))
    return candidates


def _n_best(
    context: str, candidates: list[tuple[float, int, int]], n_best: int
) -> dict[str, tuple[float, int, int]]:
    """Distinct texts, best score first (Google's n-best)."""
    candidates.sort(key=lambda c: -c[0])
    seen: dict[str, tuple[float, int, int]] = {}
    for score, start, end in candidates:
        seen.setdefault(context[start:end], (score, start, end))
        if len(seen) == n_best:
            break
    return seen


def _softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def _pick(context: str, candidates: list[tuple[float, int, int]], n_best: int) -> Prediction:
    if not candidates:
        return Prediction("", 0.0, 0.0, None)
    seen = _n_best(context, candidates, n_best)
    probabilities = _softmax([s for s, _, _ in seen.values()])
    text, (score, start, end) = next(iter(seen.items()))
    return Prediction(text, score, probabilities[0], (start, end))


def _pick_v2(
    context: str,
    candidates: list[tuple[float, int, int]],
    n_best: int,
    null_score: float,
    threshold: float,
) -> Prediction:
    """The best span, or ``""`` when the null score beats it by more than ``threshold``."""
    seen = _n_best(context, candidates, n_best)
    seen.pop("", None)  # an empty span text is the null answer, scored by null_score
    if not seen:  # no span (or no window) at all: the null answer, whatever the threshold
        null = null_score if math.isfinite(null_score) else 0.0
        return Prediction("", null, 1.0, None, math.inf)
    texts = list(seen)
    probabilities = _softmax([s for s, _, _ in seen.values()] + [null_score])
    score, start, end = seen[texts[0]]
    diff = null_score - score
    if diff > threshold:
        return Prediction("", null_score, probabilities[-1], None, diff)
    return Prediction(texts[0], score, probabilities[0], (start, end), diff)


def write_predictions(path: Path, predictions: Mapping[str, Prediction]) -> None:
    """The official predictions file: ``{question id: answer text}``; with SQuAD v2.0
    predictions also ``null_odds.json`` beside it (question id -> null score minus the best
    span's, evaluate-v2.0's ``--na-prob-file``; a question without a span: 1e9)."""
    path.write_text(json.dumps({k: p.text for k, p in predictions.items()}, indent=1) + "\n")
    odds = no_answer_scores(predictions)
    if odds:
        (path.parent / "null_odds.json").write_text(json.dumps(odds, indent=1) + "\n")


def no_answer_scores(predictions: Mapping[str, Prediction]) -> dict[str, float]:
    """Question id -> the null-score difference of v2.0 predictions (finite: clipped to
    +-1e9, a question without a span is 1e9); empty for v1.1 predictions."""
    return {
        k: max(-1e9, min(1e9, p.null_score_diff))
        for k, p in predictions.items()
        if p.null_score_diff is not None
    }


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


class SquadData(TaskData):
    """SQuAD v1.1 through ``datasets`` (``rajpurkar/squad`` or the official JSON): windows,
    the n-best span per question, the official EM/F1 and ``predictions.json``."""

    COLUMNS = ("id", "context", "question", "answers")
    #: SQuAD v2.0's null answer in post-processing (:func:`best_answers`)
    version_2 = False

    def __init__(self, task: str = "squad", hub: str = "rajpurkar/squad", **kwargs: Any) -> None:
        kwargs.setdefault("benchmark", "squad")
        kwargs.setdefault("metrics", ["exact_match", "f1"])
        super().__init__(task, hub, **kwargs)

    def read_file(self, path: Path, key: str) -> Any:
        import datasets

        columns = squad_json_columns(check_squad_file(path, key))
        if not columns["id"]:
            raise FineTuneInputError(f"{key}={path} holds no questions; pass a non-empty file.")
        return datasets.Dataset.from_dict(columns)

    def check(self, dataset: Any, where: str, labelled: bool) -> None:
        missing = [c for c in self.COLUMNS if c not in dataset.column_names]
        if missing:
            raise FineTuneInputError(
                f"{where} has the columns ({', '.join(dataset.column_names)}), not SQuAD's "
                f"({', '.join(self.COLUMNS)}, as {self.hub}); task={self.task} reads SQuAD "
                "data (a GLUE dataset needs its GLUE task)."
            )
        if len(dataset) == 0:
            raise FineTuneInputError(f"{where} holds no questions; pass a non-empty split.")

    def has_labels(self, dataset: Any) -> bool:
        return all(len(a["text"]) > 0 for a in dataset["answers"])

    def examples(self, dataset: Any, where: str, training: bool) -> list[SquadExample]:
        return examples_from_rows(dataset, where, training)

    def features(
        self, dataset: Any, tokenizer: Any, recipe: Mapping[str, Any], training: bool
    ) -> Features:
        examples = self.examples(dataset, "the data", training)
        feats = squad_features(
            examples, tokenizer, recipe["max_seq_length"], recipe["doc_stride"],
            recipe["max_query_length"], training=training,
        )  # fmt: skip
        return Features(feats.tensors(training), (examples, feats))

    def predict(
        self, dataset: Any, features: Features, outputs: Any, recipe: Mapping[str, Any]
    ) -> list[Any]:
        examples, feats = features.extra
        start, end = outputs
        best = best_answers(
            examples, feats, start, end, recipe["n_best_size"], recipe["max_answer_length"],
            version_2=self.version_2,
            null_score_diff_threshold=float(recipe.get("null_score_diff_threshold") or 0.0),
        )  # fmt: skip
        return [best[e.qid] for e in examples]

    def scores(self, dataset: Any, predictions: Sequence[Any]) -> dict[str, float]:
        from omnibert.finetune.squad_metric import squad_scores

        ids = [str(i) for i in dataset["id"]]
        result = squad_scores(
            official_rows(dataset), {i: p.text for i, p in zip(ids, predictions, strict=True)}
        )
        return {"exact_match": result["exact_match"], "f1": result["f1"]}

    def write(self, directory: Path, name: str, dataset: Any, predictions: Sequence[Any]) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / ("predictions.json" if name == "validation" else f"{name}.json")
        ids = [str(i) for i in dataset["id"]]
        write_predictions(path, dict(zip(ids, predictions, strict=True)))
        return path


class SquadV2Data(SquadData):
    """SQuAD v2.0 (``rajpurkar/squad_v2`` or the official v2.0 JSON): SQuAD v1.1's windows,
    with unanswerable questions trained to point every window at ``[CLS]``; a question is
    answered ``""`` when its null score beats its best span by more than
    ``recipe['null_score_diff_threshold']``. Metrics: evaluate-v2.0's (``exact``, ``f1``,
    ``HasAns_*``, ``NoAns_*``, ``best_*`` and their thresholds); ``predictions.json`` and
    ``null_odds.json`` (evaluate-v2.0's ``--na-prob-file``)."""

    version_2 = True

    def __init__(
        self, task: str = "squad_v2", hub: str = "rajpurkar/squad_v2", **kwargs: Any
    ) -> None:
        kwargs.setdefault("metrics", ["exact", "f1", "HasAns_f1", "NoAns_f1", "best_f1"])
        super().__init__(task, hub, **kwargs)

    def has_labels(self, dataset: Any) -> bool:
        # v2.0: an unanswerable question carries no answer; a split is labelled when some
        # question has one (a test file has none anywhere)
        return any(len(a["text"]) > 0 for a in dataset["answers"])

    def examples(self, dataset: Any, where: str, training: bool) -> list[SquadExample]:
        return examples_from_rows(dataset, where, training, unanswerable=True)

    def scores(self, dataset: Any, predictions: Sequence[Any]) -> dict[str, float]:
        from omnibert.finetune.squad_v2_metric import squad_v2_scores

        rows = official_rows(dataset)
        ids = [str(i) for i in dataset["id"]]
        by_id = dict(zip(ids, predictions, strict=True))
        result = squad_v2_scores(
            rows, {i: p.text for i, p in by_id.items()}, no_answer_scores(by_id)
        )
        # the question counts (total, HasAns_total, NoAns_total) are not metrics
        return {k: float(v) for k, v in result.items() if not k.endswith("total")}
