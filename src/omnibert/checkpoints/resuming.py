"""A run's checkpoints, before and after training: which one to resume (``ckpt_path``: a
file, ``last``, ``auto`` (this run's ``last.ckpt`` when there is one, else a fresh start; what
a launcher's restart means, :func:`auto_resume_reason`), or what a requeued job was asked to
resume), whether it fits the run (the
same model, the same batches), the half-written temporaries of a killed writer, a finished
fine-tuning run that a new one would overwrite, and the requeue file a finished run removes.
Under Lightning < 2.5, :class:`CompletedBatchProgress` makes a checkpoint written inside
``on_train_batch_end`` resume with the next batch, as Lightning 2.5's do.

Checkpoints are read lazily (``torch.load(mmap=True, weights_only=True)`` where torch has
``mmap``; :func:`omnibert.compat.load_checkpoint`): only the hyper-parameters and the loop
state are looked at. The atomic writes themselves are
:class:`~omnibert.checkpoints.writing.AtomicCheckpointIO`'s.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback

from omnibert.accelerators.elastic import joined_before
from omnibert.checkpoints.files import saved_step, unreadable_checkpoint
from omnibert.checkpoints.writing import stale_temporary_files
from omnibert.compat import lightning_resumes_after_batch_end, load_checkpoint
from omnibert.config import TrainConfigError
from omnibert.errors import UserError
from omnibert.models.config import RUNTIME_FIELDS, BertConfig

log = logging.getLogger(__name__)

#: written next to last.ckpt by a run stopped at its time limit
#: (:class:`~omnibert.callbacks.requeue.CheckpointOnSignal`); the requeued run resumes from
#: that checkpoint (:func:`resolve_ckpt_path`)
RESUME_FILE = "resume.json"

#: ``ckpt_path=auto``: this run's ``last.ckpt`` when there is one, else a fresh start
AUTO = "auto"

#: torchrun's restart count of this node's workers
TORCHRUN_COUNT = "TORCHELASTIC_RESTART_COUNT"
#: the variables a launcher sets when it starts a run again after a failure, with its name
RESTART_COUNTS = (
    (TORCHRUN_COUNT, "torchrun restarted the group"),  # torchrun --max-restarts
    ("SLURM_RESTART_COUNT", "SLURM requeued the job"),  # a requeue (scontrol requeue, a node)
)

__all__ = [
    "AUTO",
    "RESTART_COUNTS",
    "RESUME_FILE",
    "CompletedBatchProgress",
    "auto_resume_reason",
    "check_resume_position",
    "check_resume_target",
    "finished",
    "refuse_a_finished_run",
    "refuse_another_run",
    "remove_stale_temporaries",
    "resolve_ckpt_path",
    "resume_hint",
    "saved_sampler_state",
]


def auto_resume_reason(ckpt_path: Any, environ: Mapping[str, str] | None = None) -> str | None:
    """Why this run takes ``ckpt_path`` as ``auto`` (the plan prints it), None when it does not:
    ``ckpt_path=auto`` itself, or ``ckpt_path`` unset in a process a launcher started again
    after a failure (:data:`RESTART_COUNTS` > 0): the same command, which must go on from
    where the failed attempt's last checkpoint left it. Under torchrun's shared store the
    store says it for every node alike (:func:`~omnibert.accelerators.elastic.joined_before`:
    the group joined in an earlier start), not this node's restart count: an agent restarted
    by another node's failure keeps its count at 0."""
    env = os.environ if environ is None else environ
    rejoined = joined_before(env)  # read here, before this process joins
    if ckpt_path == AUTO:
        return "ckpt_path=auto"
    if ckpt_path is not None:
        return None
    for key, what in RESTART_COUNTS:
        count = env.get(key, "").strip()
        if key == TORCHRUN_COUNT and rejoined is not None:
            if rejoined and count.isdigit() and int(count) > 0:
                return f"{what} ({key}={count}), so ckpt_path=auto"
            if rejoined:
                return f"{what} after another node's restart ({key}=0 here), so ckpt_path=auto"
        elif count.isdigit() and int(count) > 0:
            return f"{what} ({key}={count}), so ckpt_path=auto"
    return None


