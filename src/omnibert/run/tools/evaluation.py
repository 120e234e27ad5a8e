"""The wiring of ``omnibert-eval``: a pretrained checkpoint of any kind on a prepared eval set.

In this order, everything checked before compute: resolve the config → the accelerator
plugin → the model (:func:`omnibert.checkpoints.reading.load_pretrained`: an omnibert
``.ckpt``, a Hugging Face directory or a TF1 checkpoint) → the eval data (only the held-out
set is read; its row shape is the data's own unless set) and its fit with the model (vocab,
positions) → Lightning's ``validate`` with the pretraining task's metrics: masked-LM accuracy
as the sum of correct predictions weighted by ``masked_lm_weights`` over the sum of weights
(MLPerf's definition), next-sentence accuracy, the losses and the number of samples, summed
over the whole set and every device (not a mean of batch means). A model without a
next-sentence head (``next_sentence_head: false``) is reported on masked-LM alone: its
report has ``objective: "MLM only"`` and no ``nsp_*`` keys. The report and the
progress line name the checkpoint's own step (its ``global_step``; a TF1 checkpoint's
``global_step`` variable; none for a Hugging Face directory), not the fresh Trainer's 0, and
the precision evaluated in (by default the one the checkpoint's run validated in:
:func:`eval_precision`), so the accuracies compare with the run's. A loader worker
(``data.num_workers`` > 0) that dies ends the evaluation in one sentence naming it, the
signal and the likely cause (:mod:`omnibert.data.loader_workers`, exit code 71). On several
devices every rank evaluates its share and the sums are gathered; rank 0 speaks for the run
(:func:`omnibert.errors.is_rank_zero`: the app prints and writes the report there alone).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from omnibert.accelerators import build_plugin
from omnibert.accelerators.launchers import check_launch_layout
from omnibert.callbacks.progress import ProgressLog
from omnibert.checkpoints.files import saved_step
from omnibert.checkpoints.reading import load_pretrained
from omnibert.compat import seed_everything
from omnibert.config import TrainConfigError
from omnibert.config.sections import objective_name
from omnibert.config.tools import EvalConfig
from omnibert.convert.tf1_bundle import TF1Checkpoint
from omnibert.data.loader_workers import LoaderWorkerDied, worker_death
from omnibert.errors import UserError, quiet_other_ranks, set_process_rank
from omnibert.run.pipeline.builders import quiet_third_party_deprecations
from omnibert.run.pipeline.target_types import check_target_types
from omnibert.run.tools.run_records import run_summary
from omnibert.tasks.pretraining import PretrainingTask

__all__ = ["evaluate_pretrained"]

MODEL_FACTS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")


def evaluate_pretrained(config: EvalConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """Evaluate ``ckpt`` on ``data``'s eval set; returns the report (``config``: the typed
    config the app built, ``EvalConfig.of`` of the composed one)."""
    quiet_third_party_deprecations()
    check_target_types([config.accelerator, config.data])
    size = config.eval_micro_batch_size
    plugin = build_plugin(config.accelerator.plain())
    launch = check_launch_layout(plugin.name, plugin.devices, plugin.num_nodes)
    set_process_rank(launch.rank)  # who speaks for the run (omnibert.errors.is_rank_zero)
    quiet_other_ranks()
    if config.precision is not None:
        plugin.check_precision(config.precision)
    loaded = load_pretrained(config.ckpt, config.bert_config)
    step = checkpoint_step(config.ckpt, loaded.kind)
    precision, precision_note = eval_precision(
        config.precision, plugin, config.ckpt, loaded.kind, step
    )
    datamodule = config.data.build(
        micro_batch_size=size, eval_micro_batch_size=size, evaluate_only=True
    )
    datamodule.check()
    model_config = loaded.config
    _check_fit(model_config, datamodule)
    task = PretrainingTask(model_config=model_config.to_dict(), vocab_file=loaded.vocab_file)
    task.model = loaded.model  # the loaded weights; the task brings the metrics
    seed_everything(config.seed, workers=False)
    hardware = plugin.trainer_kwargs(precision)
    trainer = pl.Trainer(
        **hardware,
        callbacks=[] if sys.stdout.isatty() else [_progress(step)],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        use_distributed_sampler=False,
        default_root_dir=str(output_dir) if output_dir is not None else None,
    )
    start = time.perf_counter()
    try:
        trainer.validate(task, datamodule=datamodule, verbose=False)
    except RuntimeError as err:  # a loader worker killed (the OOM killer): one sentence
        death = worker_death(err)
        if death is None:
            raise
        raise LoaderWorkerDied(
            f"{death}; the evaluation did not finish and wrote no report: run the same command "
            "again"
        ) from None
    seconds = time.perf_counter() - start
    val = task.last_validation or {}
    nsp = (
        {
            "nsp_accuracy": val.get("val/nsp_acc"),
            "nsp_majority_baseline": val.get("val/nsp_majority_baseline"),
            "nsp_loss": val.get("val/nsp_loss"),
        }
        if task.next_sentence
        else {}
    )
    return {
        "checkpoint": config.ckpt,
        "checkpoint_kind": loaded.kind,
        "step": step,
        "loaded": loaded.description,
        "model": {k: getattr(model_config, k) for k in MODEL_FACTS},
        "data": {
            "format": datamodule.format,
            "eval_path": config.eval_path,
            "max_seq_length": datamodule.max_seq_length,
            "max_predictions_per_seq": datamodule.max_predictions_per_seq,
        },
        "objective": objective_name(task.next_sentence),
        "samples": int(val.get("val/samples", 0)),
        "masked_tokens": int(val.get("val/mlm_count", 0)),
        "mlm_accuracy": val.get("val/mlm_acc"),
        "mlm_majority_baseline": val.get("val/mlm_majority_baseline"),
        "mlm_loss": val.get("val/mlm_loss"),
        **nsp,
        "loss": val.get("val/loss"),
        "precision": precision,
        "precision_note": precision_note,
        "seconds": round(seconds, 3),
    }


def eval_precision(
    given: str | None, plugin: Any, ckpt: str, kind: str, step: int | None
) -> tuple[str, str]:
    """The precision to evaluate in and why: ``precision=`` as given, else the one the
    checkpoint's run validated in (its ``summary.json``: :mod:`omnibert.run.tools.run_records`)
    where this accelerator runs it, else fp32; the note says which, and when the run's own
    validation used another (masked-LM accuracies then differ in the last digits)."""
    summary = run_summary(ckpt, step) if kind == "omnibert" else None
    ran = summary.precision if summary is not None else None
    if given is not None:
        if ran is not None and ran != given:
            return given, (
                f"as set; its run validated in {ran}, so its accuracies can differ in the last "
                f"digits: precision={ran} reproduces them"
            )
        return given, "as set" + (", as its run validated" if ran == given else "")
    if ran is None:
        return "32-true", "the default: the checkpoint's run records no precision"
    try:
        plugin.check_precision(ran)
    except UserError as err:
        return "32-true", (
            f"its run validated in {ran}, which this accelerator cannot run, so its "
            f"accuracies can differ in the last digits: {str(err).rstrip('.')}"
        )
    return ran, f"as its run validated, per {summary.path if summary else ''}"


def checkpoint_step(path: str | Path, kind: str) -> int | None:
    """The optimiser step a checkpoint was saved at: an omnibert ``.ckpt``'s (or a
    fine-tuning run's) ``global_step``, a TF1 checkpoint's ``global_step`` variable; None
    when it has none (a Hugging Face directory) or it cannot be read."""
    try:
        if kind in ("omnibert", "finetuned"):
            return saved_step(path)
        if kind == "tf1":
            prefix = Path(path).with_suffix("") if Path(path).suffix == ".index" else Path(path)
            bundle = TF1Checkpoint(prefix)
            value = bundle.read("global_step").item() if "global_step" in bundle else None
        else:
            return None
    except Exception:  # the model loaded: a step it does not record is not an error
        return None
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _progress(step: int | None) -> Any:
    """omnibert-eval's progress lines (stdout not a terminal): the validation line names the
    checkpoint's step, since this Trainer never trained (its ``global_step`` is 0)."""

    class EvalProgress(ProgressLog):
        def _print(self, trainer: Any, text: str) -> None:
            trainers = f"validation at step {trainer.global_step}:"
            if text.startswith(trainers):
                own = "validation:" if step is None else f"validation at step {step}:"
                text = own + text[len(trainers) :]
            super()._print(trainer, text)

    return EvalProgress(app="omnibert-eval")


def _check_fit(config: Any, datamodule: Any) -> None:
    """The model must cover the data's token ids and positions."""
    data_vocab = datamodule.vocab_size
    if data_vocab != config.vocab_size:
        raise TrainConfigError(
            f"the checkpoint's vocab has {config.vocab_size} tokens but the eval data was "
            f"prepared with a {data_vocab}-token vocab; evaluate on data prepared with the "
            "checkpoint's vocab.txt."
        )
    if datamodule.max_seq_length > config.max_position_embeddings:
        raise TrainConfigError(
            f"the eval rows have {datamodule.max_seq_length} tokens but the checkpoint has "
            f"{config.max_position_embeddings} positions; use data prepared with a "
            "max_seq_length it covers."
        )
