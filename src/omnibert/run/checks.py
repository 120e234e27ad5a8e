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
from typing import Any, cast

import torch
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

from omnibert.callbacks.checkpoint_io import stale_temporary_files
from omnibert.callbacks.requeue import RESUME_FILE
from omnibert.ckpt_files import unreadable_checkpoint
from omnibert.compat import load_checkpoint
from omnibert.errors import UserError
from omnibert.models.config import RUNTIME_FIELDS, architecture_diffs
from omnibert.run.plan import TrainConfigError

__all__ = [
    "RESUME_FILE",
    "check_init_from",
    "check_optimizer",
    "check_resume_position",
    "check_resume_target",
    "describe_clipping",
    "instantiate_node",
    "remove_stale_temporaries",
    "resolve_ckpt_path",
    "resolve_clipping",
    "resolve_config",
    "resolve_vocab_size",
    "saved_sampler_state",
    "tf1_bert_config",
]


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


def resolve_config(cfg: DictConfig, example: str) -> dict[str, Any]:
    """``cfg`` as plain containers with interpolations resolved; a missing key (``???``) or an
    interpolation that does not resolve is one sentence (``example`` shows a full command)."""
    try:
        missing = sorted(OmegaConf.missing_keys(cfg))
        if missing:
            raise TrainConfigError(f"{', '.join(missing)} must be set, {example}.")
        container = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationKeyError as err:
        raise TrainConfigError(_interpolation_message(cfg, err)) from err
    except OmegaConfBaseException as err:
        raise TrainConfigError(f"the config does not resolve: {err}".splitlines()[0]) from err
    assert isinstance(container, dict)
    return cast(dict[str, Any], container)


