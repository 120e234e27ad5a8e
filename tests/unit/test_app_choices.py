"""An ``experiment=`` or ``task=`` of the other app, and a sweep experiment without ``-m``,
are one sentence before Hydra composes them (omnibert.apps.choices): composed, they failed
inside Hydra (a traceback for ``omnibert-finetune task=pretraining``) or ran another job
(``experiment=glue`` without ``-m`` fine-tuned SQuAD)."""

from __future__ import annotations

import pytest
from test_experiments import FINETUNE, MODERN_SMALL, RECIPES, SMALL

from omnibert.apps.choices import AppChoiceError, check_choices, experiment_app, sweeps
from omnibert.apps.compose import group_options
from omnibert.apps.preflight import check_command_line


def test_each_experiment_belongs_to_the_app_the_suite_runs_it_with():
    trained = set(RECIPES) | SMALL | MODERN_SMALL
    assert {
        e for e in group_options("experiment") if experiment_app(e) == "omnibert-train"
    } == trained
    assert {e for e in group_options("experiment") if experiment_app(e) == "omnibert-finetune"} == (
        set(FINETUNE) | {"glue"}
    )
    assert [e for e in group_options("experiment") if sweeps(e)] == ["glue"]


@pytest.mark.parametrize(
    ("config", "argv", "multirun", "expected"),
    [
        ("finetune", ["experiment=smoke"], False,
         "experiment=smoke is an omnibert-train experiment; run omnibert-train experiment=smoke "
         "(omnibert-finetune takes experiment={glue, mrpc_bert_base, squad_bert_base})."),
        ("pretrain", ["experiment=glue", "model.init_from=x"], False,
         "experiment=glue is an omnibert-finetune experiment; run omnibert-finetune -m "
         "experiment=glue (omnibert-train takes experiment={bert_base, "),
        ("finetune", ["experiment=glue", "model.init_from=x"], False,
         "experiment=glue is a sweep (its file sets hydra.sweeper.params); run it with -m: "
         "omnibert-finetune -m experiment=glue ..."),
        ("finetune", ["task=mrpc,pretraining"], True,
         "task=pretraining is omnibert-train's task; pretrain with omnibert-train, or fine-tune "
         "one of cola, mnli, mrpc, qnli, qqp, rte, squad, squad_v2, sst2, stsb, wnli (task=<name>)."),
        ("finetune", ["+task=pretraining"], False, "task=pretraining is omnibert-train's task"),
    ],
)  # fmt: skip
def test_another_apps_choice_is_one_sentence_with_the_command(config, argv, multirun, expected):
    with pytest.raises(AppChoiceError) as refused:
        check_choices(config, argv, multirun)
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize(
    ("config", "argv", "multirun"),
    [
        ("finetune", ["experiment=glue", "model.init_from=x"], True),
        ("finetune", ["experiment=mrpc_bert_base", "seed=1,2"], True),
        ("finetune", ["task=mrpc"], False),
        ("pretrain", ["experiment=smoke"], False),
        ("pretrain", ["task=pretraining"], False),
        ("prepare", ["experiment=glue"], False),  # no experiment group there: not this check's
    ],
)  # fmt: skip
def test_the_apps_own_choices_pass(config, argv, multirun):
    check_choices(config, argv, multirun)


def test_the_console_scripts_preflight_refuses_before_composing(tmp_path):
    """Through check_command_line, as ``main`` calls it: Hydra never composes the config
    (it raised "Could not override 'model'" for this one)."""
    with pytest.raises(AppChoiceError, match=r"^experiment=smoke is an omnibert-train "):
        check_command_line("finetune", ("paths.output_root",),
                           ["experiment=smoke", f"paths.output_root={tmp_path}"])  # fmt: skip
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-m", "experiment=glue", "--cfg", "job"], "-m and --cfg cannot be combined"),
        (["-m", "--info", "config", "task=mrpc"], "-m and --info cannot be combined"),
    ],
)  # fmt: skip
def test_hydras_exclusive_modes_are_one_sentence(argv, expected):
    """Hydra raised its own ValueError (with a traceback) for these."""
    from omnibert.apps.preflight import ConfigKeyError

    with pytest.raises(ConfigKeyError) as refused:
        check_command_line("finetune", ("paths.output_root",), argv)
    assert str(refused.value) == (
        f"{expected} (Hydra takes one of them); keep one: -m runs the sweep, --cfg prints the "
        "config, --info prints Hydra's information."
    )


@pytest.mark.parametrize(
    ("argv", "refused"),
    [
        (["experiment=smoke", "--help"], True),  # Hydra's help composed it and failed
        (["experiment=glue", "--help"], False),  # nothing runs: a sweep may be shown
        (["experiment=glue", "--cfg", "job"], False),
    ],
)  # fmt: skip
def test_help_and_cfg_check_the_app_but_show_a_sweep(argv, refused):
    if refused:
        with pytest.raises(AppChoiceError):
            check_command_line("finetune", ("paths.output_root",), argv)
    else:
        assert check_command_line("finetune", ("paths.output_root",), argv) is None


def test_a_task_setting_the_recipe_lacks_is_refused():
    """A fine-tuning task keeps any key in its recipe (``**settings``), where nothing read
    ``+task.doc_stride=64`` of MRPC (a SQuAD setting)."""
    with pytest.raises(AppChoiceError) as refused:
        check_choices("finetune", ["task=mrpc", "+task.doc_stride=64"], False)
    assert str(refused.value) == (
        "task.doc_stride is not a setting of task=mrpc (its recipe has batch_size, data, epochs, "
        "eval_batch_size, lr, max_seq_length, name, num_labels, warmup_proportion); nothing would "
        "read it: remove +task.doc_stride."
    )
    check_choices("finetune", ["task=squad", "task.doc_stride=64"], False)  # its own, set
