"""A lease's records read again, with the rules its benchmarks follow now.

The H100 lease (2026-11-26) recorded its figures before the benchmarks were corrected: its test
counts left out the file its cap killed, its LAMB floor used a copy bandwidth timed around one
copy instead of the probe's, its packed rate counts the sequences of a lucky draw, and its
comparison with Hugging Face did not say how much of the ratio is work Hugging Face does and
omnibert skips. This script derives what those records support, from their own fields, into a
record of its own, so the docs quote fields of records and never arithmetic done by hand:

* the test counts per file of the check's record (a file killed before its report has none);
* LAMB's multi-tensor kernel against its 44 B/param floor at the probe's copy bandwidth;
* packed sequences/s at the length histogram's mean (real tokens/s over the mean length);
* per case, the matrix-product FLOPs per sequence each side executes (Hugging Face's
  ``BertForPreTraining`` scores every position and runs the last layer for every row;
  omnibert scores the masked ones and prunes the last layer) and the ratio per FLOP.

    python scripts/gpu_reread.py --results-dir docs/benchmarks     # gpu-h100-reread.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import benchplot

REPO = Path(__file__).resolve().parents[1]
RECORDS = REPO / "docs" / "benchmarks"
HISTOGRAM = REPO / "tests" / "fixtures" / "wikipedia_seqlen_histogram_512.json"
#: bench_gpu's sizes as the lease ran them: layers, hidden, heads, intermediate
SIZES = {"large": (24, 1024, 16, 4096), "base": (12, 768, 12, 3072)}
PREDICTIONS = {128: 20, 512: 76}
LAMB_BYTES_PER_PARAM = 44


def _probe(check: dict[str, Any]) -> dict[str, Any]:
    steps = check["runs"][0]["summary"]["steps"]
    return next(s for s in steps if s["step"] == "probe")["findings"]["probe"]


def test_counts(check: dict[str, Any]) -> list[dict[str, Any]]:
    """Each check run's ``gpu-tests`` finding: its command, the totals, and the files its cap
    killed before they wrote a report (their tests are in no count)."""
    out = []
    for run in check["runs"]:
        steps = (run.get("summary") or {}).get("steps", [])
        for step in steps:
            found = step.get("findings", {})
            if step["step"] != "gpu-tests" or "tests" not in found:
                continue
            unreported = [f.split(":")[0] for f in found["failures"] if "no JUnit report" in f]
            out.append({
                "command": run["command"],
                "tests_counted": found["tests"],
                "passed": found["passed"],
                "failed": found["failed"],
                "errors": found["errors"],
                "files_without_a_count": unreported,
            })  # fmt: skip
    return out


def lamb_at_probe(lamb: dict[str, Any], check: dict[str, Any]) -> dict[str, Any]:
    """The Triton kernel's median ms/step against the floor at the probe's bandwidth."""
    measured = lamb["measurements"]
    bandwidth = _probe(check)["ceilings"]["detail"]["copy_GBps_read_plus_write"] * 1e9
    ms = sorted(measured["ms_per_step"]["triton"])[len(measured["ms_per_step"]["triton"]) // 2]
    floor_ms = LAMB_BYTES_PER_PARAM * measured["parameters"] / bandwidth * 1e3
    own = measured["copy_bandwidth_bytes_per_s"]
    return {
        "triton_ms_per_step": ms,
        "probe_copy_bandwidth_bytes_per_s": bandwidth,
        "floor_ms_at_probe_bandwidth": floor_ms,
        "x_floor_at_probe_bandwidth": ms / floor_ms,
        "own_copy_bandwidth_bytes_per_s": own,
        "x_floor_at_own_bandwidth": ms
        / (LAMB_BYTES_PER_PARAM * measured["parameters"] / own * 1e3),
    }


def work_per_sequence(model: str, seq: int) -> dict[str, float]:
    """FLOPs a sequence costs each side in an unpacked row of ``seq`` tokens."""
    from omnibert.callbacks.throughput import bert_pretraining_flops
    from omnibert.models import BertConfig

    layers, hidden, heads, inter = SIZES[model]
    config = BertConfig(vocab_size=30522, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=inter)  # fmt: skip
    ours = bert_pretraining_flops(config, 1, seq, PREDICTIONS[seq], 1)
    real_vocab = dataclasses.replace(config, pad_vocab_size_multiple=1)
    theirs = bert_pretraining_flops(real_vocab, 1, seq, seq, 1, prune_last_layer=False)
    return {"omnibert": float(ours), "hf": float(theirs), "hf_over_omnibert": theirs / ours}


def cases(lease: dict[str, Any], mean_length: float) -> list[dict[str, Any]]:
    out = []
    for case in lease["measurements"]["cases"]:
        ours, hf = case["omnibert"], case["hf"]
        row: dict[str, Any] = {
            "model": case["model"],
            "seq": case["seq"],
            "packing": case["packing"],
            "omnibert_real_tokens_per_sec": ours["real_tokens_per_sec"],
            "omnibert_sequences_per_sec": ours["sequences_per_sec"],
            "omnibert_mean_sequence_tokens": ours["real_tokens_per_sec"]
            / ours["sequences_per_sec"],
            "hf_sequences_per_sec": hf["sequences_per_sec"],
            "ratio_sequences_per_sec": case["ratio_sequences_per_sec"],
        }
        if case["packing"] != "none":
            at_mean = ours["real_tokens_per_sec"] / mean_length
            row["omnibert_sequences_per_sec_at_histogram_mean"] = at_mean
            # Hugging Face's unpacked dense rows cost the same whatever their length
            row["ratio_at_histogram_mean"] = at_mean / hf["sequences_per_sec"]
        published = case.get("published")
        if published:  # the published per-GPU rate as real tokens/s, at the histogram's mean
            value = published["sequences_per_sec"]
            row["published_sequences_per_sec"] = value
            row["published_source"] = published["source"]
            if case["packing"] != "none":
                row["published_real_tokens_per_sec_at_histogram_mean"] = value * mean_length
                row["published_over_omnibert_real_tokens"] = (
                    value * mean_length / ours["real_tokens_per_sec"]
                )
        if case["packing"] == "none":  # both sides' rows hold one sequence each
            work = work_per_sequence(case["model"], case["seq"])
            row["flops_per_sequence"] = work
            row["ratio_per_flop"] = case["ratio_sequences_per_sec"] / work["hf_over_omnibert"]
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=Path, default=RECORDS, help="where the lease's are")
    parser.add_argument("--lease", default="h100", help="the records' suffix (h100, h200)")
    benchplot.add_arguments(parser)
    args = parser.parse_args(argv)
    read = {
        name: json.loads((args.records / f"{name}.json").read_text())
        for name in (
            f"gpu-check-{args.lease}",
            f"gpu-{args.lease}-lease",
            f"lamb-{args.lease}-bert-large",
        )
    }
    check, lease = read[f"gpu-check-{args.lease}"], read[f"gpu-{args.lease}-lease"]
    counts = json.loads(HISTOGRAM.read_text())["counts"]
    mean_length = sum((i + 1) * c for i, c in enumerate(counts)) / sum(counts)
    found = {
        "sources": sorted(read),
        "versions": check["runs"][0]["summary"]["versions"],
        "tests": test_counts(check),
        "lamb": lamb_at_probe(read[f"lamb-{args.lease}-bert-large"], check),
        "histogram_mean_length": mean_length,
        "cases": cases(lease, mean_length),
    }

    def cell(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    rows = []
    for c in found["cases"]:
        rows.append([
            f"{c['model']} seq {c['seq']} {c['packing']}",
            f"{c['omnibert_real_tokens_per_sec']:.0f}",
            f"{c['omnibert_sequences_per_sec']:.1f}",
            cell(c.get("omnibert_sequences_per_sec_at_histogram_mean"), ".1f"),
            f"{c['ratio_sequences_per_sec']:.2f}x",
            cell(c.get("ratio_at_histogram_mean"), ".2f"),
            f"{c['flops_per_sequence']['hf_over_omnibert']:.3f}" if "flops_per_sequence" in c else "n/a",
            f"{c['ratio_per_flop']:.2f}" if "ratio_per_flop" in c else "n/a",
        ])  # fmt: skip
    lamb = found["lamb"]
    record = benchplot.Record(
        name=f"gpu-{args.lease}-reread",
        title=f"The {args.lease.upper()} lease's records read with today's rules",
        headline=(
            f"LAMB Triton {lamb['x_floor_at_probe_bandwidth']:.2f}x its floor at the probe's "
            "bandwidth; tests: "
            + "; ".join(
                f"{t['passed']} of {t['tests_counted']} counted passed"
                + (
                    f" (no count: {', '.join(t['files_without_a_count'])})"
                    if t["files_without_a_count"]
                    else ""
                )
                for t in found["tests"]
            )
        ),
        tables=[
            benchplot.Table(
                "per case (FLOPs per sequence: unpacked rows)",
                [
                    "case",
                    "omnibert real tokens/s",
                    "omnibert seq/s",
                    "seq/s at histogram mean",
                    "ratio vs hf",
                    "ratio at histogram mean",
                    "hf FLOPs per sequence / omnibert's",
                    "ratio per FLOP",
                ],
                rows,
            )
        ],
        measurements=found,
    )
    benchplot.save(record, None, args.results_dir)
    return found


if __name__ == "__main__":
    main()
