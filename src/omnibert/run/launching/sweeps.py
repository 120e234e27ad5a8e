"""Sweeps (Hydra multirun): a run directory per job, named after the job's overrides, and a
table of all jobs at the end.

* A multirun lives in ``<paths.output_root>/multirun`` (``multirun/<app>`` for apps
  without an output root: :func:`sweep_dir`).
* ``paths.run_dir`` is ``${omnibert.run_dir:<single-run dir>}``: in a single run the stable
  ``<output_root>/<run_name>``; in a multirun the job's own Hydra output directory,
  ``<sweep dir>/<job number>-<swept key>=<value>,...`` (:func:`job_dirname`; the job's full
  overrides are in its ``.hydra/overrides.yaml``). Checkpoints, logs, plan and summary of
  every job live there, so ``ckpt_path=last`` in a re-run of the same sweep resumes each job
  from its own checkpoint (the same jobs get the same numbers and values).
* :class:`SweepReport` (a Hydra callback) collects every job's ``summary.json`` and
  ``compile_report.json`` when the sweep ends: a table printed and written to
  ``<sweep dir>/sweep_report.{json,md}`` (compile-only: what fits, memory, step time;
  training and fine-tuning: the final metrics, and their median, mean and spread over the
  jobs); a sweep over GLUE tasks adds ``glue_report.{json,md}``
  (:mod:`omnibert.run.finetuning.glue_report`).
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

__all__ = [
    "SweepReport",
    "job_dirname",
    "register_resolvers",
    "run_dir",
    "run_id",
    "sweep_dir",
    "sweep_group",
]

MAX_NAME = 120


def run_dir(single: str) -> str:
    """The run directory: ``single`` outside a multirun, else the job's output directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        if hydra.mode == RunMode.MULTIRUN:
            return str(hydra.runtime.output_dir)
    return single


#: set by :class:`SweepReport` when a multirun starts: the keys the sweep varies
SWEPT_KEYS_ENV = "OMNIBERT_SWEPT_KEYS"


def sweep_dir(output_root: str | None, app: str) -> str:
    """Where a multirun lives: ``<paths.output_root>/multirun`` for the apps that have an
    output root (train, finetune), ``multirun/<app>`` for the others."""
    return f"{output_root}/multirun" if output_root else f"multirun/{app}"


def job_dirname(number: Any, overrides: Any) -> str:
    """A job's directory name: its number, then the value of each key the sweep varies
    (``3-optimizer.lr=0.0002,seed=2``); the job's full overrides are in its
    ``.hydra/overrides.yaml``. Without a record of the swept keys (a job started by other
    means), every override is named. Path separators become ``_``; names over
    :data:`MAX_NAME` characters keep a prefix and a hash of the whole."""
    pairs = [str(o).lstrip("+~") for o in (overrides or [])]
    swept = os.environ.get(SWEPT_KEYS_ENV)
    if swept is not None:
        keys = swept.split(",") if swept else []
        pairs = [p for p in pairs if p.split("=", 1)[0] in keys]
    pairs = sorted(p.replace("/", "_").replace(os.sep, "_") for p in pairs)
    name = "-".join([str(number), *([",".join(pairs)] if pairs else [])])
    if len(name) > MAX_NAME:
        digest = hashlib.sha1(name.encode()).hexdigest()[:10]
        name = f"{name[: MAX_NAME - 11]}-{digest}"
    return name


