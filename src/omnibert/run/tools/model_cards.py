"""The model cards of ``omnibert-export``'s repositories (:mod:`omnibert.convert.model_card`
renders them): what the checkpoint's hyper-parameters and its run's own records say about a
pretrained model (:func:`pretrained_card`: the run's ``summary.json`` found from the
checkpoint, :mod:`omnibert.run.tools.run_records`) or a fine-tuned one (:func:`finetuned_card`:
the ``summary.json`` beside its ``checkpoints/final.ckpt``): the architecture and heads, the
data, the metrics with where they were measured, the recipe. Nothing they do not record is
claimed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omnibert.config.recorded import RecordedTraining
from omnibert.convert.model_card import Metric, ModelCard, hub_id
from omnibert.run.tools.run_records import RunSummary, read_summary, run_summary

__all__ = ["Pretrained", "finetuned_card", "pretrained_card", "recipe_rows"]


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model to export: the model, its vocab, where it came from (``source`` as
    given, ``kind`` ``omnibert`` or ``tf1``), its checkpoint's hyper-parameters and step."""

    model: Any
    vocab_file: str
    source: str
    kind: str
    hparams: RecordedTraining
    step: int | None


def recipe_rows(hparams: RecordedTraining, step: int | None, plan: dict[str, Any]) -> list:
    """The training recipe's table rows: steps, batch, shape, optimiser, schedule, precision
    (what the checkpoint's hyper-parameters and the run's plan record)."""
    rows: list[tuple[str, str]] = []
    total = hparams.total_steps
    if step is not None:
        rows.append(("optimiser steps", f"{step:,}" + (f" of {total:,} planned" if total else "")))
    batch = plan.get("batch") or {}
    if batch:
        rows.append((
            "global batch", f"{batch.get('global_batch_size'):,} sequences "
            f"({batch.get('micro_batch_size')} per micro-batch x "
            f"{batch.get('accumulate_grad_batches')} accumulated x {batch.get('world_size')} "
            "device(s))",
        ))  # fmt: skip
    data = plan.get("data") or {}
    if data.get("max_seq_length"):
        rows.append((
            "sequence length", f"{data['max_seq_length']} tokens, "
            f"{data.get('max_predictions_per_seq')} masked positions",
        ))  # fmt: skip
    optimizer = hparams.optimizer
    if optimizer is not None:
        extra = ", ".join(f"{k} {v}" for k, v in optimizer.listed(("weight_decay", "betas", "eps")))
        rows.append(("optimiser", f"{optimizer.short_name} ({extra})"))
        rows.append(("peak learning rate", f"{optimizer.lr}"))
    schedule = hparams.schedule
    if schedule is not None:
        keys = ("warmup_proportion", "warmup_steps", "power", "decay_proportion")
        extra = ", ".join(f"{k} {v}" for k, v in schedule.listed(keys))
        rows.append(("schedule", f"{schedule.short_name} ({extra})"))
    if plan.get("precision"):
        rows.append(("precision", str(plan["precision"])))
    if plan.get("objective"):
        rows.append(("objective", str(plan["objective"])))
    return rows


def _data_lines(plan: dict[str, Any]) -> list[str]:
    data = plan.get("data") or {}
    lines = []
    if data.get("train_path"):
        lines.append(
            f"training data: `{data['train_path']}` ({data.get('format')}), "
            f"{data.get('train_samples', 0):,} sequences"
        )
    if data.get("eval_path"):
        lines.append(
            f"held-out data: `{data['eval_path']}`, {data.get('eval_samples', 0):,} sequences"
        )
    if data.get("vocab_file"):
        lines.append(f"vocab: `{data['vocab_file']}` ({plan.get('vocab_size', 0):,} tokens)")
    return lines


