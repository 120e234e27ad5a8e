"""What a benchmark measured, as a JSON record and a figure beside its printed ratios.

Every ``scripts/bench_*.py`` ends with :func:`save`: ``<results-dir>/<name>.json`` (the command,
the machine, the headline, tables and raw measurements) and ``<results-dir>/<name>.svg`` (the
figure). The documentation's benchmarks page renders the records committed under
``docs/benchmarks/`` (``scripts/docsite/benchmark_pages.py``), so the numbers on the site are
the ones a script wrote, never hand-copied console output::

    python scripts/bench_packing.py --results-dir docs/benchmarks   # update the site's record

Figures use matplotlib's object API (no pyplot, no display needed).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shlex
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_RESULTS_DIR = Path("outputs/benchmarks")
#: omnibert first, its peer second: the same colours on every figure
COLOURS = ["#3f51b5", "#9e9e9e", "#ff9800", "#4caf50", "#e91e63", "#00bcd4"]


@dataclass
class Table:
    """A table of the page: a title, column names and rows of already formatted cells."""

    title: str
    columns: list[str]
    rows: list[list[str]]


@dataclass
class Record:
    """One benchmark run, as written to ``<name>.json``."""

    name: str  # file stem: "packing", "lamb", ...
    title: str  # what was compared, one line
    headline: str  # the ratio the script prints last, one line
    command: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    tables: list[Table] = field(default_factory=list)
    measurements: dict[str, Any] = field(default_factory=dict)  # raw numbers
    notes: list[str] = field(default_factory=list)
    figure: str | None = None  # file name of the figure beside the JSON


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``--results-dir``: where the JSON and the figure go."""
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=DEFAULT_RESULTS_DIR,
        help="write <name>.json and <name>.svg here (docs/benchmarks updates the site's "
        f"record; default {DEFAULT_RESULTS_DIR})",
    )


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command that ran, as a user would type it (``python scripts/bench_x.py ...``)."""
    argv = list(sys.argv if argv is None else argv)
    script = Path(argv[0])
    with contextlib.suppress(ValueError):
        script = script.resolve().relative_to(Path.cwd())
    return shlex.join(["python", str(script), *argv[1:]])


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine() -> dict[str, Any]:
    """The machine a measurement ran on: CPU, cores, memory, load, versions, date (UTC)."""
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gib": _memory_gib(),
        "load_average_1m": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "date_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M"),
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
    else:
        # a script that measures other processes (bench_attention's omnibert-train runs) never
        # imports torch itself: those processes run this interpreter's installed one
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            info["torch"] = importlib.metadata.version("torch")
    return info


def describe_machine(info: Mapping[str, Any]) -> str:
    """One line for the page: ``Intel Xeon ..., 2 CPUs, 24 GiB, load 4.1, torch 2.13.0``."""
    parts = [str(info.get("cpu", "?"))]
    if info.get("gpu"):
        parts.append(str(info["gpu"]))
    if info.get("usable_cpus"):
        parts.append(f"{info['usable_cpus']} CPUs")
    if info.get("memory_gib"):
        parts.append(f"{info['memory_gib']} GiB")
    if info.get("load_average_1m") is not None:
        parts.append(f"load average {info['load_average_1m']} at start")
    if info.get("torch"):
        parts.append(f"torch {info['torch']}")
    if info.get("date_utc"):
        parts.append(f"{info['date_utc']} UTC")
    return ", ".join(parts)


def save(record: Record, figure: Any | None, results_dir: Path) -> list[Path]:
    """Write ``<name>.json`` (and ``<name>.svg`` when there is a figure); print where."""
    results_dir.mkdir(parents=True, exist_ok=True)
    record.command = record.command or command_line()
    record.machine = record.machine or machine()
    written = []
    if figure is not None:
        record.figure = f"{record.name}.svg"
        svg = results_dir / record.figure
        _save_svg(figure, svg)
        written.append(svg)
    path = results_dir / f"{record.name}.json"
    path.write_text(json.dumps(asdict(record), indent=2) + "\n")
    written.insert(0, path)
    print(f"results: {', '.join(str(p) for p in written)}", flush=True)
    return written


def load(path: Path) -> Record:
    """A record written by :func:`save`."""
    data = json.loads(Path(path).read_text())
    data["tables"] = [Table(**t) for t in data.get("tables", [])]
    return Record(**data)


def _save_svg(figure: Any, path: Path) -> None:
    import matplotlib

    # the same measurements give the same file: no date, fixed ids
    with matplotlib.rc_context({"svg.hashsalt": "omnibert", "svg.fonttype": "path"}):
        figure.savefig(path, format="svg", metadata={"Date": None}, bbox_inches="tight")


def figure(
    panels: int = 1, width: float | None = None, height: float = 3.6
) -> tuple[Any, list[Any]]:
    """A figure with ``panels`` axes side by side: (figure, axes)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width or max(5.0, 4.6 * panels), height), layout="constrained")
    return fig, list(fig.subplots(1, panels, squeeze=False)[0])


