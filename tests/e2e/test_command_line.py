"""What the apps refuse before any work: unwritable output paths and mistyped keys, each in
one line with exit code 2, through the console scripts and the apps' own functions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.apps.compose import compose
from omnibert.apps.preflight import ConfigKeyError, check_command_line, preflight
from omnibert.paths import PathError, check_writable_dir

# /proc takes no new entries, even from root (tests may run as root, which ignores 0o500)
UNWRITABLE = "/proc/omnibert-test/out"


def test_check_writable_dir_refuses_without_leaving_anything(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    with pytest.raises(PathError, match=r"^out=/proc/omnibert-test/out is not writable \(creat"):
        check_writable_dir(UNWRITABLE, "out")
    with pytest.raises(PathError, match=r"out=.*file.txt/sub cannot be created because .*file.txt"):
        check_writable_dir(a_file / "sub", "out")
    with pytest.raises(PathError, match=r"out=.*file.txt is a file, not a directory"):
        check_writable_dir(a_file, "out")
    assert check_writable_dir(tmp_path / "new" / "deeper", "out") == tmp_path / "new" / "deeper"
    assert check_writable_dir(tmp_path, "out") == tmp_path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]  # nothing created


def test_each_app_refuses_an_unwritable_output_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from omnibert.apps import export, prepare
    from omnibert.apps.train import run_or_exit

    cfg = compose(
        "prepare",
        [
            f"input_files=[{tmp_path / 'missing.txt'}]",
            "vocab_file=v.txt",
            f"output_dir={UNWRITABLE}",
        ],
    )
    with pytest.raises(PathError, match=r"^output_dir=/proc/omnibert-test/out is not writable"):
        prepare.run(cfg)  # before the (missing) input files are looked at
    cfg = compose("export", [f"ckpt={tmp_path / 'missing.ckpt'}", f"out={UNWRITABLE}"])
    with pytest.raises(PathError, match=r"^out=/proc/omnibert-test/out is not writable"):
        export.run(cfg)  # before the (missing) checkpoint is read
    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={UNWRITABLE}"])
    with pytest.raises(SystemExit) as exited:
        run_or_exit(cfg, None)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("omnibert-train: error: paths.output_root=/proc/omnibert-test/out")


@pytest.mark.parametrize(
    ("config", "argv", "expected"),
    [
        ("pretrain", ["phase.max_step=3"], "phase.max_step is not a key of the config; did you mean phase.max_steps"),
        ("pretrain", ["max_steps=3"], "did you mean phase.max_steps or trainer.max_steps?"),
        ("prepare", ["max_seq_lenght=128"], "max_seq_lenght is not a key of the config; did you mean max_seq_length?"),
        ("export", ["ckpt=a", "out=b", "vocab=v.txt"], "did you mean vocab_file?"),
        ("pretrain", ["phase.zzz=1"], "phase has phase.name, phase.max_seq_length,"),
        ("pretrain", ["model=bert_bse"], "model=bert_bse is not an option of model; did you mean bert_base"),
        ("pretrain", ["-m", "model=bert_tiny,bert_mini", "phase.max_step=1,2"], "did you mean phase.max_steps"),
        ("pretrain", ["mlperf.target_accuracy=2"], "mlperf.target_accuracy=2 sets a key of mlperf, which this config leaves off (mlperf: null); choose one first (mlperf=bert) or drop mlperf.target_accuracy."),
    ],
)  # fmt: skip
def test_mistyped_keys_name_the_closest_existing_ones(config, argv, expected) -> None:
    with pytest.raises(ConfigKeyError) as refused:
        check_command_line(config, [], argv)
    assert expected in str(refused.value)
    assert "\n" not in str(refused.value) and "+" not in str(refused.value)


def test_good_command_lines_and_sweeps_pass(tmp_path: Path) -> None:
    root = f"paths.output_root={tmp_path}"
    check_command_line("pretrain", ["paths.output_root"], ["experiment=smoke", root])
    check_command_line(
        "pretrain",
        ["paths.output_root"],
        ["-m", "model=bert_tiny,bert_mini", "phase.max_steps=1,2", root],
    )
    check_command_line("prepare", ["output_dir"], ["+extra=1", "--cfg", "job"])
    assert not list(tmp_path.iterdir())  # nothing created


def test_preflight_exits_with_one_line(monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(sys, "argv", ["omnibert-export", "ckpt=a", f"out={UNWRITABLE}"])
    with pytest.raises(SystemExit) as exited:
        preflight("omnibert-export", "export", ("out",))
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        "omnibert-export: error: out=/proc/omnibert-test/out is not writable (creating it starts "
        "in /proc): No such file or directory; choose a directory you can write to.\n"
    )


@pytest.mark.parametrize(
    ("app", "argv", "expected"),
    [
        ("omnibert-train", ["phase.max_step=3"], "omnibert-train: error: phase.max_step is not a key"),
        ("omnibert-prepare", ["input_files=[a.txt]", "vocab_file=v.txt", f"output_dir={UNWRITABLE}"],
         "omnibert-prepare: error: output_dir=/proc/omnibert-test/out is not writable"),
        ("omnibert-export", ["ckpt=a.ckpt", f"out={UNWRITABLE}"],
         "omnibert-export: error: out=/proc/omnibert-test/out is not writable"),
    ],
)  # fmt: skip
def test_console_scripts_refuse_in_one_line(app, argv, expected) -> None:
    exe = Path(sys.executable).with_name(app)
    done = subprocess.run([str(exe), *argv], capture_output=True, text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(expected)


#: runs an app's main() with argv, then prints whether torch / Lightning were imported
_IMPORTS_PROBE = """
import sys
from importlib import import_module
main = import_module(sys.argv[1]).main
sys.argv = sys.argv[2:]
try:
    main()
except SystemExit as stop:
    print(stop.code, "torch" in sys.modules, "lightning" in sys.modules)
"""


@pytest.mark.parametrize(
    ("module", "argv"),
    [
        ("omnibert.apps.export", ["omnibert-export", "ckpt=a.ckpt", f"out={UNWRITABLE}"]),
        ("omnibert.apps.predict", ["omnibert-predict", "ckpt=no/such/run", "text=a [MASK]"]),
        ("omnibert.apps.train", ["omnibert-train", "phase.max_steps=abc"]),
        ("omnibert.apps.finetune", ["omnibert-finetune", "task=mrpc", "micro_batch_size=0"]),
    ],
)  # fmt: skip
def test_a_refusal_comes_before_torch_and_lightning_are_imported(module, argv, tmp_path) -> None:
    """A mistyped path or value is answered before the seconds that importing torch and
    Lightning take (export and predict used to import the model code before any check)."""
    done = subprocess.run([sys.executable, "-c", _IMPORTS_PROBE, module, *argv],
                          capture_output=True, text=True, check=False, cwd=tmp_path)  # fmt: skip
    assert done.stdout.split() == ["2", "False", "False"], done.stderr
    assert "error:" in done.stderr
