"""The fastest micro batch that fits: a few timed forward/backward passes before training.

The memory estimate (:mod:`omnibert.run.memory`) says how large a micro batch may be, not how
fast it runs. On a CPU the largest size that fits is often slow: bert-tiny at seq 128 fits
1,024 rows in 80 % of 24 GiB, but the 20 × 1,024 masked positions' logits over a 30,522-token
vocabulary (2.5 GB in fp32) overflow every cache, and a 1,024-row micro-batch ran at about
30 sequences/s where 64 rows ran several times faster. On a GPU larger is usually faster.
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

With ``torch.compile`` on, the passes run eagerly (compiling each candidate would take minutes);
the ranking of sizes is the eager one, which the plan says.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from omnibert.run.memory import largest_micro_batch

__all__ = [
    "BUDGET_S",
    "TOLERANCE",
    "ProbeResult",
    "cache_file",
    "candidate_sizes",
    "choose_fastest",
    "probe_batch",
    "probe_micro_batch",
]

#: seconds the probe may spend timing (a next size projected past it is not tried)
BUDGET_S = 20.0
#: rates within this fraction of the best count as equally fast (the largest wins)
TOLERANCE = 0.05
#: seconds the training loop spends per micro-batch besides the forward and backward the probe
#: times (Lightning's hooks, the loader's hand-over, gradient accumulation), added to each
#: pass before rates are compared: without it a probe on the demo ranked 8 rows above 32
#: (112.5 against 108.6 rows/s) where training ran 32 rows 20 % faster
LOOP_SECONDS = 0.010
#: a rate this far below the best so far ends the ascending probe
FALLING = 0.10
#: timed passes per size: until this many seconds, at least one and at most MAX_PASSES
MIN_TIMED_S = 0.25
MAX_PASSES = 3
#: the smallest candidate below the largest that fits
MIN_SIZE = 4
#: the cache file's name under the cache folder
CACHE_NAME = "micro_batch_probe.json"


@dataclass(frozen=True)
class ProbeResult:
    """The chosen size, the measured ``(size, rows per second)`` in probe order, the
    candidates not timed, and where a cached result came from (None: measured now)."""

    size: int
    rates: tuple[tuple[int, float], ...]
    untried: tuple[int, ...] = ()
    cached: str | None = None
    note: str = ""

    def describe(self) -> str:
        rates = ", ".join(f"{size} → {rate:,.1f}" for size, rate in self.rates)
        text = f"the fastest measured (rows/s: {rates})"
        if self.untried:
            text += f"; not timed: {', '.join(map(str, self.untried))}"
        if self.cached:
            text += f"; cached in {self.cached}"
        return text + (f"; {self.note}" if self.note else "")

    def to_dict(self) -> dict[str, Any]:
        return {"size": self.size, "rates": [list(r) for r in self.rates],
                "untried": list(self.untried)}  # fmt: skip


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
    tolerance)."""
    ordered = sorted(set(candidates))
    start = clock()
    rates: list[tuple[int, float]] = []
    last_pass = 0.0
    untried: list[int] = []
    for i, size in enumerate(ordered):
        if rates:
            projected = last_pass * size / rates[-1][0] * 2  # a warm-up and a timed pass
            best = max(rate for _, rate in rates)
            if rates[-1][1] < best * (1 - FALLING) or clock() - start + projected > budget_s:
                untried = ordered[i:]
                break
        last_pass = max(seconds_per_pass(size), 1e-9)
        rates.append((size, size / (last_pass + loop_seconds)))
    best = max(rate for _, rate in rates)
    size = max(s for s, rate in rates if rate >= best * (1 - TOLERANCE))
    return ProbeResult(size, tuple((s, round(r, 3)) for s, r in rates), tuple(untried))


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


def cache_file() -> Path:
    """``$OMNIBERT_CACHE_DIR``, else ``$XDG_CACHE_HOME/omnibert``, else
    ``~/.cache/omnibert``, then :data:`CACHE_NAME`."""
    root = os.environ.get("OMNIBERT_CACHE_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(base) / "omnibert")
    return Path(root) / CACHE_NAME


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda {torch.cuda.get_device_name(device)}"
    if device.type != "cpu":
        return device.type
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu {line.split(':', 1)[1].strip()}"
    return "cpu"


def _read_cache(path: Path, key: str) -> dict[str, Any] | None:
    try:
        entry = json.loads(path.read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("size"), int) else None


def _write_cache(path: Path, key: str, entry: dict[str, Any]) -> str | None:
    """Add ``entry`` under ``key``; the reason in words when the cache cannot be written."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            table = json.loads(path.read_text())
            table = table if isinstance(table, dict) else {}
        except (OSError, ValueError):
            table = {}
        table[key] = entry
        temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
        temporary.replace(path)
    except OSError as err:
        return f"not cached ({path}: {err.strerror or err})"
    return None


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
    """``seconds_per_pass(size)``: one warm-up pass, then timed passes (the fastest counts)."""

    def one_pass(batch: dict[str, Tensor]) -> float:
        _sync(device)
        begin = time.perf_counter()
        with _autocast(device, precision):
            loss = model(batch)["loss"]
        loss.backward()
        _sync(device)
        elapsed = time.perf_counter() - begin
        model.zero_grad(set_to_none=True)
        return elapsed

    def seconds_per_pass(size: int) -> float:
        batch = probe_batch(shapes, size, vocab, device)
        one_pass(batch)  # warm-up: allocations, kernel selection
        times: list[float] = []
        while len(times) < MAX_PASSES and (not times or sum(times) < MIN_TIMED_S):
            times.append(one_pass(batch))
        return min(times)

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

    key_facts = {
        "model": model_config.to_dict(),
        "shapes": {k: list(v)[1:] for k, v in shapes.items()},
        "precision": precision,
        "device": _device_name(device),
        "threads": torch.get_num_threads() if device.type == "cpu" else None,
        "torch": torch.__version__,
        "candidates": sorted(set(candidates)),
        "budget_s": budget_s,
    }
    key = hashlib.sha256(json.dumps(key_facts, sort_keys=True).encode()).hexdigest()[:24]
    path = cache_file()
    note = "timed eagerly (compile is on)" if compiled else ""
    if use_cache and (entry := _read_cache(path, key)) is not None:
        rates = tuple((int(s), float(r)) for s, r in entry.get("rates", []))
        untried = tuple(int(s) for s in entry.get("untried", []))
        return ProbeResult(int(entry["size"]), rates, untried, str(path), note)
    fork = [device.index or 0] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=fork):
        model = BertForPreTraining(model_config)
        dtype = {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(precision)
        model = model.to(device=device, dtype=dtype).train()
        timer = _timer(model, shapes, model_config.vocab_size, device, precision)
        result = choose_fastest(candidates, timer, budget_s)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    entry = {**result.to_dict(), "key": key_facts, "when": time.strftime("%Y-%m-%d %H:%M:%S")}
    failed = _write_cache(path, key, entry) if use_cache else None
    note = "; ".join(n for n in (note, failed) if n)
    return ProbeResult(result.size, result.rates, result.untried, None, note)
