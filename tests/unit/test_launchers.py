"""Which launcher started a process, a launch that does not match the config, the
process-group timeout, and the one line a failed collective becomes (no processes: the real
multi-process runs are tests/e2e/test_ranks.py)."""

from __future__ import annotations

from datetime import timedelta

import lightning.pytorch as pl
import pytest
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment

from omnibert.accelerators.base import AcceleratorError
from omnibert.accelerators.cpu import CPUPlugin
from omnibert.accelerators.ddp import (
    START_TIMEOUT_S,
    OmnibertDDPStrategy,
    OpenMPIEnvironment,
    how_it_ended,
    lost_rank,
)
from omnibert.accelerators.environment import format_report
from omnibert.accelerators.gpu import GPUPlugin
from omnibert.accelerators.launchers import LaunchError, check_launch_layout, detect_launcher
from omnibert.apps.compose import compose
from omnibert.config import TrainConfig
from omnibert.config.sections import ConfigError
from omnibert.run.launching.slurm import check_slurm_layout

TORCHRUN = {"RANK": "1", "GROUP_RANK": "0", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
            "WORLD_SIZE": "2"}  # fmt: skip
MPI = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
       "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}  # fmt: skip
#: what srun sets in the task of node 1 of a 2-node job with one task per node
#: (``sbatch --nodes=2 --ntasks-per-node=1``)
SLURM_2_NODES = {
    "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain", "SLURM_NNODES": "2",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2",
    "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_NODELIST": "node[1-2]", "SLURMD_NODENAME": "node2",
}  # fmt: skip


@pytest.mark.parametrize(
    ("env", "devices", "nodes", "text"),
    [
        ({}, 1, 1, "single process"),
        ({}, 2, 1, "lightning: world size 2, rank 0 (local rank 0 of 2); this process starts "
                   "the other 1 of this node"),
        ({"LOCAL_RANK": "1", "NODE_RANK": "1"}, 2, 2, "lightning: world size 4, rank 3 "
                                                      "(local rank 1 of 2, node 1 of 2)"),
        (TORCHRUN, 2, 1, "torchrun: world size 2, rank 1 (local rank 1 of 2)"),
        ({**TORCHRUN, "GROUP_RANK": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}, 1, 2,
         "torchrun: world size 2, rank 1 (local rank 0 of 1, node 1 of 2)"),
        (MPI, 2, 2, "mpirun (Open MPI): world size 4, rank 3 (local rank 1 of 2, node 1 of 2)"),
        ({"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
          "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NAME": "train"}, 2, 1,
         "slurm: world size 2, rank 1 (local rank 1 of 2)"),
        (SLURM_2_NODES, 1, 2, "slurm: world size 2, rank 1 (local rank 0 of 1, node 1 of 2)"),
    ],
    ids=["single", "lightning-rank0", "lightning-child", "torchrun", "torchrun-2-nodes",
         "mpirun", "slurm", "slurm-2-nodes"],
)  # fmt: skip
def test_the_launcher_is_found_and_said_in_one_line(env, devices, nodes, text):
    assert detect_launcher(devices, nodes, env).describe(devices, nodes) == text


@pytest.mark.parametrize(
    ("env", "devices", "nodes", "names"),
    [
        (TORCHRUN, 1, 1, ("torchrun started 2 processes on this node", "accelerator.devices=2")),
        (TORCHRUN, 2, 2, ("torchrun started 2 processes in all", "accelerator.num_nodes=1")),
        (MPI, 2, 1, ("mpirun (Open MPI) started 4 processes in all", "accelerator.num_nodes=2")),
        (MPI, 4, 1, ("mpirun (Open MPI) started 2 processes on this node",
                     "accelerator.devices=2")),
    ],
)  # fmt: skip
def test_a_launch_that_does_not_match_the_config_is_one_sentence(env, devices, nodes, names):
    with pytest.raises(LaunchError) as info:
        check_launch_layout("cpu", devices, nodes, env)
    message = str(info.value)
    assert message.count(". ") == 0 and message.endswith(".")
    assert all(name in message for name in names), message
    assert check_launch_layout("cpu", 2, 1, TORCHRUN).name == "torchrun"
    assert check_launch_layout("cpu", 2, 2, MPI).rank == 3