def resolve_ckpt_path(
    ckpt_path: Any,
    checkpoint_dir: str | os.PathLike[str],
    error: type[UserError] = TrainConfigError,
) -> str | None:
    """``null`` → fresh run (refused over an earlier run's checkpoints), or the checkpoint a
    run stopped at its time limit asked to be resumed from (``resume.json``, written by
    :class:`~omnibert.callbacks.requeue.CheckpointOnSignal`: what a requeued job finds), or,
    in a launcher's restart, what ``auto`` finds; ``auto`` → ``<checkpoint_dir>/last.ckpt``
    when it exists, else a fresh run; ``last`` → ``<checkpoint_dir>/last.ckpt``; otherwise an
    existing file."""
    folder = Path(checkpoint_dir)
    if ckpt_path is None and (folder / RESUME_FILE).is_file() and (folder / "last.ckpt").is_file():
        ckpt_path = "last"
    if auto_resume_reason(ckpt_path) is not None:
        ckpt_path = "last" if (folder / "last.ckpt").is_file() else None
    if ckpt_path is None:
        existing = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
        if existing:
            raise error(
                f"{folder} already holds {len(existing)} checkpoint(s) of an earlier run "
                f"(e.g. {existing[-1].name}); resume it with ckpt_path=last, or start a new "
                "run under another run_name."
            )
        return None
    if ckpt_path == "last":
        last = folder / "last.ckpt"
        if not last.is_file():
            raise error(
                f"ckpt_path=last but there is no last.ckpt in {folder}; run without ckpt_path "
                "to start fresh, or pass ckpt_path=<file.ckpt>."
            )
        return str(_newest_last(last))
    path = Path(str(ckpt_path))
    if not path.is_file():
        raise error(
            f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt file or ckpt_path=last."
        )
    return str(path)


def refuse_another_run(
    ckpt: str | None, changes: list[str], reason: str | None, error: type[UserError]
) -> None:
    """``auto`` resumes this run only: a checkpoint whose run differs from this one in a
    setting a resume would otherwise apply (``changes``, :func:`plan_resume`'s lines; another
    model, data or batch is refused by the resume checks themselves) belongs to another run."""
    if ckpt is None or reason is None or not changes:
        return
    raise error(
        f"{reason} found {ckpt}, a checkpoint of another run ({'; '.join(changes)}); to go on "
        "from it with these changes resume it with ckpt_path=last, or start a new run under "
        "another run_name."
    )


def _newest_last(last: Path) -> Path:
    """``last.ckpt``, or the ``last-vN.ckpt`` beside it that holds a later step: Lightning's
    version counter (on in omnibert before issue 43) wrote those when its bookkeeping did not
    know the existing ``last.ckpt``, leaving the newest state under another name."""
    versions = sorted(last.parent.glob(f"{last.stem}-v*{last.suffix}"))
    if not versions:
        return last
    steps = {path: saved_step(path) for path in (last, *versions)}
    newest = max(steps, key=lambda path: -1 if (step := steps[path]) is None else step)
    if newest != last:
        log.warning(
            "%s holds step %s, later than %s (step %s): resuming it; the -vN files are "
            "older omnibert's names for last.ckpt and can be removed once this run has saved",
            newest, steps[newest], last.name, steps[last],
        )  # fmt: skip
    return newest


def refuse_a_finished_run(checkpoint_dir: Path, ckpt_path: Any, error: type[UserError]) -> None:
    """A fine-tuning run directory that holds ``final.ckpt`` is finished: a fresh run there
    would overwrite it."""
    if ckpt_path in (None, AUTO) and (checkpoint_dir / "final.ckpt").is_file():
        raise error(
            f"{checkpoint_dir} already holds final.ckpt, a finished fine-tuning run; choose "
            "another run_name (or seed, or paths.output_root) to keep it, or delete it."
        )


def check_resume_target(ckpt: str, model_config: Mapping[str, Any]) -> None:
    """The checkpoint to resume must hold the same model (read lazily with ``mmap``)."""
    try:
        saved = load_checkpoint(ckpt, mmap=True)
    except Exception as err:
        raise TrainConfigError(unreadable_checkpoint("ckpt_path", ckpt, err)) from err
    theirs = (saved.get("hyper_parameters") or {}).get("model_config") or {}
    # a field the checkpoint lacks (written before the field existed) counts as its default
    saved_config = {**{f.name: f.default for f in dataclasses.fields(BertConfig)}, **theirs}
    diffs = [
        f"{k}={saved_config.get(k)!r} (now {v!r})"
        for k, v in model_config.items()
        if saved_config.get(k) != v
        and k not in RUNTIME_FIELDS  # e.g. attention: any backend resumes
    ]
    if diffs:
        raise TrainConfigError(
            f"ckpt_path={ckpt} was written for another model ({', '.join(diffs)}); resume with "
            "the model config of that run or start a new run_name."
        )


