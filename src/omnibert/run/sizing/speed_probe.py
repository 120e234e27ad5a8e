"""The fastest micro batch that fits: a few timed forward/backward passes before training.

The memory estimate (:mod:`omnibert.run.sizing.memory`) says how large a micro batch may be, not how
fast it runs. On a CPU the largest size that fits is often slow: the masked positions'
logits of a large micro batch over a 30,522-token vocabulary overflow every cache, so a
smaller one runs more rows per second (docs/accelerators/cpu.md and docs/scale.md have the
figures of bert-tiny's). On a GPU larger is usually faster.
So, unless ``micro_batch_size`` is set, the run times its own model (freshly built, the run's
precision, its device and threads) on synthetic rows of its batch shapes (:func:`probe_batch`)
at up to four candidate sizes (:func:`candidate_sizes`: the largest that fits and quarter
steps below it) and keeps the one with the most rows per second (:func:`choose_fastest`).

* Ascending, so the probe stays short: a size whose rate falls clearly below the best so far
  ends it (larger ones run slower still), and so does a next size whose projected time
  exceeds what is left of ``budget_s`` (:data:`BUDGET_S`).
* Each pass is counted with :data:`LOOP_SECONDS`, what the training loop spends per
  micro-batch beyond the forward and backward (hooks, the loader's hand-over, accumulation),
  and sizes within :data:`TOLERANCE` of the best rate count as equally fast: the largest of
  them wins.
* The result is cached (:func:`cache_file`) under a key of everything that changes the timing
  (model shape, batch shapes, precision, device, threads, torch version, candidates): a second
  run with the same key reads it instead of timing again. The plan prints the candidates and
  their rates either way.
* The probe changes no random state of the run (its model is built inside a forked RNG).

On CUDA the same candidates (within the GPU's memory rule) are timed on the device: CUDA
events give a pass's device time, the host clock the time the host took to queue it, and the
pass counts as the longer of the device time and the host time plus :data:`LOOP_SECONDS`
(:func:`overlapped_seconds`: the loop's own work overlaps the device's queue, so a step is
as slow as the busier of the two). A size that runs out of GPU memory ends the probe (the
memory estimate was optimistic there); the sizes below it stand. The cache key then names the
GPU and this way of timing.

With ``torch.compile`` on, the passes run eagerly (compiling each candidate would take minutes);
the ranking of sizes is the eager one, which the plan says.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from omnibert.config import TrainConfigError
from omnibert.run.sizing.memory import largest_micro_batch
from omnibert.run.sizing.probe_cache import (
    cache_file,
    cache_key,
    device_name,
    read_cache,
    write_cache,
)

__all__ = [
    "BUDGET_S",
    "CUDA_TIMING",
    "TOLERANCE",
    "ProbeResult",
    "TooLarge",
    "cache_file",
    "cache_key",
    "candidate_sizes",
    "choose_fastest",
    "overlapped_seconds",
    "probe_batch",
    "probe_micro_batch",
]

#: seconds the probe may spend timing (a next size projected past it is not tried)
BUDGET_S = 20.0
#: rates within this fraction of the best count as equally fast (the largest wins)
TOLERANCE = 0.05
#: seconds the training loop spends per micro-batch besides the forward and backward the probe
#: times (Lightning's hooks, the loader's hand-over, gradient accumulation), added to each
#: pass before rates are compared: without it the probe ranks a small micro batch above a
#: larger one that trains faster (the loop's cost per micro-batch is what tips them)
LOOP_SECONDS = 0.010
#: a rate this far below the best so far ends the ascending probe
FALLING = 0.10
#: timed passes per size: until this many seconds, at least one and at most MAX_PASSES
MIN_TIMED_S = 0.25
MAX_PASSES = 3
#: the smallest candidate below the largest that fits
MIN_SIZE = 4
#: how a pass is timed on CUDA, as the plan says it (:func:`overlapped_seconds`)
CUDA_TIMING = (
    "timed on the GPU with CUDA events: a pass counts its device time, or the host's time to "
    f"queue it plus {LOOP_SECONDS * 1e3:.0f} ms of loop work where that is longer"
)
#: a CUDA out-of-memory error (compat: torch.OutOfMemoryError, torch >= 2.5; before, torch.cuda's)
OUT_OF_MEMORY: type[Exception] = getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError)


class TooLarge(RuntimeError):
    """A pass at ``size`` rows ran out of device memory."""

    def __init__(self, size: int) -> None:
        super().__init__(f"out of memory at micro batch {size}")
        self.size = size


def overlapped_seconds(device_s: float, host_s: float, loop_s: float = LOOP_SECONDS) -> float:
    """A micro-batch's seconds in the training loop on an asynchronous device: the host queues
    the pass (``host_s``) and goes on with the loop's own work (``loop_s``) while the device
    runs the queue (``device_s``, measured from the pass's first queued kernel): the longer of
    the two sets the pace."""
    return max(device_s, host_s + loop_s)


@dataclass(frozen=True)
class ProbeResult:
    """The chosen size, the measured ``(size, rows per second)`` in probe order, the
    candidates not timed, and where a cached result came from (None: measured now)."""

    size: int
    rates: tuple[tuple[int, float], ...]
    untried: tuple[int, ...] = ()
    cached: str | None = None
    note: str = ""
    #: why the untried sizes were not timed
    stopped: str = ""
    #: how a pass was timed, where not by the host's clock around it (CUDA: CUDA_TIMING)
    timing: str = ""

    @property
    def why(self) -> str:
        """Why :attr:`size` won, in words."""
        best_size, best = max(self.rates, key=lambda r: r[1])
        if dict(self.rates).get(self.size, 0.0) >= best:
            return f"{self.size} ran the most rows/s"
        return (
            f"{self.size} ran within {TOLERANCE:.0%} of the fastest ({best_size}) and is the "
            "largest that did"
        )

    def describe(self) -> str:
        rates = ", ".join(f"{size} → {rate:,.1f}" for size, rate in self.rates)
        text = f"the fastest measured (rows/s: {rates}): {self.why}"
        if self.untried:
            text += f"; not timed: {', '.join(map(str, self.untried))}"
            text += f" ({self.stopped})" if self.stopped else ""
        if self.timing:
            text += f"; {self.timing}"
        if self.cached:
            text += f"; cached in {self.cached}"
        return text + (f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "rates": [list(r) for r in self.rates],
                "untried": list(self.untried), "why": self.why, "stopped": self.stopped,
                "timing": self.timing}  # fmt: skip


def candidate_sizes(limit: int, per_device: int, packed: bool, count: int = 4) -> list[int]:
    """Up to ``count`` ascending sizes: ``limit`` (the largest that fits) and about a quarter
    of the previous one below it, each a divisor of ``per_device`` when unpacked and none
    below :data:`MIN_SIZE` (a row or two per pass is never the fastest per row)."""
    sizes = [largest_micro_batch(per_device, limit, packed)]
    while len(sizes) < count:
        smaller = largest_micro_batch(per_device, max(1, sizes[-1] // 4), packed)
        if smaller >= sizes[-1] or smaller < MIN_SIZE:
            break
        sizes.append(smaller)
    return sorted(set(sizes))


def choose_fastest(
    candidates: Sequence[int],
    seconds_per_pass: Callable[[int], float],
    budget_s: float = BUDGET_S,
    clock: Callable[[], float] = time.perf_counter,
    loop_seconds: float = LOOP_SECONDS,
) -> ProbeResult:
    """Time ``candidates`` in ascending order with ``seconds_per_pass(size)`` (one forward and
    backward at that size; it may take a warm-up pass and several timed ones) and pick the
    size with the most rows per second, each pass counted with ``loop_seconds`` of the
    training loop's own per-micro-batch time (module docstring: the stop rules and the
    tolerance). ``seconds_per_pass`` raises :class:`TooLarge` for a size that does not fit:
    the probe ends there (raised on when it is the smallest)."""
    ordered = sorted(set(candidates))
    start = clock()
    rates: list[tuple[int, float]] = []
    last_pass = 0.0
    untried: list[int] = []
    stopped = ""
    for i, size in enumerate(ordered):
        if rates:
            projected = last_pass * size / rates[-1][0] * 2  # a warm-up and a timed pass
            best = max(rate for _, rate in rates)
            if rates[-1][1] < best * (1 - FALLING):
                stopped = f"{rates[-1][0]} ran over {FALLING:.0%} slower than the best"
            elif clock() - start + projected > budget_s:
                stopped = f"projected past the {budget_s:g} s budget"
            if stopped:
                untried = ordered[i:]
                break
        try:
            last_pass = max(seconds_per_pass(size), 1e-9)
        except TooLarge:
            if not rates:
                raise
            untried, stopped = ordered[i:], f"out of memory at {size}"
            break
        rates.append((size, size / (last_pass + loop_seconds)))
    best = max(rate for _, rate in rates)
    size = max(s for s, rate in rates if rate >= best * (1 - TOLERANCE))
    return ProbeResult(
        size, tuple((s, round(r, 3)) for s, r in rates), tuple(untried), stopped=stopped
    )


def probe_batch(
    shapes: Mapping[str, Sequence[int]], rows: int, vocab_size: int, device: Any
) -> dict[str, Tensor]:
    """``rows`` synthetic rows of the batch contract at the run's shapes (``input_ids`` [1,S],
    ``masked_lm_positions`` [1,P], ``nsp_labels`` [1,K]): every token real, K sequences of
    equal length per row (positions restart per sequence), P masked slots spread over them,
    random token ids (a fixed generator)."""
    seq, predictions, packs = (int(shapes[k][1]) for k in
                               ("input_ids", "masked_lm_positions", "nsp_labels"))  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    bounds = torch.linspace(0, seq, packs + 1).long()
    starts = bounds[:-1]
    token = torch.arange(seq)
    which = torch.bucketize(token, bounds[1:], right=True).clamp(max=packs - 1)
    positions = token - starts[which]
    masked = torch.linspace(1, seq - 1, predictions).long() if predictions else token[:0]
    row = {
        "input_ids": torch.randint(1, max(2, vocab_size), (rows, seq), generator=gen),
        "segment_ids": torch.zeros(rows, seq, dtype=torch.long),
        "position_ids": positions.expand(rows, seq),
        "sequence_ids": (which + 1).expand(rows, seq),
        "masked_lm_positions": masked.expand(rows, predictions),
        "masked_lm_ids": torch.randint(1, max(2, vocab_size), (rows, predictions), generator=gen),
        "masked_lm_weights": torch.ones(rows, predictions),
        "nsp_positions": starts.expand(rows, packs),
        "nsp_labels": torch.zeros(rows, packs, dtype=torch.long),
        "nsp_weights": torch.ones(rows, packs),
    }
    return {k: v.contiguous().to(device) for k, v in row.items()}


def _autocast(device: torch.device, precision: str) -> Any:
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer(
    model: torch.nn.Module, shapes: Mapping[str, Sequence[int]], vocab: int,
    device: torch.device, precision: str,
) -> Callable[[int], float]:  # fmt: skip
    """``seconds_per_pass(size)``: one warm-up pass, then timed passes (the fastest counts);
    on CUDA each pass is :func:`overlapped_seconds` of its CUDA-event and host times, and a
    size that runs out of memory raises :class:`TooLarge`."""

    def forward_backward(batch: dict[str, Tensor]) -> None:
        with _autocast(device, precision):
            loss = model(batch)["loss"]
        loss.backward()

    def one_pass(batch: dict[str, Tensor]) -> float:
        _sync(device)
        begin = time.perf_counter()
        forward_backward(batch)
        _sync(device)
        elapsed = time.perf_counter() - begin
        model.zero_grad(set_to_none=True)
        return elapsed

    def one_cuda_pass(batch: dict[str, Tensor]) -> float:
        _sync(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin = time.perf_counter()
        start.record()
        forward_backward(batch)
        end.record()
        host = time.perf_counter() - begin  # queued, not waited for
        end.synchronize()
        model.zero_grad(set_to_none=True)
        return overlapped_seconds(start.elapsed_time(end) / 1e3, host)

    timed = one_cuda_pass if device.type == "cuda" else one_pass

    def seconds_per_pass(size: int) -> float:
        times: list[float] = []
        try:
            batch = probe_batch(shapes, size, vocab, device)
            timed(batch)  # warm-up: allocations, kernel selection
            while len(times) < MAX_PASSES and (not times or sum(times) < MIN_TIMED_S):
                times.append(timed(batch))
        except OUT_OF_MEMORY:
            pass
        else:
            return min(times)
        # out of the handler, whose traceback held the pass's tensors: free them, then say so
        del batch
        model.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise TooLarge(size)

    return seconds_per_pass


def probe_micro_batch(
    model_config: Any,
    shapes: Mapping[str, Sequence[int]],
    *,
    precision: str,
    device: torch.device,
    candidates: Sequence[int],
    budget_s: float = BUDGET_S,
    compiled: bool = False,
    use_cache: bool = True,
) -> ProbeResult:
    """Time ``candidates`` with a fresh model of ``model_config`` (a BertConfig) on
    ``device`` and choose the fastest (:func:`choose_fastest`), or read the cached choice."""
    from omnibert.models import BertForPreTraining

    key, key_facts = cache_key(model_config, shapes, precision, device, candidates, budget_s)
    path = cache_file()
    note = "timed eagerly (compile is on)" if compiled else ""
    timing = CUDA_TIMING if device.type == "cuda" else ""
    if use_cache and (entry := read_cache(path, key)) is not None:
        rates = tuple((int(s), float(r)) for s, r in entry.get("rates", []))
        untried = tuple(int(s) for s in entry.get("untried", []))
        stopped = str(entry.get("stopped", ""))
        return ProbeResult(int(entry["size"]), rates, untried, str(path), note, stopped, timing)
    fork = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork):
        model = BertForPreTraining(model_config)
        dtype = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
        model = model.to(device=device, dtype=dtype).train()
        timer = _timer(model, shapes, model_config.vocab_size, device, precision)
        # on CUDA the loop's own time is inside each pass's figure (overlapped_seconds)
        loop = 0.0 if device.type == "cuda" else LOOP_SECONDS
        try:
            result = choose_fastest(candidates, timer, budget_s, loop_seconds=loop)
        except TooLarge as err:
            raise TrainConfigError(
                f"the micro-batch speed probe ran out of memory on {device_name(device)} at "
                f"micro batch {err.size}, the smallest size the memory estimate allows here "
                f"(of {', '.join(map(str, sorted(set(candidates))))}); set micro_batch_size to "
                "a smaller size that divides the per-device batch, or a lower memory_fraction."
            ) from None
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result = dataclasses.replace(result, timing=timing)
    entry = {**result.to_dict(), "key": key_facts, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    failed = write_cache(path, key, entry) if use_cache else None
    note = "; ".join(n for n in (note, failed) if n)
    return dataclasses.replace(result, note=note)
