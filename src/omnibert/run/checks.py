"""Checks the apps run before compute: the optimiser and schedule build, the vocab size,
the checkpoint to resume, initial weights, clipping; and building config nodes so that a
user error raised inside a constructor reaches the user as one sentence.

Checkpoints are read lazily (``torch.load(mmap=True, weights_only=True)`` where torch >= 2.1
has ``mmap``; :func:`omnibert.compat.load_checkpoint`): only the
hyper-parameters are looked at.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from omnibert.callbacks.checkpoint_io import stale_temporary_files
from omnibert.compat import load_checkpoint
from omnibert.errors import UserError
from omnibert.run.plan import TrainConfigError


def instantiate_node(node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)``; a :class:`UserError` raised by the target
    is re-raised as it is (Hydra wraps every exception in ``InstantiationException``)."""
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        return instantiate(node, **kwargs)
    except InstantiationException as err:
        cause = err.__cause__
        if isinstance(cause, UserError):
            raise cause from None
        raise


def resolve_clipping(setting: Any, optimizer: Mapping[str, Any]) -> float | None:
    """``clip_grad_per_micro_batch``: ``auto`` → 1.0 when the optimiser itself does not clip
    (``max_grad_norm: null``, as ``lamb_mlperf``), else off; a number → that norm; null → off."""
    if setting is None:
        return None
    if setting == "auto":
        clips_itself = optimizer.get("max_grad_norm", 0) is not None
        return None if clips_itself or "max_grad_norm" not in optimizer else 1.0
    if isinstance(setting, bool) or not isinstance(setting, (int, float)) or setting <= 0:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={setting!r} must be auto, null or a positive norm."
        )
    return float(setting)


def describe_clipping(
    micro_clip: float | None, optimizer: Mapping[str, Any], gradient_clip_val: Any
) -> str:
    in_optimizer = optimizer.get("max_grad_norm")
    if micro_clip is not None and in_optimizer is not None:
        raise TrainConfigError(
            f"clip_grad_per_micro_batch={micro_clip} and optimizer.max_grad_norm="
            f"{in_optimizer} would clip twice; set one of them to null."
        )
    if gradient_clip_val and (micro_clip is not None or in_optimizer is not None):
        raise TrainConfigError(
            f"trainer.gradient_clip_val={gradient_clip_val} clips on top of the optimiser's "
            "own clipping and changes the maths; leave trainer.gradient_clip_val null."
        )
    if micro_clip is not None:
        return f"each micro-batch to global norm {micro_clip:g} before accumulation (MLPerf)"
    if in_optimizer is not None:
        return f"accumulated gradient to global norm {in_optimizer:g} in the optimiser (apex)"
    if gradient_clip_val:
        return f"accumulated gradient to {gradient_clip_val:g} by Lightning"
    return "none"


def check_optimizer(
    optimizer: Mapping[str, Any], schedule: Mapping[str, Any] | None, total_steps: int
) -> None:
    """Build the optimiser and schedule (``total_steps`` long) on one dummy tensor: config
    errors before any compute."""
    from hydra.utils import instantiate

    weight = torch.zeros(1, requires_grad=True)
    try:
        opt = instantiate_node(dict(optimizer), _convert_="all")([("dummy.weight", weight)])
    except UserError:
        raise
    except Exception as err:
        raise TrainConfigError(
            f"optimizer ({optimizer.get('_target_')}) cannot be built: {_root(err)}; fix the "
            "optimizer keys."
        ) from err
    if schedule is None:
        return
    try:
        instantiate(dict(schedule), _convert_="all")(opt, total_steps=total_steps)
    except Exception as err:
        raise TrainConfigError(
            f"schedule ({schedule.get('_target_')}) cannot be built: {_root(err)}; fix the "
            "schedule keys (the schedule runs phase.max_steps steps)."
        ) from err


def _root(err: BaseException) -> str:
    while err.__cause__ is not None:
        err = err.__cause__
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__


def resolve_vocab_size(model_config: Mapping[str, Any], data_vocab_size: int) -> int:
    configured = model_config.get("vocab_size")
    if configured is None:
        return int(data_vocab_size)
    if configured != data_vocab_size:
        raise TrainConfigError(
            f"model.config.vocab_size={configured} but the data was tokenised with a "
            f"{data_vocab_size}-token vocab; set model.config.vocab_size=null (take it from "
            "the data) or use data prepared with the model's vocab."
        )
    return int(configured)


