"""Issue 16, point 9: training on one's own small data. A global batch larger than the data
names phase.global_batch_size with the largest value that works; progress written to a file
counts steps; third-party deprecation warnings are not printed on every run."""

from __future__ import annotations

import re
import warnings

import pytest
from lightning.pytorch.callbacks import TQDMProgressBar

from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.callbacks.progress import ProgressLog, select_progress


def _refused(tmp_path, capsys, *overrides: str) -> str:
    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}", *overrides])
    with pytest.raises(SystemExit) as info:
        run_or_exit(cfg, tmp_path / "out")
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert not (tmp_path / "out").exists()
    return err[0]


def test_too_little_data_names_the_global_batch_and_the_largest_that_works(tmp_path, capsys):
    message = _refused(tmp_path, capsys, "data.num_train_samples=22", "phase.global_batch_size=64")
    assert "22 sequences" in message and "phase.global_batch_size=64" in message
    assert "set phase.global_batch_size=20 (the largest that fits)" in message  # micro 4
    message = _refused(tmp_path, capsys, "data.num_train_samples=22", "phase.global_batch_size=64",
                       "micro_batch_size=null")  # fmt: skip
    assert "set phase.global_batch_size=22 (the largest that fits)" in message
    assert "micro_batch_size=" not in message.split(";")[0]
    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}",
                               "data.num_train_samples=22", "phase.global_batch_size=20",
                               "phase.max_steps=1", "val_every_n_steps=null"])  # fmt: skip
    assert run_or_exit(cfg, tmp_path / "ok")["steps"] == 1  # the value it named works


def test_progress_without_a_terminal_is_step_lines_and_no_deprecation_warnings(tmp_path, capsys):
    overrides = ["experiment=smoke", f"paths.output_root={tmp_path}", "callbacks=default",
                 "trainer.enable_progress_bar=true", "callbacks.progress_log.every_n_steps=2",
                 "callbacks.throughput=null", "data.num_workers=1"]  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_or_exit(compose("pretrain", overrides), tmp_path / "out")
    out = capsys.readouterr().out  # captured: not a TTY
    # step lines (a micro-batch or evaluation-batch line shows only after 10 s: a loaded machine)
    lines = [
        line for line in out.splitlines() if re.match(r"omnibert-train: step \d+/\d+ \(", line)
    ]
    assert [line.split()[2] for line in lines] == ["2/6", "4/6", "6/6"], out[-3000:]
    assert "seq/s" in lines[0] and "ETA" in lines[0] and "loss " in lines[0]
    assert "omnibert-train: validation at step 3: mlm_acc" in out
    assert "Epoch" not in out
    texts = [str(w.message) for w in caught]
    assert not [t for t in texts if "set_vital" in t or "LeafSpec" in t], texts


def test_a_terminal_keeps_the_progress_bar():
    bar, log = TQDMProgressBar(), ProgressLog()
    assert select_progress([bar, log], is_tty=True) == [bar]
    assert select_progress([bar, log], is_tty=False, sequences_per_step=8) == [log]
    assert log.sequences_per_step == 8
    assert select_progress([bar], is_tty=False) == [bar]  # no log configured: the bar stays
    assert select_progress([log], is_tty=True) == [log]  # no bar configured: the log stays