def test_the_ddp_strategy_carries_timeout_s_and_open_mpis_ranks(monkeypatch):
    for plugin in (CPUPlugin(devices=2, timeout_s=42), GPUPlugin(devices=2, timeout_s=42),
                   CPUPlugin(devices=2, strategy="ddp", timeout_s=42)):  # fmt: skip
        strategy = plugin.trainer_kwargs("32-true")["strategy"]
        assert isinstance(strategy, OmnibertDDPStrategy)
        assert strategy._timeout == timedelta(seconds=START_TIMEOUT_S)  # the start
        assert strategy.collective_timeout == timedelta(seconds=42)  # each collective
        assert strategy.cluster_environment is None  # Lightning chooses
    assert CPUPlugin(devices=2, timeout_s=900).trainer_kwargs("32-true")["strategy"]._timeout == (
        timedelta(seconds=900)
    )
    for key, value in {**MPI, "MASTER_ADDR": "node0"}.items():
        monkeypatch.setenv(key, value)
    env = (
        CPUPlugin(devices=2, num_nodes=2).trainer_kwargs("32-true")["strategy"].cluster_environment
    )
    assert isinstance(env, OpenMPIEnvironment) and env.creates_processes_externally
    assert (env.world_size(), env.global_rank(), env.local_rank(), env.node_rank()) == (4, 3, 1, 1)
    assert (env.main_address, env.main_port) == ("node0", 29500)


def test_slurms_2_node_layout_gives_each_task_its_rank_node_and_rank_0s_address(monkeypatch):
    """The task of node 1 of ``sbatch --nodes=2 --ntasks-per-node=1`` (``srun`` in
    scripts/slurm/pretrain.sbatch): Lightning's ``SLURMEnvironment`` under omnibert's DDP
    strategy, the address and port of rank 0 derived from the node list and the job id as
    the sbatch script leaves them (tests/e2e/test_elastic.py trains it)."""
    for key in ("MASTER_ADDR", "MASTER_PORT"):  # Lightning sets them: undone after the test
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    for key, value in SLURM_2_NODES.items():
        monkeypatch.setenv(key, value)
    check_slurm_layout("cpu", 1, 2)
    from lightning.fabric.utilities import rank_zero
    from lightning_utilities.core import rank_zero as utilities_rank_zero

    for module in (rank_zero, utilities_rank_zero):  # the Trainer makes this process rank 1
        monkeypatch.setattr(module.rank_zero_only, "rank", module.rank_zero_only.rank)
    trainer = pl.Trainer(**CPUPlugin(devices=1, num_nodes=2).trainer_kwargs("32-true"),
                         logger=False, enable_checkpointing=False)  # fmt: skip
    strategy = trainer.strategy
    assert isinstance(strategy, OmnibertDDPStrategy)
    assert isinstance(strategy.cluster_environment, SLURMEnvironment)
    layout = (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank)
    assert layout == (2, 1, 0, 1)
    environment = strategy.cluster_environment
    assert (environment.main_address, environment.main_port) == ("node1", 15000 + 4242)


@pytest.mark.parametrize("value", [0, -1, "abc", True])
def test_timeout_s_out_of_range_is_one_sentence(value):
    with pytest.raises(AcceleratorError, match=r"accelerator\.timeout_s=.* positive number"):
        CPUPlugin(timeout_s=value)
    cfg = compose("pretrain", ["experiment=smoke", f"accelerator.timeout_s={value}"])
    with pytest.raises(ConfigError, match=r"^accelerator\.timeout_s=.* fix accelerator\.timeout_s"):
        TrainConfig.of(cfg)


RESET = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:537] Read error "
         "[127.0.0.1]:50601: Connection reset by peer. This is typically caused by a remote "
         "worker hanging or bugs in the application.")  # fmt: skip
TIMED_OUT = ("[/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
             "waiting 10000ms for recv operation to complete")  # fmt: skip
RESUME = "; the run stops; resume with ckpt_path=last"


@pytest.mark.parametrize(
    ("error", "rank", "world", "line"),
    [
        (RuntimeError(RESET), 0, 2, "rank 1 was lost: rank 0's connection to it closed "
                                    f"(Connection reset by peer){RESUME}"),
        (torch.distributed.DistBackendError(RESET), 1, 3, "another rank was lost: rank 1's "
         f"connection to it closed (Connection reset by peer){RESUME}"),
        (RuntimeError(TIMED_OUT), 1, 2, "rank 0 stopped responding (no collective for 10 s, "
                                        f"accelerator.timeout_s){RESUME}"),
        (RuntimeError(RESET), 0, 1, None),  # one process: not a lost rank
        (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), 0, 2, None),
        (ValueError(RESET), 0, 2, None),
    ],
)  # fmt: skip
def test_a_failed_collective_becomes_one_line(error, rank, world, line):
    lost = lost_rank(error, rank, world, 10)
    assert (None if lost is None else str(lost)) == line


def test_how_a_child_ended_and_the_launcher_in_the_report():
    assert how_it_ended(-9) == "killed by SIGKILL"
    assert how_it_ended(1) == "exited with code 1"
    report = CPUPlugin(devices=2).environment()
    assert report["launcher"]["name"] == "lightning"
    assert report["accelerator"]["timeout_s"] == 300
    assert "  launcher      lightning: world size 2, rank 0" in format_report(report)