def resolve_ckpt_path(ckpt_path: Any, checkpoint_dir: str | os.PathLike[str]) -> str | None:
    """``null`` → fresh run (refused over an earlier run's checkpoints); ``last`` →
    ``<checkpoint_dir>/last.ckpt``; otherwise an existing file."""
    folder = Path(checkpoint_dir)
    if ckpt_path is None:
        existing = sorted(folder.glob("*.ckpt")) if folder.is_dir() else []
        if existing:
            raise TrainConfigError(
                f"{folder} already holds {len(existing)} checkpoint(s) of an earlier run "
                f"(e.g. {existing[-1].name}); resume it with ckpt_path=last, or start a new "
                "run under another run_name."
            )
        return None
    if ckpt_path == "last":
        last = folder / "last.ckpt"
        if not last.is_file():
            raise TrainConfigError(
                f"ckpt_path=last but there is no last.ckpt in {folder}; run without ckpt_path "
                "to start fresh, or pass ckpt_path=<file.ckpt>."
            )
        return str(last)
    path = Path(str(ckpt_path))
    if not path.is_file():
        raise TrainConfigError(
            f"ckpt_path={ckpt_path} does not exist; pass an existing .ckpt file or ckpt_path=last."
        )
    return str(path)


def check_resume_target(ckpt: str, model_config: Mapping[str, Any]) -> None:
    """The checkpoint to resume must hold the same model (read lazily with ``mmap``)."""
    try:
        saved = load_checkpoint(ckpt, mmap=True)
    except Exception as err:
        raise TrainConfigError(
            f"ckpt_path={ckpt} cannot be read ({_root(err)}); pass an intact checkpoint."
        ) from err
    theirs = (saved.get("hyper_parameters") or {}).get("model_config") or {}
    diffs = [
        f"{k}={theirs.get(k)!r} (now {v!r})" for k, v in model_config.items() if theirs.get(k) != v
    ]
    if diffs:
        raise TrainConfigError(
            f"ckpt_path={ckpt} was written for another model ({', '.join(diffs)}); resume with "
            "the model config of that run or start a new run_name."
        )


#: BertConfig fields that may differ between a run and the weights it starts from
REGULARISATION_FIELDS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "initializer_range")


def architecture_diffs(saved: Mapping[str, Any], model: Mapping[str, Any]) -> list[str]:
    """``key=saved (this model: ours)`` for every architecture field that differs."""
    return [
        f"{k}={saved.get(k)!r} (this model: {v!r})"
        for k, v in model.items()
        if k not in REGULARISATION_FIELDS and saved.get(k) != v
    ]


def check_init_from(init_from: Any, model_config: Mapping[str, Any]) -> str | None:
    """``init_from`` must exist and hold this architecture (a Hugging Face directory's
    config.json, or a .ckpt's ``hyper_parameters['model_config']``, read lazily)."""
    if init_from is None:
        return None
    path = Path(str(init_from))
    if not path.exists():
        raise TrainConfigError(
            f"init_from={init_from} does not exist; point model.init_from at a Hugging Face "
            "BERT directory or phase.init_from at a .ckpt of the previous phase."
        )
    if path.is_dir():
        from omnibert.convert.hf import read_hf_config

        saved = dataclasses.asdict(read_hf_config(path))
    else:
        try:
            ckpt = load_checkpoint(path, mmap=True)
            saved = dict(ckpt["hyper_parameters"]["model_config"])
        except Exception as err:
            raise TrainConfigError(
                f"init_from={path} is not a checkpoint written by omnibert-train "
                f"({_root(err)}); pass the previous phase's .ckpt."
            ) from err
    diffs = architecture_diffs(saved, model_config)
    if diffs:
        raise TrainConfigError(
            f"init_from={path} holds a different architecture: {', '.join(diffs)}; use the "
            "same model config (or model.config.vocab_size of the same vocab)."
        )
    return str(path)


def remove_stale_temporaries(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """Delete half-written checkpoint temporaries of killed writers (never a real checkpoint)."""
    removed = []
    for path in stale_temporary_files(checkpoint_dir):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed
