"""Two phases in one command (``phases``, experiment=smoke_two_phase): phase 2 starts from phase
1's final weights with a fresh optimiser; a re-run skips finished phases and resumes an
interrupted one exactly; every phase's data is checked before anything trains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare as prepare_shards
from omnibert.run.pretraining.job import build_task, prepare
from omnibert.run.pretraining.phases import derive_phases, phase_status

TESTS = Path(__file__).parents[1]
REFERENCE = TESTS / "fixtures" / "reference"
TWO = ("experiment=smoke_two_phase",)


def _ckpt(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def _train(root: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-m", "omnibert.apps.train", *TWO, f"paths.output_root={root}",
         f"hydra.run.dir={root}/hydra", *overrides],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted two-phase run, in this process."""
    root = tmp_path_factory.mktemp("straight")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = run_or_exit(
            compose("pretrain", [*TWO, f"paths.output_root={root}", "accelerator.threads=1"]),
            root / "out",
        )
    finally:
        torch.set_num_threads(threads)
    return {"root": root, "summary": summary}


def test_phase_two_starts_from_phase_one_with_a_fresh_optimiser(straight):
    root, summary = straight["root"], straight["summary"]
    assert set(summary["phases"]) == {"phase1", "phase2"}
    first, second = summary["phases"]["phase1"], summary["phases"]["phase2"]
    assert first["steps"] == 4 and second["steps"] == 2
    assert first["plan"]["data"]["shapes"]["input_ids"] == [4, 32]
    assert second["plan"]["data"]["shapes"]["input_ids"] == [4, 64]
    phase1_last = root / "smoke-phase1" / "checkpoints" / "last.ckpt"
    assert second["plan"]["init_from"] == str(phase1_last.resolve())
    end = _ckpt(root / "smoke-phase2" / "checkpoints" / "last.ckpt")
    assert end["hyper_parameters"]["init_from"] == str(phase1_last.resolve())
    # fresh optimiser: its step counts are phase 2's alone (LAMB counts per group)
    assert [g["step"] for g in end["optimizer_states"][0]["param_groups"]] == [2, 2]
    assert end["global_step"] == 2
    assert (root / "out" / "phase1" / "plan.json").is_file()
    assert (root / "out" / "phase2" / "summary.json").is_file()


def test_phase_two_takes_phase_one_final_weights(straight, tmp_path):
    cfg = compose("pretrain", [*TWO, f"paths.output_root={tmp_path}"])
    (_, _), (_, phase2) = derive_phases(cfg)
    phase1_last = straight["root"] / "smoke-phase1" / "checkpoints" / "last.ckpt"
    task, loaded = build_task(prepare(TrainConfig.of(compose_with(phase2, phase1_last))))
    assert "fresh optimiser" in loaded
    weights = {k.removeprefix("model."): v for k, v in _ckpt(phase1_last)["state_dict"].items()}
    for name, value in task.model.state_dict().items():
        assert torch.equal(value, weights[name]), name


def compose_with(cfg, init_from: Path):
    from omegaconf import OmegaConf

    return OmegaConf.merge(cfg, {"phase": {"init_from": str(init_from)}})


def test_a_rerun_skips_finished_phases(straight, capsys):
    root = straight["root"]
    before = sorted(p.name for p in (root / "smoke-phase2" / "checkpoints").iterdir())
    summary = run_or_exit(compose("pretrain", [*TWO, f"paths.output_root={root}"]), None)
    assert summary["phases"]["phase1"]["skipped"] and summary["phases"]["phase2"]["skipped"]
    assert "phase1 finished earlier" in capsys.readouterr().out
    assert sorted(p.name for p in (root / "smoke-phase2" / "checkpoints").iterdir()) == before
    assert phase_status(root / "smoke-phase2" / "checkpoints", 2)[0] == "done"
    assert phase_status(root / "smoke-phase2" / "checkpoints", 3)[0] == "resume"
    assert phase_status(root / "nothing", 3)[0] == "fresh"


def test_an_interrupted_phase_two_resumes_to_the_uninterrupted_result(straight, tmp_path):
    """SIGKILL in phase 2 after its first step; the same command again skips phase 1 and
    resumes phase 2: the final weights equal the uninterrupted run's bit for bit."""
    every_step = "callbacks.checkpoint.every_n_train_steps=1"
    kill = "+callbacks.kill={_target_:faults.KillAtStep,step:1,run:smoke-phase2}"
    killed = _train(tmp_path, kill, every_step)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert phase_status(tmp_path / "smoke-phase2" / "checkpoints", 2)[0] == "resume"
    resumed = _train(tmp_path, every_step)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "phase1 finished earlier" in resumed.stdout and "phase2: resuming" in resumed.stdout
    ours = _ckpt(tmp_path / "smoke-phase2" / "checkpoints" / "last.ckpt")["state_dict"]
    theirs = _ckpt(straight["root"] / "smoke-phase2" / "checkpoints" / "last.ckpt")["state_dict"]
    assert ours.keys() == theirs.keys()
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


@pytest.fixture(scope="module")
def seq32(tmp_path_factory: pytest.TempPathFactory, bert_vocab_file: Path) -> Path:
    out = tmp_path_factory.mktemp("seq32") / "train"
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    prepare_shards([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, out, settings,
                   progress=False)  # fmt: skip
    return out


def test_phase_two_data_that_does_not_fit_is_refused_before_phase_one_trains(
    seq32, tmp_path, capsys
):
    """experiment=two_phase with both phases pointed at seq-32 shards: phase 2 (seq 64 here)
    is refused with both values named before phase 1 starts."""
    overrides = [f"paths.output_root={tmp_path}", "experiment=two_phase", "data.num_workers=0"]
    overrides += [f"model.config.{k}={v}" for k, v in (("hidden_size", 32), ("num_hidden_layers", 1),
                  ("num_attention_heads", 2), ("intermediate_size", 64))]  # fmt: skip
    for name, seq, masks in (("phase1", 32, 5), ("phase2", 64, 10)):
        overrides += [f"phases.{name}.data.train_path={seq32}", f"phases.{name}.data.eval_path=null",
                      f"phases.{name}.phase.max_seq_length={seq}", "micro_batch_size=4",
                      f"phases.{name}.phase.max_predictions_per_seq={masks}",
                      f"phases.{name}.phase.global_batch_size=8"]  # fmt: skip
    cfg = compose("pretrain", overrides)
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "phases.phase2:" in err[0] and "max_seq_length=32" in err[0] and "is 64" in err[0]
    assert not (tmp_path / "smoke-phase1").exists()  # nothing trained, nothing written


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("run_name=same", "would share the checkpoint directory"),
        ("ckpt_path=last", "resumes each phase by itself"),
    ],
)
def test_phase_settings_that_cannot_work_are_refused(tmp_path, capsys, override, words):
    with pytest.raises(SystemExit):
        run_or_exit(compose("pretrain", [*TWO, f"paths.output_root={tmp_path}", override]),
                    tmp_path / "out")  # fmt: skip
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
