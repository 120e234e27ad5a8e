"""Every app refuses a value of the wrong type or out of range, and an output path it cannot
write, before any work: one sentence naming the key and the fix, exit code 2 (issue 23,
points 3 and 4)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from omnibert.apps.compose import compose
from omnibert.apps.preflight import ConfigTypeError, check_command_line
from omnibert.config import TrainConfig
from omnibert.errors import UserError
from omnibert.paths import PathError

UNWRITABLE_FILE = "/proc/omnibert-test/e.json"


@pytest.mark.parametrize(
    ("config", "argv", "expected"),
    [
        ("prepare", ["max_seq_length=abc"], "max_seq_length=abc is not an integer; fix max_seq_length."),
        ("prepare", ["masked_lm_prob=high"], "masked_lm_prob=high is not a number; fix masked_lm_prob."),
        ("prepare", ["overwrite=maybe"], "overwrite=maybe is not true or false; fix overwrite."),
        ("prepare", ["pack.max_sequences_per_pack=x"], "pack.max_sequences_per_pack=x is not an integer"),
        ("pretrain", ["phase.max_steps=abc"], "phase.max_steps=abc is not an integer; fix phase.max_steps."),
        ("pretrain", ["phase.max_steps=null"], "phase.max_steps=null cannot be null; fix phase.max_steps."),
        ("pretrain", ["-m", "seed=1,abc"], None),  # a sweep is checked by its first value
        ("pretrain", ["-m", "seed=abc,1"], "seed=abc is not an integer; fix seed."),
        ("eval", ["ckpt=a", "eval_micro_batch_size=1.5"], "eval_micro_batch_size=1.5 is not an integer"),
        ("export", ["ckpt=a", "out=b", "overwrite=yes please"], "overwrite=yes please is not true or false"),
        ("finetune", ["seed=x"], "seed=x is not an integer; fix seed."),
        ("finetune", ["data.num_workers=some"], "data.num_workers=some is not an integer"),
    ],
)  # fmt: skip
def test_a_value_of_the_wrong_type_names_its_key(config, argv, expected, tmp_path) -> None:
    if expected is None:
        check_command_line(config, [], argv)
        return
    with pytest.raises(ConfigTypeError) as refused:
        check_command_line(config, [], argv)
    assert str(refused.value).startswith(expected)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("app", "argv", "expected"),
    [
        ("omnibert-prepare", ["input_files=[a.txt]", "vocab_file=v.txt", "output_dir=o", "max_seq_length=abc"],
         "omnibert-prepare: error: max_seq_length=abc is not an integer; fix max_seq_length.\n"),
        ("omnibert-prepare", ["input_files=[a.txt]", "vocab_file=v.txt", "output_dir=o", "num_workers=0"],
         "omnibert-prepare: error: num_workers=0 must be at least 1; fix num_workers.\n"),
        ("omnibert-train", ["phase.max_steps=abc"],
         "omnibert-train: error: phase.max_steps=abc is not an integer; fix phase.max_steps.\n"),
        ("omnibert-eval", ["ckpt=a.ckpt", f"out={UNWRITABLE_FILE}"],
         f"omnibert-eval: error: out={UNWRITABLE_FILE} is not writable (creating it starts in "
         "/proc): No such file or directory; choose a directory you can write to.\n"),
    ],
)  # fmt: skip
def test_console_scripts_refuse_types_ranges_and_outputs_in_one_line(
    app, argv, expected, tmp_path
) -> None:
    exe = Path(sys.executable).with_name(app)
    done = subprocess.run(
        [str(exe), *argv], capture_output=True, text=True, check=False, cwd=tmp_path
    )
    assert (done.returncode, done.stderr) == (2, expected)
    assert not list(tmp_path.iterdir())  # nothing written: no outputs/<app>/<time>/


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.max_epochs=abc", "trainer.max_epochs='abc' is not an integer (lightning.pytorch.Trainer"),
        ("optimizer.lr=abc", "optimizer.lr='abc' is not a number (omnibert.optim.Lamb takes lr"),
        ("callbacks.checkpoint.every_n_train_steps=often",
         "callbacks.checkpoint.every_n_train_steps='often' is not an integer"),
        ("data.num_workers=abc", "data.num_workers='abc' is not an integer"),
    ],
)  # fmt: skip
def test_keys_of_built_objects_are_checked_against_what_they_build(
    override, expected, tmp_path
) -> None:
    """Groups that are ``_target_`` nodes: the value is refused by the training app's own
    preparation, before a data module, model or Trainer exists."""
    from omnibert.run.pretraining.job import prepare

    cfg = compose("pretrain", ["experiment=smoke", f"paths.output_root={tmp_path}", override])
    with pytest.raises(UserError) as refused:
        prepare(TrainConfig.of(cfg))
    assert str(refused.value).startswith(expected)
    assert str(refused.value).endswith(f"; fix {override.split('=')[0]}.")
    assert not list(tmp_path.iterdir())


def test_eval_checks_its_report_file_before_evaluating(tmp_path) -> None:
    """``out`` used to be written after the whole evaluation: a missing checkpoint shows the
    order (the path is refused first)."""
    from omnibert.apps import eval as eval_app

    cfg = compose("eval", [f"ckpt={tmp_path / 'missing.ckpt'}", f"out={UNWRITABLE_FILE}"])
    with pytest.raises(PathError, match=r"^out=/proc/omnibert-test/e.json is not writable"):
        eval_app.run(cfg, None)
    cfg = compose("eval", [f"ckpt={tmp_path / 'missing.ckpt'}", f"out={tmp_path}"])
    with pytest.raises(PathError, match=r"is a directory; name a file in it instead"):
        eval_app.run(cfg, None)


def test_a_value_set_through_an_interpolation_names_the_key_typed(tmp_path, tiny_hf) -> None:
    """Fine-tuning's ``task.lr`` reaches the optimiser as ``optimizer.lr`` (through
    ``phase.lr.adamw``): a bad value names ``task.lr``, the key the user typed (issue 43)."""
    from finetune_data import mrpc_file

    from omnibert.apps import finetune

    tsv = mrpc_file(tmp_path / "train.tsv", 4, seed=1)
    cfg = compose("finetune", [
        "task=mrpc", f"data.train_file={tsv}", f"model.init_from={tiny_hf}",
        f"paths.output_root={tmp_path / 'runs'}", "task.lr=big",
    ])  # fmt: skip
    with pytest.raises(UserError) as refused:
        finetune.run(cfg)
    assert str(refused.value) == (
        "task.lr='big' is not a number (it sets optimizer.lr: omnibert.optim.AdamW takes lr as "
        "a number); fix task.lr."
    )
    assert not (tmp_path / "runs").exists()
