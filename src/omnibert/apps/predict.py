"""``omnibert-predict``: predictions of any fine-tuned run (``conf/predict.yaml``).

Wiring only (the steps live in :mod:`omnibert.run.predicting`): read the inputs (one on the
command line, or ``input_file``) → load the run's checkpoint and vocab
(:mod:`omnibert.run.inference`), refuse inputs or a ``task=`` of another task → predict in
batches (a progress bar over a file) → JSON Lines, one record per input, to ``out`` (or
stdout for one input); a SQuAD file with answers or a labelled GLUE file also prints its
official metrics.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, cast

import hydra
from omegaconf import DictConfig, OmegaConf

from omnibert.apps.compose import CONFIG_PATH
from omnibert.apps.preflight import preflight
from omnibert.apps.schema import register
from omnibert.errors import exit_on
from omnibert.finetune.tokenizer import FineTuneInputError

register()


def _metrics(recipe: dict[str, Any], cfg: dict[str, Any], inputs: Any, found: dict) -> dict:
    """The official metrics of a labelled input file (empty when it has no labels)."""
    if not inputs.labelled:
        return {}
    if "squad" in found:
        texts = {k: p.text for k, p in found["squad"].items()}
        data = json.loads(Path(str(cfg["input_file"])).read_text(encoding="utf-8"))["data"]
        if recipe["format"] == "squad_v2":
            from omnibert.finetune.squad import no_answer_scores
            from omnibert.finetune.squad_v2_metric import squad_v2_scores

            return squad_v2_scores(data, texts, no_answer_scores(found["squad"]))
        from omnibert.finetune.squad_metric import squad_scores

        scores = squad_scores(data, texts)
        return {"exact_match": scores["exact_match"], "f1": scores["f1"]}
    from omnibert.finetune.glue import accuracy_f1

    return accuracy_f1(found["labels"], [e.label for e in inputs.examples])


def run(cfg: DictConfig) -> dict[str, Any]:
    """Predict as configured; returns ``{"records": [...], "out": path or None, **metrics}``."""
    from omnibert.accelerators import build_plugin
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.inference import load_finetuned
    from omnibert.run.predicting import check_task, predict_records, read_inputs

    c = cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))
    if c.get("input_file") and not c.get("out"):
        raise FineTuneInputError("input_file= needs out=<predictions.jsonl>; set out.")
    plugin = build_plugin(cfg.accelerator)
    finetuned = load_finetuned(str(c["ckpt"]))
    recipe = dict(finetuned.recipe)
    if c.get("batch_size"):
        recipe["eval_batch_size"] = int(c["batch_size"])
    check_task(c, recipe, str(c["ckpt"]))
    inputs = read_inputs(c, recipe)  # before the model runs: a bad file costs nothing
    task = finetuned.task.to(plugin.device)
    tokenizer = build_tokenizer(finetuned.vocab_file)
    autocast = plugin.autocast(str(c["precision"]))
    bar = None
    if inputs.from_file:
        from tqdm import tqdm

        bar = tqdm(total=len(inputs.examples), desc="omnibert-predict", unit="row",
                   file=sys.stderr, disable=None)  # fmt: skip
    progress = None if bar is None else _Progress(bar)
    try:
        records, found = predict_records(task, recipe, tokenizer, inputs, autocast, progress)
    finally:
        if bar is not None:
            bar.close()
    lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    out = None
    if c.get("out"):
        out = Path(str(c["out"]))
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(lines, encoding="utf-8")
    else:
        print(lines, end="")
    metrics = _metrics(recipe, c, inputs, found)
    if out is not None:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in metrics.items() if not k.endswith("total"))
        print(f"omnibert-predict: {len(records)} records ({recipe['name']}) written to {out}"
              + (f"; {shown}" if shown else ""))  # fmt: skip
    return {"records": records, "out": None if out is None else str(out), **metrics}


class _Progress:
    """Moves a tqdm bar over the model's input rows (a SQuAD question may have several
    windows): ``progress(done, total)`` after each batch."""

    def __init__(self, bar: Any) -> None:
        self.bar = bar

    def __call__(self, done: int, total: int) -> None:
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()


def run_or_exit(cfg: DictConfig) -> dict[str, Any]:
    with exit_on("omnibert-predict"):
        return run(cfg)


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    run_or_exit(cfg)


def main() -> None:
    preflight("omnibert-predict", "predict", ())
    _hydra_main()


if __name__ == "__main__":
    main()
