"""Lightning callbacks omnibert needs that Lightning does not ship: throughput and MFU,
progress lines, MLPerf logging, the safe stop, the non-finite step policy, the requeue at a
time limit. The checkpoint callback lives with the rest of the checkpoint code
(:mod:`omnibert.checkpoints`) and is named here too, as the configs name it
(``callbacks.checkpoint._target_: omnibert.callbacks.PretrainingCheckpoint``).

* :class:`~omnibert.callbacks.throughput.PretrainingThroughput`: samples, real tokens,
  real sequences per second, FLOPs and MFU.
* :class:`~omnibert.checkpoints.saving.PretrainingCheckpoint`: ``ModelCheckpoint`` that
  also saves the final step.
"""

from omnibert.callbacks.throughput import PretrainingThroughput
from omnibert.checkpoints.saving import PretrainingCheckpoint

__all__ = ["PretrainingCheckpoint", "PretrainingThroughput"]
