"""The GLUE table of a sweep over GLUE tasks and seeds (``omnibert-finetune -m
experiment=glue``), like Table 1 of the BERT paper: per task its metrics (the median over the
seeds, x100), the number of seeds, the task's score (the mean of its metrics, as the GLUE
paper averages tasks with several: MRPC F1 and accuracy, STS-B Pearson and Spearman, MNLI
matched and mismatched) and the GLUE average over the tasks present (all nine for the GLUE
score; the BERT paper's average leaves WNLI out).

Written by :class:`omnibert.run.launching.sweeps.SweepReport` at the end of a sweep whose jobs'
``summary.json`` say ``"benchmark": "glue"``: ``<sweep dir>/glue_report.{md,json}``.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

__all__ = ["GLUE_ORDER", "glue_table", "write_glue_report"]

#: the tasks in the order of the GLUE paper's and the BERT paper's tables
GLUE_ORDER = ("cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli")


def glue_table(summaries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"tasks": {task: {...}}, "average": float | None, "missing": [...]}`` from the jobs'
    summaries (the GLUE ones; others are ignored)."""
    by_task: dict[str, list[Mapping[str, Any]]] = {}
    for summary in summaries:
        if summary.get("benchmark") == "glue" and summary.get("metrics"):
            by_task.setdefault(str(summary["task"]), []).append(summary)
    tasks: dict[str, Any] = {}
    order = [t for t in GLUE_ORDER if t in by_task] + sorted(set(by_task) - set(GLUE_ORDER))
    for task in order:
        runs = sorted(by_task[task], key=lambda s: s.get("seed", 0))
        keys = list(runs[0]["metrics"])
        metrics: dict[str, dict[str, Any]] = {}
        for key in keys:
            values = [float(r["metrics"][key]) for r in runs if key in r["metrics"]]
            metrics[key] = {"median": statistics.median(values), "values": values}
        tasks[task] = {
            "label": runs[0].get("task_label", task),
            "metrics": metrics,
            "seeds": [r.get("seed") for r in runs],
            "score": statistics.fmean(float(m["median"]) for m in metrics.values()),
        }
    scores = [t["score"] for t in tasks.values()]
    return {
        "tasks": tasks,
        "average": statistics.fmean(scores) if scores else None,
        "missing": [t for t in GLUE_ORDER if t not in tasks],
    }


def markdown(table: Mapping[str, Any]) -> str:
    """The table as Markdown (metrics x100, as GLUE reports them)."""
    lines = ["| task | metric | median over seeds | seeds | score |", "|---|---|---|---|---|"]
    for entry in table["tasks"].values():
        names = " / ".join(entry["metrics"])
        medians = " / ".join(f"{100 * m['median']:.1f}" for m in entry["metrics"].values())
        lines.append(
            f"| {entry['label']} | {names} | {medians} | {len(entry['seeds'])} | "
            f"{100 * entry['score']:.1f} |"
        )
    average = table["average"]
    count = len(table["tasks"])
    shown = "" if average is None else f"{100 * average:.1f}"
    lines.append(f"| **GLUE average** ({count} task{'s' * (count != 1)}) | | | | {shown} |")
    if table["missing"]:
        lines.append(f"\nnot in this sweep: {', '.join(table['missing'])}")
    return "\n".join(lines) + "\n"


def write_glue_report(sweep_dir: Path) -> dict[str, Any] | None:
    """``glue_report.{json,md}`` in ``sweep_dir`` from its jobs' summaries, printed; None
    when no job was a GLUE task."""
    summaries = []
    for path in sorted(sweep_dir.glob("*/summary.json")):
        summaries.append(json.loads(path.read_text()))
    table = glue_table(summaries)
    if not table["tasks"]:
        return None
    (sweep_dir / "glue_report.json").write_text(json.dumps(table, indent=2) + "\n")
    text = markdown(table)
    (sweep_dir / "glue_report.md").write_text(text)
    print(f"GLUE ({sweep_dir}):\n{text}", flush=True)
    return table
