"""Test helpers: fault injection: a real ``SIGKILL`` right after a checkpoint is on disk, a
step that waits once a stop was asked for, a run held at a step until the test lets it go on,
checkpoint writes that fail, damaged shards and checkpoints."""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import lightning.pytorch as pl


def _say(line: str) -> None:
    """One line on stderr in one write (the ranks of a run share it)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class KillAtStep(pl.Callback):
    """``SIGKILL`` this process once the checkpoint of optimiser step ``step`` has been written.

    Lightning runs checkpoint callbacks after every other callback at the end of a batch, and
    validation after that, so the kill is sent from the next hook that follows them: the start
    of the next training batch (or the end of training when ``step`` is the last step). The
    kill is ``SIGKILL``: no ``finally`` blocks, no logger flush, no teardown, as a crash or a
    pre-empted node. Choose ``step`` as a multiple of the checkpoint interval. A run resumed
    past ``step`` never fires. With ``run`` it fires only in a run whose checkpoint directory
    contains that text (one phase of a multi-phase run). With ``rank`` only that rank of a
    multi-process run is killed (the others find out as they would from a crash).
    """

    def __init__(self, step: int, run: str | None = None, rank: int | None = None) -> None:
        super().__init__()
        if step < 1:
            raise ValueError(f"KillAtStep step must be >= 1, got {step}.")
        self.step = step
        self.run = run
        self.rank = rank
        self._armed = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        where = str(getattr(trainer.checkpoint_callback, "dirpath", ""))
        self._armed = trainer.global_step < self.step and (self.run is None or self.run in where)
        self._armed &= self.rank is None or trainer.global_rank == self.rank

    def _maybe_kill(self, trainer: pl.Trainer) -> None:
        if self._armed and trainer.global_step >= self.step:
            _say(f"KillAtStep: SIGKILL at global step {trainer.global_step} (pid {os.getpid()})")
            os.kill(os.getpid(), signal.SIGKILL)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._maybe_kill(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._maybe_kill(trainer)


class HoldWhenStopping(pl.Callback):
    """Once SIGTERM / SIGINT asked the run to stop (:func:`omnibert.stopping.pending`), make
    the current micro-batch last ``seconds`` longer before the safe point that would end
    it, announcing it on stderr: a micro-batch long enough for a second signal to arrive in
    it (give the run a ``trainer.stop_within_s`` longer than ``seconds``)."""

    def __init__(self, seconds: float = 120.0) -> None:
        super().__init__()
        self.seconds = seconds

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        from omnibert import stopping

        if stopping.pending():
            print("HoldWhenStopping: holding the step", file=sys.stderr, flush=True)
            import time

            time.sleep(self.seconds)


class PauseAtMicroBatch(pl.Callback):
    """In a run that starts before optimiser step ``step``, wait at the end of micro-batch
    ``micro_batch`` of that step until SIGTERM / SIGINT arrives, announcing it on stderr
    (``PauseAtMicroBatch: waiting at micro-batch 7 of step 2``), so that a test sends its
    signal at a known micro-batch; then hold that micro-batch ``hold_s`` seconds longer (a
    micro-batch that outlasts ``trainer.stop_within_s``). With ``in_write``, the hold happens
    instead inside the next checkpoint write (while its temporary file is open): a write
    that outlasts the deadline. Fails after ``timeout_s`` without a signal."""

    def __init__(
        self, step: int, micro_batch: int, hold_s: float = 0.0, in_write: bool = False,
        timeout_s: float = 600.0,
    ) -> None:  # fmt: skip
        super().__init__()
        self.step, self.micro_batch, self.hold_s = step, micro_batch, hold_s
        self.in_write, self.timeout_s = in_write, timeout_s
        self._armed = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._armed = trainer.global_step < self.step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        import time

        from omnibert import stopping

        batch_idx = args[-1]
        accumulate = int(trainer.accumulate_grad_batches)
        here = (
            trainer.global_step + 1 == self.step and batch_idx % accumulate + 1 == self.micro_batch
        )
        if not (self._armed and here):
            return
        self._armed = False
        print(f"PauseAtMicroBatch: waiting at micro-batch {self.micro_batch} of step {self.step}",
              file=sys.stderr, flush=True)  # fmt: skip
        deadline = time.monotonic() + self.timeout_s
        while not stopping.pending():
            if time.monotonic() > deadline:
                raise RuntimeError("PauseAtMicroBatch: no signal came")
            time.sleep(0.01)
        if self.hold_s and not self.in_write:
            print("PauseAtMicroBatch: holding the micro-batch", file=sys.stderr, flush=True)
            time.sleep(self.hold_s)

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        from omnibert import stopping

        if self.in_write and stopping.pending():
            checkpoint["pause_at_micro_batch"] = _SlowToPickle(self.hold_s)


class SignalAtMicroBatch(pl.Callback):
    """In a run that starts before optimiser step ``step``, send this process ``signum``
    (SIGTERM by default) at the end of micro-batch ``micro_batch`` of that step: a stop inside
    a step of an in-process run, at a known micro-batch."""

    def __init__(self, step: int, micro_batch: int, signum: int = 15) -> None:
        super().__init__()
        self.step, self.micro_batch, self.signum = step, micro_batch, signum
        self._armed = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._armed = trainer.global_step < self.step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        accumulate = int(trainer.accumulate_grad_batches)
        here = (
            trainer.global_step + 1 == self.step and args[-1] % accumulate + 1 == self.micro_batch
        )
        if self._armed and here:
            self._armed = False
            os.kill(os.getpid(), self.signum)


class PauseInValidation(pl.Callback):
    """Wait at the end of validation batch ``batch`` of the validation after optimiser step
    ``step`` until SIGTERM / SIGINT arrives, announcing it on stderr
    (``PauseInValidation: waiting at validation batch 1 after step 3``)."""

    def __init__(self, step: int, batch: int = 1, timeout_s: float = 600.0) -> None:
        super().__init__()
        self.step, self.batch, self.timeout_s = step, batch, timeout_s

    def on_validation_batch_end(self, trainer: pl.Trainer, *args: Any, **kwargs: Any) -> None:
        import time

        from omnibert import stopping

        batch_idx = args[-1] if args else kwargs["batch_idx"]
        if trainer.global_step != self.step or batch_idx + 1 != self.batch:
            return
        print(f"PauseInValidation: waiting at validation batch {self.batch} after step "
              f"{self.step}", file=sys.stderr, flush=True)  # fmt: skip
        deadline = time.monotonic() + self.timeout_s
        while not stopping.pending():
            if time.monotonic() > deadline:
                raise RuntimeError("PauseInValidation: no signal came")
            time.sleep(0.01)


class _SlowToPickle:
    """An object whose pickling (inside ``torch.save``, with the file open) takes ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        import time

        print("PauseAtMicroBatch: holding the checkpoint write", file=sys.stderr, flush=True)
        time.sleep(self.seconds)
        return (int, (0,))


