"""``omnibert-predict``: predictions of any fine-tuned run (``conf/predict.yaml``).

Wiring only: load the run's checkpoint, its task's data spec and vocab
(:func:`omnibert.run.inference.load_finetuned`), read and check the inputs
(:mod:`omnibert.run.predicting`), predict with the task's own features and post-processing
(:func:`omnibert.run.finetuning.predict_outputs`), write JSON Lines (one record per input) to
``out`` or print the one record; with a labelled file, print the task's metrics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH, register
from omnibert.apps.preflight import preflight
from omnibert.errors import exit_on
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.paths import check_writable_file, hydra_output_discarded_when_refused

register()


def run(cfg: DictConfig) -> dict[str, Any]:
    """Predict as configured; returns the record for one input, or ``{"predictions", "out",
    ...metrics}`` for a file."""
    if cfg.get("input_file") and not cfg.get("out"):
        raise FineTuneInputError("input_file= needs out=<predictions.jsonl>; set out.")
    if cfg.get("out"):
        check_writable_file(str(cfg.out), "out")
    if cfg.get("batch_size") is not None and int(cfg.batch_size) < 1:
        raise FineTuneInputError(f"batch_size={cfg.batch_size} must be a positive integer.")
    from omnibert.accelerators import build_plugin
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning import task_data
    from omnibert.run.inference import load_finetuned
    from omnibert.run.predicting import check_task, predict_records, read_inputs

    options: dict[str, Any] = OmegaConf.to_container(cfg, resolve=True)  # type: ignore[assignment]
    finetuned = load_finetuned(str(cfg.ckpt))
    recipe = dict(finetuned.recipe)
    data = task_data(recipe)
    check_task(options, data, str(cfg.ckpt))
    inputs = read_inputs(options, data)  # before any forward pass: a bad file costs nothing
    if cfg.get("batch_size") is not None:
        recipe["eval_batch_size"] = int(cfg.batch_size)
    plugin = build_plugin(cfg.accelerator)
    task = finetuned.task.to(plugin.device)
    tokenizer = build_tokenizer(finetuned.vocab_file)
    autocast = plugin.autocast(str(cfg.precision))
    records, predictions = predict_records(data, task, inputs, tokenizer, recipe, autocast)
    if not inputs.from_file:
        print(json.dumps(records[0], ensure_ascii=False))  # one JSON Lines record
        return records[0]
    out = Path(str(cfg.out))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    result: dict[str, Any] = {"predictions": len(records), "out": str(out)}
    if inputs.labelled:
        result.update(data.scores(inputs.dataset, predictions))
    metrics = "; ".join(
        f"{k} {v:.4f}" for k, v in result.items() if k not in ("predictions", "out")
    )
    print(
        f"omnibert-predict: {len(records)} task={data.task} records written to {out}"
        + (f"; {metrics}" if metrics else "")
    )
    return result


def run_or_exit(cfg: DictConfig) -> dict[str, Any]:
    with exit_on("omnibert-predict"):
        return run(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-predict"), hydra_output_discarded_when_refused():
        run(cfg)


def main() -> None:
    preflight("omnibert-predict", "predict", (), output_files=("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
