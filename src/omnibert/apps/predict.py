"""``omnibert-predict``: predictions of any fine-tuned run, and the masked words of a
pretrained model (``conf/predict.yaml``).

Wiring only. A pretrained model (:func:`omnibert.run.tools.fill_mask.masked_lm_path`): read the
texts, load the model and its tokenizer, the top-k tokens per ``[MASK]``
(:mod:`omnibert.run.tools.fill_mask`). A fine-tuned run: load its checkpoint, its task's data spec
and vocab (:func:`omnibert.checkpoints.reading.load_finetuned`), read and check the inputs
(:mod:`omnibert.run.tools.predicting`), predict with the task's own features and post-processing
(:func:`omnibert.run.finetuning.outputs.predict_outputs`), write JSON Lines (one record per input)
to ``out`` or print them (one input on the command line, or ``input_file=-`` without ``out``); with
a labelled file, print the task's metrics.

Text is not configuration: ``question=``, ``context=``, ``text=`` and ``text_pair=`` are taken
out of the command line before Hydra parses it (:func:`split_text_arguments`), so their
values reach the model as the shell passed them (``;``, ``,``, brackets, quotes, ``=``,
newlines, any Unicode), and are put into the composed config afterwards. ``--help``
describes these keys (from ``conf/predict.yaml``'s comments) and ``--version`` prints
omnibert's version; both answer before Hydra starts.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from omnibert.apps.compose import CONFIG_MODULE, CONFIG_PATH, group_options, register
from omnibert.apps.preflight import preflight
from omnibert.config.tools import PredictConfig
from omnibert.errors import exit_on, is_rank_zero
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.paths import check_writable_file, hydra_output_discarded_when_refused
from omnibert.run.tools.predicting import STDIN

register()

#: the keys whose values are text to predict on, never parsed by Hydra's override grammar
TEXT_KEYS = ("question", "context", "text", "text_pair")
#: the texts :func:`main` took out of the command line, put into the config Hydra composes
_command_line_texts: dict[str, str] = {}


def split_text_arguments(argv: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    """``(texts, rest)``: each ``question=``/``context=``/``text=``/``text_pair=`` argument's
    value (everything after the first ``=``, literally) and the other arguments, for Hydra."""
    texts: dict[str, str] = {}
    rest: list[str] = []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or key not in TEXT_KEYS:
            rest.append(arg)
            continue
        if key in texts:
            raise FineTuneInputError(f"{key}= is given twice; pass it once.")
        texts[key] = value
    return texts, rest


def with_texts(cfg: DictConfig, texts: dict[str, str]) -> DictConfig:
    """``cfg`` with the command line's texts as its text keys."""
    for key, value in texts.items():
        cfg[key] = value
    return cfg


def run(cfg: DictConfig) -> dict[str, Any]:
    """Predict as configured; returns the record for one input, or ``{"predictions", "out",
    ...metrics}`` for a file. Started as several processes (``torchrun``, ``srun``), rank 0
    does it all and the others return ``{}`` at once, saying nothing: the work is not split
    between processes (one voice: :func:`omnibert.errors.is_rank_zero`)."""
    if not is_rank_zero():
        return {}
    config = PredictConfig.of(cfg, FineTuneInputError)
    from_stdin = config.input_file == STDIN
    if config.input_file and not config.out and not from_stdin:
        raise FineTuneInputError("input_file= needs out=<predictions.jsonl>; set out.")
    if config.out:
        check_writable_file(config.out, "out")
    from omnibert.run.tools.fill_mask import masked_lm_path

    pretrained = masked_lm_path(config.ckpt)
    if pretrained is not None:
        return _fill_mask(config, pretrained)
    from omnibert.accelerators import build_plugin
    from omnibert.checkpoints.reading import load_finetuned
    from omnibert.finetune.tokenizer import build_tokenizer
    from omnibert.run.finetuning.inputs import task_data
    from omnibert.run.tools.predicting import check_task, predict_records, read_inputs

    finetuned = load_finetuned(config.ckpt)
    recipe = finetuned.recipe.plain()
    data = task_data(recipe)
    check_task(config, data, config.ckpt)
    inputs = read_inputs(config, data)  # before any forward pass: a bad file costs nothing
    if config.batch_size is not None:
        recipe["eval_batch_size"] = config.batch_size
    plugin = build_plugin(config.accelerator.plain())
    task = finetuned.task.to(plugin.device)
    tokenizer = build_tokenizer(finetuned.vocab_file)
    autocast = plugin.autocast(config.precision)
    to_stdout = not inputs.from_file or not config.out
    # records on stdout (a pipe) leave it to them alone: no progress lines there
    progress = None if not to_stdout else False
    records, predictions = predict_records(
        data, task, inputs, tokenizer, recipe, autocast, progress=progress
    )
    scores = (lambda: data.scores(inputs.dataset, predictions)) if inputs.labelled else None
    return _emit(config, records, inputs.from_file, f"task={data.task}", scores)