def saved_sampler_state(ckpt: str) -> dict[str, Any] | None:
    """The training sampler's saved position in a Lightning checkpoint (read lazily), as
    torchdata's ``StatefulDataLoader`` (with or without workers) or
    :class:`~omnibert.data.loaders.SamplerStateDataLoader` stored it; ``None`` when the
    checkpoint holds no loader state (Lightning restores nothing then)."""
    try:
        saved = load_checkpoint(ckpt, mmap=True)
        loaders = saved["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    except (KeyError, TypeError):
        return None
    except Exception as err:
        raise TrainConfigError(unreadable_checkpoint("ckpt_path", ckpt, err)) from err
    if not loaders or not isinstance(loaders[0], Mapping):
        return None
    state = loaders[0]
    main = state.get("_snapshot", {}).get("_main_snapshot", state)
    sampler = main.get("_index_sampler_state")
    return dict(sampler) if isinstance(sampler, Mapping) else None


def check_resume_position(ckpt: str, sampler: Any) -> None:
    """The checkpoint's sampler position must belong to ``sampler`` (the training sampler
    this run will build): a resume with another batch size, data or seed raises the
    sampler's :class:`~omnibert.data.samplers.SamplerStateError` here, before the Trainer
    starts (inside ``trainer.fit`` Lightning's teardown hides it behind its own error)."""
    state = saved_sampler_state(ckpt)
    if state is not None:
        sampler.load_state_dict(state)


def remove_stale_temporaries(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """Delete half-written checkpoint temporaries of killed writers (never a real checkpoint)."""
    removed = []
    for path in stale_temporary_files(checkpoint_dir):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed


def finished(checkpoint_dir: str | os.PathLike[str]) -> None:
    """A run that finished has nothing left to resume after a time limit: its requeue file
    goes (rank 0 calls it)."""
    (Path(checkpoint_dir) / RESUME_FILE).unlink(missing_ok=True)


def resume_hint(checkpoint_dir: str | os.PathLike[str]) -> str:
    """How to go on after a run ended by a fault: from ``last.ckpt`` (its step named) when
    there is one, else from the start."""
    last = Path(checkpoint_dir) / "last.ckpt"
    if not last.is_file():
        return "no checkpoint was written before it: run the same command again"
    step = saved_step(last)
    if step is None:
        return f"resume with ckpt_path=last ({last})"
    return (
        f"{last} holds step {step}: resume with ckpt_path=last (the steps after {step} are "
        "trained again)"
    )


class CompletedBatchProgress(Callback):
    """Lightning < 2.5: a checkpoint written in ``on_train_batch_end`` (``every_n_train_steps``
    saves there) records the batch as processed but not yet completed, and a run resumed
    from it trains that batch index again: one extra micro-batch, accumulation boundaries
    shifted by one, and at the end of an epoch an extra step in the finished epoch (Lightning
    issues #14579 and #19815; Lightning 2.5 corrects the counters on restart, PR #20379).

    On those versions this callback rewrites the loop counters of the checkpoint being
    written to what Lightning 2.5 restores: the batch completed (its optimiser step counted
    for the loggers' step) and, when it was the last of its epoch and no validation is due
    after it, the epoch finished, so that the resumed run continues with the next batch
    (a validation due after the batch still runs first, as it would have). It changes
    nothing on Lightning >= 2.5. ``omnibert-train`` always adds it; the resume tests
    (tests/unit/test_datamodule.py, test_train_resume.py, test_lamb_lightning.py) prove it under
    Lightning 2.3 in the IPU environment (scripts/envs/ipu_env.sh).
    """

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if lightning_resumes_after_batch_end():
            return
        fit = checkpoint.get("loops", {}).get("fit_loop")
        progress = (fit or {}).get("epoch_loop.batch_progress")
        if not progress:
            return
        current = progress["current"]
        if current["processed"] != current["completed"] + 1:  # not inside on_train_batch_end
            return
        for scope in ("total", "current"):
            progress[scope]["completed"] = progress[scope]["processed"]
        loop = trainer.fit_loop.epoch_loop
        if not loop._should_accumulate():  # Lightning counts it after on_train_batch_end
            state = fit.setdefault("epoch_loop.state_dict", {})
            state["_batches_that_stepped"] = int(state.get("_batches_that_stepped", 0)) + 1
        last = progress.get("is_last_batch") or current["completed"] >= trainer.num_training_batches
        fetcher: Any = trainer.fit_loop._data_fetcher  # set while fitting
        if last and not loop._should_check_val_fx(fetcher):
            _finish_epoch(fit)


def _finish_epoch(fit: dict[str, Any]) -> None:
    """The fit loop's counters as after its epoch-end: the epoch processed and completed, the
    per-epoch counters reset as a new epoch resets them (what Lightning 2.5 restores)."""
    for counts in fit["epoch_progress"].values():
        counts["processed"] = counts["completed"] = counts["ready"]
    fit["epoch_loop.batch_progress"]["is_last_batch"] = False
    for key in ("epoch_loop.batch_progress", "epoch_loop.scheduler_progress"):
        _zero(fit.get(key, {}).get("current"))
    optimizer = fit.get("epoch_loop.automatic_optimization.optim_progress", {}).get("optimizer", {})
    for tracker in optimizer.values():
        _zero(tracker.get("current"))
    _zero(fit.get("epoch_loop.val_loop.batch_progress", {}).get("total"))


def _zero(counts: Any) -> None:
    if isinstance(counts, dict):
        for key, value in counts.items():
            if isinstance(value, int):
                counts[key] = 0