def draw_bars(
    ax: Any,
    title: str,
    ylabel: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    ratio_of: tuple[str, str] | None = None,
    labels: Sequence[str] | None = None,
    log: bool = False,
    ylim: tuple[float, float] | None = None,
) -> None:
    """Grouped bars on ``ax``: one group per configuration, one bar per implementation
    (omnibert first, then its peer); a missing value (None) leaves a gap. ``ratio_of=(a, b)``
    writes a/b above each group, or ``labels`` (one per group) when given."""
    import numpy as np

    x = np.arange(len(groups))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        offset = (i - (len(series) - 1) / 2) * width
        heights = [np.nan if v is None else v for v in values]
        ax.bar(x + offset, heights, width, label=label, color=COLOURS[i % len(COLOURS)])
    if ratio_of is not None:
        a, b = (series[k] for k in ratio_of)
        for j, (va, vb) in enumerate(zip(a, b, strict=True)):
            if va and vb:
                top = max(v[j] or 0 for v in series.values())
                ax.annotate(
                    labels[j] if labels is not None else f"{va / vb:.2f}x",
                    (x[j], top),
                    xytext=(0, 3),
                    textcoords="offset points",
                    ha="center",
                    fontweight="bold",
                )
        ax.margins(y=0.15)
    ax.set_xticks(x, groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if log:
        ax.set_yscale("log")
    if ylim is not None:
        ax.set_ylim(*ylim)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)


def bars(
    title: str,
    ylabel: str,
    groups: Sequence[str],
    series: Mapping[str, Sequence[float | None]],
    *,
    ratio_of: tuple[str, str] | None = None,
    labels: Sequence[str] | None = None,
    log: bool = False,
) -> Any:
    """A one-panel figure of :func:`draw_bars`."""
    fig, (ax,) = figure(1, width=max(5.0, 1.6 * len(groups) + 2.5))
    draw_bars(ax, title, ylabel, groups, series, ratio_of=ratio_of, labels=labels, log=log)
    return fig


def draw_curves(
    ax: Any,
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    target: float | None = None,
    logx: bool = False,
) -> None:
    """Lines of y against x per implementation on ``ax`` (e.g. accuracy against seconds),
    with an optional horizontal target line (time-to-accuracy)."""
    for i, (label, (xs, ys)) in enumerate(series.items()):
        ax.plot(xs, ys, marker="o", markersize=3, label=label, color=COLOURS[i % len(COLOURS)])
    if target is not None:
        ax.axhline(target, color="black", linestyle="--", linewidth=1, label=f"target {target}")
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(frameon=False, fontsize=8)
    ax.grid(alpha=0.3)


def curves(
    title: str,
    xlabel: str,
    ylabel: str,
    series: Mapping[str, tuple[Sequence[float], Sequence[float]]],
    *,
    target: float | None = None,
) -> Any:
    """A one-panel figure of :func:`draw_curves` (time-to-accuracy: accuracy against seconds
    of omnibert and its peer, the target as a dashed line)."""
    fig, (ax,) = figure(1, width=7.0)
    draw_curves(ax, title, xlabel, ylabel, series, target=target)
    return fig


def save_throughput(
    results_dir: Path,
    name: str,
    title: str,
    setup: str,
    rates: Mapping[str, Sequence[float]],
    ratios: Sequence[float],
    extra: Mapping[str, Any] | None = None,
    unit: str = "tokens/s",
    peer: str = "hf",
    ours: str = "omnibert",
    headline: str | None = None,
    notes: Sequence[str] = (),
) -> list[Path]:
    """The record of a throughput comparison run in rounds: each round's rate of ``ours`` and
    of ``peer`` (the keys of ``rates``) as bars with the median, the per-round ratios
    ours/peer; the headline defaults to the medians and the median ratio."""
    import statistics
    import textwrap

    rounds = [f"round {i}" for i in range(len(ratios))] + ["median"]
    median = {n: statistics.median(v) for n, v in rates.items()}
    series = {n: [*v, median[n]] for n, v in rates.items()}
    headline = headline or (
        f"{ours} {median[ours]:.1f} {unit}, {peer} {median[peer]:.1f} {unit}: median "
        f"ratio {statistics.median(ratios):.2f}x (per round {min(ratios):.2f}-{max(ratios):.2f}x)"
    )
    # above each round its ratio, above the medians the median of the per-round ratios
    labels = [f"{r:.2f}x" for r in ratios] + [f"{statistics.median(ratios):.2f}x"]
    fig = bars(textwrap.fill(setup, 70), unit, rounds, series, ratio_of=(ours, peer), labels=labels)
    rows = [
        [r, f"{series[ours][i]:.1f}", f"{series[peer][i]:.1f}", labels[i]]
        for i, r in enumerate(rounds)
    ]
    record = Record(
        name=name,
        title=title,
        headline=headline,
        tables=[Table(setup, ["", f"{ours} {unit}", f"{peer} {unit}", "ratio"], rows)],
        measurements={"rates": dict(rates), "ratios": list(ratios), **(extra or {})},
        notes=list(notes),
    )
    return save(record, fig, results_dir)
