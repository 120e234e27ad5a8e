"""Many processes, one run, in real ``torchrun`` groups of two CPU processes (gloo), dropout
0.1 as every shipped recipe has it, a checkpoint every step:

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
* two nodes on one host: two torchrun node agents (``--nnodes 2 --nproc_per_node 1``, a c10d
  rendezvous on localhost) train to the weights of the single-node two-process run.

Two launches (module fixtures) serve every assertion: the uninterrupted run is the two-node
one, and the restarted single-node run ends bitwise where it ends, which shows both that the
restart resumes exactly and that two nodes train as one node's two processes (an
uninterrupted single-node run would be a third launch; a break in either claim fails both
tests that compare them).
"""

from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
from test_ranks import ARGS, STEPS, _finish, _free_port, started
from training_state import assert_same_training_state, load_state

from omnibert.config import TrainConfig
from omnibert.errors import UserError, exit_on, set_process_rank
from omnibert.run.pretraining.job import prepare
from omnibert.stopping import Stopped
from omnibert.tasks.rng_states import RANKS_KEY, RNG_KEY, states_for_rank

BIN = Path(sys.executable).parent
#: test_ranks' 6 smoke steps with a checkpoint after each, with dropout 0.1
RUN = (*(arg for arg in ARGS if "dropout" not in arg), "model.config.hidden_dropout_prob=0.1",
       "model.config.attention_probs_dropout_prob=0.1")  # fmt: skip
KILL = ("+callbacks.kill._target_=faults.KillAtStep", "+callbacks.kill.step=3",
        "+callbacks.kill.rank=1")  # fmt: skip


def _torchrun(root: Path, *extra: str, restarts: int) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--max-restarts", str(restarts), str(BIN / "omnibert-train"), *RUN,
        "accelerator.devices=2", f"paths.output_root={root}", *extra,
    ]  # fmt: skip


def _last(root: Path) -> Path:
    return root / "smoke" / "checkpoints" / "last.ckpt"


def _node_agent(root: Path, node: int, port: int) -> list[str]:
    """One of two torchrun node agents on this host: one process each, a c10d rendezvous."""
    per_rank = f"hydra.run.dir={root.parent / 'hydra-rank'}${{oc.env:RANK}}"  # each rank's own
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc_per_node", "1",
        "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}", "--node-rank",
        str(node), "--max-restarts", "0", str(BIN / "omnibert-train"), *RUN,
        "accelerator.devices=1", "accelerator.num_nodes=2", f"paths.output_root={root}", per_rank,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, list[str], Path]:
    """The uninterrupted run, on two nodes of one process each: exit code, every output line
    of both node agents, the output root."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    port = _free_port()
    with started(_node_agent(tmp / "runs", 1, port), tmp, "node-1") as other:
        code, lines = _finish(_node_agent(tmp / "runs", 0, port), tmp, "node-0")
        other_code, other_lines = other.finish()
    assert code == other_code == 0, "\n".join([*lines, "--- node 1:", *other_lines])
    return code, [*lines, *other_lines], tmp / "runs"


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
    assert_same_training_state(load_state(_last(uninterrupted[2])), got, STEPS)
    # each rank drew its own dropout masks: rank 0's states would not have done for rank 1
    ranks = got[RANKS_KEY]
    assert len(ranks) == 2 and torch.equal(ranks[0]["torch"], got[RNG_KEY]["torch"])
    assert not torch.equal(ranks[0]["torch"], ranks[1]["torch"])


def test_two_node_agents_train_to_the_weights_of_one_nodes_two_processes(uninterrupted, restarted):
    """``torchrun --nnodes 2 --nproc_per_node 1`` twice on this host, against the single-node
    ``--nproc_per_node 2`` run (restarted once, which the test above shows changes nothing)."""
    _, lines, root = uninterrupted
    layouts = [line.split("launcher", 1)[1].strip() for line in lines
               if line.startswith("  launcher  ")]  # fmt: skip
    assert layouts == ["torchrun: world size 2, rank 0 (local rank 0 of 1, node 0 of 2)"], (
        "\n".join(lines)
    )
    two_nodes, one_node = load_state(_last(root)), load_state(_last(restarted[2]))
    assert_same_training_state(one_node, two_nodes, STEPS)


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
    _, lines, root = uninterrupted
    text = "\n".join(lines)
    for first in ("omnibert-train: environment", "omnibert-train: smoke", "  resume from  ",
                  "omnibert-train: done, 6 steps", "  validation    MLM accuracy"):  # fmt: skip
        assert sum(line.startswith(first) for line in lines) == 1, (first, text)
    # nothing of rank 1's: neither its lines nor Lightning's or the loggers' on its behalf
    assert not [line for line in lines if line.startswith("rank 1:") or "RANK: 1" in line], text
    rank0, rank1 = root.parent / "hydra-rank0", root.parent / "hydra-rank1"
    for name in ("summary.json", "plan.json", "environment.json"):
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