def swept_keys(config: DictConfig) -> list[str]:
    """The keys a multirun varies: its command line's sweeps (``seed=1,2``, ``range(...)``)
    and a sweeper's search space (``hydra.sweeper.params``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    keys: list[str] = []
    try:
        task = [str(o) for o in config.hydra.overrides.task]
        for override in OverridesParser.create().parse_overrides(task):
            if override.is_sweep_override():
                keys.append(override.get_key_element().lstrip("+~"))
    except Exception:  # a grammar Hydra itself reports
        pass
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    if params:
        keys += [str(k) for k in params if str(k) not in keys]
    return keys


def run_id(directory: str) -> str:
    """A stable id of a run directory (W&B's run id): the same directory, the same run, so a
    resumed or requeued job continues its experiment-tracker run."""
    return hashlib.sha1(str(Path(directory).resolve()).encode()).hexdigest()[:16]


def sweep_group() -> str | None:
    """The sweep a job belongs to (W&B's group): the sweep directory's name, None outside a
    multirun."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        path = Path(str(HydraConfig.get().sweep.dir))
        # the default <output_root>/multirun: named by its output root
        return f"{path.parent.name}/{path.name}" if path.name == "multirun" else path.name
    return None


def register_resolvers() -> None:
    resolvers = (
        ("omnibert.run_dir", run_dir),
        ("omnibert.job_dirname", job_dirname),
        ("omnibert.sweep_dir", sweep_dir),
        ("omnibert.run_id", run_id),
        ("omnibert.sweep_group", sweep_group),
    )
    for name, fn in resolvers:
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)


def _rows(sweep_dir: Path) -> list[dict[str, Any]]:
    rows = []
    jobs = [p for p in sweep_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    for job in sorted(jobs, key=_job_order):
        row: dict[str, Any] = {"job": job.name}
        compile_report = job / "compile_report.json"
        summary = job / "summary.json"
        if compile_report.is_file():
            report = json.loads(compile_report.read_text())
            measured = report.get("measured") or {}
            row.update(
                kind="compile_only",
                micro_batch=report["batch"]["micro_batch_size"],
                shape=report["batch"]["shapes"]["input_ids"],
                fits=report["fits"],
                estimate_gib=round(report["memory_estimate_bytes"]["total"] / 2**30, 3),
                peak_gib=None if measured.get("peak_memory_bytes") is None
                else round(measured["peak_memory_bytes"] / 2**30, 3),
                step_seconds=measured.get("step_seconds"),
            )  # fmt: skip
        elif summary.is_file():
            data = json.loads(summary.read_text())
            metrics = data.get("metrics") or {
                k.removeprefix("val/"): v
                for k, v in (data.get("validation") or {}).items()
                if k in ("val/mlm_acc", "val/nsp_acc", "val/loss")
            }
            row.update(kind="train", steps=data.get("steps"), **metrics)
        else:
            continue
        rows.append(row)
    return rows


def _job_order(job: Path) -> tuple[int, str]:
    """Jobs in their numbers' order (``2-...`` before ``10-...``), other names after."""
    number = job.name.split("-", 1)[0]
    return (int(number) if number.isdigit() else 1 << 30, job.name)


def _table(rows: list[dict[str, Any]]) -> str:
    keys = [k for k in rows[0] if k != "kind"]
    for row in rows[1:]:
        keys += [k for k in row if k not in keys and k != "kind"]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for row in rows:
        lines.append("| " + " | ".join(str(row.get(k, "")) for k in keys) + " |")
    return "\n".join(lines)


def _spread(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Median, mean, min, max and standard deviation of every numeric metric over the jobs
    (a seed sweep of omnibert-finetune: the spread of its summaries' ``metrics``)."""
    out: dict[str, dict[str, float]] = {}
    skip = {"job", "kind", "steps", "micro_batch", "shape", "fits"}
    for key in {k for row in rows for k in row if k not in skip}:
        values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        if len(values) >= 2:
            out[key] = {
                "median": statistics.median(values),
                "mean": statistics.fmean(values),
                "min": min(values),
                "max": max(values),
                "stdev": statistics.stdev(values),
                "jobs": len(values),
            }
    return out


class SweepReport(Callback):
    """Hydra callback: at the start of a multirun, the keys it varies are recorded for the
    job directories' names (:func:`job_dirname`); at its end, one table of all its jobs
    (module doc)."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        os.environ[SWEPT_KEYS_ENV] = ",".join(swept_keys(config))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if not sweep_dir.is_dir():
            return
        rows = _rows(sweep_dir)
        if not rows:
            return
        spread = _spread([r for r in rows if r["kind"] == "train"])
        report = {"jobs": rows, "spread": spread}
        (sweep_dir / "sweep_report.json").write_text(json.dumps(report, indent=2) + "\n")
        text = f"{_table(rows)}\n"
        for key, stats in sorted(spread.items()):
            text += (
                f"\n{key}: median {stats['median']:.4f}, mean {stats['mean']:.4f} (min "
                f"{stats['min']:.4f}, max "
                f"{stats['max']:.4f}, stdev {stats['stdev']:.4f}, {stats['jobs']} jobs)"
            )
        (sweep_dir / "sweep_report.md").write_text(text + "\n")
        print(f"sweep of {len(rows)} job(s) in {sweep_dir}:\n{text}", flush=True)
        from omnibert.run.finetuning.glue_report import write_glue_report

        write_glue_report(sweep_dir)  # a sweep over GLUE tasks: the GLUE table too
