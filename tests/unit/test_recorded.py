"""The typed views over what a checkpoint recorded (omnibert.config.recorded): the tools and
a fine-tuning task rebuilt from its checkpoint read the recorded values through them, older
checkpoints (keys missing) included."""

from __future__ import annotations

import pytest

from omnibert.config.recorded import RecordedRecipe, RecordedTraining
from omnibert.models import BertConfig
from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

TINY = BertConfig(vocab_size=40, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                  intermediate_size=16, max_position_embeddings=32).__dict__  # fmt: skip


def test_a_pretraining_checkpoints_hyper_parameters_read_typed():
    recorded = RecordedTraining({
        "total_steps": 7038,
        "optimizer": {"_target_": "omnibert.optim.Lamb", "lr": 6e-3, "weight_decay": 0.01,
                      "betas": [0.9, 0.999], "eps": None},
        "schedule": {"_target_": "omnibert.optim.schedules.PolyWarmup", "warmup_proportion":
                     0.2843, "power": 0.5},
        "init_from": "/runs/phase1/last.ckpt", "vocab_file": "/runs/vocab.txt",
        "vocab_sha256": "ab" * 32, "do_lower_case": 1,
    })  # fmt: skip
    assert recorded.total_steps == 7038
    assert recorded.optimizer is not None and recorded.optimizer.short_name == "Lamb"
    assert recorded.optimizer.lr == 6e-3
    # eps is recorded as None: left out; the keys come in the order asked for
    assert recorded.optimizer.listed(("eps", "betas", "weight_decay")) == [
        ("betas", "[0.9, 0.999]"), ("weight_decay", "0.01"),
    ]  # fmt: skip
    assert recorded.schedule is not None and recorded.schedule.short_name == "PolyWarmup"
    assert recorded.init_from == "/runs/phase1/last.ckpt"
    assert (recorded.vocab_file, recorded.vocab_sha256) == ("/runs/vocab.txt", "ab" * 32)
    assert recorded.do_lower_case is True


def test_an_older_checkpoint_without_the_keys_reads_as_unknown():
    recorded = RecordedTraining({"model_config": TINY})
    assert recorded.total_steps is None and recorded.optimizer is None
    assert recorded.schedule is None and recorded.init_from is None
    assert recorded.vocab_file is None and recorded.do_lower_case is None
    assert RecordedTraining(None) == {}  # a TF1 checkpoint records nothing
    assert RecordedTraining({"optimizer": {}}).optimizer is None


def test_a_recipe_reads_typed_and_stays_the_recorded_mapping():
    values = {"name": "squad", "doc_stride": 128, "max_seq_length": 384, "max_query_length": 64,
              "n_best_size": 20, "max_answer_length": 30, "null_score_diff_threshold": -1.5,
              "data": {"format": "squad"}}  # fmt: skip
    recipe = RecordedRecipe(values)
    assert recipe.name == "squad" and recipe.question_answering
    assert recipe.qa_windows() == {"max_seq_length": 384, "doc_stride": 128,
                                   "max_query_length": 64, "n_best_size": 20,
                                   "max_answer_length": 30}  # fmt: skip
    assert recipe.null_score_diff_threshold == -1.5
    assert recipe.plain() == values and dict(recipe) == values and recipe["data"] == values["data"]
    with pytest.raises(TypeError):
        recipe["name"] = "mnli"  # type: ignore[index]
    older = RecordedRecipe({"format": "squad"})  # runs before the data node
    assert older.question_answering and older.null_score_diff_threshold == 0.0
    glue = RecordedRecipe({"name": "mrpc", "max_seq_length": 128})
    assert not glue.question_answering and glue.num_labels == 2
    with pytest.raises(KeyError):
        glue.qa_windows()


@pytest.mark.parametrize(("recipe", "outputs"), [({"num_labels": 3}, 3), ({"num_labels": 1}, 1),
                                                 ({}, 2)])  # fmt: skip
def test_a_classifier_rebuilt_from_its_recipe_has_the_recorded_outputs(recipe, outputs):
    """A checkpoint without num_labels (older runs, BERT's two classes) still rebuilds."""
    task = SequenceClassificationTask(model_config=TINY, recipe=recipe)
    assert task.model.num_labels == outputs
    assert task.hparams["recipe"] == recipe and task.recipe.num_labels == outputs


def test_a_question_answering_task_keeps_its_recipe():
    task = QuestionAnsweringTask(model_config=TINY, recipe={"name": "squad"}, doc_stride=64)
    assert task.recipe.question_answering and task.recipe.name == "squad"
    assert task.hparams["recipe"] == {"name": "squad", "doc_stride": 64}
