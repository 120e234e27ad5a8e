"""``scripts/bench_gpu.py``'s run: the cases in order under a deadline, the JSON rewritten
after every case, SIGTERM kept as an interrupted run, then the record and its figure.

Imports :mod:`bench_gpu` when it runs (that module imports this one's :func:`main`)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import benchplot
import torch


def write_json(path: Path, results: Mapping[str, Any]) -> None:
    """``results`` to ``path`` atomically: a temporary file beside it, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class Terminated(BaseException):
    """SIGTERM (``timeout``): the JSON is written with what ran, then the run ends."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def raise_recompile_limit(limit: int = 64) -> None:
    """Dynamo keeps one cache per code object: every layer (and every case: new models, new
    shapes) adds its entries to the same ``forward``'s, past the default limit of 8 after a
    few cases, beyond which it would run the layer eagerly. Both models alike."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), limit))
            return


def free_memory() -> None:
    """Drop the finished case's models, optimiser state and batches before the next."""
    gc.collect()
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def against_first(cases: list[dict[str, Any]]) -> None:
    """Each case's real tokens/s over the first case's (the ablation's baseline), in place."""
    if not cases:
        return
    first = cases[0]["omnibert"]["real_tokens_per_sec"]
    for case in cases:
        case["ratio_to_first_case"] = case["omnibert"]["real_tokens_per_sec"] / first


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import bench_gpu as bg
    import transformers

    started = time.monotonic()
    args = bg.parse(argv)
    cases: list[bg.Case] = args.case_list
    deadline_at = None if args.deadline is None else started + args.deadline
    path = Path(args.json or f"outputs/bench_gpu/bench_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    command = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    command["case_list"] = [c.to_dict() for c in cases]
    results: dict[str, Any] = {
        "command": command,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "status": "running",
        "compile_scope": args.compile_scope,
        "deadline_seconds": args.deadline,
        "elapsed_seconds": 0.0,
        "cases": [],
        "skipped": [],
        "failed": [],
        "pending": [c.to_dict() for c in cases],
    }

    def save(status: str | None = None) -> None:
        if status is not None:
            results["status"] = status
        results["elapsed_seconds"] = round(time.monotonic() - started, 3)
        write_json(path, results)

    save()
    print(
        f"bench_gpu: {len(cases)} case(s) on {args.device}, compile scope {args.compile_scope}, "
        f"deadline {args.deadline if args.deadline is not None else 'none'} s; results in {path}",
        flush=True,
    )
    raise_recompile_limit()
    previous = signal.signal(signal.SIGTERM, _terminate)
    done: list[tuple[bg.Case, dict[str, float]]] = []
    current = "the start"
    try:
        with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
            if args.smoke and args.length_histogram is None:  # lengths 5..seq alike: packing packs
                uniform = Path(tmp) / "uniform_lengths.json"
                uniform.write_text(json.dumps({"counts": [1] * max(c.seq for c in cases)}))
                args.length_histogram = str(uniform)
            for index, case in enumerate(cases):
                results["pending"] = [c.to_dict() for c in cases[index + 1 :]]
                left = None if deadline_at is None else deadline_at - time.monotonic()
                estimate = bg.estimate_seconds(args, case, done)
                if left is not None and estimate is not None and left < estimate[0]:
                    reason = (
                        f"deadline: {left:.0f} s left of {args.deadline:.0f} s, estimate "
                        f"{estimate[0]:.0f} s ({estimate[1]})"
                    )
                    print(f"bench_gpu: skipped {case.label()}: {reason}", flush=True)
                    results["skipped"].append({**case.to_dict(), "reason": reason})
                    save()
                    continue
                print(f"bench_gpu: {case.label()} ...", flush=True)
                current = case.label()
                try:
                    out = bg.run_case(args, case, Path(tmp), deadline_at)
                except Exception as err:  # recorded, the next case runs
                    text = traceback.format_exc()
                    print(f"bench_gpu: {case.label()} FAILED: {err!r}\n{text}", flush=True)
                    results["failed"].append(
                        {**case.to_dict(), "error": repr(err), "traceback": text[-4000:]}
                    )
                    save()
                    continue
                finally:
                    free_memory()
                current = f"the cases after {case.label()}"
                done.append((case, out["seconds"]))
                results["cases"].append(out)
                against_first(results["cases"])
                save()
                print(bg.report(out), flush=True)
                if index:
                    print(f"  against the first case: {out['ratio_to_first_case']:.3f}x its "
                          "real tokens/s", flush=True)  # fmt: skip
                print(
                    f"bench_gpu: {len(results['cases'])} case(s) written to {path} "
                    f"({time.monotonic() - started:.0f} s elapsed)",
                    flush=True,
                )
    except (Terminated, KeyboardInterrupt) as err:
        save(f"interrupted ({err!r}) during {current}")
        print(f"bench_gpu: interrupted; {len(results['cases'])} case(s) in {path}", flush=True)
        raise SystemExit(143) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    results["pending"] = []
    save("done")
    print(
        f"bench_gpu: results in {path} ({len(results['cases'])} done, "
        f"{len(results['skipped'])} skipped, {len(results['failed'])} failed, "
        f"{results['elapsed_seconds']:.0f} s)",
        flush=True,
    )
    if results["cases"]:
        rec = record(args, results["cases"], results)
        benchplot.save(rec, figure(rec), args.results_dir)
    return results


def figure(rec: Any) -> Any:
    """Real tokens/s per case, omnibert beside its peer, the ratio above each pair (log scale:
    seq 128 and seq 512 rates differ tenfold)."""
    (table,) = rec.tables
    rows = table.rows
    series = {
        "omnibert": [float(r[1]) if r[1] != "n/a" else None for r in rows],
        "Hugging Face": [float(r[2]) if r[2] != "n/a" else None for r in rows],
    }
    groups = [r[0].replace(", ", "\n") for r in rows]
    return benchplot.bars(rec.title, "real tokens/s per device", groups, series,
                          ratio_of=("omnibert", "Hugging Face"), log=True)  # fmt: skip


def record(args: Any, cases: list[dict[str, Any]], results: Any) -> Any:
    """The run as a :class:`benchplot.Record` (the site's benchmark pages read those)."""

    def cell(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    models = list(dict.fromkeys(c.get("model", args.model) for c in cases))

    def label(c: Mapping[str, Any]) -> str:
        name = f"seq {c['seq']}, {c['packing']}"
        name += f", {c['options']}" if c.get("options") else ""
        return name if len(models) == 1 else f"{c['model']} {name}"

    rows = [
        [
            label(c),
            cell(c["omnibert"]["real_tokens_per_sec"], ".0f"),
            cell(c.get("hf", {}).get("real_tokens_per_sec"), ".0f"),
            cell(c.get("ratio_sequences_per_sec"), ".2f") + ("x" if "hf" in c else ""),
            cell(c["omnibert"]["sequences_per_sec"], ".1f"),
            cell(c["omnibert"]["sequences_per_sec_at_histogram_mean"], ".1f"),
            cell(c["omnibert"]["mfu"], ".1%"),
            cell(c.get("ratio_to_first_case"), ".2f"),
            cell(c.get("ratio_to_published"), ".2f"),
        ]
        for c in cases
    ]
    device = cases[0]["device"] if cases else "none"
    headline = "; ".join(
        f"{r[0]}: {r[1]} real tokens/s"
        + (f", {r[3]} hf on the same sequences" if r[2] != "n/a" else "")
        for r in rows
    )
    return benchplot.Record(
        name="gpu-" + "-".join(models) + ("-smoke" if args.smoke else ""),
        title=f"{'/'.join(models)} pretraining step on {device}: omnibert against Hugging Face",
        headline=headline,
        command=benchplot.command_line(),
        machine=benchplot.machine(),
        tables=[
            benchplot.Table(
                f"per device ({cases[0]['precision'] if cases else ''}, compile "
                f"{cases[0]['compile']['scope'] if cases else ''}, update per "
                f"{cases[0].get('update') if cases else ''})",
                [
                    "case",
                    "omnibert real tokens/s",
                    "hf real tokens/s",
                    "ratio (same sequences)",
                    "omnibert seq/s",
                    "seq/s at histogram mean",
                    "omnibert MFU",
                    "vs first case",
                    "vs published",
                ],
                rows,
            )
        ],
        measurements=results,
    )
