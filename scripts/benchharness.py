"""How every ``scripts/bench_*.py`` measures: rounds, warm-up, deadline, presets and its JSON.

One definition of a **round**, the same in every benchmark: each peer (omnibert and what it
is compared with, or the variants of an ablation) runs its region once; a region is timed
between two device synchronisations (CUDA: ``torch.cuda.synchronize``; a CPU needs none), so
a round never stops the clock before the device's queued work does, and nothing inside a
region synchronises for the timing's sake. The order of the peers changes every round: two
peers alternate (A B, B A, ...), more rotate (A B C, B C A, C A B, ...), so drift in the
machine's load hits them alike. Warm-up passes (compilation, allocation, caches) run the same
regions before the rounds; they are reported, never counted. A deadline stops the rounds
once it has passed (at least one round runs). Per peer: the seconds of each round and their
median, the process CPU seconds of the same regions, and what each call returned.

:func:`run_rounds` runs them; :class:`Deadline` is a run's time budget (what is left, whether
it passed, whether a case whose estimate is known still fits); :func:`apply_presets` fills the
flags the command line left out from presets (``--smoke``, ``--lease``) and the defaults, in
that order; :func:`write_json` writes a file atomically and :class:`ResultsFile` is a
benchmark's JSON, rewritten after every stage, that a SIGTERM (a lease's ``timeout``) leaves
marked as interrupted with what ran. ``scripts/benchplot.py`` is the record and its figure.

Standard library only at import (``scripts/gpu_check.py`` uses the deadline before anything
is installed); torch is imported when a CUDA device is synchronised.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "Deadline",
    "Region",
    "ResultsFile",
    "Rounds",
    "Terminated",
    "Turn",
    "apply_presets",
    "device_sync",
    "order_of_round",
    "run_rounds",
    "timed_region",
    "write_json",
]


# ----------------------------------------------------------------------------- presets


def apply_presets(args: argparse.Namespace, *presets: Mapping[str, Any] | None) -> dict[str, Any]:
    """Fill each setting the command line left unset (``None``) from the first of ``presets``
    that names it: explicit flags win, then the presets in the order given (e.g. ``--smoke``,
    then ``--lease``), then the last one, usually the defaults. ``None`` stands for a preset
    that is off. A preset may name a setting that has no flag (it becomes an attribute).
    Returns what the presets filled in."""
    filled: dict[str, Any] = {}
    chosen = [p for p in presets if p]
    for key in dict.fromkeys(k for preset in chosen for k in preset):
        if getattr(args, key, None) is None:
            filled[key] = next(p[key] for p in chosen if key in p)
            setattr(args, key, filled[key])
    return filled


# ----------------------------------------------------------------------------- deadline


class Deadline:
    """A run's time budget: ``seconds`` from ``start`` (``None``: no deadline, never passes).

    ``clock`` is :func:`time.monotonic` (the tests give their own)."""

    def __init__(
        self,
        seconds: float | None,
        *,
        start: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seconds = seconds
        self.clock = clock
        self.start = clock() if start is None else start

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float | None:
        """Seconds left (negative once passed), ``None`` without a deadline."""
        return None if self.seconds is None else self.seconds - self.elapsed()

    def passed(self) -> bool:
        left = self.left()
        return left is not None and left <= 0

    def fits(self, estimate: float | None) -> bool:
        """Whether work estimated at ``estimate`` seconds fits in what is left (it does when
        there is no deadline or no estimate)."""
        left = self.left()
        return left is None or estimate is None or estimate <= left

    def skip_reason(self, estimate: tuple[float, str] | None) -> str | None:
        """Why a case estimated at ``(seconds, whence)`` is skipped, or ``None`` when it fits
        (or nothing is known yet to estimate from)."""
        if estimate is None or self.fits(estimate[0]):
            return None
        return (
            f"deadline: {self.left():.0f} s left of {self.seconds:.0f} s, estimate "
            f"{estimate[0]:.0f} s ({estimate[1]})"
        )


# ----------------------------------------------------------------------------- rounds


@dataclass(frozen=True)
class Turn:
    """What a peer is called with: which pass it is (rounds and warm-up passes count from 0
    separately)."""

    index: int
    warmup: bool = False

    @property
    def tag(self) -> str:
        """``round3`` or ``warmup0``: unique among a run's passes (names of run folders)."""
        return f"{'warmup' if self.warmup else 'round'}{self.index}"