class HoldUntilSignalled(pl.Callback):
    """Every rank holds at the end of optimiser step ``step`` (before the safe stop looks for
    a signal) until SIGTERM / SIGINT is pending, saying so once on stderr: a test sends the
    signal once every rank holds, and the run stops at exactly that step."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step != self.step:
            return
        from omnibert import stopping

        _say(f"HoldUntilSignalled: rank {trainer.global_rank} holds at step {self.step}")
        import time

        while not stopping.pending():  # the handler notes the signal as it arrives
            time.sleep(0.05)
        self.step = -1


class HangAtStep(pl.Callback):
    """Rank ``rank`` stops answering at the start of the batch after optimiser step ``step``
    (and its checkpoint): it blocks for good, as a process stuck in a driver or a dead node
    whose socket stays open, so its peers wait in their next collective."""

    def __init__(self, step: int, rank: int) -> None:
        super().__init__()
        self.step = step
        self.rank = rank

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_rank == self.rank and trainer.global_step == self.step:
            import threading

            _say(f"HangAtStep: rank {self.rank} (pid {os.getpid()}) hangs at step {self.step}")
            threading.Event().wait()


class SlowFirstStep(pl.Callback):
    """Rank ``rank`` sleeps ``seconds`` before its first training batch, as a rank that
    compiles its step from an empty cache while its peers load theirs: its peers wait that
    long in the first step's collectives."""

    def __init__(self, seconds: float, rank: int) -> None:
        super().__init__()
        self.seconds = seconds
        self.rank = rank
        self._slept = False

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_rank == self.rank and not self._slept:
            import time

            self._slept = True
            _say(f"SlowFirstStep: rank {self.rank} compiles for {self.seconds:g} s")
            time.sleep(self.seconds)


