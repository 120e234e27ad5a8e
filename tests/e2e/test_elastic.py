"""Many processes, one run, in real groups of two CPU processes (gloo), dropout 0.1 as every
shipped recipe has it, a checkpoint every step:

* a launcher's restart resumes by itself (``ckpt_path=auto``): rank 1 SIGKILLed after step
  3's checkpoint (tests/faults.py's ``KillAtStep``: by step, never by time), torchrun
  (``--max-restarts 3``) starts the group again, both ranks find
  ``TORCHELASTIC_RESTART_COUNT=1`` and resume ``last.ckpt``, and torchrun exits 0;
* every rank's RNG states are in the checkpoint and each rank resumes its own: the restarted
  run ends bitwise where the uninterrupted run ends although each rank draws its own dropout
  masks; a checkpoint with rank 0's states only (older omnibert's) still resumes, and the
  plan says so;
* one voice: rank 0 alone prints the plan, the progress and the summary and writes the
  run's files (each rank given a Hydra directory of its own to show it); another rank's
  error is its own line, named by its rank;
* two nodes on one host under an elastic restart of one node agent: two torchrun node
  agents (``--nnodes 2 --nproc_per_node 1``, a c10d rendezvous on localhost), the worker of
  one SIGKILLed after step 3's checkpoint; both agents start the group again (the other one
  because the first one did, its restart count still 0), both ranks resume by themselves and
  the run ends bitwise where one node's two processes end;
* SLURM's 2-node layout through the environment SLURM sets: scripts/slurm/pretrain.sbatch
  run as the batch script of ``sbatch --nodes=2 --ntasks-per-node=1`` (the job's variables)
  with an ``srun`` that starts one task per node with the variables ``srun`` adds (this host
  runs no SLURM of two nodes; tests/unit/test_launchers.py checks each task's ranks, nodes
  and rank 0's address): the same weights.

Three launches serve every assertion: the uninterrupted run is the SLURM-layout one (module
fixture), and the single-node torchrun run restarted once (module fixture) and the two-node
torchrun run restarted once each end bitwise where it ends. Together they show that a
restart resumes exactly and that two torchrun nodes and two SLURM nodes train as one node's
two processes (a break in any claim fails the tests that compare them).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import socket
import sys
from pathlib import Path

import pytest
import torch
from test_ranks import ARGS, ENV, STEPS, _finish, _free_port, started
from test_signals import started as started_with
from training_state import assert_same_training_state, load_state

from omnibert.config import TrainConfig
from omnibert.errors import UserError, exit_on, set_process_rank
from omnibert.run.pretraining.job import prepare
from omnibert.stopping import Stopped
from omnibert.tasks.rng_states import RANKS_KEY, RNG_KEY, states_for_rank

BIN = Path(sys.executable).parent
SBATCH = Path(__file__).resolve().parents[2] / "scripts" / "slurm" / "pretrain.sbatch"
#: test_ranks' 6 smoke steps with a checkpoint after each, with dropout 0.1
RUN = (*(arg for arg in ARGS if "dropout" not in arg), "model.config.hidden_dropout_prob=0.1",
       "model.config.attention_probs_dropout_prob=0.1")  # fmt: skip
KILL = ("+callbacks.kill._target_=faults.KillAtStep", "+callbacks.kill.step=3",
        "+callbacks.kill.rank=1")  # fmt: skip
#: the files of a run, which rank 0 alone writes
RUN_FILES = ("summary.json", "plan.json", "environment.json")


def _torchrun(root: Path, *extra: str, restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--max-restarts", str(restarts), str(BIN / "omnibert-train"), *RUN,
        "accelerator.devices=2", f"paths.output_root={root}", *extra,
    ]  # fmt: skip


def _last(root: Path) -> Path:
    return root / "smoke" / "checkpoints" / "last.ckpt"


def _layouts(lines: list[str]) -> list[str]:
    return [line.split("launcher", 1)[1].strip() for line in lines
            if line.startswith("  launcher  ")]  # fmt: skip


def _node_agent(root: Path, node: int, port: int) -> list[str]:
    """One of two torchrun node agents on this host: one process each, a c10d rendezvous,
    rank 1 SIGKILLed after step 3 and the group started again."""
    per_rank = f"hydra.run.dir={root.parent / 'hydra-rank'}${{oc.env:RANK}}"  # each rank's own
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--node-rank",
        str(node), "--max-restarts", "3", str(BIN / "omnibert-train"), *RUN,
        "accelerator.devices=1", "accelerator.num_nodes=2", f"paths.output_root={root}", per_rank,
        *KILL,
    ]  # fmt: skip


def _slurm_job_id() -> str:
    """A job id whose port for rank 0 (Lightning's ``SLURMEnvironment``: 15000 + the id's last
    four digits where ``MASTER_PORT`` is unset, as scripts/slurm/pretrain.sbatch leaves it) is
    free here."""
    for port in random.sample(range(15000, 25000), 200):
        with socket.socket() as probe:
            try:
                probe.bind(("", port))
            except OSError:
                continue
        return f"9{port - 15000:04d}"
    raise AssertionError("no free port between 15000 and 24999")


#: ``srun`` in a job of two nodes with one task each, both nodes this host: each task started
#: with the variables ``srun`` adds to the job's, and srun's exit status the tasks' worst
SRUN = """#!/usr/bin/env bash
pids=()
for task in 0 1; do
  SLURM_PROCID=$task SLURM_NODEID=$task SLURM_LOCALID=0 SLURM_STEP_NUM_NODES=2 \\
    SLURM_STEP_NUM_TASKS=2 "$@" &
  pids+=($!)
