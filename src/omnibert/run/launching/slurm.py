"""SLURM: the job's task layout must match the accelerator config before anything starts.

Under SLURM, Lightning takes ranks from SLURM (``SLURMEnvironment``: one task per device,
started by ``srun``) instead of launching processes itself, so ``--ntasks-per-node`` must
equal ``accelerator.devices`` and ``--nodes`` must equal ``accelerator.num_nodes``
(``conf/hydra/launcher/slurm.yaml`` derives both from the accelerator config). Lightning
finds a mismatch only once the Trainer is built; :func:`check_slurm_layout` finds it at
start with one sentence. The IPU plugin runs one host process for all its replicas, so it
wants one task per node.

Like Lightning, an interactive allocation (``salloc`` then ``python``; job name ``bash`` or
``interactive``) is not a SLURM launch and is not checked.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from omnibert.config import TrainConfigError

__all__ = ["check_slurm_layout", "processes_per_node"]

#: accelerators whose plugin drives all its devices from one host process
SINGLE_PROCESS = ("ipu",)


def processes_per_node(accelerator: str, devices: int) -> int:
    """Host processes (SLURM tasks) per node the accelerator plugin expects."""
    return 1 if accelerator in SINGLE_PROCESS else devices


def check_slurm_layout(
    accelerator: str, devices: int, num_nodes: int, environ: Mapping[str, str] | None = None
) -> None:
    """Raise :class:`TrainConfigError` when a SLURM job's tasks per node or node count does
    not match ``accelerator.devices`` / ``accelerator.num_nodes``; no-op outside SLURM."""
    env = os.environ if environ is None else environ
    if "SLURM_NTASKS" not in env or env.get("SLURM_JOB_NAME") in ("bash", "interactive"):
        return
    wanted = processes_per_node(accelerator, devices)
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    if per_node is not None and per_node.isdigit() and int(per_node) != wanted:
        fix = (
            f"accelerator.devices={per_node}"
            if wanted == devices
            else f"--ntasks-per-node={wanted} (accelerator={accelerator} runs one process)"
        )
        raise TrainConfigError(
            f"the SLURM job runs {per_node} tasks per node (SLURM_NTASKS_PER_NODE) but "
            f"accelerator={accelerator} with accelerator.devices={devices} needs {wanted}; "
            f"set {fix} or launch with hydra/launcher=slurm, which derives it."
        )
    nodes = env.get("SLURM_NNODES")
    if nodes is not None and nodes.isdigit() and int(nodes) != num_nodes:
        raise TrainConfigError(
            f"the SLURM job has {nodes} nodes (SLURM_NNODES) but accelerator.num_nodes="
            f"{num_nodes}; set accelerator.num_nodes={nodes} or launch with "
            "hydra/launcher=slurm, which derives it."
        )