@dataclass(frozen=True)
class Region:
    """One peer's timed region: seconds between the two synchronisations, the process CPU
    seconds over the same span, and what the peer returned."""

    peer: str
    turn: Turn
    seconds: float
    cpu_seconds: float
    value: Any = None


@dataclass
class Rounds:
    """What :func:`run_rounds` measured (so far, inside its hooks)."""

    peers: list[str]
    planned: int
    regions: list[Region] = field(default_factory=list)  # the timed rounds, in run order
    warmups: list[Region] = field(default_factory=list)
    orders: list[list[str]] = field(default_factory=list)  # each round's order
    cut_by_deadline: bool = False
    errors: dict[str, str] = field(default_factory=dict)  # peer -> what it raised (dropped)

    @property
    def rounds(self) -> int:
        """Rounds started (a round cut short by a peer's error counts)."""
        return len(self.orders)

    def _of(self, peer: str) -> list[Region]:
        return [r for r in self.regions if r.peer == peer]

    def seconds(self, peer: str) -> list[float]:
        return [r.seconds for r in self._of(peer)]

    def cpu_seconds(self, peer: str) -> list[float]:
        return [r.cpu_seconds for r in self._of(peer)]

    def values(self, peer: str) -> list[Any]:
        return [r.value for r in self._of(peer)]

    def median(self, peer: str) -> float:
        return statistics.median(self.seconds(peer))

    def warmup_seconds(self, peer: str) -> float:
        return sum(r.seconds for r in self.warmups if r.peer == peer)

    def speedups(self, ours: str, peer: str) -> list[float]:
        """Per round, ``peer``'s seconds over ``ours`` (> 1: ours faster), for peers that do
        the same work in a round."""
        return [p / o for o, p in zip(self.seconds(ours), self.seconds(peer), strict=False)]


def order_of_round(peers: Sequence[str], index: int) -> list[str]:
    """The order of round ``index``: rotated by ``index`` places (two peers alternate)."""
    if not peers:
        return []
    turn = index % len(peers)
    return [*peers[turn:], *peers[:turn]]


