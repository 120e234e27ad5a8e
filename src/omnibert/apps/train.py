"""``omnibert-train``: BERT pretraining with Lightning, configured by ``conf/pretrain.yaml``.

Wiring only, in this order: compose → derive the batch plan → build the data module and
``check()`` it → derive and check everything else (vocab size, resume target, initial
weights, optimiser and schedule, clipping) → print and save the plan → build the task and
the Trainer → ``fit`` → a final validation on the whole eval set → print and save a summary.
Every configuration problem stops the run before any compute with one sentence and exit
code 2; the composed config is never modified.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from omnibert.apps.compose import CONFIG_PATH
from omnibert.errors import exit_on
from omnibert.run.plan import (
    BatchPlan,
    TrainConfigError,
    TrainPlan,
    batch_plan,
    check_init_from,
    check_optimizer,
    check_resume_target,
    describe_clipping,
    packed_batch_plan,
    remove_stale_temporaries,
    resolve_ckpt_path,
    resolve_clipping,
    resolve_vocab_size,
)
from omnibert.run.profiling import check_profile, profiler_for_run
from omnibert.run.slurm import check_slurm_layout

log = logging.getLogger("omnibert.apps.train")


def _resolved(cfg: DictConfig) -> dict[str, Any]:
    missing = sorted(OmegaConf.missing_keys(cfg))
    if missing:
        raise TrainConfigError(
            f"{', '.join(missing)} must be set, e.g. omnibert-train data.train_path=<dir> "
            "data.eval_path=<dir> (or experiment=demo)."
        )
    try:
        container = OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise TrainConfigError(f"the config does not resolve: {err}".splitlines()[0]) from err
    assert isinstance(container, dict)
    return cast(dict[str, Any], container)


def _instantiate_all(nodes: DictConfig | None) -> list[Any]:
    from hydra.utils import instantiate

    if not nodes:
        return []
    return [instantiate(node) for node in nodes.values() if node is not None]


def plan_run(c: dict[str, Any], datamodule: Any, batch: BatchPlan) -> TrainPlan:
    """Everything derived from the resolved config ``c`` and the (checked) data."""
    model_cfg = dict(c["model"]["config"])
    vocab_size = resolve_vocab_size(model_cfg, datamodule.vocab_size)
    model_cfg["vocab_size"] = vocab_size
    from omnibert.models import BertConfig

    config = BertConfig(**model_cfg)
    phase = c["phase"]
    if phase["max_seq_length"] > config.max_position_embeddings:
        raise TrainConfigError(
            f"phase.max_seq_length={phase['max_seq_length']} exceeds "
            f"model.config.max_position_embeddings={config.max_position_embeddings}; shorten "
            "the sequences or use a model with more positions."
        )
    max_steps = c["trainer"]["max_steps"]
    if not isinstance(max_steps, int) or max_steps < 1:
        raise TrainConfigError(f"phase.max_steps={max_steps!r} must be a positive integer.")
    model_init, phase_init = c["model"].get("init_from"), phase.get("init_from")
    checkpoint_dir = str(Path(c["paths"]["checkpoint_dir"]).resolve())
    ckpt = resolve_ckpt_path(c.get("ckpt_path"), checkpoint_dir)
    if ckpt is not None:
        check_resume_target(ckpt, model_cfg)
        init_from = None  # a resume takes its weights from the checkpoint
    else:
        if model_init is not None and phase_init is not None:
            raise TrainConfigError(
                f"both model.init_from={model_init} and phase.init_from={phase_init} are set; "
                "set the one you mean and the other to null."
            )
        init_from = check_init_from(
            model_init if model_init is not None else phase_init, dataclasses.asdict(config)
        )
    check_optimizer(c["optimizer"], c.get("schedule"))
    micro_clip = resolve_clipping(c.get("clip_grad_per_micro_batch"), c["optimizer"])
    precision = str(c["trainer"].get("precision"))
    if micro_clip is not None and precision.startswith("16"):
        raise TrainConfigError(
            f"clip_grad_per_micro_batch with trainer.precision={precision} would clip "
            "loss-scaled gradients; use bf16-mixed or 32-true."
        )
    clipping = describe_clipping(micro_clip, c["optimizer"], c["trainer"].get("gradient_clip_val"))
    steps_per_epoch = datamodule.num_train_rows // batch.rows_per_step
    if steps_per_epoch < 1:
        raise TrainConfigError(
            f"the training set has {datamodule.num_train_samples} sequences in "
            f"{datamodule.num_train_rows} rows, fewer than one global batch of "
            f"{batch.rows_per_step} rows (phase.global_batch_size={batch.global_batch_size}); "
            "use more data or a smaller global batch."
        )
    cap = c.get("steps_per_epoch")
    if cap is not None:
        if not isinstance(cap, int) or cap < 1:
            raise TrainConfigError(f"steps_per_epoch={cap!r} must be null or a positive integer.")
        steps_per_epoch = min(steps_per_epoch, cap)
    every = c.get("val_every_n_steps")
    if every is not None and (not isinstance(every, int) or every < 1):
        raise TrainConfigError(f"val_every_n_steps={every!r} must be null or a positive integer.")
    if datamodule.num_eval_samples == 0:
        every = None
    acc = batch.accumulate_grad_batches
    return TrainPlan(
        batch=batch,
        max_steps=max_steps,
        steps_per_epoch=steps_per_epoch,
        limit_train_batches=steps_per_epoch * acc,
        val_every_n_steps=every,
        val_check_interval=None if every is None else every * acc,
        vocab_size=vocab_size,
        init_from=init_from,
        ckpt_path=ckpt,
        checkpoint_dir=checkpoint_dir,
        clipping=clipping,
        clip_grad_per_micro_batch=micro_clip,
        precision=precision,
        data=datamodule.describe(),
    )


def run(cfg: DictConfig, output_dir: Path | None = None) -> dict[str, Any]:
    """Train as configured; returns the summary (also written to ``output_dir``)."""
    from hydra.utils import instantiate

    c = _resolved(cfg)
    plugin, environment = _accelerator(cfg)
    check_slurm_layout(plugin.name, plugin.devices, plugin.num_nodes)
    acc = c["accelerator"]
    batch = batch_plan(
        c["phase"]["global_batch_size"],
        acc["devices"],
        acc["num_nodes"],
        c.get("micro_batch_size"),
        c.get("eval_micro_batch_size"),
    )
    datamodule = instantiate(
        cfg.data,
        micro_batch_size=batch.micro_batch_size,
        eval_micro_batch_size=batch.eval_micro_batch_size,
    )
    datamodule.check()
    if datamodule.packing.enabled:  # the global batch counts sequences: fewer, fuller rows
        batch = packed_batch_plan(batch, datamodule.sequences_per_row, c.get("micro_batch_size"))
        datamodule.micro_batch_size = batch.micro_batch_size
        datamodule.check()
    plan = plan_run(c, datamodule, batch)

    print(f"omnibert-train: {c['run_name']}\n{plan.table()}", flush=True)
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
        (output_dir / "environment.json").write_text(json.dumps(environment, indent=2) + "\n")
    profile = check_profile(c)
    if c.get("compile_only"):  # build, compile and time one step; report; no training
        from omnibert.run.compile_only import compile_only

        return compile_only(c, plan, datamodule, plugin, output_dir)
    for name in remove_stale_temporaries(plan.checkpoint_dir):
        log.warning("removed %s, a checkpoint a killed process had not finished writing", name)

    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ProgressBar

    from omnibert.callbacks import AtomicCheckpointIO, PretrainingThroughput
    from omnibert.tasks.pretraining import PretrainingTask

    pl.seed_everything(c["seed"], workers=False, verbose=False)
    model_config = {**c["model"]["config"], "vocab_size": plan.vocab_size}
    task = PretrainingTask(
        model_config=model_config,
        optimizer=plugin.optimizer_config(c["optimizer"]),
        schedule=c.get("schedule"),
        init_from=plan.init_from,
        vocab_file=getattr(datamodule, "vocab_file", None),
        clip_grad_per_micro_batch=plan.clip_grad_per_micro_batch,
    )
    loaded = task.load_initial_weights() if plan.ckpt_path is None else None
    if loaded:
        print(f"omnibert-train: initialised from {loaded}", flush=True)

    callbacks = _instantiate_all(cfg.get("callbacks"))
    if not c["trainer"].get("enable_progress_bar", True):
        callbacks = [cb for cb in callbacks if not isinstance(cb, ProgressBar)]
    loggers = _instantiate_all(cfg.get("logger"))
    plugin.compile_model(task.model)
    acc_batches = batch.accumulate_grad_batches
    # the plugin's Trainer arguments (accelerator, strategy, precision, ...) and its view of
    # the loop counts (IPU: device-side accumulation) override the trainer config's
    hardware = plugin.trainer_kwargs(plan.precision)
    hardware_plugins = hardware.pop("plugins")
    loop = plugin.loop_kwargs(
        acc_batches, plan.limit_train_batches, plan.val_check_interval, plan.max_steps
    )
    if loop["val_check_interval"] is None:
        loop["val_check_interval"] = (loop["max_steps"] + 1) * loop["accumulate_grad_batches"]
    if profile is not None:  # profile=true: torch.profiler traces in <output dir>/profile
        run_dir = output_dir if output_dir is not None else Path(c["paths"]["run_dir"])
        hardware["profiler"] = profiler_for_run(profile, run_dir / "profile", plugin.name)
    trainer: pl.Trainer = instantiate(
        cfg.trainer,
        **{**hardware, **loop},
        callbacks=callbacks,
        logger=loggers or False,
        plugins=[*hardware_plugins, AtomicCheckpointIO()],
    )

    start = time.perf_counter()
    trainer.fit(task, datamodule=datamodule, ckpt_path=plan.ckpt_path)
    seconds = time.perf_counter() - start
    last = task.last_validation
    if plan.data.get("eval_samples") and (last is None or last["step"] != trainer.global_step):
        trainer.validate(task, datamodule=datamodule, verbose=False)
    throughput = next((cb for cb in callbacks if isinstance(cb, PretrainingThroughput)), None)
    last_ckpt = Path(plan.checkpoint_dir) / "last.ckpt"
    summary = {
        "run_name": c["run_name"],
        "steps": trainer.global_step,
        "fit_seconds": round(seconds, 3),
        "validation": task.last_validation,
        "throughput": throughput.summary() if throughput is not None else {},
        "checkpoint_dir": plan.checkpoint_dir,
        "last_checkpoint": str(last_ckpt) if last_ckpt.is_file() else None,
        "plan": plan.to_dict(),
    }
    _print_summary(summary, output_dir)
    if output_dir is not None:
        (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _accelerator(cfg: DictConfig) -> tuple[Any, dict[str, Any]]:
    """The accelerator plugin (its SDK checked before any compute) and the environment
    report, printed here and saved as ``environment.json`` next to the plan."""
    from omnibert.accelerators import build_plugin
    from omnibert.accelerators.environment import format_report

    plugin = build_plugin(cfg.accelerator)
    environment = plugin.environment()
    print(f"omnibert-train: environment\n{format_report(environment)}", flush=True)
    return plugin, environment


def _print_summary(summary: dict[str, Any], output_dir: Path | None) -> None:
    val = summary["validation"] or {}
    speed = summary["throughput"]
    lines = [
        f"omnibert-train: done, {summary['steps']} steps in {summary['fit_seconds']:.1f} s",
    ]
    if val:
        lines.append(
            f"  validation    mlm_acc {val['val/mlm_acc']:.4f}  nsp_acc {val['val/nsp_acc']:.4f}"
            f"  loss {val['val/loss']:.4f} (step {int(val['step'])})"
        )
    if speed.get("samples_per_sec"):
        lines.append(
            f"  throughput    {speed['samples_per_sec']:.1f} sequences/s, "
            f"{speed['real_tokens_per_sec']:.0f} real tokens/s "
            f"({speed['padding_fraction']:.1%} padding)"
        )
    lines.append(f"  checkpoints   {summary['checkpoint_dir']}")
    if output_dir is not None:
        lines.append(f"  summary       {output_dir / 'summary.json'}")
    print("\n".join(lines), flush=True)


def run_or_exit(cfg: DictConfig, output_dir: Path | None) -> dict[str, Any]:
    """:func:`run`, turning a configuration problem into one line on stderr and exit code 2."""
    with exit_on("omnibert-train"):
        return run(cfg, output_dir)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="pretrain")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    run_or_exit(cfg, Path(HydraConfig.get().runtime.output_dir))


def main() -> None:
    _hydra_main()


if __name__ == "__main__":
    main()
