"""The report a finished run ends with: its loss and evaluation curves, read back from the CSV
logger's ``metrics.csv`` and drawn as ``curves.png`` next to ``summary.json``.

Panels are chosen from the columns the run logged: losses (``*loss*``), accuracies and
scores (``*acc*``, ``f1``, ``exact_match``; majority baselines dashed) and the learning rate
(``train/lr``, ``lr-*``). Final metrics that were never logged as curves (fine-tuning's
EM/F1, accuracy) are written in the figure's corner. matplotlib's object API, no display.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

CURVES_FILE = "curves.png"

Series = dict[str, tuple[list[float], list[float]]]


def csv_metrics_file(loggers: Iterable[Any]) -> Path | None:
    """The ``metrics.csv`` of the first CSV logger among ``loggers`` (None without one, or
    before anything was logged)."""
    from lightning.pytorch.loggers import CSVLogger

    for logger in loggers:
        if isinstance(logger, CSVLogger):
            path = Path(logger.experiment.metrics_file_path)
            return path if path.is_file() else None
    return None


def read_metrics(path: Path) -> Series:
    """Every numeric column of a Lightning ``metrics.csv`` as (steps, values), rows without a
    value for that column skipped (Lightning writes train and validation rows apart)."""
    series: Series = {}
    with Path(path).open(newline="") as f:
        for row in csv.DictReader(f):
            step_text = row.get("step") or ""
            if not step_text:
                continue
            step = float(step_text)
            for key, text in row.items():
                if key in ("step", "epoch") or key is None or not text:
                    continue
                try:
                    value = float(text)
                except ValueError:
                    continue
                if math.isfinite(value):
                    xs, ys = series.setdefault(key, ([], []))
                    xs.append(step)
                    ys.append(value)
    return series


def _panels(series: Series) -> list[tuple[str, list[str]]]:
    names = sorted(series)
    losses = [n for n in names if "loss" in n]
    scores = [
        n
        for n in names
        if ("acc" in n or n.split("/")[-1] in ("f1", "exact_match") or "baseline" in n)
        and "loss" not in n
    ]
    rates = [n for n in names if n == "train/lr" or n.startswith("lr-")]
    panels = [("loss", losses), ("accuracy", scores), ("learning rate", rates)]
    return [(title, cols) for title, cols in panels if cols]


def plot(series: Series, title: str, final: Mapping[str, float] | None = None) -> Any:
    """The curves figure (a ``matplotlib.figure.Figure``)."""
    from matplotlib.figure import Figure

    panels = _panels(series)
    fig = Figure(figsize=(4.2 * max(1, len(panels)), 3.4), layout="constrained")
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    for ax, (panel, columns) in zip(axes, panels, strict=False):
        colours: dict[str, Any] = {}
        for name in columns:
            xs, ys = series[name]
            dashed = "baseline" in name
            single = len(xs) == 1
            # a majority baseline in the colour of the accuracy it is the baseline of
            same = colours.get(name.replace("_majority_baseline", "_acc")) if dashed else None
            (line,) = ax.plot(
                xs,
                ys,
                label=name,
                color=same,
                linestyle="--" if dashed else "-",
                marker="o" if single or name.startswith("val/") else None,
                markersize=3,
                linewidth=1.0 if dashed else 1.4,
            )
            colours[name] = line.get_color()
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, frameon=False)
    if not panels:
        axes[0].text(0.5, 0.5, "no curves were logged", ha="center", va="center")
        axes[0].set_axis_off()
    if final:
        text = "\n".join(f"{k}: {v:.4g}" for k, v in final.items())
        axes[-1].text(
            0.98,
            0.02,
            text,
            transform=axes[-1].transAxes,
            ha="right",
            va="bottom",
            fontsize=8,
            bbox={"boxstyle": "round", "facecolor": "white", "alpha": 0.8},
        )
    fig.suptitle(title)
    return fig


def write_curves(
    loggers: Iterable[Any],
    out_dir: Path,
    title: str,
    final: Mapping[str, float] | None = None,
) -> Path | None:
    """Draw the run's curves into ``out_dir/curves.png``; returns its path, or None when the
    run had no CSV logger (``logger=none``, ``logger=wandb`` alone) or logged nothing."""
    metrics = csv_metrics_file(loggers)
    if metrics is None:
        return None
    out = Path(out_dir) / CURVES_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    plot(read_metrics(metrics), title, final).savefig(out, dpi=110)
    return out
