"""What ``scripts/gpu_check.py`` prints last: a line per step, then what failed, then the
figures (bench_gpu's cases a line each, bench_lamb's ms per step, bench_fp8's verdict).
Standard library only."""

from __future__ import annotations

import json
from typing import Any


def _rate(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def case_line(case: dict[str, Any]) -> str:
    """One bench_gpu case in a line: real tokens/s, sequences/s (at the histogram's mean where
    it applies), MFU, against Hugging Face on the same sequences or against the first case."""
    ours = case["omnibert"]
    options = f" ({case['options']})" if case.get("options") else ""
    line = (
        f"{case.get('model')} seq {case['seq']} {case['packing']}{options}: "
        f"{ours['real_tokens_per_sec']:,.0f} real tokens/s, {ours['sequences_per_sec']:.1f} seq/s"
        f" ({_rate(ours.get('sequences_per_sec_at_histogram_mean'), '.1f')} at the histogram's "
        f"mean), MFU {_rate(ours.get('mfu'), '.1%')}, micro batch {case['micro_batch']}"
    )
    if "hf" in case:
        line += (f"; hf {case['hf']['real_tokens_per_sec']:,.0f} real tokens/s, ratio "
                 f"{case['ratio_sequences_per_sec']:.2f} on the same sequences")  # fmt: skip
    if case.get("ratio_to_first_case") is not None:
        line += f"; x{case['ratio_to_first_case']:.2f} the first line"
    return line


def partial_lines(results: dict[str, Any]) -> list[str]:
    """A benchmark's own JSON in a few lines: bench_gpu's cases (one a line, each side's
    profile below it), bench_lamb's ms per step, bench_fp8's verdict."""
    lines = []
    for case in results.get("cases", []):
        lines.append(case_line(case))
        for name in ("omnibert", "hf"):
            prof = (case.get(name) or {}).get("profile")
            if prof:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in sorted(prof["shares"].items(),
                                                                    key=lambda kv: -kv[1]))  # fmt: skip
                busy = "n/a" if prof.get("busy") is None else f"{prof['busy']:.0%}"
                top = prof["top"][0]["name"][:60] if prof.get("top") else "-"
                lines.append(f"  profile {name}: busy {busy} of {prof['wall_seconds'] * 1e3:.0f} ms; "
                             f"{shares}; top {top}")  # fmt: skip
    for key in ("skipped", "failed"):
        lines += [f"{key}: {str(item)[:300]}" for item in results.get(key) or []]
    if "ms_per_step" in results:
        lines.append(f"ms per step {results['ms_per_step']}; floor {results.get('floor_ms')} ms "
                     f"({results.get('floor_bandwidth_source', '')})")  # fmt: skip
        lines += [f"error {k}: {str(v)[:200]}" for k, v in (results.get("errors") or {}).items()]
    if "verdict" in results:
        lines.append(f"fp8 against bf16: {results['verdict']}")
    return lines


def summary_lines(summary: dict[str, Any]) -> list[str]:
    """The printed summary: a line per step, then what failed, then the figures."""
    lines = [f"gpu_check: {summary['mode']} on {summary.get('device', '?')}, "
             f"{summary['seconds']:.0f} s of {summary['deadline_s']:.0f}"]  # fmt: skip
    for entry in summary["steps"]:
        lines.append(f"  {entry['step']:<12} {entry['status']:<8} {entry['seconds']:6.1f} s"
                     + (f"  {entry['detail']}" if "detail" in entry else ""))  # fmt: skip
        findings = entry.get("findings", {})
        for name, item in findings.get("probe", {}).items():
            detail = json.dumps(item["detail"])
            lines.append(f"      {name:<50} {item['status']:<7} {detail[:220]}")
        if "tests" in findings:
            lines.append("      tests {tests}: passed {passed}, failed {failed}, errors {errors}, "
                         "skipped {skipped}".format(**findings))  # fmt: skip
            for name, part in findings.get("per_file", {}).items():
                lines.append(f"        {name}: {part['passed']} of {part['tests']} passed "
                             f"({part['source']})")  # fmt: skip
            lines += [f"      FAIL {f}" for f in findings["failures"][:40]]
        if "collected" in findings:
            lines.append(f"      collected {findings['collected']} gpu tests")
        results = findings.get("results") or {}
        if results:
            lines.append(f"      (its JSON as last written: {results.get('status')})")
            lines += ["      " + line for line in partial_lines(results)]
        for name, record in findings.get("records", {}).items():
            lines.append(f"      {name}: {record['headline']}")
    if summary.get("records"):
        lines.append(f"  records in OUT/records: {', '.join(summary['records'])}")
    return lines