def _fill_mask(config: PredictConfig, path: Path) -> dict[str, Any]:
    """Masked words from a pretrained model (:mod:`omnibert.run.tools.fill_mask`)."""
    from omnibert.accelerators import build_plugin
    from omnibert.run.tools.fill_mask import fill_mask_records, load_masked_lm, read_texts

    if config.task_name and config.task_name != "fill-mask":
        raise FineTuneInputError(
            f"ckpt={config.ckpt} is a pretrained model, which fills masked words "
            f"(task_name=fill-mask), not task_name={config.task_name}; pass an omnibert-finetune "
            f"task={config.task_name} run (or drop task_name=)."
        )
    texts, from_file = read_texts(config)  # before the model loads: a bad file costs nothing
    masked = load_masked_lm(path)
    plugin = build_plugin(config.accelerator.plain())
    records = fill_mask_records(
        masked, texts, config.top_k, config.batch_size or 32,
        plugin.autocast(config.precision), plugin.device, from_file,
    )  # fmt: skip
    return _emit(config, records, from_file, "fill-mask")


def _emit(
    config: PredictConfig,
    records: list[dict[str, Any]],
    from_file: bool,
    what: str,
    scores: Callable[[], dict[str, float]] | None = None,
) -> dict[str, Any]:
    """The records as JSON Lines: one input's printed, a file's to ``out`` (else stdout);
    ``scores``: a labelled file's metrics, printed with the file written."""
    if not from_file:
        print(json.dumps(records[0], ensure_ascii=False))  # one JSON Lines record
        return records[0]
    if not config.out:
        for record in records:
            print(json.dumps(record, ensure_ascii=False))
        sys.stdout.flush()
        return {"predictions": len(records), "out": None, "records": records}
    out = Path(str(config.out))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    result: dict[str, Any] = {"predictions": len(records), "out": str(out)}
    if scores is not None:
        result.update(scores())
    metrics = "; ".join(
        f"{k} {v:.4f}" for k, v in result.items() if k not in ("predictions", "out")
    )
    print(
        f"omnibert-predict: {len(records)} {what} records written to {out}"
        + (f"; {metrics}" if metrics else "")
    )
    return result


def run_or_exit(cfg: DictConfig) -> dict[str, Any]:
    with exit_on("omnibert-predict"):
        return run(cfg)


def help_text() -> str:
    """``--help``: what ``conf/predict.yaml`` says about omnibert-predict and each of its keys
    (the comments there are the keys' documentation), not Hydra's list of every group."""
    from importlib import resources

    from omnibert import __version__

    lines = resources.files(CONFIG_MODULE).joinpath("predict.yaml").read_text("utf-8").splitlines()
    header: list[str] = []
    while lines and lines[0].startswith("#"):
        header.append(lines.pop(0)[1:].removeprefix(" "))
    keys: list[str] = []
    comment: list[str] = []
    for line in lines:
        if line.startswith("#"):
            comment.append(line[1:].strip())
            continue
        match = re.match(r"([a-z_]+):\s*(.*?)\s*$", line)
        if match and match.group(1) not in ("defaults", "hydra"):
            name, default = match.groups()
            keys.append(f"  {name}={default or 'null'}")
            keys += [f"      {c}" for c in comment]
        comment = []
    device = re.search(r"-\s*accelerator:\s*(\S+)", "\n".join(lines))
    keys.append(f"  accelerator={device.group(1) if device else 'cpu'}")
    keys.append(f"      the device: {', '.join(group_options('accelerator'))}")
    return "\n".join([
        f"omnibert-predict {__version__}", "", *header, "", "Keys (key=value):", *keys, "",
        "The keys other than the texts are Hydra overrides: --cfg job prints the composed "
        "config, --hydra-help Hydra's own options.",
    ])  # fmt: skip


@hydra.main(version_base="1.3", config_path=CONFIG_PATH, config_name="predict")
def _hydra_main(cfg: DictConfig) -> None:
    with exit_on("omnibert-predict"), hydra_output_discarded_when_refused():
        run(with_texts(cfg, _command_line_texts))


def main() -> None:
    with exit_on("omnibert-predict"):
        texts, rest = split_text_arguments(sys.argv[1:])
    if any(arg in ("-h", "--help") for arg in rest):
        print(help_text())
        return
    if "--version" in rest:
        from omnibert import __version__

        print(f"omnibert-predict {__version__}")
        return
    sys.argv = [sys.argv[0], *rest]
    _command_line_texts.clear()
    _command_line_texts.update(texts)
    preflight("omnibert-predict", "predict", (), output_files=("out",))
    _hydra_main()


if __name__ == "__main__":
    main()
