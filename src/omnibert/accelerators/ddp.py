"""Data-parallel training that ends in one line when a rank is lost, under every launcher.

:func:`ddp_strategy` is the DDP strategy the CPU and GPU plugins give Lightning for more than
one process: Lightning's ``DDPStrategy`` with

* the process-group timeout ``accelerator.timeout_s`` (gloo and NCCL), so a collective whose
  peer stopped answering ends after that long instead of torch's 30 minutes; in the first
  steps, where every rank compiles, at least :data:`~omnibert.accelerators.compile_allowance.
  COMPILE_ALLOWANCE_S` (:mod:`omnibert.accelerators.compile_allowance`);
* under Lightning's own launcher, :class:`WatchedLauncher`: rank 0 is the parent of the
  node's other ranks and one thread per child waits on it. A child that dies (killed, or
  exiting with an error) ends the run at once with one line, ``rank 1 (pid 4242) was lost:
  killed by SIGKILL; ...``: the other children are killed and the process exits with
  :data:`~omnibert.errors.EXIT_LOST_RANK`. (Lightning's own observer looks every 5 s,
  reports at INFO level, which the apps do not show, and kills rank 0 with SIGKILL, exit
  code 137; it also did that when a child stopped at a safe point on SIGTERM before rank 0.)
  A child that finished (0) or stopped at a safe point (143, 130: every rank stops at that
  step) is not a loss;
* under ``torchrun``, each start of the group (``--max-restarts``, another node's restart)
  joins under keys of its own in torchrun's store: a restarted group would otherwise read
  the failed start's addresses (:mod:`omnibert.accelerators.elastic`);
* under ``mpirun`` (Open MPI), :class:`OpenMPIEnvironment` (Lightning's ``MPIEnvironment``
  needs mpi4py);
* with ``accelerator.optimizer_sharding=zero1``, the optimiser partitioned over the ranks
  (:attr:`OmnibertDDPStrategy.optimizer_partition_group`, :mod:`omnibert.optim.zero1`).

On the other ranks, and wherever the launcher is not this process, the loss shows as the
collective's error (gloo: ``Connection reset by peer``, ``Timed out waiting 300000ms``);
:func:`lost_rank` turns it into the same kind of line, so the run ends without a traceback.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from omnibert.accelerators.compile_allowance import CompileAllowance, compile_allowance
from omnibert.accelerators.elastic import agent_store, store_of_this_start
from omnibert.accelerators.launchers import OPEN_MPI
from omnibert.errors import EXIT_LOST_RANK, LostRank, report_lost_rank

__all__ = [
    "OmnibertDDPStrategy",
    "OpenMPIEnvironment",
    "WatchedLauncher",
    "ddp_strategy",
    "how_it_ended",
    "lost_rank",
    "mpi_environment",
]

#: what every lost-rank line ends with
RESUME = "the run stops; resume with ckpt_path=last"
#: the shortest wait for every rank to join the process group at start (seconds)
START_TIMEOUT_S = 600.0
START_TIMEOUT = timedelta(seconds=START_TIMEOUT_S)
#: exit codes of a child that is not lost: finished, or stopped at a safe point like every rank
NOT_LOST = (0, 128 + signal.SIGTERM, 128 + signal.SIGINT)


def how_it_ended(code: int) -> str:
    """``killed by SIGKILL`` for a ``Popen.returncode`` of -9, ``exited with code 1`` for 1."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class _ChildWatcher:
    """One thread per child waiting on it (``Popen.wait``: no polling); see the module
    docstring. :meth:`wait_for_loss` lets the main thread, whose collective failed, learn
    what happened to the child before it reports."""

    def __init__(self, procs: Sequence[subprocess.Popen[Any]], first_rank: int) -> None:
        self.procs = list(procs)
        self.lost: str | None = None
        self._event = threading.Event()
        for offset, proc in enumerate(self.procs):
            threading.Thread(
                target=self._watch, args=(proc, first_rank + offset), daemon=True,
                name=f"omnibert-watch-rank-{first_rank + offset}",
            ).start()  # fmt: skip

    def _watch(self, proc: subprocess.Popen[Any], rank: int) -> None:
        code = proc.wait()
        if code in NOT_LOST:
            return
        self.lost = f"rank {rank} (pid {proc.pid}) was lost: {how_it_ended(code)}"
        self._event.set()
        if report_lost_rank(f"{self.lost}; {RESUME}"):
            self.kill_all()
            sys.stdout.flush()
            os._exit(EXIT_LOST_RANK)  # the main thread may be inside a collective that waits

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()

    def wait_for_loss(self, timeout: float) -> str | None:
        self._event.wait(timeout)
        return self.lost


