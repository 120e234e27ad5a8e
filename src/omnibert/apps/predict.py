"""``omnibert-predict``: answers from a fine-tuned SQuAD model (``conf/predict.yaml``).

Wiring only: load the run's checkpoint and vocab (:mod:`omnibert.run.inference`), build the
windows, take the best span (:func:`omnibert.run.finetuning.predict_squad`), print it; with
``input_file`` write the official predictions file and, when the file has answers, EM / F1.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from omnibert.apps.compose import CONFIG_PATH
from omnibert.apps.preflight import preflight
from omnibert.apps.schema import register
from omnibert.errors import exit_on
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.paths import check_writable_file, hydra_output_discarded_when_refused

register()


def _check(cfg: DictConfig) -> None:
    single = cfg.get("question") is not None or cfg.get("context") is not None
    if cfg.get("input_file"):
        if single:
            raise FineTuneInputError(
                "pass either question= and context= or input_file= (with out=), not both."
            )
        if not cfg.get("out"):
            raise FineTuneInputError("input_file= needs out=<predictions.json>; set out.")
        return
    if not cfg.get("question") or not cfg.get("context"):
        raise FineTuneInputError(
            'pass question="..." and context="..." (or input_file=<SQuAD json> out=<file>).'
        )


def run(cfg: DictConfig) -> dict[str, Any]:
    """Predict as configured; returns ``{"answer", "score", "probability"}`` for one question
    or ``{"predictions", "out", ...metrics}`` for a file."""
    _check(cfg)
    if cfg.get("out"):
        check_writable_file(str(cfg.out), "out")
    from omnibert.accelerators import build_plugin
    from omnibert.finetune.squad import SquadExample, read_squad, write_predictions
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning import predict_squad
    from omnibert.run.inference import load_finetuned

    examples = None
    if cfg.get("input_file"):  # before the checkpoint: a bad file costs nothing
        examples = read_squad(str(cfg.input_file), "input_file", training=False)
    plugin = build_plugin(cfg.accelerator)
    finetuned = load_finetuned(str(cfg.ckpt))
    if "doc_stride" not in finetuned.recipe:
        raise FineTuneInputError(
            f"ckpt={cfg.ckpt} is a {finetuned.recipe.get('name')} model; omnibert-predict "
            "answers questions with an omnibert-finetune task=squad model."
        )
    task = finetuned.task.to(plugin.device)
    tokenizer = build_tokenizer(finetuned.vocab_file)
    autocast = plugin.autocast(str(cfg.precision))
    if examples is None:
        example = SquadExample("question", str(cfg.question), str(cfg.context))
        best = predict_squad(task, [example], tokenizer, finetuned.recipe, autocast)["question"]
        print(f"answer: {best.text}\nscore: {best.score:.4f} (probability {best.probability:.4f})")
        return {"answer": best.text, "score": best.score, "probability": best.probability}
    predictions = predict_squad(task, examples, tokenizer, finetuned.recipe, autocast)
    out = Path(str(cfg.out))
    out.parent.mkdir(parents=True, exist_ok=True)
    write_predictions(out, predictions)
    result: dict[str, Any] = {"predictions": len(predictions), "out": str(out)}
    if all(ex.answers for ex in examples):
        from omnibert.finetune.squad_metric import squad_scores

        data = json.loads(Path(str(cfg.input_file)).read_text(encoding="utf-8"))["data"]
        scores = squad_scores(data, {k: p.text for k, p in predictions.items()})
        result.update(exact_match=scores["exact_match"], f1=scores["f1"])
    metrics = (
        f"; exact_match {result['exact_match']:.2f}, f1 {result['f1']:.2f}"
        if "f1" in result
        else ""
    )
    print(f"omnibert-predict: {len(predictions)} answers written to {out}{metrics}")
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
