"""Several phases in one command: phase 1, then phase 2 from phase 1's final weights.

``phases`` (null for a single run) maps each phase's name, in order, to what it changes in
the config: its ``phase`` node (composed from a ``conf/phase`` option, e.g.
``/phase@phases.phase1.phase: phase1`` in ``conf/experiment/two_phase.yaml``), its ``data``
keys (each phase has its own shards) and any other top-level key (e.g. ``micro_batch_size``).
Each phase's config is derived from the composed one by merging its entry over it; the
composed config itself is never modified.

* Before anything trains, every phase's data is checked against that phase (row width and
  masked positions: one sentence naming both values), so a wrong phase-2 set is found before
  hours of phase 1.
* Phase k > 1 starts from the final checkpoint of phase k - 1: its weights only, with a fresh
  optimiser and schedule (``phase.init_from``, derived here and printed).
* Re-running the same command resumes the phase that was interrupted (from its
  ``last.ckpt``) and skips a finished one (its ``last.ckpt`` is at ``phase.max_steps``):
  ``ckpt_path=auto`` for every phase, so ``ckpt_path`` may be ``auto`` or unset;
  ``++phases.<name>.ckpt_path=<file>`` resumes that phase from another of its checkpoints
  (what the non-finite stop's advice names, its keys given as ``++phases.<name>.<key>``).
* ``compile_only=true`` compiles every phase's step at its own shapes (phase 2's seq 512 as
  well as phase 1's 128) with nothing loaded or resumed: one report per phase.
* Each phase keeps its own run directory (``run_name`` defaults to ``<model>-<phase>``) and
  writes its plan and summary under ``<output dir>/<phase name>/``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from omnibert.callbacks.nonfinite import NonFiniteStop
from omnibert.checkpoints.resuming import AUTO
from omnibert.compat import load_checkpoint
from omnibert.config import TrainConfig, TrainConfigError
from omnibert.errors import UserError, is_rank_zero
from omnibert.run.pretraining.job import check_data

__all__ = ["derive_phases", "phase_status", "run_phases"]

RunOne = Callable[[TrainConfig, Path | None], dict[str, Any]]

#: the keys a non-finite stop's advice gives, which a run of phases takes per phase as
#: ``++phases.<name>.<key>=`` (added, or set again where the command set it already;
#: ``ckpt_path=last`` stays: the app turns it into "the same command")
_PHASE_KEYS = re.compile(r"(?<![\w.])(ckpt_path=(?!last\b)|optimizer\.lr=|run_name=)")


def derive_phases(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    """``(name, config)`` of every phase, in order: each entry of ``phases`` merged over the
    composed config (without ``phases``)."""
    entries = cfg.get("phases")
    if not entries:
        raise TrainConfigError("phases is empty; list at least one phase or set phases=null.")
    if cfg.get("ckpt_path") not in (None, AUTO):
        raise TrainConfigError(
            "ckpt_path is set, but a run of several phases resumes each phase by itself; "
            "drop ckpt_path and re-run the same command."
        )
    base = copy.deepcopy(cfg)  # the composed config itself stays as it is
    base.phases = None
    base.ckpt_path = None  # auto: what a run of phases does by itself
    derived = []
    for name, entry in entries.items():
        if not OmegaConf.is_dict(entry) or "phase" not in entry:
            raise TrainConfigError(
                f"phases.{name} must be a mapping with a phase node (e.g. from "
                f"/phase@phases.{name}.phase: phase1) and the keys this phase changes."
            )
        start = copy.deepcopy(base)
        lrs = OmegaConf.select(entry, "phase.lr")
        if OmegaConf.is_dict(lrs):  # a phase may bring LRs for optimisers the root phase lacks
            with open_dict(start):
                for key in lrs:
                    start.phase.lr.setdefault(str(key), lrs[key])
        merged = OmegaConf.merge(start, entry)
        assert isinstance(merged, DictConfig)
        derived.append((str(name), merged))
    dirs = [str(OmegaConf.select(c, "paths.checkpoint_dir")) for _, c in derived]
    if len(set(dirs)) != len(dirs):
        raise TrainConfigError(
            f"the phases would share the checkpoint directory {dirs[0]}; leave run_name at its "
            "default (<model>-<phase>) or make it depend on ${phase.name}."
        )
    return derived


def phase_status(checkpoint_dir: str | Path, max_steps: int) -> tuple[str, Path]:
    """``("fresh" | "resume" | "done", last.ckpt)`` of a phase from its checkpoint directory."""
    last = Path(checkpoint_dir) / "last.ckpt"
    if not last.is_file():
        return "fresh", last
    try:
        saved = load_checkpoint(last, mmap=True)
        step = int(saved["global_step"])
    except Exception as err:
        raise TrainConfigError(
            f"{last} cannot be read ({type(err).__name__}); move it away to restart that phase."
        ) from err
    return ("done" if step >= max_steps else "resume"), last


def run_phases(cfg: DictConfig, output_dir: Path | None, run_one: RunOne) -> dict[str, Any]:
    """Run the phases in order with ``run_one(config, output_dir)`` (the single-run app); each
    phase's config is typed once."""
    derived = derive_phases(cfg)
    phases = [(derived[0][0], TrainConfig.of(derived[0][1]))]
    for name, phase_cfg in derived[1:]:  # later phases' data before anything trains (the
        try:  # first phase's is checked as it starts)
            config = TrainConfig.of(phase_cfg)
            check_data(config)
        except UserError as err:
            raise TrainConfigError(f"phases.{name}: {err}") from err
        phases.append((name, config))
    summaries: dict[str, Any] = {}
    if phases[0][1].compile_only:  # every phase's shapes; no weights to hand on, nothing resumed
        for name, config in phases:
            out = None if output_dir is None else output_dir / name
            _say(f"omnibert-train: {name}: compile only")
            summaries[name] = run_one(config.starting_from(None), out)
        return {"phases": summaries}
    previous: Path | None = None
    for index, (name, config) in enumerate(phases):
        out = None if output_dir is None else output_dir / name
        status, last = phase_status(config.paths.checkpoint_dir, config.phase.max_steps)
        resume_from = str(last)
        if config.ckpt_path is not None:  # phases.<name>.ckpt_path: that checkpoint instead
            status, resume_from = "resume", config.ckpt_path
        if status == "done":
            _say(f"omnibert-train: {name} finished earlier ({last}); skipped")
            summaries[name] = {"skipped": True, "last_checkpoint": str(last)}
        else:
            note = f"resuming from {resume_from}" if status == "resume" else "starting"
            took = f", weights from {previous} (fresh optimiser)" if index else ""
            _say(f"omnibert-train: {name}: {note}{took}")
            if index > 0:
                config = config.starting_from(str(previous), model_init=False)
            if status == "resume":
                config = config.starting_from(
                    config.phase.init_from, resume_from, model_init=index == 0
                )
            try:
                summaries[name] = run_one(config, out)
            except NonFiniteStop as stop:  # its keys, as this command takes them
                stop.args = (_PHASE_KEYS.sub(f"++phases.{name}.\\1", str(stop)),)
                raise
        previous = last.resolve()
    return {"phases": summaries}


def _say(line: str) -> None:
    """A phase's line, printed by rank 0 alone (one voice: :mod:`omnibert.errors`)."""
    if is_rank_zero():
        print(line, flush=True)