#: the watcher of this process's children (rank 0 under Lightning's launcher), if any
_WATCHER: list[_ChildWatcher] = []


class WatchedLauncher(_SubprocessScriptLauncher):
    """Lightning's launcher of the node's other ranks, with :class:`_ChildWatcher` in place
    of Lightning's observer."""

    def launch(
        self, function: Callable[..., Any], *args: Any, trainer: Any = None, **kwargs: Any
    ) -> Any:
        self.cluster_environment.validate_settings(
            num_devices=self.num_processes, num_nodes=self.num_nodes
        )
        if not self.cluster_environment.creates_processes_externally:
            self._call_children_scripts()
            first = self.cluster_environment.node_rank() * self.num_processes + 1
            _WATCHER[:] = [_ChildWatcher(self.procs, first)]
        _set_num_threads_if_needed(num_processes=self.num_processes)
        return function(*args, **kwargs)


class OmnibertDDPStrategy(CompileAllowance, DDPStrategy):
    """``DDPStrategy`` whose launcher is :class:`WatchedLauncher`; ``timeout`` bounds the
    start (every rank joining the process group), ``collective_timeout`` (None: the same)
    each collective once all have joined, ``compile_allowance`` (None: none) those of the
    first steps (:class:`~omnibert.accelerators.compile_allowance.CompileAllowance`);
    ``optimizer_sharding`` (``accelerator.optimizer_sharding``): ``zero1`` has the task
    partition the optimiser over the ranks (:attr:`optimizer_partition_group`)."""

    def __init__(self, *args: Any, optimizer_sharding: str = "none", **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.optimizer_sharding = optimizer_sharding

    @property
    def optimizer_partition_group(self) -> Any:
        """The process group the task partitions the optimiser over (every rank: DDP's
        group) under ``optimizer_sharding=zero1`` (:mod:`omnibert.optim.zero1`); else None."""
        if self.optimizer_sharding != "zero1":
            return None
        return torch.distributed.group.WORLD

    def setup_distributed(self) -> None:
        joined = torch.distributed.is_initialized()  # a second fit or validate: joined
        store = None if joined else agent_store(self._timeout or START_TIMEOUT)
        if store is not None:  # joined here; Lightning's setup then finds the group made
            self.set_world_ranks()
            wait = self._timeout or START_TIMEOUT
            torch.distributed.init_process_group(
                self._get_process_group_backend(), rank=self.global_rank,
                store=store_of_this_start(store, self.global_rank, self.world_size, wait),
                world_size=self.world_size, timeout=self._timeout,
            )  # fmt: skip
        super().setup_distributed()
        self.apply_collective_timeout()

    def _configure_launcher(self) -> None:
        super()._configure_launcher()
        if type(self._launcher) is _SubprocessScriptLauncher:
            assert self.cluster_environment is not None
            self._launcher = WatchedLauncher(
                self.cluster_environment, self.num_processes, self.num_nodes
            )


class OpenMPIEnvironment(ClusterEnvironment):
    """Ranks from Open MPI's ``mpirun`` (``OMPI_COMM_WORLD_*``), without mpi4py. The address
    and port of rank 0 come from ``MASTER_ADDR`` / ``MASTER_PORT`` (``mpirun -x
    MASTER_ADDR=<first host> -x MASTER_PORT=29500``); on one node they default to
    127.0.0.1 and 29500. Nodes are filled in order (``--map-by slot``, mpirun's default), so
    the node rank is the global rank divided by the processes per node."""

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "29500"))

    @staticmethod
    def detect() -> bool:
        return all(key in os.environ for key in OPEN_MPI)

    def world_size(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_SIZE"])

    def set_world_size(self, size: int) -> None:
        pass  # mpirun decides

    def global_rank(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_RANK"])

    def set_global_rank(self, rank: int) -> None:
        pass  # mpirun decides

    def local_rank(self) -> int:
        return int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])

    def node_rank(self) -> int:
        return self.global_rank() // int(os.environ["OMPI_COMM_WORLD_LOCAL_SIZE"])


