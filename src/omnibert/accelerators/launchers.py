"""Which launcher started this process, read from the environment (standard library only).

A multi-process run is started one of five ways; each leaves its own variables, read in the
order Lightning itself looks for them:

* ``slurm``: ``srun`` (``hydra/launcher=slurm*`` or ``sbatch``): ``SLURM_NTASKS``,
  ``SLURM_PROCID`` (Lightning's ``SLURMEnvironment``; an interactive ``salloc`` shell is not
  a launch, as Lightning decides);
* ``torchrun``: ``python -m torch.distributed.run`` / ``torchrun`` (also what a Kubeflow
  PyTorchJob runs): ``RANK``, ``GROUP_RANK``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
  ``WORLD_SIZE`` (Lightning's ``TorchElasticEnvironment``);
* ``mpirun (Open MPI)``: ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
  ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE`` (omnibert's own
  :class:`~omnibert.accelerators.ddp.OpenMPIEnvironment`; no mpi4py needed);
* ``lightning``: no launcher: with ``accelerator.devices`` > 1 Lightning's own launcher makes
  this process rank 0 and starts the other ranks of the node as its children, which find
  ``LOCAL_RANK`` set by it;
* ``single process``: none of these and one device.

:func:`detect_launcher` says which, with the world size and this process's rank; the
environment report prints it at start (``launcher  torchrun: world size 2, rank 0 (local
rank 0 of 2)``) and :func:`check_launch_layout` refuses a launch whose process count
disagrees with ``accelerator.devices`` × ``accelerator.num_nodes``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from omnibert.errors import UserError

__all__ = ["Launch", "LaunchError", "check_launch_layout", "detect_launcher"]


class LaunchError(UserError):
    """The processes a launcher started do not match the accelerator config."""


TORCHRUN = ("RANK", "GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE")
OPEN_MPI = (
    "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
)


@dataclass(frozen=True)
class Launch:
    """How this process was started: the launcher's name, the world size it launched (None:
    Lightning decides from the config), this process's global and local rank, the
    processes per node (None where the launcher does not say) and this process's node."""

    name: str
    world_size: int | None
    rank: int
    local_rank: int
    local_world_size: int | None
    node_rank: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self, devices: int, num_nodes: int) -> str:
        """One line: ``torchrun: world size 2, rank 0 (local rank 0 of 2)``; on several nodes
        with this process's node: ``slurm: world size 2, rank 1 (local rank 0 of 1, node 1 of
        2)``."""
        if self.name == "single process":
            return "single process"
        world = self.world_size or devices * num_nodes
        local = self.local_world_size or devices
        node = f", node {self.node_rank} of {num_nodes}" if num_nodes > 1 else ""
        text = (
            f"{self.name}: world size {world}, rank {self.rank} "
            f"(local rank {self.local_rank} of {local}{node})"
        )
        if self.name == "lightning" and self.rank == 0 and local > 1:
            text += f"; this process starts the other {local - 1} of this node"
        return text


def _int(env: Mapping[str, str], key: str, default: int = 0) -> int:
    value = env.get(key, "")
    return int(value) if value.strip().isdigit() else default


def _slurm(env: Mapping[str, str]) -> bool:
    return "SLURM_NTASKS" in env and env.get("SLURM_JOB_NAME") not in ("bash", "interactive")


def detect_launcher(
    devices: int, num_nodes: int, environ: Mapping[str, str] | None = None
) -> Launch:
    """The launcher of this process (module docstring), for ``devices`` × ``num_nodes``."""
    env = os.environ if environ is None else environ
    if _slurm(env):
        return Launch(
            "slurm", _int(env, "SLURM_NTASKS", 1), _int(env, "SLURM_PROCID"),
            _int(env, "SLURM_LOCALID"), _int(env, "SLURM_NTASKS_PER_NODE", 0) or None,
            _int(env, "SLURM_NODEID"),
        )  # fmt: skip
    if all(key in env for key in TORCHRUN):
        return Launch(
            "torchrun", _int(env, "WORLD_SIZE", 1), _int(env, "RANK"),
            _int(env, "LOCAL_RANK"), _int(env, "LOCAL_WORLD_SIZE", 1), _int(env, "GROUP_RANK"),
        )  # fmt: skip
    if all(key in env for key in OPEN_MPI):
        rank, per_node = (
            _int(env, "OMPI_COMM_WORLD_RANK"),
            _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1),
        )
        return Launch(
            "mpirun (Open MPI)", _int(env, "OMPI_COMM_WORLD_SIZE", 1), rank,
            _int(env, "OMPI_COMM_WORLD_LOCAL_RANK"), per_node, rank // max(per_node, 1),
        )  # fmt: skip
    if devices * num_nodes > 1 or "LOCAL_RANK" in env:
        local, node = _int(env, "LOCAL_RANK"), _int(env, "NODE_RANK")
        return Launch(
            "lightning", devices * num_nodes, node * devices + local, local, devices, node
        )
    return Launch("single process", 1, 0, 0, 1)


def check_launch_layout(
    accelerator: str, devices: int, num_nodes: int, environ: Mapping[str, str] | None = None
) -> Launch:
    """The launch (:func:`detect_launcher`); :class:`LaunchError` in one sentence when
    torchrun or mpirun started another number of processes than ``accelerator.devices`` per
    node × ``accelerator.num_nodes`` (Lightning would stop later, inside the Trainer, with a
    traceback, or hang). SLURM is checked by :mod:`omnibert.run.launching.slurm`; an IPU run is one
    host process for all its replicas."""
    launch = detect_launcher(devices, num_nodes, environ)
    if launch.name not in ("torchrun", "mpirun (Open MPI)"):
        return launch
    option = "--nproc_per_node" if launch.name == "torchrun" else "-np"
    per_node = 1 if accelerator == "ipu" else devices
    if launch.local_world_size is not None and launch.local_world_size != per_node:
        fix = (
            f"accelerator.devices={launch.local_world_size}"
            if per_node == devices
            else f"{option} 1 per node (accelerator=ipu runs one host process)"
        )
        raise LaunchError(
            f"{launch.name} started {launch.local_world_size} processes on this node but "
            f"accelerator={accelerator} with accelerator.devices={devices} needs {per_node}; "
            f"set {fix} or start {per_node} per node."
        )
    wanted = per_node * num_nodes
    if launch.world_size is not None and launch.world_size != wanted:
        nodes = launch.world_size // max(per_node, 1)
        raise LaunchError(
            f"{launch.name} started {launch.world_size} processes in all but "
            f"accelerator.devices={devices} × accelerator.num_nodes={num_nodes} needs {wanted}; "
            f"set accelerator.num_nodes={nodes} or start {wanted} processes."
        )
    return launch