def device_sync(device: Any) -> Callable[[], None] | None:
    """The synchronisation of ``device`` (a ``torch.device`` or its name) that brackets each
    timed region: ``None`` on a CPU (its work is done when the call returns), else the
    device's ``torch.<type>.synchronize``."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cpu":
        return None
    import torch

    module = getattr(torch, kind, None)
    sync = getattr(module, "synchronize", None)
    if sync is None:
        raise ValueError(f"benchharness: no torch.{kind}.synchronize to time {device} with")
    target = device if kind == "cuda" else None

    def synchronize() -> None:
        if target is not None:
            sync(target)
        else:
            sync()

    return synchronize


Peer = Callable[[Turn], Any]


def timed_region(name: str, peer: Peer, turn: Turn, sync: Callable[[], None] | None) -> Region:
    """``peer(turn)`` timed between two calls of ``sync`` (none when it is ``None``): the
    region of a round, and of any single timed pass (a profiled one)."""
    if sync is not None:
        sync()
    start, cpu = time.perf_counter(), time.process_time()
    value = peer(turn)
    if sync is not None:
        sync()
    return Region(name, turn, time.perf_counter() - start, time.process_time() - cpu, value)


def run_rounds(
    peers: Mapping[str, Peer],
    *,
    rounds: int,
    sync: Callable[[], None] | None,
    warmup: int = 0,
    deadline: Deadline | None = None,
    fit_next_round: bool = False,
    before_round: Callable[[int], None] | None = None,
    after_round: Callable[[int, Rounds], None] | None = None,
    before_region: Callable[[str, Turn], None] | None = None,
    after_region: Callable[[Region], None] | None = None,
    on_error: Callable[[str, Turn, Exception], str] | None = None,
) -> Rounds:
    """Time ``peers`` (name -> a callable given the :class:`Turn`) in alternating rounds.

    ``sync`` synchronises the device around every region (:func:`device_sync`; ``None`` on a
    CPU); the caller states it. First ``warmup`` passes of each peer in turn, untimed in the
    rounds (their seconds are reported in :attr:`Rounds.warmups`); then up to ``rounds``
    rounds, each peer once, in :func:`order_of_round`'s order. Before every round but the
    first, the rounds stop once ``deadline`` has passed, or (``fit_next_round``) once what
    is left is less than the previous round took.

    Hooks: ``before_round(index)`` and ``after_round(index, rounds so far)`` around a round
    (e.g. a bandwidth measurement between rounds, the JSON rewritten after each);
    ``before_region(name, turn)`` and ``after_region(region)`` around each peer's region,
    outside its timed span (e.g. peak memory reset and read). With ``on_error``, a peer that
    raises is dropped from the later passes (its regions so far are kept) and
    ``on_error(name, turn, error)`` returns the message kept in :attr:`Rounds.errors`;
    without it the error propagates.
    """
    names = list(peers)
    out = Rounds(peers=list(names), planned=rounds)
    live = list(names)

    def one(name: str, turn: Turn) -> Region | None:
        if before_region is not None:
            before_region(name, turn)
        try:
            region = timed_region(name, peers[name], turn, sync)
        except Exception as err:
            if on_error is None:
                raise
            out.errors[name] = on_error(name, turn, err)
            live.remove(name)
            return None
        if after_region is not None:
            after_region(region)
        return region

    for name in names:
        for index in range(warmup):
            if name not in live:
                break
            region = one(name, Turn(index, warmup=True))
            if region is not None:
                out.warmups.append(region)
    clock = deadline.clock if deadline is not None else time.monotonic
    last = 0.0
    for index in range(rounds):
        if index and deadline is not None:
            left = deadline.left()
            if deadline.passed() or (fit_next_round and left is not None and left < last):
                out.cut_by_deadline = True
                break
        if not live:
            break
        if before_round is not None:
            before_round(index)
        order = order_of_round(live, index)
        out.orders.append(order)
        started = clock()
        for name in order:
            region = one(name, Turn(index))
            if region is not None:
                out.regions.append(region)
        last = clock() - started
        if after_round is not None:
            after_round(index, out)
    return out


# ----------------------------------------------------------------------------- JSON


def write_json(path: str | Path, data: Any) -> None:
    """``data`` as indented JSON at ``path``, atomically: serialised first, written to a
    temporary file beside it, flushed to disk, then renamed over ``path``. A reader (or a
    kill) never sees half a file, and a failed write leaves the old file and no temporary
    one. Values JSON has no type for (paths, devices) are written as their ``str``."""
    path = Path(path)
    text = json.dumps(data, indent=2, default=str) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


class Terminated(BaseException):
    """SIGTERM arrived (a lease's ``timeout``): the JSON keeps what ran, then the run ends."""


class ResultsFile:
    """A benchmark's JSON at ``path``: :attr:`data` with ``status`` and ``elapsed_seconds``,
    rewritten atomically by :meth:`save` after every stage, so a kill keeps what finished.
    :meth:`interruptible` turns SIGTERM (and Ctrl-C) into a last save marked
    ``interrupted (...) during <stage>`` and exit status 143."""

    def __init__(
        self,
        path: str | Path,
        data: dict[str, Any],
        *,
        name: str = "bench",
        started: float | None = None,
    ) -> None:
        self.path = Path(path)
        self.data = data
        self.name = name  # the script's, for its printed lines
        #: ``time.monotonic()`` when the run began (``elapsed_seconds`` counts from there)
        self.started = time.monotonic() if started is None else started
        #: what runs now, in words, for an interruption's status (``None``: not said)
        self.stage: str | None = None
        self.data.setdefault("status", "running")

    def save(self, status: str | None = None) -> None:
        if status is not None:
            self.data["status"] = status
        self.data["elapsed_seconds"] = round(time.monotonic() - self.started, 3)
        write_json(self.path, self.data)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[ResultsFile]:
        def terminate(signum: int, frame: Any) -> None:
            raise Terminated(f"signal {signum}")

        previous = signal.signal(signal.SIGTERM, terminate)
        try:
            yield self
        except (Terminated, KeyboardInterrupt) as err:
            during = f" during {self.stage}" if self.stage else ""
            self.save(f"interrupted ({err!r}){during}")
            print(f"{self.name}: interrupted; what ran is in {self.path}", flush=True)
            raise SystemExit(143) from None
        finally:
            signal.signal(signal.SIGTERM, previous)