def mpi_environment() -> OpenMPIEnvironment | None:
    """:class:`OpenMPIEnvironment` under Open MPI's ``mpirun``, else None (Lightning finds
    the others itself): for the strategies built elsewhere (FSDP, Gaudi's)."""
    return OpenMPIEnvironment() if OpenMPIEnvironment.detect() else None


def ddp_strategy(timeout_s: float, **kwargs: Any) -> DDPStrategy:
    """The DDP strategy of the module docstring, ``kwargs`` passed on. The ranks wait for
    each other at start for at least :data:`START_TIMEOUT_S` (one rank may still be loading
    and checking its data while another waits); each collective after that waits
    ``timeout_s``, those of the first steps at least ``COMPILE_ALLOWANCE_S`` (a peer may
    still be compiling)."""
    env = mpi_environment()
    return OmnibertDDPStrategy(
        timeout=timedelta(seconds=max(timeout_s, START_TIMEOUT_S)),
        collective_timeout=timedelta(seconds=timeout_s),
        compile_allowance=compile_allowance(timeout_s),
        cluster_environment=env,
        **kwargs,
    )


_CLOSED = re.compile(
    r"(Connection (?:reset|closed) by peer|Broken pipe|remote process exiting prematurely"
    r"|NCCL communicator was aborted)",
    re.IGNORECASE,
)
_TIMED_OUT = re.compile(r"Timed out waiting (\d+)\s*ms|timed out after (\d+)\s*ms", re.IGNORECASE)


def lost_rank(
    error: BaseException, rank: int, world_size: int, timeout_s: float | None
) -> LostRank | None:
    """The :class:`~omnibert.errors.LostRank` that ``error``, raised by a collective on
    ``rank`` of ``world_size``, means; None when it is another error. Rank 0 under
    Lightning's launcher first asks its watcher what happened to its child (it says how the
    child died); elsewhere the line names the other rank when there are two."""
    if world_size <= 1 or not isinstance(error, RuntimeError):
        return None
    text = str(error)
    closed, timed_out = _CLOSED.search(text), _TIMED_OUT.search(text)
    if closed is None and timed_out is None:
        return None
    if _WATCHER:  # rank 0 under Lightning's launcher: a dead child says how it died
        known = _WATCHER[0].wait_for_loss(timeout=30.0 if timed_out is None else 0.0)
        _WATCHER[0].kill_all()
        if known is not None:
            return LostRank(f"{known}; {RESUME}")
    other = f"rank {1 - rank}" if world_size == 2 else "another rank"
    if timed_out is not None:
        waited = int(timed_out.group(1) or timed_out.group(2)) / 1000
        if timeout_s is None:
            seconds = f"{waited:g} s"
        elif waited > timeout_s + 1:  # in the first steps (compile_allowance)
            seconds = f"{waited:g} s, the first steps' allowance for compiling"
        else:
            seconds = f"{timeout_s:g} s, accelerator.timeout_s"
        return LostRank(f"{other} stopped responding (no collective for {seconds}); {RESUME}")
    assert closed is not None
    return LostRank(
        f"{other} was lost: rank {rank}'s connection to it closed ({closed.group(1)}); {RESUME}"
    )
