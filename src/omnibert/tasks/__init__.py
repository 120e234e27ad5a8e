"""LightningModules (pretraining; SQuAD and GLUE fine-tuning later) and the derived training
plan of ``omnibert-train``."""

from omnibert.tasks.pretraining import PretrainingTask

__all__ = ["PretrainingTask"]
