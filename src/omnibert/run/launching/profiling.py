"""``profile=true``: a ``torch.profiler`` trace of a few training steps in ``<run dir>/profile/``.

The profiler is Lightning's own :class:`~lightning.pytorch.profilers.PyTorchProfiler` (a
``torch.profiler.profile`` driven by Lightning's hooks): every training step is one profiler
step, and the ``torch.profiler.schedule`` ``wait``/``warmup``/``active`` (``repeat`` cycles,
after ``skip_first``) decides which are recorded; validation steps never move it. Each finished cycle is written by
``torch.profiler.tensorboard_trace_handler`` as ``<dir>/<name>.<time>.pt.trace.json``: a
Chrome trace (``chrome://tracing``, https://ui.perfetto.dev) that TensorBoard's profiler
plugin also reads (``tensorboard --logdir <dir>``); the operator table goes to
``<dir>/fit-profile.txt``. Steps are Lightning training steps, i.e. micro-batches.

Activities follow the accelerator: CPU always, CUDA on ``accelerator=gpu`` (when CUDA is
there) and ``ProfilerActivity.HPU`` on ``accelerator=hpu``. Intel documents HPU tracing as
``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.HPU])`` after
``habana_frameworks.torch`` has been imported (it registers the HPU profiler backend); that
import happens here, lazily, and only for ``hpu``.

``profile`` in ``conf/pretrain.yaml`` is ``false``, ``true`` (the :class:`ProfileSettings`
defaults) or a mapping of :class:`ProfileSettings` fields, e.g.
``profile={wait:2,warmup:1,active:5,profile_memory:false}``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.profilers import PyTorchProfiler

from omnibert.config import TrainConfigError

__all__ = [
    "ProfileSettings",
    "build_profiler",
    "check_profile",
    "profile_settings",
    "profiler_activities",
    "profiler_for_run",
]


@dataclass(frozen=True)
class ProfileSettings:
    """What ``profile=true`` records (``torch.profiler.schedule`` and ``profile`` options).

    Steps are Lightning training steps (micro-batches). The defaults record micro-batches 2-4
    (counted from 0: one idle, one warm-up, three recorded): a few steady-state steps, a
    trace small enough to open in a browser.
    """

    #: ``torch.profiler.schedule``: steps skipped once, then per cycle idle / warm-up / recorded
    skip_first: int = 0
    wait: int = 1
    warmup: int = 1
    active: int = 3
    #: cycles (0 = until training ends; each cycle writes one trace file)
    repeat: int = 1
    #: ``torch.profiler.profile`` options
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False
    with_flops: bool = True

    def schedule_kwargs(self) -> dict[str, int]:
        return {
            "skip_first": self.skip_first,
            "wait": self.wait,
            "warmup": self.warmup,
            "active": self.active,
            "repeat": self.repeat,
        }

    def recorded_steps(self) -> list[int]:
        """0-based training steps the first cycle records (for the start-up message)."""
        first = self.skip_first + self.wait + self.warmup
        return list(range(first, first + self.active))


def profile_settings(value: Any) -> ProfileSettings | None:
    """``cfg.profile`` → settings, or ``None`` when profiling is off.

    Raises :class:`TrainConfigError` naming the key for anything else than a boolean or a
    mapping of :class:`ProfileSettings` fields with sensible values.
    """
    if value is None or value is False:
        return None
    if value is True:
        return ProfileSettings()
    if not isinstance(value, Mapping):
        raise TrainConfigError(
            f"profile={value!r} must be true, false or a mapping such as "
            "profile={wait:1,warmup:1,active:3}."
        )
    fields = {f.name: f for f in dataclasses.fields(ProfileSettings)}
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise TrainConfigError(
            f"profile.{unknown[0]} is not a profiler setting; use {', '.join(fields)}."
        )
    for key, item in value.items():
        expected = bool if fields[key].type in ("bool", bool) else int
        low = 1 if key == "active" else 0
        wrong = not isinstance(item, expected) or (
            expected is int and (isinstance(item, bool) or item < low)
        )
        if wrong:
            what = "true or false" if expected is bool else f"an integer >= {low}"
            raise TrainConfigError(f"profile.{key}={item!r} must be {what}; fix profile.{key}.")
    return ProfileSettings(**dict(value))


def profiler_activities(accelerator: str) -> list[Any]:
    """``torch.profiler.ProfilerActivity`` values to record on ``accelerator`` (see module doc;
    read when called: the activities a torch has)."""
    activity = torch.profiler.ProfilerActivity
    activities = [activity.CPU]
    if accelerator == "gpu" and torch.cuda.is_available():
        activities.append(activity.CUDA)
    if accelerator == "hpu":
        import habana_frameworks.torch  # noqa: F401  (registers the HPU profiler backend)

        hpu = getattr(activity, "HPU", None)  # compat: not in every torch
        if hpu is None:
            raise TrainConfigError(
                f"profile=true with accelerator=hpu traces ProfilerActivity.HPU, which torch "
                f"{torch.__version__} does not have; run in Intel's Gaudi PyTorch container "
                "(requirements-hpu.txt) or set profile=false."
            )
        activities.append(hpu)
    return activities


def build_profiler(settings: ProfileSettings, dirpath: Path, accelerator: str) -> Any:
    """Lightning's ``PyTorchProfiler`` writing Chrome/TensorBoard traces into ``dirpath``,
    its schedule counting training steps only.

    Lightning's profiler also steps its schedule on validation steps, each stage with its own
    count, so a validation during training restarted the cycle: the operator table
    (``fit-profile.txt``) then held the events of a later, partial cycle instead of the
    recorded training steps, and a validation trace appeared. Validation that falls inside
    the recorded window stays in the trace. The table lists every operator (Lightning cuts it
    at the 20 slowest, so which operators appeared depended on the machine's load).
    """

    class TrainingStepProfiler(PyTorchProfiler):
        STEP_FUNCTIONS = {"training_step"}  # noqa: RUF012 (Lightning's class attribute)

    dirpath.mkdir(parents=True, exist_ok=True)
    return TrainingStepProfiler(
        dirpath=str(dirpath),
        filename="profile",
        export_to_chrome=True,
        schedule=torch.profiler.schedule(**settings.schedule_kwargs()),
        activities=profiler_activities(accelerator),
        row_limit=-1,
        record_shapes=settings.record_shapes,
        profile_memory=settings.profile_memory,
        with_stack=settings.with_stack,
        with_flops=settings.with_flops,
    )


def check_profile(config: Any) -> ProfileSettings | None:
    """``profile`` of the run's typed config checked before any compute: its settings, or
    ``None`` when off. Refuses a second profiler (``trainer.profiler``, e.g. ``debug=profile``)
    and ``compile_only=true`` (which trains nothing to profile)."""
    settings = profile_settings(config.profile)
    if settings is None:
        return None
    if config.trainer.profiler is not None:
        raise TrainConfigError(
            "profile=true and trainer.profiler (debug=profile) both configure a profiler; "
            "use one of them."
        )
    if config.compile_only:
        raise TrainConfigError(
            "compile_only=true runs no training steps to profile; drop profile=true (the "
            "compile-only report has the step time and memory)."
        )
    return settings


def profiler_for_run(settings: ProfileSettings, dirpath: Path, accelerator: str) -> Any:
    """:func:`build_profiler` for a run, saying which steps it records and where."""
    profiler = build_profiler(settings, dirpath, accelerator)
    steps = settings.recorded_steps()
    print(
        f"omnibert-train: profiling training micro-batches {steps[0]}-{steps[-1]} (from 0) "
        f"into {dirpath}",
        flush=True,
    )
    return profiler
