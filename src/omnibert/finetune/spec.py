"""What a fine-tuning task declares: the extension point of ``omnibert-finetune``.

A task is one YAML file, ``conf/task/<name>.yaml``, holding three things:

* **its LightningModule and recipe**: ``_target_`` (``omnibert.tasks.SequenceClassificationTask``
  for GLUE, ``QuestionAnsweringTask`` for SQuAD; the *head*: its ``build_model`` picks the
  :mod:`omnibert.models.heads` module, its ``training_step`` the loss) and the recipe keys
  next to it (``epochs``, ``lr``, ``batch_size``, ``warmup_proportion``, ``max_seq_length``,
  ``eval_batch_size``, head settings such as ``num_labels``; SQuAD's ``doc_stride`` ...).
  The app instantiates the node (``instantiate(cfg.task)(model_config=..., ...)``): every key
  but ``_target_`` arrives as the task's ``recipe``, which the checkpoint keeps in its
  hparams, so a fine-tuned run rebuilds its data and metrics from itself.
* **its data and metrics**: ``task.data``, a node whose ``_target_`` is a :class:`TaskData`
  subclass (:class:`omnibert.finetune.glue.GlueData`, :class:`omnibert.finetune.squad.SquadData`):
  the Hub name and config ``datasets.load_dataset`` uses, the split names, the columns, the
  label names, the metric names and the submission files.
* nothing else: the run pipeline (:mod:`omnibert.run.finetuning.job`) is the same for every task.

A :class:`TaskData` subclass implements, for its family of tasks:

* **reader**: :meth:`TaskData.read_file` turns a file in the original format (SQuAD JSON, GLUE
  TSV) into a ``datasets.Dataset`` with the Hub's columns (Parquet, JSON Lines and Hub-layout
  directories go through ``datasets`` directly: :mod:`omnibert.finetune.sources`), and
  :meth:`TaskData.check` refuses a dataset with the wrong columns or label values in one
  sentence naming the file and the fix;
* **features**: :meth:`TaskData.features` gives the model's input tensors ``[N, S]`` (plus the
  training labels) and whatever post-processing needs;
* **predictions**: :meth:`TaskData.predict` turns the head's outputs (``logits`` of every
  feature, from :func:`omnibert.run.finetuning.outputs.logits`) into one prediction per example;
* **metric**: :meth:`TaskData.scores` computes the official metrics of a labelled split;
* **submission writer**: :meth:`TaskData.write` writes the predictions of a split in the
  format its benchmark takes (``predictions.json`` for SQuAD, ``CoLA.tsv`` ... for GLUE).

Splits have names: ``train_split``, ``eval_splits`` (``{name: split}``: metrics on each;
MNLI has ``matched`` and ``mismatched``) and ``test_splits`` (``{submission name: split}``,
predicted with ``data.predict_test=true``; a split written ``<config>/<split>`` comes from
another config of the same dataset, as GLUE's AX from MNLI's model). Adding a task of an
existing family is a YAML file; a new family is a :class:`TaskData` subclass and a YAML file.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["Features", "TaskData"]


class Features:
    """Model inputs of a split: ``tensors`` (``input_ids``, ``segment_ids``,
    ``attention_mask`` ``[N,S]`` and, in training, the labels) and ``extra``: what
    post-processing needs (SQuAD's windows: which example, offsets, max-context flags)."""

    def __init__(self, tensors: Mapping[str, Any], extra: Any = None) -> None:
        self.tensors = dict(tensors)
        self.extra = extra

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])


class TaskData:
    """The data, metrics and submission files of a family of tasks (module docstring).

    Args:
        task: the task's name (``cola``, ``squad``, ...), used in messages.
        hub: the dataset's Hub name (``nyu-mll/glue``), loaded when no file is given.
        config: the Hub config (``cola``; ``None`` for datasets without configs).
        train_split: the split trained on.
        eval_splits: ``{name: split}`` evaluated after training (metrics per name).
        test_splits: ``{submission name: split}`` predicted with ``data.predict_test``.
        metrics: the metric names, in the order the benchmark reports them.
        benchmark: ``glue``, ``squad``: what the sweep's table groups by.
        label: the display name of the task (``CoLA``, ``SQuAD v1.1``).
    """

    def __init__(
        self,
        task: str,
        hub: str,
        config: str | None = None,
        train_split: str = "train",
        eval_splits: Mapping[str, str] | None = None,
        test_splits: Mapping[str, str] | None = None,
        metrics: Sequence[str] = (),
        benchmark: str | None = None,
        label: str | None = None,
    ) -> None:
        self.task = task
        self.hub = hub
        self.config = config
        self.train_split = train_split
        self.eval_splits = dict(eval_splits or {"validation": "validation"})
        self.test_splits = dict(test_splits or {})
        self.metrics = list(metrics)
        self.benchmark = benchmark
        self.label = label or task

    # ---------------------------------------------------------------- reader
    def read_file(self, path: Path, key: str) -> Any:
        """A ``datasets.Dataset`` with the Hub's columns from a file in the original format;
        one sentence naming ``key`` when the file is not this task's."""
        raise NotImplementedError

    def check(self, dataset: Any, where: str, labelled: bool) -> None:
        """Refuse a dataset without this task's columns or with label values it does not
        have (``labelled``: the split must carry labels), naming ``where``."""
        raise NotImplementedError

    # -------------------------------------------------------------- features
    def features(
        self, dataset: Any, tokenizer: Any, recipe: Mapping[str, Any], training: bool
    ) -> Features:
        raise NotImplementedError

    # ----------------------------------------------------------- predictions
    def predict(
        self, dataset: Any, features: Features, outputs: Any, recipe: Mapping[str, Any]
    ) -> list[Any]:
        """One prediction per example of ``dataset`` from the head's ``outputs``."""
        raise NotImplementedError

    def scores(self, dataset: Any, predictions: Sequence[Any]) -> dict[str, float]:
        """The official metrics of ``predictions`` against ``dataset``'s labels."""
        raise NotImplementedError

    def write(self, directory: Path, name: str, dataset: Any, predictions: Sequence[Any]) -> Path:
        """The predictions of split ``name`` in the benchmark's format, under ``directory``."""
        raise NotImplementedError

    def has_labels(self, dataset: Any) -> bool:
        """Whether the split carries labels (test splits do not)."""
        raise NotImplementedError
