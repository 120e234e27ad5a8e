"""LightningModules: pretraining (``omnibert-train``) and SQuAD / GLUE fine-tuning
(``omnibert-finetune``)."""

from omnibert.tasks.finetuning import QuestionAnsweringTask, SequenceClassificationTask
from omnibert.tasks.pretraining import PretrainingTask

__all__ = ["PretrainingTask", "QuestionAnsweringTask", "SequenceClassificationTask"]