class SlowUntilResumed(pl.Callback):
    """Sleep ``seconds`` after every training batch of a run that started fresh, none in a
    resumed one: a job slow enough to meet its time limit the first time, quick once requeued."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self._fresh = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._fresh = trainer.ckpt_path is None

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._fresh:
            import time

            time.sleep(self.seconds)


class PauseAt(pl.Callback):
    """Hold the run at the start of the first micro-batch after each optimiser step in
    ``steps`` (that step's checkpoint, when one is due, is on disk then): print ``PauseAt:
    paused at step <s>`` and wait until the file ``<folder>/go-<s>`` exists (at most
    ``seconds``). A test changes the world under the run (a file size limit, a dead worker)
    at a known point, then lets it go on."""

    def __init__(self, steps: list[int], folder: str, seconds: float = 600.0) -> None:
        super().__init__()
        self.steps = set(steps)
        self.folder = folder
        self.seconds = seconds

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        import time
        from pathlib import Path

        step = trainer.global_step
        if step not in self.steps:
            return
        self.steps.discard(step)
        print(f"PauseAt: paused at step {step}", file=sys.stderr, flush=True)
        go = Path(self.folder) / f"go-{step}"
        deadline = time.monotonic() + self.seconds
        while not go.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"PauseAt: {go} did not appear in {self.seconds} s")
            time.sleep(0.05)


class FailingCheckpointWrites:
    """Checkpoint writes whose file name contains one of ``names`` fail with ``OSError(code)``
    at ``stage``: ``write`` (the file object's write, after some bytes went out), ``fsync``
    or ``rename``; every other file is written as usual. Install it with
    :meth:`install` (a pytest ``monkeypatch``): it replaces ``open``, ``os.fsync`` and
    ``os.replace`` as :mod:`omnibert.checkpoints.writing` sees them. The first ``spare``
    writes of such a file succeed (a disk that fills later, for a file rewritten under one
    name). ``failures`` counts the writes it failed."""

    def __init__(
        self, names: tuple[str, ...], stage: str = "write", code: int = 28, spare: int = 0
    ) -> None:
        self.names = names
        self.stage = stage
        self.code = code
        self.spare = spare
        self.failures = 0

    def _hit(self, path: Any) -> bool:
        if not any(name in os.path.basename(str(path)) for name in self.names):
            return False
        if self.spare > 0:
            self.spare -= 1
            return False
        return True

    def _fail(self) -> None:
        self.failures += 1
        raise OSError(self.code, os.strerror(self.code))

    def install(self, monkeypatch: Any) -> FailingCheckpointWrites:
        import builtins

        from omnibert.checkpoints import writing

        real_open, real_fsync, real_replace = builtins.open, os.fsync, os.replace
        paths: dict[int, str] = {}
        hooks = self

        class Failing:
            def __init__(self, handle: Any) -> None:
                self._handle = handle
                self._written = 0

            def write(self, data: Any) -> int:
                if self._written > 1000:  # a partial file first, as a disk filling up
                    hooks._fail()
                self._written += len(data)
                return int(self._handle.write(data))

            def __getattr__(self, name: str) -> Any:
                return getattr(self._handle, name)

            def __enter__(self) -> Failing:
                return self

            def __exit__(self, *exc: Any) -> None:
                self._handle.close()

        def fake_open(path: Any, *args: Any, **kwargs: Any) -> Any:
            handle = real_open(path, *args, **kwargs)
            paths[handle.fileno()] = str(path)
            if hooks.stage == "write" and hooks._hit(path):
                return Failing(handle)
            return handle

        def fake_fsync(fd: int) -> None:
            if hooks.stage == "fsync" and hooks._hit(paths.get(fd, "")):
                hooks._fail()
            real_fsync(fd)

        def fake_replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if hooks.stage == "rename" and hooks._hit(dst):
                hooks._fail()
            real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(writing, "open", fake_open, raising=False)
        monkeypatch.setattr(writing.os, "fsync", fake_fsync)
        monkeypatch.setattr(writing.os, "replace", fake_replace)
        return self


# ------------------------------------------------------------------ damaged shards


def truncate(path: Any, keep: float = 0.5) -> None:
    """Cut an Arrow file short (an interrupted copy)."""
    with open(path, "r+b") as handle:
        handle.truncate(int(handle.seek(0, os.SEEK_END) * keep))


def overwrite_bytes(path: Any, count: int = 16) -> None:
    """Overwrite ``count`` bytes in the middle of a file, keeping its size (a bad disk)."""
    with open(path, "r+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        handle.seek(size // 2)
        old = handle.read(count)
        handle.seek(size // 2)
        handle.write(bytes(b ^ 0xFF for b in old))


def damage_random_bytes(path: Any, seed: int, count: int = 4, size: int = 1024) -> list[int]:
    """Overwrite ``count`` runs of ``size`` random bytes at random offsets (seeded) of a
    file, keeping its size (a bad disk, a bad copy); returns the offsets."""
    import random

    rng = random.Random(seed)
    with open(path, "r+b") as handle:
        total = handle.seek(0, os.SEEK_END)
        offsets = sorted(rng.randrange(0, max(1, total - size)) for _ in range(count))
        for offset in offsets:
            handle.seek(offset)
            handle.write(rng.randbytes(min(size, total - offset)))
    return offsets


def damage_masked_positions(path: Any, value: int = 60000) -> None:
    """Every masked position of an Arrow stream file set to ``value`` (:func:`damage_column`)."""
    damage_column(path, "masked_lm_positions", value)


def damage_column(path: Any, name: str, value: int) -> None:
    """Rewrite an Arrow stream file with every value of list column ``name`` set to
    ``value``: the same size and row counts (rewriting it unchanged gives the same bytes),
    rows that no batch can hold."""
    import numpy as np
    import pyarrow as pa

    with pa.OSFile(str(path)) as source:  # a copy in memory: the file is rewritten below
        reader = pa.ipc.open_stream(source)
        schema, batches = reader.schema, list(reader)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for batch in batches:
            column = batch.column(name)
            kind = column.type.value_type
            values = pa.array(np.full(len(column.values), value, dtype=kind.to_pandas_dtype()))
            damaged = pa.ListArray.from_arrays(column.offsets, values.cast(kind))
            writer.write_batch(
                pa.RecordBatch.from_arrays(
                    [damaged if n == name else batch.column(n) for n in schema.names],
                    schema=schema,
                )
            )


class NanGradAt(pl.Callback):
    """Make one gradient element NaN (``value``: or inf) in the optimiser steps ``steps``
    (1-based, the ``global_step`` after them), just before the optimiser looks at the
    gradients: a step that went numerically wrong, injected from outside the product."""

    def __init__(self, steps: list[int], value: float = float("nan")) -> None:
        super().__init__()
        self.steps = {int(s) for s in steps}
        self.value = float(value)

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        if trainer.global_step + 1 in self.steps:
            grad = next(p.grad for p in pl_module.parameters() if p.grad is not None)
            grad.view(-1)[0] = self.value


class EndFitAtStep(pl.Callback):
    """End ``fit`` once optimiser step ``step`` is done (``Trainer.should_stop``), in-process:
    the run's ``step-*.ckpt`` of that step is a checkpoint to resume an interrupted run from."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = int(step)

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if trainer.global_step >= self.step:
            trainer.should_stop = True


class SigtermAtStep(pl.Callback):
    """A real ``SIGTERM`` to this process once optimiser step ``step`` is done, for a run
    inside the test process: omnibert's handler (installed by the app's ``exit_on``) notes it
    and the run stops at the next micro-batch boundary, as a signal from outside would stop
    it. Refuses to send it where omnibert does not handle SIGTERM (it would end the process)."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = int(step)
        self._sent = False

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:  # fmt: skip
        if self._sent or trainer.global_step < self.step:
            return
        from omnibert import stopping

        if signal.getsignal(signal.SIGTERM) != stopping._STATE.handle:
            raise RuntimeError("SigtermAtStep: omnibert does not handle SIGTERM here")
        self._sent = True
        signal.raise_signal(signal.SIGTERM)