def _metrics(summary: RunSummary, kept_nsp: bool) -> tuple[list[Metric], str]:
    val = summary.validation
    metrics = []
    if val.get("val/mlm_acc") is not None:
        metrics.append(Metric("accuracy", "masked-LM accuracy", float(val["val/mlm_acc"])))
    nsp = val.get("val/nsp_acc")
    if nsp is not None and kept_nsp:
        metrics.append(Metric("accuracy", "next-sentence accuracy", float(nsp)))
    if val.get("val/mlm_loss") is not None:
        metrics.append(Metric("loss", "masked-LM loss", float(val["val/mlm_loss"])))
    if not metrics:
        return [], f"The run's summary ({summary.path}) records no validation."
    data = summary.plan.get("data") or {}
    baseline = val.get("val/mlm_majority_baseline")
    note = (
        f"The run's validation at step {int(val.get('step', summary.values.get('steps', 0)))} "
        f"on `{data.get('eval_path')}` ({int(val.get('val/samples', 0)):,} sequences, "
        f"{int(val.get('val/mlm_count', 0)):,} masked tokens) in {summary.precision}, from "
        f"`{summary.path}`"
    )
    if baseline is not None:
        note += f"; always predicting the most frequent masked token scores {baseline:.4f}"
    if nsp is not None and not kept_nsp:
        note += f"; its next-sentence head (accuracy {nsp:.4f}) is not in this export"
    return metrics, note + "."


def pretrained_card(
    p: Pretrained, out: Path, arch: str, lower: tuple[bool, str], kept_nsp: bool
) -> str:
    """The card of a pretrained model exported as ``arch`` to ``out`` (``lower``: its
    tokenizer's lower-casing and why; ``kept_nsp``: the next-sentence head is exported)."""
    config = p.model.config
    family = "BERT" if config.is_bert else "ModernBERT"
    sizes = (
        f"L{config.num_hidden_layers}-H{config.hidden_size}-A{config.num_attention_heads}, "
        f"intermediate {config.intermediate_size}, {config.max_position_embeddings} positions, "
        f"vocab {config.vocab_size:,}"
    )
    summary = run_summary(p.source, p.step) if p.kind == "omnibert" else None
    name = str((summary.values.get("run_name") if summary else None) or Path(p.source).stem)
    heads = {
        "BertForMaskedLM": "the encoder and the masked-LM head; the pooler and the "
        "next-sentence head of pretraining are left out (omnibert-export heads=mlm; "
        "heads=pretraining keeps them as BertForPreTraining)",
        "BertForPreTraining": "the encoder, the masked-LM head, the pooler and the "
        "next-sentence head (AutoModelForPreTraining loads it; AutoModelForMaskedLM would "
        "report the pooler and next-sentence weights as unexpected)",
    }.get(arch, "the encoder and the masked-LM head")
    about = (
        f"A {family} encoder ({sizes}) pretrained with omnibert, exported as `{arch}`: {heads}.",
        "",
        f"The tokenizer is WordPiece over the run's vocab.txt, "
        f"{'lower-cased' if lower[0] else 'cased'} ({lower[1]}), at most "
        f"{config.max_position_embeddings} tokens (`model_max_length`).",
    )
    if arch == "BertForPreTraining":
        usage = (
            "from transformers import AutoModelForPreTraining, AutoTokenizer\n\n"
            f'model = AutoModelForPreTraining.from_pretrained("{out}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{out}")\n'
        )
    else:
        usage = (
            "from transformers import pipeline\n\n"
            f'fill_mask = pipeline("fill-mask", model="{out}")\n'
            'print(fill_mask("The [MASK] is here.", tokenizer_kwargs={"truncation": True}))\n'
        )
    plan = summary.plan if summary else {}
    metrics, note = _metrics(summary, kept_nsp) if summary else ([], "")
    if not summary:
        note = (
            "No evaluation: the checkpoint's run left no summary.json for its step beside it "
            "(<run>/hydra/*/summary.json); `omnibert-eval` scores it on prepared data."
            if p.kind == "omnibert"
            else "No evaluation is recorded in a TensorFlow 1 checkpoint."
        )
    started = p.hparams.init_from
    data = _data_lines(plan)
    return ModelCard(
        title=f"{name} ({arch})",
        pipeline_tag="fill-mask",
        architecture=arch,
        about=about,
        usage=usage,
        source=f"{p.source}" + (f" (step {p.step:,})" if p.step is not None else ""),
        tags=("bert" if config.is_bert else "modernbert", "fill-mask", "pretraining"),
        started_from=started,
        base_model=hub_id(started),
        data=tuple(data),
        metrics=tuple(metrics),
        metrics_note=note,
        eval_data=str((plan.get("data") or {}).get("eval_path") or "held-out data"),
        recipe=tuple(recipe_rows(p.hparams, p.step, plan)),
    ).render()


#: Hugging Face metric types of omnibert's fine-tuning metrics (the Hub's names)
_METRIC_TYPES = {"exact_match": "exact_match", "f1": "f1", "accuracy": "accuracy",
                 "matthews_correlation": "matthews_correlation", "pearson": "pearsonr",
                 "spearman": "spearmanr"}  # fmt: skip


