"""What a checkpoint recorded about the run that wrote it, read back typed.

A task keeps plain data in its ``hyper_parameters`` (:mod:`omnibert.tasks`) so that a
checkpoint rebuilds from itself; the tools that read a checkpoint back (``omnibert-export``,
``omnibert-predict``, the model cards, a fine-tuning task rebuilt from its checkpoint) read
those values through the views here, as typed attributes, in one place: a key renamed in a
task is then renamed here, not in every reader. The views accept what older checkpoints
recorded (any key may be missing) and never change the recorded values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RecordedNode", "RecordedRecipe", "RecordedTraining"]


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class _Recorded(Mapping[str, Any]):
    """A read-only view over a recorded mapping (``None``: nothing recorded)."""

    __slots__ = ("_values",)

    def __init__(self, values: Mapping[str, Any] | None) -> None:
        self._values = dict(values or {})

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def listed(self, keys: tuple[str, ...]) -> list[tuple[str, str]]:
        """``(key, value as text)`` of those ``keys`` that are recorded and not None, in
        ``keys``' order: the rows a model card shows."""
        return [(key, str(self._values[key])) for key in keys if self._values.get(key) is not None]


class RecordedNode(_Recorded):
    """An optimiser's or schedule's ``_target_`` node as the checkpoint recorded it."""

    __slots__ = ()

    @property
    def short_name(self) -> str:
        """The class the node built, without its module (``unknown`` when not recorded)."""
        target = self._values.get("_target_")
        return str(target).rsplit(".", 1)[-1] if target else "unknown"

    @property
    def lr(self) -> float | None:
        """The peak learning rate (None: not recorded)."""
        return _number(self._values.get("lr"))


class RecordedTraining(_Recorded):
    """An ``omnibert-train`` checkpoint's hyper-parameters (:class:`~omnibert.tasks.
    PretrainingTask`): the plan's optimiser steps, the update rule, where the weights started
    and the vocab the data was prepared with."""

    __slots__ = ()

    @property
    def total_steps(self) -> int | None:
        value = self._values.get("total_steps")
        return int(value) if isinstance(value, int) and not isinstance(value, bool) else None

    @property
    def optimizer(self) -> RecordedNode | None:
        node = self._values.get("optimizer")
        return RecordedNode(node) if isinstance(node, Mapping) and node else None

    @property
    def schedule(self) -> RecordedNode | None:
        node = self._values.get("schedule")
        return RecordedNode(node) if isinstance(node, Mapping) and node else None

    @property
    def init_from(self) -> str | None:
        value = self._values.get("init_from")
        return None if value is None else str(value)

    @property
    def vocab_file(self) -> str | None:
        value = self._values.get("vocab_file")
        return None if value is None else str(value)

    @property
    def vocab_sha256(self) -> str | None:
        value = self._values.get("vocab_sha256")
        return None if value is None else str(value)

    @property
    def do_lower_case(self) -> bool | None:
        """How the training data was lower-cased (None: not recorded, older checkpoints)."""
        value = self._values.get("do_lower_case")
        return None if value is None else bool(value)


#: a classifier's outputs where the recipe names none (BERT's two-class default)
DEFAULT_NUM_LABELS = 2
#: the question-answering windows and span limits omnibert-predict and the export read
QA_WINDOWS = ("max_seq_length", "doc_stride", "max_query_length", "n_best_size",
              "max_answer_length")  # fmt: skip


class RecordedRecipe(_Recorded):
    """A fine-tuning task's recipe as its checkpoint (or a task built in code) records it: the
    task node's keys with its ``data`` node (:class:`omnibert.config.finetune.Recipe` is the
    same recipe checked as a run's config)."""

    __slots__ = ()

    @property
    def name(self) -> str | None:
        value = self._values.get("name")
        return None if value is None else str(value)

    @property
    def num_labels(self) -> int:
        """A classifier's outputs (1: a regression score); BERT's two where none is recorded."""
        value = self._values.get("num_labels")
        return DEFAULT_NUM_LABELS if value is None else int(value)

    @property
    def question_answering(self) -> bool:
        """The recipe reads answers out of windows (SQuAD): it has a ``doc_stride`` (older
        checkpoints: ``format: squad``)."""
        return "doc_stride" in self._values or self._values.get("format") == "squad"

    def qa_windows(self) -> dict[str, Any]:
        """The question-answering windows and span limits (:data:`QA_WINDOWS`), as recorded."""
        return {key: self._values[key] for key in QA_WINDOWS}

    @property
    def null_score_diff_threshold(self) -> float:
        """SQuAD v2's no-answer margin (0: not recorded)."""
        return _number(self._values.get("null_score_diff_threshold")) or 0.0

    def plain(self) -> dict[str, Any]:
        """The recipe as a plain dict (what the task's data functions take)."""
        return dict(self._values)
