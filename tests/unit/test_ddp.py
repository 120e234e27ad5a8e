"""Multi-process data parallelism and SLURM.

Two CPU processes train to the same weights as one process with the same global batch and
seed (tests/e2e/test_ranks.py, against its two-process reference run); the ranks read disjoint rows whose union is the
one-process global batch; a SLURM job whose task layout does not match the accelerator
config is refused at start; the submitit launcher config gives SLURM the accelerator's shape.
"""

from __future__ import annotations

import os

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfigError
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.generated import GeneratedSource
from omnibert.run.launching.slurm import check_slurm_layout

# experiment=smoke (global batch 8, 6 steps) without dropout: with dropout each rank would
# draw its own masks, which no single process reproduces. One masked position per row: the
# masked-LM loss is a mean over each micro-batch's masked positions, and one process splits a
# step's 8 rows into micro-batches differently from two ranks (rows 0-3 | 4-7 against
# 0,2,4,6 | 1,3,5,7), so rows with different mask counts would be weighted differently.
# With the same count in every row the two weightings are the same.
SMOKE = (
    "experiment=smoke",
    "data.num_workers=0",
    "phase.max_predictions_per_seq=1",
    "model.config.hidden_dropout_prob=0",
    "model.config.attention_probs_dropout_prob=0",
    "callbacks.checkpoint.every_n_train_steps=6",
)


def _rows(dm: PretrainingDataModule, rank: int, world: int, batches: int) -> list[list[tuple]]:
    """The first ``batches`` training batches of ``rank``, each as its rows' token tuples."""
    dm.rank, dm.world_size = rank, world
    loader = dm.train_dataloader()
    out = []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        out.append([tuple(row.tolist()) for row in batch["input_ids"]])
    return out


def test_ranks_read_disjoint_rows_that_make_up_the_single_process_global_batch():
    settings = dict(vocab_size=128, max_seq_length=32, max_predictions_per_seq=5, seed=7)
    dm = PretrainingDataModule(
        source=GeneratedSource, micro_batch_size=4, num_train_samples=64, **settings
    )
    dm.check()
    steps = 8  # a whole epoch: 64 rows = 8 global batches of 8
    single = _rows(dm, rank=0, world=1, batches=2 * steps)  # 2 micro-batches per step
    rank0 = _rows(dm, rank=0, world=2, batches=steps)
    rank1 = _rows(dm, rank=1, world=2, batches=steps)
    assert len(rank0) == len(rank1) == steps
    seen: list[tuple] = []
    for step in range(steps):
        both = rank0[step] + rank1[step]
        assert not set(rank0[step]) & set(rank1[step])  # no row on both ranks
        assert sorted(both) == sorted(single[2 * step] + single[2 * step + 1])
        seen += both
    assert len(seen) == len(set(seen)) == 64  # the epoch covers every row exactly once


# ------------------------------------------------------------------------------ SLURM

SLURM = {"SLURM_NTASKS": "8", "SLURM_JOB_NAME": "pretrain", "SLURM_NNODES": "2"}


def test_slurm_layout_matching_the_accelerator_passes():
    check_slurm_layout("gpu", 4, 2, {**SLURM, "SLURM_NTASKS_PER_NODE": "4"})
    check_slurm_layout("ipu", 4, 2, {**SLURM, "SLURM_NTASKS_PER_NODE": "1"})  # one host process
    check_slurm_layout("gpu", 4, 2, {})  # not under SLURM
    interactive = {**SLURM, "SLURM_JOB_NAME": "bash", "SLURM_NTASKS_PER_NODE": "1"}
    check_slurm_layout("gpu", 4, 2, interactive)  # salloc + python: Lightning launches


@pytest.mark.parametrize(
    ("accelerator", "devices", "nodes", "env", "names"),
    [
        ("gpu", 8, 2, {"SLURM_NTASKS_PER_NODE": "4"}, ("SLURM_NTASKS_PER_NODE", "devices=4")),
        ("ipu", 4, 2, {"SLURM_NTASKS_PER_NODE": "4"}, ("--ntasks-per-node=1",)),
        ("cpu", 4, 1, {"SLURM_NTASKS_PER_NODE": "4"}, ("SLURM_NNODES", "num_nodes=2")),
    ],
)
def test_slurm_layout_that_differs_is_one_sentence(accelerator, devices, nodes, env, names):
    with pytest.raises(TrainConfigError) as info:
        check_slurm_layout(accelerator, devices, nodes, {**SLURM, **env})
    message = str(info.value)
    assert message.count(". ") == 0 and message.endswith(".")
    assert all(name in message for name in names), message


def test_the_app_refuses_a_mismatched_slurm_job_before_writing(
    tmp_path, monkeypatch, capsys, compose_config
):
    for key, value in {**SLURM, "SLURM_NNODES": "1", "SLURM_NTASKS_PER_NODE": "2"}.items():
        monkeypatch.setenv(key, value)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as info:
        run_or_exit(compose_config("experiment=smoke", f"paths.output_root={tmp_path}"), out)
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "SLURM_NTASKS_PER_NODE" in err[0], err
    assert "accelerator.devices=2" in err[0]
    assert not out.exists()


def test_the_submitit_launcher_takes_the_job_shape_from_the_accelerator(tmp_path, monkeypatch):
    """Compose hydra/launcher=slurm_gpu and let the real launcher build its sbatch script (a
    fake ``srun`` on PATH lets submitit believe it is on a cluster; nothing is submitted)."""
    import submitit

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    srun = fake_bin / "srun"
    srun.write_text("#!/bin/sh\necho 'FAKE srun for omnibert tests' >&2\nexit 1\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake_bin}{os.pathsep}{os.environ['PATH']}")
    cfg = compose(
        "pretrain",
        [
            "hydra/launcher=slurm_gpu",
            "accelerator=gpu",
            "accelerator.devices=4",
            "accelerator.num_nodes=2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}",
            "hydra.launcher.partition=p1",
        ],
        return_hydra_config=True,
    )
    launcher = instantiate(cfg.hydra.launcher)
    launcher.setup(hydra_context=None, task_function=None, config=cfg)
    scripts = []

    def capture(executor, fn, *args):  # what map_array would submit with sbatch
        scripts.append(executor._executor._make_submission_file_text("CMD", "uid"))
        raise KeyboardInterrupt

    monkeypatch.setattr(submitit.AutoExecutor, "map_array", capture)
    with pytest.raises(KeyboardInterrupt):
        launcher.launch([["micro_batch_size=4"]], initial_job_idx=0)
    (script,) = scripts
    for line in (
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --nodes=2",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=p1",
    ):
        assert line in script.splitlines(), script
    assert OmegaConf.select(cfg, "hydra.launcher.tasks_per_node") == 4