done
code=0
for pid in "${pids[@]}"; do wait "$pid" || code=$?; done
exit $code
"""


def _sbatch_job(tmp: Path, root: Path) -> dict[str, str]:
    """What ``sbatch --nodes=2 --ntasks-per-node=1`` sets for the batch script (both nodes
    named for this host; the first is rank 0's address, as Lightning reads the list), and
    scripts/slurm/pretrain.sbatch's own variables; ``srun`` (:data:`SRUN`) first on ``PATH``."""
    bin_dir = tmp / "slurm-bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(SRUN)
    (bin_dir / "srun").chmod(0o755)
    return {
        **ENV, "PATH": f"{bin_dir}{os.pathsep}{BIN}{os.pathsep}{os.environ['PATH']}",
        "SLURM_JOB_ID": _slurm_job_id(), "SLURM_JOB_NAME": "omnibert-pretrain",
        "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NODELIST": "localhost,127.0.0.1", "SLURM_NODELIST": "localhost,127.0.0.1",
        "ACCELERATOR": "cpu", "RUN_NAME": "smoke", "OUTPUT_ROOT": str(root),
    }  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The uninterrupted run: scripts/slurm/pretrain.sbatch as a 2-node, 1-task-per-node job
    would run it (``srun`` starts a task per node, each with its node's variables), a Hydra
    directory per task: every output line of both tasks, the output root."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    root = tmp / "runs"
    per_task = f"hydra.run.dir={tmp / 'hydra-task'}${{oc.env:SLURM_PROCID}}"
    command = ["bash", str(SBATCH), *RUN, per_task]
    with started_with(command, tmp, "sbatch", env=_sbatch_job(tmp, root), grace=60) as job:
        code, lines = job.finish()
    assert code == 0, "\n".join(lines)
    return lines, root


@pytest.fixture(scope="module")
def restarted(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[str], Path]:
    """The run whose rank 1 is killed, restarted by torchrun: exit code, lines, output root."""
    tmp = tmp_path_factory.mktemp("restarted")
    command = _torchrun(tmp / "runs", f"hydra.run.dir={tmp / 'hydra'}", *KILL, restarts=3)
    code, lines = _finish(command, tmp, "restarted")
    return code, lines, tmp / "runs"


def test_a_torchrun_restart_resumes_by_itself_bitwise_with_dropout(restarted, uninterrupted):
    code, lines, root = restarted
    text = "\n".join(lines)
    assert code == 0, text
    assert sum("KillAtStep: SIGKILL at global step 3" in line for line in lines) == 1, text
    # the first start was fresh; the restart resumed step 3 and says why
    starts = [
        line.split("resume from", 1)[1].strip() for line in lines if "  resume from  " in line
    ]
    why = "torchrun restarted the group (TORCHELASTIC_RESTART_COUNT=1), so ckpt_path=auto"
    assert set(starts) == {"fresh run", f"{_last(root)} ({why}: this run's last checkpoint)"}
    assert any(re.search(r"omnibert-train: rank 1 .*was lost", line) for line in lines), text
    got = load_state(_last(root))
    assert_same_training_state(load_state(_last(uninterrupted[1])), got, STEPS)
    # each rank drew its own dropout masks: rank 0's states would not have done for rank 1
    ranks = got[RANKS_KEY]
    assert len(ranks) == 2 and torch.equal(ranks[0]["torch"], got[RNG_KEY]["torch"])
    assert not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


def test_two_node_agents_restarting_after_one_nodes_loss_train_to_one_nodes_weights(
    uninterrupted, tmp_path
):
    """``torchrun --nnodes 2 --nproc_per_node 1 --max-restarts 3`` twice on this host, rank 1
    (the worker of one agent) SIGKILLed after step 3's checkpoint: its agent restarts, the
    other agent restarts because it did (or because its own worker, rank 0, ended on the
    loss), every rank finds that the group joined before (torchrun's store) and resumes;
    both agents exit 0 with the weights of one node's two processes (the uninterrupted run,
    and the single-node torchrun run: the test above)."""
    port, root = _free_port(), tmp_path / "runs"
    with started(_node_agent(root, 1, port), tmp_path, "node-1") as other:
        code, lines = _finish(_node_agent(root, 0, port), tmp_path, "node-0")
        other_code, other_lines = other.finish()
    lines = [*lines, "--- node 1:", *other_lines]
    text = "\n".join(lines)
    assert code == other_code == 0, text
    assert sum("KillAtStep: SIGKILL at global step 3" in line for line in lines) == 1, text
    assert (
        _layouts(lines) == ["torchrun: world size 2, rank 0 (local rank 0 of 1, node 0 of 2)"] * 2
    )
    starts = [
        line.split("resume from", 1)[1].strip() for line in lines if "  resume from  " in line
    ]
    assert len(starts) == 2 and starts.count("fresh run") == 1, text
    (resumed,) = (start for start in starts if start != "fresh run")
    # whichever agent hosts rank 0: one whose worker failed counts a restart, the other not
    assert re.fullmatch(
        rf"{re.escape(str(_last(root)))} \(torchrun restarted the group "
        r"(\(TORCHELASTIC_RESTART_COUNT=[1-3]\)|after another node's restart "
        r"\(TORCHELASTIC_RESTART_COUNT=0 here\)), so ckpt_path=auto: this run's last checkpoint\)",
        resumed,
    ), text
    assert_same_training_state(load_state(_last(uninterrupted[1])), load_state(_last(root)), STEPS)
    # one voice under torchrun too: rank 1's Hydra directory holds none of the run's files
    for name in RUN_FILES:
        assert (tmp_path / "hydra-rank0" / name).is_file(), name
        assert not (tmp_path / "hydra-rank1" / name).exists(), name


def test_slurms_two_node_layout_trains_to_the_weights_of_one_nodes_two_processes(
    uninterrupted, restarted
):
    """The uninterrupted run's tasks (SLURM's 2-node layout) found their ranks and nodes in
    SLURM's variables, and trained to the weights of the single-node torchrun run (restarted
    once, which the first test shows changes nothing)."""
    lines, root = uninterrupted
    assert _layouts(lines) == ["slurm: world size 2, rank 0 (local rank 0 of 1, node 0 of 2)"], (
        "\n".join(lines)
    )
    one_node = load_state(_last(restarted[2]))
    assert_same_training_state(one_node, load_state(_last(root)), STEPS)


def test_a_checkpoint_with_rank_0s_rng_states_only_resumes_and_the_plan_says_so(
    restarted, tmp_path, compose_config
):
    """What omnibert wrote before every rank's states were saved: every rank resumes rank 0's
    (as it did), and the plan names the ranks whose states were not in it."""
    old = load_state(_last(restarted[2]))
    del old[RANKS_KEY]
    path = tmp_path / "older.ckpt"
    torch.save(old, path)
    assert states_for_rank(old, 1) is old[RNG_KEY]
    root = tmp_path / "runs"
    shutil.rmtree(root, ignore_errors=True)
    plan = prepare(TrainConfig.of(compose_config(*RUN, "accelerator.devices=2", f"ckpt_path={path}",
                                  root=root))).plan  # fmt: skip
    assert plan.resume_changes == [
        "RNG states: the checkpoint holds rank 0's only (written before omnibert saved every "
        "rank's); rank 1 goes on from rank 0's states, so it draws rank 0's dropout masks"
    ]


def test_only_rank_0_prints_the_run_and_writes_its_files(uninterrupted):
    lines, root = uninterrupted
    text = "\n".join(lines)
    for first in ("omnibert-train: environment", "omnibert-train: smoke", "  resume from  ",
                  "omnibert-train: done, 6 steps", "  validation    MLM accuracy"):  # fmt: skip
        assert sum(line.startswith(first) for line in lines) == 1, (first, text)
    # nothing of rank 1's: neither its lines nor Lightning's or the loggers' on its behalf
    assert not [line for line in lines if line.startswith("rank 1:") or "RANK: 1" in line], text
    rank0, rank1 = root.parent / "hydra-task0", root.parent / "hydra-task1"
    for name in RUN_FILES:
        assert (rank0 / name).is_file(), name
        assert not (rank1 / name).exists(), name


def test_another_ranks_error_is_named_by_its_rank_and_its_stop_is_not_printed(capsys):
    set_process_rank(1)
    try:
        with pytest.raises(SystemExit) as refused, exit_on("omnibert-train"):
            raise UserError("data.train_path=/x does not exist; fix data.train_path.")
        with pytest.raises(SystemExit) as stopped, exit_on("omnibert-train"):
            raise Stopped(15, " at step 2", "resume with ckpt_path=last")
    finally:
        set_process_rank(None)
    assert refused.value.code == 2 and stopped.value.code == 143
    assert capsys.readouterr().err == (
        "rank 1: omnibert-train: error: data.train_path=/x does not exist; fix data.train_path.\n"
    )
