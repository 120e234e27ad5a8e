"""A key the run would not apply is refused, never dropped in silence: a Lightning key of
``trainer`` that the app sets itself (the loop counts the batch plan derives, the sections
that build callbacks and loggers, the hardware keys the accelerator plugin passes), and an
architecture field added with ``+model.config.<key>`` that the model does not have."""

from __future__ import annotations

import pytest

from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig, TrainConfig
from omnibert.config.sections import ConfigError

#: each app's config, the smallest command line it composes with and its config class
APPS = {
    "pretrain": (["experiment=smoke"], TrainConfig),
    "finetune": (["task=mrpc"], FinetuneConfig),
}


def _config(app: str, tmp_path, *overrides: str):
    """The app's typed config of its smallest command line plus ``overrides``."""
    argv, config_class = APPS[app]
    return config_class.of(compose(app, [*argv, f"paths.output_root={tmp_path}", *overrides]))


def _refusal(app: str, tmp_path, override: str) -> str:
    """The sentence the app's typed config refuses ``override`` with."""
    with pytest.raises(ConfigError) as refused:
        _config(app, tmp_path, override)
    return str(refused.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+trainer.limit_train_batches=0.5",
         "trainer.limit_train_batches=0.5 is not read: the app sets it from steps_per_epoch "
         "(optimiser steps per pass over the data); remove trainer.limit_train_batches."),
        ("+trainer.accumulate_grad_batches=3",
         "trainer.accumulate_grad_batches=3 is not read: the app sets it from "
         "phase.global_batch_size over micro_batch_size; remove trainer.accumulate_grad_batches."),
        ("+trainer.val_check_interval=10",
         "trainer.val_check_interval=10 is not read: the app sets it from val_every_n_steps "
         "(optimiser steps between evaluations); remove trainer.val_check_interval."),
        ("+trainer.callbacks=[]",
         "trainer.callbacks=[] is not read: the app sets it from the callbacks section "
         "(callbacks=...); remove trainer.callbacks."),
        ("trainer.strategy=ddp",
         "trainer.strategy='ddp' is not read: the accelerator plugin passes "
         "accelerator.strategy='auto'; set accelerator.strategy instead of trainer.strategy."),
        ("trainer.devices=2",
         "trainer.devices=2 is not read: the accelerator plugin passes accelerator.devices=1; "
         "set accelerator.devices instead of trainer.devices."),
    ],
)  # fmt: skip
def test_pretraining_refuses_trainer_keys_it_derives(override, expected, tmp_path) -> None:
    assert _refusal("pretrain", tmp_path, override) == expected


def test_the_advice_followed_is_applied(tmp_path) -> None:
    """``accelerator.strategy`` (what the refusal names) reaches the trainer node."""
    config = _config("pretrain", tmp_path, "accelerator.strategy=ddp")
    assert config.trainer.node["strategy"] == config.accelerator.node["strategy"] == "ddp"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("trainer.max_steps=5",
         "trainer.max_steps=5 is not read: the app sets it from task.epochs (the steps are "
         "epochs x steps per epoch); remove trainer.max_steps."),
        ("trainer.max_epochs=5",
         "trainer.max_epochs=5 is not read: the app sets it from task.epochs (the steps are "
         "epochs x steps per epoch); remove trainer.max_epochs."),
        ("+trainer.accumulate_grad_batches=2",
         "trainer.accumulate_grad_batches=2 is not read: the app sets it from task.batch_size "
         "over micro_batch_size; remove trainer.accumulate_grad_batches."),
        ("+trainer.limit_val_batches=0.5",
         "trainer.limit_val_batches=0.5 is not read: the app sets it from the task (it "
         "evaluates after training); remove trainer.limit_val_batches."),
    ],
)  # fmt: skip
def test_fine_tuning_refuses_trainer_keys_it_derives(override, expected, tmp_path) -> None:
    assert _refusal("finetune", tmp_path, override) == expected


def test_fine_tuning_keeps_a_trainer_limit_it_reads(tmp_path) -> None:
    """``trainer.limit_train_batches`` is Lightning's and fine-tuning's sampler follows it
    (data/finetuning.lightning_epoch_cap): accepted as set."""
    config = _config("finetune", tmp_path, "+trainer.limit_train_batches=3")
    assert config.trainer.node["limit_train_batches"] == 3


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+model.config.num_hidden_layer=1",
         "model.config.num_hidden_layer is not a field of the architecture "
         "(omnibert.models.BertConfig); did you mean model.config.num_hidden_layers"),
        ("+model.config.foo=1",
         "model.config.foo is not a field of the architecture (omnibert.models.BertConfig); "
         "remove model.config.foo."),
    ],
)  # fmt: skip
def test_an_architecture_field_the_model_lacks_is_refused(override, expected, tmp_path) -> None:
    """It ended in a TypeError traceback from BertConfig when the model was built."""
    assert _refusal("pretrain", tmp_path, override).startswith(expected)


@pytest.mark.parametrize("app", ["pretrain", "finetune"])
def test_a_top_level_key_nothing_reads_is_refused(app, tmp_path) -> None:
    """``+foo=1`` was composed in and read by nothing."""
    assert _refusal(app, tmp_path, "+foo=1") == "foo is not a key of the config; remove +foo."


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("+task.foo=1", "task.foo is not a setting of omnibert.tasks.PretrainingTask (it takes "),
        ("+schedule.foo=1", "schedule.foo is not a setting of omnibert.optim.schedules.PolyWarmupLR"),
        ("+optimizer.foo=1", "optimizer.foo is not a setting of omnibert.optim.Lamb (it takes "),
    ],
)  # fmt: skip
def test_a_key_its_target_does_not_take_is_refused_before_building(override, expected, tmp_path):
    """A target without ``**kwargs`` would end the run in a TypeError traceback
    (``+task.foo=1`` did, when the task was built)."""
    from omnibert.run.pipeline.target_types import TargetTypeError, check_target_types

    config = _config("pretrain", tmp_path, override)
    with pytest.raises(TargetTypeError) as refused:
        check_target_types(config.target_nodes())
    assert str(refused.value).startswith(expected)
    key = override.split("=")[0].lstrip("+")
    assert str(refused.value).endswith(f"; remove {key}.")
