"""Each log message once, and progress as lines when stdout is not a terminal, for every app
(issue 23, point 9): Lightning's lines and model summary once; inside a long optimiser step
a line counting its micro-batches (the first after ``first_seconds``: 0 here, so every
micro-batch prints; the 10 s default is the same mechanism); prepare's files as lines."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

from omnibert.logs import LineProgress, progress_bar
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"


def test_train_prints_each_line_once_and_counts_micro_batches(tmp_path: Path) -> None:
    exe = Path(sys.executable).with_name("omnibert-train")
    done = subprocess.run(
        [str(exe), "experiment=smoke", "phase.max_steps=2", f"paths.output_root={tmp_path}",
         "trainer.enable_progress_bar=true", "trainer.enable_model_summary=true",
         "+callbacks.progress_log={_target_:omnibert.callbacks.progress.ProgressLog,"
         "first_seconds:0,every_seconds:0}"],
        capture_output=True, text=True, check=False, cwd=tmp_path, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    both = done.stdout + done.stderr
    assert "\r" not in both  # no carriage-return bar in a log file
    assert both.count("GPU available") == 1  # Lightning's handler and Hydra's printed it twice
    assert both.count("Trainable params") == 1  # the model summary
    lines = done.stdout.splitlines()
    assert "omnibert-train: training from step 0 to 2" in lines
    # smoke: 2 micro-batches per step; the first of each step is counted before the step ends
    micro = [line for line in lines if line.startswith("omnibert-train: step") and "micro" in line]
    assert [m.split("  ")[0] for m in micro] == [
        "omnibert-train: step 0/2: micro-batch 1/2 of step 1 (4 sequences)",
        "omnibert-train: step 1/2: micro-batch 1/2 of step 2 (4 sequences)",
    ]
    assert any(line.startswith("omnibert-train: step 2/2 (100%)  loss") for line in lines)
    assert any(line.startswith("omnibert-train: evaluation batch 5/5") for line in lines)


def test_line_progress_prints_lines_not_a_bar() -> None:
    out = io.StringIO()
    bar = LineProgress(3, "omnibert-prepare", "file", every_seconds=0, first_seconds=0, stream=out)
    bar.update()
    bar.set_postfix(instances="1,024")
    bar.update(2)
    bar.close()
    bar.close()  # once
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("omnibert-prepare: 0/3 files (0%)  elapsed 0:00:00  started")
    assert lines[1].startswith("omnibert-prepare: 1/3 files (33%)  elapsed")
    assert lines[2].startswith("omnibert-prepare: 3/3 files (100%)  instances=1,024  elapsed")
    assert lines[-1].endswith("done") and len(lines) == 4
    assert "\r" not in out.getvalue()
    tty_bar = progress_bar(3, "omnibert-prepare", "file", enabled=True, is_tty=True)
    assert type(tty_bar).__name__ == "tqdm"
    tty_bar.close()


def test_prepare_prints_lines_when_stdout_is_not_a_terminal(
    tmp_path: Path, bert_vocab_file: Path, capsys
) -> None:
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=5, dupe_factor=1)
    prepare([str(REFERENCE / "tiny_docs.txt")], bert_vocab_file, tmp_path / "out", settings)
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err
    assert captured.out.splitlines()[0].startswith("omnibert-prepare: 0/1 files (0%)")
    assert "omnibert-prepare: 1/1 files (100%)  instances=25  tokens=725" in captured.out
