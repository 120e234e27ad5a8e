"""``omnibert-finetune``: SQuAD v1.1 and GLUE fine-tuning, configured by
``conf/finetune.yaml`` (the task's recipe, data and metrics in ``conf/task/<name>.yaml``).

Wiring only (the steps live in :mod:`omnibert.run.finetuning.job`, which tests call too): check
the command line, the config and the data files before any heavy import (one sentence and
exit code 2 on a problem) → load the checkpoint's encoder, fit, predict the eval splits →
print and write ``summary.json`` (+ ``eval/``, ``submission/``) in the run directory.
A ``-m`` sweep (``seed=1,2,3``) ends with Hydra's ``SweepReport``: each metric's median,
mean, standard deviation, min and max over the jobs; a sweep over GLUE tasks
(``experiment=glue``) adds the GLUE table (``glue_report.{md,json}``).
"""

from __future__ import annotations

from typing import Any

import hydra
from omegaconf import DictConfig

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.config import FinetuneConfig
from omnibert.errors import exit_on
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.paths import hydra_output_discarded_when_refused

register()

#: the directories a run writes, checked before Hydra creates its run directory in them
OUTPUT_KEYS = ("paths.output_root",)


def run(cfg: DictConfig) -> dict[str, Any]:
    """Fine-tune as configured; returns the summary (also written to the run directory)."""
    from omnibert.run.finetuning.inputs import check_inputs

    config = FinetuneConfig.of(cfg, FineTuneInputError)  # every range
    inputs = check_inputs(config)  # config and data files, before torch and Lightning load
    from omnibert.run.finetuning.job import run as run_finetuning

    summary = run_finetuning(inputs)
    if summary:
        metrics = ", ".join(f"{k} {v:.4g}" for k, v in summary["metrics"].items())
        print(
            f"omnibert-finetune: done, {summary['steps']} steps in {summary['fit_seconds']:.1f} s;"
            f" training loss {summary['train_loss_first']:.4f} -> "
            f"{summary['train_loss_last']:.4f}\n  {summary['task']} on "
            f"{summary['eval_examples']} eval examples: {metrics or '(no eval_file)'}\n"
            f"  summary       {summary['run_dir']}/summary.json\n"
            f"  curves        {summary['curves'] or 'none (no csv logger)'}",
            flush=True,
        )
    return summary


def run_or_exit(cfg: DictConfig) -> dict[str, Any]:
    with exit_on("omnibert-finetune"):
        return run(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="finetune")
def _hydra_main(cfg: DictConfig) -> float | None:
    """One run; returns its first metric (the task's ``task.data.metrics[0]``; for MNLI on
    the matched set) for a sweeper."""
    with exit_on("omnibert-finetune"), hydra_output_discarded_when_refused():
        summary = run(cfg)
    metrics = summary.get("metrics") or {}
    names = summary.get("metric_names") or []
    value = next((v for k, v in metrics.items() if names and k.startswith(names[0])), None)
    return None if value is None else float(value)


def main() -> None:
    preflight("omnibert-finetune", "finetune", OUTPUT_KEYS)
    _hydra_main()


if __name__ == "__main__":
    main()