def _finetune_summary(checkpoint: Path) -> RunSummary | None:
    """The ``summary.json`` beside a fine-tuned run's ``checkpoints/final.ckpt``, when it
    names that checkpoint."""
    path = checkpoint.parent.parent / "summary.json"
    found = read_summary(path)
    if found is None or not found.get("checkpoint"):
        return None
    if Path(str(found["checkpoint"])).resolve() != checkpoint.resolve():
        return None
    return RunSummary(path, found)


def _hub_sources(where: Any) -> tuple[str, ...]:
    """The Hub dataset ids among a fine-tuning run's data sources (not local paths)."""
    found = []
    for value in (where or {}).values() if isinstance(where, dict) else ():
        name = str(value).split(" ")[0]
        if name.count("/") == 1 and not Path(name).exists() and name not in found:
            found.append(name)
    return tuple(found)


def finetuned_card(finetuned: Any, out: Path, qa: bool) -> str:
    """The model card of a fine-tuned export (module docstring)."""
    recipe = finetuned.recipe
    config = finetuned.task.model.config
    summary = _finetune_summary(Path(finetuned.checkpoint))
    values = summary.values if summary else {}
    plan = summary.plan if summary else {}
    task = recipe.name
    arch = "BertForQuestionAnswering" if qa else "BertForSequenceClassification"
    started = values.get("init_from")
    if qa:
        usage = (
            "from transformers import AutoModelForQuestionAnswering, AutoTokenizer\n"
            "from omnibert.finetune.qa_client import answer_question\n\n"
            f'model = AutoModelForQuestionAnswering.from_pretrained("{out}")\n'
            f'tokenizer = AutoTokenizer.from_pretrained("{out}")\n'
            'print(answer_question(model, tokenizer, "Who wrote it?", "It was written by Ada."))\n'
        )
    else:
        usage = (
            "from transformers import pipeline\n\n"
            f'classify = pipeline("text-classification", model="{out}")\n'
            'print(classify({"text": "A first sentence.", "text_pair": "A second one."}))\n'
        )
    metrics = [
        Metric(_METRIC_TYPES.get(name, name), name, float(value))
        for name, value in (values.get("metrics") or {}).items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    ]
    note = (
        f"The run's evaluation on {values.get('eval_examples', 0):,} examples after "
        f"{values.get('steps', 0):,} steps, in {plan.get('precision')}, from `{summary.path}`."
        if summary and metrics
        else "No evaluation is recorded beside the checkpoint (its run's summary.json)."
    )
    where = plan.get("data") or {}
    data = (
        [f"{split}: `{source}`" for split, source in where.items()]
        if isinstance(where, dict)
        else []
    )
    if values.get("train_examples"):
        data.append(f"{values['train_examples']:,} training examples")
    recipe_table = recipe.listed(
        ("epochs", "batch_size", "lr", "warmup_proportion", "max_seq_length", "doc_stride",
         "max_query_length", "n_best_size", "max_answer_length")
    )  # fmt: skip
    if values.get("steps"):
        recipe_table.insert(0, ("optimiser steps", f"{values['steps']:,}"))
    if plan.get("precision"):
        recipe_table.append(("precision", str(plan["precision"])))
    if values.get("seed") is not None:
        recipe_table.append(("seed", str(values["seed"])))
    about = (
        f"A BERT encoder (L{config.num_hidden_layers}-H{config.hidden_size}-"
        f"A{config.num_attention_heads}, vocab {config.vocab_size:,}) fine-tuned with omnibert "
        f"on {task}, exported as `{arch}`.",
        "",
        "The tokenizer is WordPiece over the run's vocab.txt, lower-casing as the run did, at "
        f"most {config.max_position_embeddings} tokens (`model_max_length`).",
    )
    return ModelCard(
        title=f"{values.get('run_name') or task} ({arch})",
        pipeline_tag="question-answering" if qa else "text-classification",
        architecture=arch,
        about=about,
        usage=usage,
        source=str(finetuned.checkpoint),
        tags=("bert", str(task)),
        started_from=started,
        base_model=hub_id(started),
        datasets=_hub_sources(where),
        data=tuple(data),
        metrics=tuple(metrics),
        metrics_note=note,
        eval_data=str(values.get("task_label") or task),
        recipe=tuple(recipe_table),
    ).render()