def _interpolation_message(cfg: DictConfig, err: InterpolationKeyError) -> str:
    key = str(err.full_key or "")
    text = str(err).splitlines()[0]
    if key == "optimizer.lr" and "phase.lr." in text:
        family = text.split("phase.lr.")[1].split("'")[0]
        tuned = ", ".join(OmegaConf.select(cfg, "phase.lr", default={}) or {}) or "none"
        return (
            f"the optimizer takes its learning rate from phase.lr.{family}, which "
            f"phase={OmegaConf.select(cfg, 'phase.name')} does not set (it has LRs for "
            f"{tuned}); set optimizer.lr=<value> or +phase.lr.{family}=<value>."
        )
    return f"{key or 'the config'} does not resolve: {text}"


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
    """``null`` → fresh run (refused over an earlier run's checkpoints), or the checkpoint a
    run stopped at its time limit asked to be resumed from (``resume.json``, written by
    :class:`~omnibert.callbacks.requeue.CheckpointOnSignal`: what a requeued job finds);
    ``last`` → ``<checkpoint_dir>/last.ckpt``; otherwise an existing file."""
    folder = Path(checkpoint_dir)
    if ckpt_path is None and (folder / RESUME_FILE).is_file() and (folder / "last.ckpt").is_file():
        ckpt_path = "last"
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
        raise TrainConfigError(unreadable_checkpoint("ckpt_path", ckpt, err)) from err
    theirs = (saved.get("hyper_parameters") or {}).get("model_config") or {}
    diffs = [
        f"{k}={theirs.get(k)!r} (now {v!r})"
        for k, v in model_config.items()
        if theirs.get(k) != v and k not in RUNTIME_FIELDS  # e.g. attention: any backend resumes
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


def check_init_from(
    init_from: Any, model_config: Mapping[str, Any], bert_config: Any = None
) -> str | None:
    """``init_from`` must exist and hold this architecture: a Hugging Face directory's
    config.json, a .ckpt's ``hyper_parameters['model_config']`` (read lazily), or a TensorFlow 1
    checkpoint prefix with its ``bert_config.json`` (``model.bert_config``, else the one next
    to it), whose index is checked against the model (names, shapes, every shard present)."""
    if init_from is None:
        if bert_config is not None:
            raise TrainConfigError(
                f"model.bert_config={bert_config} applies only to a TensorFlow 1 init_from and "
                "none is set; set model.init_from=<checkpoint prefix> or model.bert_config=null."
            )
        return None
    path = Path(str(init_from))
    tf1 = tf1_bert_config(path, bert_config)
    if tf1 is not None:
        from omnibert.convert.tf1 import check_tf1_checkpoint, read_bert_config

        pad = int(model_config.get("pad_vocab_size_multiple", 8))
        theirs = read_bert_config(tf1, pad_vocab_size_multiple=pad)
        saved = dataclasses.asdict(theirs)
        where = f"init_from={path} (architecture from {tf1})"
    elif not path.exists():
        hint = _tf1_hint(path) or (
            "point model.init_from at a Hugging Face BERT directory or a TensorFlow checkpoint "
            "prefix, or phase.init_from at a .ckpt of the previous phase"
        )
        raise TrainConfigError(f"init_from={init_from} does not exist; {hint}.")
    elif path.is_dir() and not (path / "config.json").is_file() and _tf1_hint(path):
        raise TrainConfigError(
            f"init_from={path} is a directory of TF checkpoints; {_tf1_hint(path)}."
        )
    elif path.is_dir():
        from omnibert.convert.hf import read_hf_config

        saved = dataclasses.asdict(read_hf_config(path))
        where = f"init_from={path}"
    elif _tf1_hint(path):
        raise TrainConfigError(f"init_from={path} is a file of a TF checkpoint; {_tf1_hint(path)}.")
    else:
        try:
            ckpt = load_checkpoint(path, mmap=True)
        except Exception as err:
            raise TrainConfigError(unreadable_checkpoint("init_from", path, err)) from err
        try:
            saved = dict(ckpt["hyper_parameters"]["model_config"])
        except Exception as err:
            raise TrainConfigError(
                f"init_from={path} is not a checkpoint written by omnibert-train "
                f"({_root(err)}); pass the previous phase's .ckpt."
            ) from err
        where = f"init_from={path}"
    diffs = architecture_diffs(saved, model_config)
    if diffs:
        raise TrainConfigError(
            f"{where} holds a different architecture: {', '.join(diffs)}; use the same model "
            "config (or model.config.vocab_size of the same vocab)."
        )
    if tf1 is not None:
        check_tf1_checkpoint(path, theirs)  # names, shapes and shards before any compute
    return str(path)


def _tf1_hint(path: Path) -> str | None:
    from omnibert.convert.tf1 import checkpoint_hint

    return checkpoint_hint(path)


def tf1_bert_config(init_from: Any, bert_config: Any) -> str | None:
    """The ``bert_config.json`` of a TensorFlow 1 ``init_from`` (``model.bert_config``, else
    the one next to the checkpoint); ``None`` when ``init_from`` is not a TF1 prefix, where
    a ``model.bert_config`` is refused."""
    if init_from is None:
        return None
    from omnibert.convert.tf1 import resolve_bert_config
    from omnibert.convert.tf1_bundle import is_tf1_checkpoint

    if not is_tf1_checkpoint(init_from):
        if bert_config is not None:
            raise TrainConfigError(
                f"model.bert_config={bert_config} applies only to a TensorFlow 1 init_from and "
                f"init_from={init_from} is not one (no {init_from}.index); set "
                "model.bert_config=null or init_from to the TF checkpoint's prefix."
            )
        return None
    return str(resolve_bert_config(init_from, bert_config, key="model.bert_config"))


def remove_stale_temporaries(checkpoint_dir: str | os.PathLike[str]) -> list[str]:
    """Delete half-written checkpoint temporaries of killed writers (never a real checkpoint)."""
    removed = []
    for path in stale_temporary_files(checkpoint_dir):
        path.unlink(missing_ok=True)
        removed.append(path.name)
    return removed
