"""What ``scripts/bench_gpu.py`` prints and records: a case's lines (:func:`report`), each
case against the run's first (the ablation's baseline), and the run as a
:class:`benchplot.Record` with its figure (the site's benchmark pages read those)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import benchplot
from bench_gpu_profile import profile_lines


def report(case: dict[str, Any]) -> str:
    compiled = case.get("compile", {}).get("scope", "n/a")
    lines = [
        f"{case.get('model', '?')} seq {case['seq']} packing {case['packing']}"
        + (f" ({case['options']})" if case.get("options") else "")
        + f" micro batch {case['micro_batch']} {case['precision']} on {case['device']}, compile "
        f"{compiled}, update per {case.get('update')}, {case.get('rounds', '?')} rounds"
    ]
    for name in ("omnibert", "hf"):
        if name not in case:
            continue
        r = case[name]
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        mem = "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
        at_mean = r.get("sequences_per_sec_at_histogram_mean")
        lines.append(
            f"  {name:<9} {r['real_tokens_per_sec']:12.0f} real tokens/s  "
            f"{r['sequences_per_sec']:9.1f} sequences/s"
            + (f" ({at_mean:.1f} at the histogram's mean)" if at_mean else "")
            + f"  MFU {mfu:>6}  peak {mem} GiB  ({r['sequences_per_step']:.1f} sequences of "
            f"{r['mean_sequence_tokens']:.0f} tokens a micro batch; warm-up "
            f"{r.get('warmup_seconds', float('nan')):.1f} s)"
        )
        w = r["work"]
        lines.append(
            f"            work a round: {w['token_rows_through_encoder']} token rows through the "
            f"encoder, {w['mlm_positions_scored']} MLM positions scored, "
            f"{w['flops_executed'] / 1e12:.2f} TFLOP"
        )
    if "ratio_sequences_per_sec" in case:
        lines.append(
            f"  ratio omnibert/hf on the same sequences (median of rounds): "
            f"{case['ratio_sequences_per_sec']:.3f}; hf executes "
            f"{case['ratio_work_per_sequence']:.2f}x omnibert's FLOPs a sequence"
        )
    for name in ("omnibert", "hf"):
        if case.get(name, {}).get("profile"):
            lines += profile_lines(name, case[name]["profile"])
    if "published" in case:
        pub = case["published"]
        lines.append(
            f"  ratio to published {pub['sequences_per_sec']:.0f} sequences/s per GPU "
            f"({pub['source']}): {case['ratio_to_published']:.3f}"
        )
    if "seconds" in case:
        s = case["seconds"]
        lines.append(
            f"  case took {s['total']:.1f} s (setup {s['setup']:.1f}, warm-up {s['warmup']:.1f}, "
            f"timed {s['timed']:.1f})"
        )
    return "\n".join(lines)


def against_first(cases: list[dict[str, Any]]) -> None:
    """Each case's real tokens/s over the first case's (the ablation's baseline), in place."""
    if not cases:
        return
    first = cases[0]["omnibert"]["real_tokens_per_sec"]
    for case in cases:
        case["ratio_to_first_case"] = case["omnibert"]["real_tokens_per_sec"] / first


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
