"""``omnibert-train``: BERT pretraining with Lightning, configured by ``conf/pretrain.yaml``.

Wiring only (the steps live in :mod:`omnibert.run.pretraining.job`, which tests call too): prepare
the run (every check before compute; one sentence and exit code 2 on a problem) → print and
save the plan and the environment report → ``compile_only``: report and stop; otherwise
build the task and the Trainer → fit → a final validation on the whole eval set → print and
save a summary. In a run of several processes rank 0 prints and writes all of it; the other
ranks print only their errors (:func:`omnibert.errors.is_rank_zero`). The composed config is
never modified.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import check_paths, preflight
from omnibert.config import TrainConfig
from omnibert.errors import RunFailed, exit_on, is_rank_zero, quiet_other_ranks
from omnibert.paths import hydra_output_discarded_when_refused
from omnibert.threads import set_wait_policy_env

register()

#: the directories a run writes, checked before Hydra creates its run directory in them
OUTPUT_KEYS = ("paths.output_root", "paths.checkpoint_dir", "paths.log_dir")


def run(cfg: DictConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """Train as configured (one phase, or each of ``phases`` in turn: see
    :mod:`omnibert.run.pretraining.phases`); returns the summary (also written to ``output_dir``).
    """
    from omnibert import stopping

    stopping.set_context(" before training started")
    if cfg.get("phases"):
        from omnibert.run.pretraining.phases import run_phases

        try:
            summary = run_phases(cfg, output_dir, run_phase)
        except stopping.Stopped as stop:  # each phase resumes by itself when run again
            if stop.hint:
                stop.hint = "resume with the same command"
            raise
        except RunFailed as failed:  # a full disk, a dead loader worker: the same
            text = str(failed).replace("ckpt_path=last", "the same command (no ckpt_path)")
            failed.args = (text,)
            raise
        if output_dir is not None and is_rank_zero():
            output_dir.mkdir(parents=True, exist_ok=True)
            _write_json(output_dir / "summary.json", summary)
        return summary
    config = TrainConfig.of(cfg)  # every range checked, before torch is imported
    DATA_PATHS(cfg)  # then the data the config names, also before torch
    return run_phase(config, output_dir)


def run_phase(config: TrainConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """One training run (one phase; typed by :func:`run` or, one of several, by
    :func:`omnibert.run.pretraining.phases.run_phases`)."""
    from omnibert import stopping
    from omnibert.accelerators.environment import format_report
    from omnibert.run.pipeline.builders import build_loggers, finish_loggers
    from omnibert.run.pretraining.job import build, fit, logged_hyperparameters, prepare

    prepared = prepare(config)  # this process's rank is known from here on
    quiet_other_ranks()
    speaks = is_rank_zero()
    stopping.set_context(
        " before training resumed; resume with ckpt_path=last"
        if prepared.plan.ckpt_path
        else " before training started; nothing to resume"
    )
    if speaks:
        print(f"omnibert-train: environment\n{format_report(prepared.environment)}", flush=True)
        print(f"omnibert-train: {config.run_name}\n{prepared.plan.table()}", flush=True)
    if speaks and prepared.plan.checkpoint_space.get("warning"):
        print(f"omnibert-train: warning: {prepared.plan.checkpoint_space['warning']}", flush=True)
    if output_dir is not None and speaks:
        output_dir.mkdir(parents=True, exist_ok=True)
        _write_json(output_dir / "plan.json", prepared.plan.to_dict())
        _write_json(output_dir / "environment.json", prepared.environment)
    if config.compile_only:  # build, compile and time one step; report; no training
        from omnibert.run.sizing.compile_only import compile_only, report_metrics

        report = compile_only(prepared, output_dir)
        loggers = build_loggers(config.logger, logged_hyperparameters(prepared))
        for logger in loggers:
            logger.log_metrics(report_metrics(report), step=0)
            logger.save()
        finish_loggers(loggers)
        return report
    built = build(prepared, output_dir)
    if built.initialised_from and speaks:
        print(f"omnibert-train: initialised from {built.initialised_from}", flush=True)
    summary = fit(built)
    if not speaks:
        return summary
    if output_dir is not None and built.trainer.is_global_zero:
        # the run's loss/accuracy/LR curves from the CSV logger, next to summary.json
        from omnibert.reporting import write_curves

        title = f"omnibert-train {summary['run_name']}: {summary['steps']} steps"
        curves = write_curves(built.trainer.loggers, output_dir, title)
        summary["curves"] = str(curves) if curves else None
    _print_summary(summary, output_dir)
    if output_dir is not None:
        _write_json(output_dir / "summary.json", summary)
    return summary


def _write_json(path: Path, payload: Any) -> None:
    path.write_text(json.dumps(payload, indent=2) + "\n")


def _print_summary(summary: dict[str, Any], output_dir: Path | None) -> None:
    val = summary["validation"] or {}
    speed = summary["throughput"]
    lines = [
        f"omnibert-train: done, {summary['steps']} steps in {summary['fit_seconds']:.1f} s",
    ]
    if val:
        nsp = (
            f"NSP accuracy {val['val/nsp_acc']:.4f} (majority baseline "
            f"{val['val/nsp_majority_baseline']:.4f}), "
            if "val/nsp_acc" in val
            else ""
        )
        lines.append(
            f"  validation    MLM accuracy {val['val/mlm_acc']:.4f} (majority baseline "
            f"{val['val/mlm_majority_baseline']:.4f}), {nsp}loss "
            f"{val['val/loss']:.4f} (step {int(val['step'])})"
        )
    if speed.get("samples_per_sec"):
        lines.append(
            f"  throughput    {speed['samples_per_sec']:.1f} sequences/s, "
            f"{speed['real_tokens_per_sec']:.0f} real tokens/s "
            f"({speed['padding_fraction']:.1%} padding)"
        )
    mlperf = summary.get("mlperf")
    if mlperf:
        result = (
            f"reached {mlperf['target_accuracy']} after {mlperf['samples_to_target']:,} samples "
            f"in {mlperf['seconds_to_target']:.1f} s"
            if mlperf["reached"]
            else f"{mlperf['status']} after {mlperf['samples']:,} samples (target "
            f"{mlperf['target_accuracy']} not reached)"
        )
        lines.append(f"  MLPerf        {result}; log {mlperf['log_file']}")
    lines.append(f"  checkpoints   {summary['checkpoint_dir']}")
    if output_dir is not None:
        lines.append(f"  summary       {output_dir / 'summary.json'}")
    if "curves" in summary:
        lines.append(f"  curves        {summary['curves'] or 'none (no csv logger)'}")
    print("\n".join(lines), flush=True)


def run_or_exit(cfg: DictConfig, output_dir: Path | None) -> dict[str, Any]:
    """:func:`run`, turning a user error into one line on stderr and exit code 2."""
    with exit_on("omnibert-train"):
        return run(cfg, output_dir)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="pretrain")
def _hydra_main(cfg: DictConfig) -> float | None:
    """One run; returns the final held-out masked-LM accuracy (what a Hydra sweeper such as
    Optuna, ``hydra/sweeper=optuna_mlm``, maximises), None without an eval set."""
    from hydra.core.hydra_config import HydraConfig

    with exit_on("omnibert-train"), hydra_output_discarded_when_refused():
        summary = run(cfg, Path(HydraConfig.get().runtime.output_dir))
    return final_mlm_accuracy(summary)


def final_mlm_accuracy(summary: dict[str, Any]) -> float | None:
    """The last phase's final ``val/mlm_acc`` of a run summary (None when not validated)."""
    if "phases" in summary:
        last = list(summary["phases"].values())[-1]
        return final_mlm_accuracy(last) if "validation" in last else None
    validation = summary.get("validation") or {}
    value = validation.get("val/mlm_acc")
    return None if value is None else float(value)


#: the data paths a run reads, checked once its config is typed (its ranges first)
DATA_PATHS = check_paths(("data.train_path", "data.eval_path", "data.vocab_file"))


def main() -> None:
    cfg = preflight("omnibert-train", "pretrain", OUTPUT_KEYS)
    # before anything imports torch: the OpenMP runtime reads its wait policy when it loads
    policy = None if cfg is None else _select_policy(cfg)
    with exit_on("omnibert-train"):
        set_wait_policy_env(policy)
    _hydra_main()


def _select_policy(cfg: DictConfig) -> str | None:
    from omegaconf import OmegaConf

    value = OmegaConf.select(cfg, "accelerator.omp_wait_policy", default=None)
    return None if value is None else str(value)


if __name__ == "__main__":
    main()
