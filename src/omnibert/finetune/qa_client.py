"""Answers from an exported question-answering model, for clients outside omnibert.

transformers 5 has no ``pipeline("question-answering")``; :func:`answer_questions` is what
``omnibert-predict`` does with a SQuAD run, on the Hugging Face objects an export loads into::

    model = AutoModelForQuestionAnswering.from_pretrained("exports/squad")
    tokenizer = AutoTokenizer.from_pretrained("exports/squad")
    answer_question(model, tokenizer, "Who wrote it?", "It was written by Ada.")

The same windows over the context (:func:`omnibert.finetune.squad_windows.squad_features`:
Google's ``max_seq_length`` / ``doc_stride`` / ``max_query_length``), the same span rule
(:func:`omnibert.finetune.squad_answers.best_answers`: the n-best starts and ends of each
window, a token scored in its max-context window, at most ``max_answer_length`` tokens; SQuAD
v2.0's null answer and threshold) and the same record as ``omnibert-predict``. The settings
default to the run's own, which ``omnibert-export`` writes into the export's ``config.json``
(``question_answering``), else Google's ``run_squad.py`` values. ``model`` is any callable
taking ``input_ids``, ``token_type_ids`` and ``attention_mask`` and returning
``start_logits`` and ``end_logits`` (``BertForQuestionAnswering``); ``tokenizer`` a
Hugging Face fast tokenizer (or a ``tokenizers.Tokenizer``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from omnibert.finetune.squad_answers import best_answers
from omnibert.finetune.squad_examples import SquadExample
from omnibert.finetune.squad_windows import squad_features
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["DEFAULTS", "answer_question", "answer_questions"]

#: Google's run_squad.py settings: what a model without recorded settings gets
DEFAULTS: dict[str, Any] = {
    "max_seq_length": 384,
    "doc_stride": 128,
    "max_query_length": 64,
    "n_best_size": 20,
    "max_answer_length": 30,
    "version_2_with_negative": False,
    "null_score_diff_threshold": 0.0,
}


def _settings(model: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(options) - set(DEFAULTS))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)}; known: {', '.join(DEFAULTS)}")
    recorded = getattr(getattr(model, "config", None), "question_answering", None) or {}
    return {**DEFAULTS, **{k: v for k, v in recorded.items() if k in DEFAULTS}, **options}


def _backend(tokenizer: Any) -> Any:
    """A copy of the fast tokenizer's ``tokenizers.Tokenizer`` with no truncation or padding
    (a Hugging Face call with ``truncation=True`` leaves it set on the backend)."""
    from tokenizers import Tokenizer

    backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
    if not isinstance(backend, Tokenizer):
        raise TypeError(
            f"tokenizer is a {type(tokenizer).__name__}, not a fast tokenizer: load it with "
            "AutoTokenizer.from_pretrained(<export>) (the export's tokenizer.json)"
        )
    copy = Tokenizer.from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _logits(model: Any, inputs: Mapping[str, np.ndarray], batch_size: int) -> tuple[Any, Any]:
    import torch

    device = next(iter(model.parameters())).device if hasattr(model, "parameters") else "cpu"
    starts, ends = [], []
    with torch.inference_mode():
        for first in range(0, len(inputs["input_ids"]), batch_size):
            rows = slice(first, first + batch_size)
            out = model(**{k: torch.as_tensor(v[rows], device=device) for k, v in inputs.items()})
            starts.append(out.start_logits.float().cpu().numpy())
            ends.append(out.end_logits.float().cpu().numpy())
    # no answer starts or ends on padding: left in, its logits would take n-best slots from
    # real tokens (omnibert's evaluation masks them the same way)
    padding = inputs["attention_mask"] == 0
    start, end = np.concatenate(starts), np.concatenate(ends)
    start[padding] = end[padding] = -np.inf
    return start, end


def answer_questions(
    model: Any,
    tokenizer: Any,
    questions: Sequence[tuple[str, str]],
    *,
    batch_size: int = 32,
    **options: Any,
) -> list[dict[str, Any]]:
    """One record per ``(question, context)``, as ``omnibert-predict`` writes it: ``answer``
    (cut from the context as written; ``""`` when SQuAD v2.0's null answer wins),
    ``probability`` (among the n-best answers), ``score`` (start + end logit), ``start`` (its
    character offset in the context, None without an answer) and, for a SQuAD v2.0 model,
    ``null_score_diff``. ``options``: any of :data:`DEFAULTS`, over the model's own."""
    settings = _settings(model, options)
    examples = []
    for index, (question, context) in enumerate(questions):
        if not str(question).strip() or not str(context).strip():
            raise FineTuneInputError(
                f"question {index} has an empty question or context; give both as text."
            )
        examples.append(SquadExample(str(index), str(question), str(context)))
    if not examples:
        return []
    features = squad_features(
        examples,
        _backend(tokenizer),
        settings["max_seq_length"],
        settings["doc_stride"],
        settings["max_query_length"],
    )
    inputs = {
        "input_ids": features.input_ids,
        "token_type_ids": features.segment_ids,
        "attention_mask": features.attention_mask,
    }
    start, end = _logits(model, inputs, batch_size)
    best = best_answers(
        examples, features, start, end, settings["n_best_size"], settings["max_answer_length"],
        version_2=bool(settings["version_2_with_negative"]),
        null_score_diff_threshold=float(settings["null_score_diff_threshold"]),
    )  # fmt: skip
    records = []
    for example in examples:
        p = best[example.qid]
        record: dict[str, Any] = {
            "answer": p.text, "probability": p.probability, "score": p.score,
            "start": None if p.char_span is None else p.char_span[0],
        }  # fmt: skip
        if p.null_score_diff is not None:
            record["null_score_diff"] = max(-1e9, min(1e9, p.null_score_diff))
        records.append(record)
    return records


def answer_question(
    model: Any, tokenizer: Any, question: str, context: str, **options: Any
) -> dict[str, Any]:
    """:func:`answer_questions` of one question over its context."""
    return answer_questions(model, tokenizer, [(question, context)], **options)[0]
