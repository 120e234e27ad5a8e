"""Optimisers and learning-rate schedules: LAMB (apex semantics, fused), AdamW, BERT schedules.

docs/lamb.md states the semantics and how they map to apex, Habana, poptorch and MLPerf TF.
"""

from omnibert.optim.accumulation import MicroBatchClipper
from omnibert.optim.lamb import Lamb
from omnibert.optim.param_groups import BERT_NO_WEIGHT_DECAY, AdamW, build_param_groups
from omnibert.optim.schedules import (
    NaturalExpWarmupLR,
    PolyWarmupLR,
    StepTableLR,
    WarmupStableDecayLR,
)

__all__ = [
    "BERT_NO_WEIGHT_DECAY",
    "AdamW",
    "Lamb",
    "MicroBatchClipper",
    "NaturalExpWarmupLR",
    "PolyWarmupLR",
    "StepTableLR",
    "WarmupStableDecayLR",
    "build_param_groups",
]
