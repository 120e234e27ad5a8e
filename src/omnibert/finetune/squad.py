"""SQuAD v1.1 and v2.0 as fine-tuning tasks: :class:`SquadData` and :class:`SquadV2Data`,
the ``task.data`` of ``conf/task/squad.yaml`` and ``squad_v2.yaml``.

The pieces they wire: the questions (:mod:`omnibert.finetune.squad_examples`: the official
JSON and the Hub's columns), the windows of features and training labels
(:mod:`omnibert.finetune.squad_windows`), the answers from the logits and the predictions files
(:mod:`omnibert.finetune.squad_answers`), and the official metrics
(:mod:`omnibert.finetune.squad_metric`, :mod:`omnibert.finetune.squad_v2_metric`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omnibert.finetune.spec import Features, TaskData
from omnibert.finetune.squad_answers import best_answers, no_answer_scores, write_predictions
from omnibert.finetune.squad_examples import (
    SquadExample,
    check_squad_file,
    examples_from_rows,
    official_rows,
    squad_json_columns,
)
from omnibert.finetune.squad_metric import squad_scores
from omnibert.finetune.squad_v2_metric import squad_v2_scores
from omnibert.finetune.squad_windows import squad_features
from omnibert.finetune.tokenizer import FineTuneInputError

__all__ = ["SquadData", "SquadV2Data"]


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
        import datasets  # lazy: datasets takes most of a second to import

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
        rows = official_rows(dataset)
        ids = [str(i) for i in dataset["id"]]
        by_id = dict(zip(ids, predictions, strict=True))
        result = squad_v2_scores(
            rows, {i: p.text for i, p in by_id.items()}, no_answer_scores(by_id)
        )
        # the question counts (total, HasAns_total, NoAns_total) are not metrics
        return {k: float(v) for k, v in result.items() if not k.endswith("total")}
