"""The two sides of ``scripts/bench_time_to_accuracy.py`` and what they share: the sizes and
their recipes (:data:`SIZES`, :data:`MODERN_SIZES`), the seeded initial weights both load,
omnibert's run (the real ``omnibert-train`` to the target, :func:`run_omnibert`) and Hugging
Face's (a plain training loop with the same optimiser, schedule and evaluation,
:func:`run_hf`). Each returns its own curve: the time to the target is the run's clock at
the evaluation that reached it."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from omegaconf import OmegaConf

from omnibert.apps.compose import compose
from omnibert.apps.train import run as train
from omnibert.convert.hf_export import export_hf
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.sources import ArrowSource
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.optim import Lamb, PolyWarmupLR


@dataclass(frozen=True)
class Size:
    """A Google BERT miniature or a modern preset and the recipe both sides run it with on the
    demo data."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    target: float  # held-out masked-LM accuracy (the majority token scores about 0.056)
    lr: float  # LAMB peak
    warmup: int
    max_steps: int
    #: conf/model preset of a modern size (its other options come from there); None: BERT
    preset: str | None = None

    @property
    def modern(self) -> bool:
        return self.preset is not None


#: Turc et al. 2019's miniatures (tiny L2-H128, mini L4-H256, small L4-H512), each with a
#: target and LAMB learning rate for the demo data at 32 sequences a step, chosen so that both
#: sides reach the target well inside max_steps (the steps they took are in the records of
#: docs/benchmarks.md; the mini at LR 1e-2 stays at the unigram guess).
SIZES = {
    "tiny": Size(2, 128, 2, 512, target=0.10, lr=1e-2, warmup=50, max_steps=1000),
    "mini": Size(4, 256, 4, 1024, target=0.10, lr=4e-3, warmup=100, max_steps=1000),
    "small": Size(4, 512, 8, 2048, target=0.10, lr=2e-3, warmup=100, max_steps=1000),
}
#: The ModernBERT family scaled down (conf/model/modern_tiny.yaml: L2-H128-A2, GeGLU 192;
#: modern_mini.yaml: L4-H256-A4, GeGLU 384; the shapes are checked against the yaml by
#: tests/e2e/test_bench_time_to_accuracy.py), masked-LM only, with BERT's recipe: LAMB, linear
#: warmup and decay, 32 sequences a step, the same 0.10 target. modern_tiny takes bert-tiny's
#: LAMB 1e-2, modern_mini bert-mini's 4e-3 (the same L4-H256 shape); both sides reach the target
#: with them (docs/modern.md#benchmarks has the records).
MODERN_SIZES = {
    "modern_tiny": Size(2, 128, 2, 192, target=0.10, lr=1e-2, warmup=50, max_steps=1000,
                        preset="modern_tiny"),
    "modern_mini": Size(4, 256, 4, 384, target=0.10, lr=4e-3, warmup=100, max_steps=1000,
                        preset="modern_mini"),
}  # fmt: skip
#: omnibert's LAMB no_weight_decay (conf/optimizer/lamb.yaml) on each side's parameter names:
#: BERT's names are the same on both sides; ModernBERT's norms are ``norm`` / ``*_norm``
NO_WEIGHT_DECAY = {
    False: ["bias", "LayerNorm", "layer_norm"],
    True: ["bias", "norm"],
}


def label(name: str) -> str:
    """The printed name of a size: bert-tiny, modern-tiny."""
    return name.replace("_", "-") if name in MODERN_SIZES else f"bert-{name}"


def data_shape(data: Path) -> tuple[int, int]:
    meta = json.loads((data / "train" / "metadata.json").read_text())["settings"]
    return int(meta["max_seq_length"]), int(meta["max_predictions_per_seq"])


def preset_config(preset: str, vocab_size: int) -> BertConfig:
    """conf/model/<preset>.yaml's ``config`` with the data's vocabulary, as omnibert-train
    builds it for ``model=<preset>``."""
    fields = OmegaConf.to_container(compose("pretrain", [f"model={preset}"]).model.config)
    assert isinstance(fields, dict)
    return BertConfig(**{**fields, "vocab_size": vocab_size})


def initial_weights(size: Size, seed: int, work: Path, vocab_file: Path) -> Path:
    """A seeded model exported as Hugging Face's BertForPreTraining (BERT sizes) or
    ModernBertForMaskedLM (modern sizes) with the data's vocabulary: both sides start there."""
    vocab_size = sum(1 for _ in vocab_file.open(encoding="utf-8"))
    if size.preset is not None:
        config = preset_config(size.preset, vocab_size)
        shape = (config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                 config.intermediate_size)  # fmt: skip
        if shape != (size.layers, size.hidden, size.heads, size.ffn):
            raise SystemExit(
                f"conf/model/{size.preset}.yaml is L{shape[0]}-H{shape[1]}-A{shape[2]}-FFN"
                f"{shape[3]} but MODERN_SIZES says L{size.layers}-H{size.hidden}-A{size.heads}"
                f"-FFN{size.ffn}: make MODERN_SIZES match the preset."
            )
    else:
        config = BertConfig(vocab_size=vocab_size, hidden_size=size.hidden,
                            num_hidden_layers=size.layers, num_attention_heads=size.heads,
                            intermediate_size=size.ffn)  # fmt: skip
    torch.manual_seed(seed)
    out = work / f"init-{size.preset or 'bert'}-{size.layers}-{size.hidden}"
    export_hf(BertForPreTraining(config), out, vocab_file)
    return out


def run_omnibert(
    args: argparse.Namespace,
    size: Size,
    init: Path,
    work: Path,
    name: str,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    """One ``omnibert-train`` to the target; ``extra``: more overrides (a variant's)."""
    data = Path(args.data)
    seq, predictions = data_shape(data)
    overrides = [
        "experiment=mlperf_smoke", f"paths.output_root={work}", f"run_name={name}",
        f"data.train_path={data / 'train'}", f"data.eval_path={data / 'eval'}",
        f"data.vocab_file={data / 'vocab.txt'}", "data.packing=online", "data.num_workers=0",
        f"phase.max_seq_length={seq}", f"phase.max_predictions_per_seq={predictions}",
        f"model.init_from={init}", "optimizer=lamb", "schedule=linear_warmup",
        f"phase.global_batch_size={args.batch}", f"phase.max_steps={size.max_steps}",
        f"phase.lr.lamb={size.lr}", f"phase.warmup_steps={size.warmup}",
        f"mlperf.target_accuracy={size.target}", f"mlperf.eval_every_samples={args.eval_every}",
        "callbacks=minimal", "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", f"seed={args.seed}",
        f"accelerator.threads={args.threads}",
        "trainer.precision=" + ("bf16-mixed" if args.precision == "bf16" else "32-true"),
    ]  # fmt: skip
    if size.preset is not None:  # the preset's shape and options, MLM only
        overrides.append(f"model={size.preset}")
    else:
        overrides += [
            f"model.config.num_hidden_layers={size.layers}",
            f"model.config.hidden_size={size.hidden}",
            f"model.config.num_attention_heads={size.heads}",
            f"model.config.intermediate_size={size.ffn}",
        ]
    if args.precision == "bf16":
        overrides.append("accelerator.allow_slow_bf16=true")  # the benchmark decided already
    if args.batch_unit == "rows":  # --batch packed rows a step, whatever they hold
        overrides.append(f"micro_batch_size={args.batch}")
    overrides += extra
    out = work / f"{name}-out"
    summary = train(compose("pretrain", overrides), out)
    plan = json.loads((out / "plan.json").read_text())["batch"]
    m = summary["mlperf"]
    curve = [(e["seconds"], e["samples"], e["step"], e["val/mlm_acc"]) for e in m["evaluations"]]
    return {
        "seconds": m["seconds_to_target"],
        "samples": m["samples_to_target"] if m["reached"] else m["samples"],
        "steps": summary["steps"],
        "rows_per_step": plan["rows_per_step"],
        "sequences_per_step": round(plan["sequences_per_step"], 2),
        "curve": curve,
    }


def _hf_inputs(batch: dict[str, torch.Tensor], modern: bool = False) -> dict[str, torch.Tensor]:
    """Hugging Face's inputs for the unpacked rows: masked-LM labels at the weighted masked
    positions (-100 elsewhere); BERT also takes segment ids and the NSP label, ModernBERT
    (no token types, no NSP head) only ids and the attention mask."""
    labels = torch.full_like(batch["input_ids"], -100)
    weights = batch["masked_lm_weights"] > 0
    rows = torch.arange(labels.shape[0])[:, None].expand_as(weights)
    labels[rows[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    if modern:
        return {
            "input_ids": batch["input_ids"],
            "attention_mask": (batch["sequence_ids"] > 0).long(),
            "labels": labels,
        }
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "token_type_ids": batch["segment_ids"],
        "labels": labels,
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def _autocast(precision: str) -> Any:
    if precision == "bf16":
        return torch.autocast("cpu", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def hf_modern_hits(model: Any, batch: dict[str, torch.Tensor]) -> tuple[float, float]:
    """(weighted correct, weight) of a ModernBertForMaskedLM with ``sparse_prediction`` on a
    batch: its logits are those of the labelled positions in row-major order, so the weights
    are scattered to the same positions and read back in that order."""
    inputs = _hf_inputs(batch, modern=True)
    logits = model(**inputs).logits
    labels = inputs["labels"].view(-1)
    weight_map = torch.zeros(inputs["labels"].shape, dtype=torch.float32)
    rows = torch.arange(weight_map.shape[0])[:, None].expand_as(batch["masked_lm_positions"])
    weight_map[rows, batch["masked_lm_positions"]] = batch["masked_lm_weights"].float()
    keep = labels != -100
    hits = (logits.argmax(-1) == labels[keep]).float()
    weights = weight_map.view(-1)[keep]
    return float((hits * weights).sum()), float(weights.sum())


def hf_accuracy(model: Any, loader: Any, precision: str, modern: bool = False) -> float:
    correct = total = 0.0
    model.eval()
    with torch.no_grad(), _autocast(precision):
        for batch in loader:
            if modern:
                hit, weight = hf_modern_hits(model, batch)
                correct, total = correct + hit, total + weight
                continue
            inputs = _hf_inputs(batch)
            out = model(**{k: v for k, v in inputs.items() if "label" not in k})
            logits = out.prediction_logits.gather(
                1,
                batch["masked_lm_positions"][..., None].expand(
                    -1, -1, out.prediction_logits.shape[-1]
                ),
            )
            hits = (logits.argmax(-1) == batch["masked_lm_ids"]).float()
            correct += float((hits * batch["masked_lm_weights"]).sum())
            total += float(batch["masked_lm_weights"].sum())
    model.train()
    return correct / total


def run_hf(args: argparse.Namespace, size: Size, init: Path) -> dict[str, Any]:
    data = Path(args.data)
    seq, predictions = data_shape(data)
    module = PretrainingDataModule(
        source=ArrowSource, train_path=str(data / "train"), eval_path=str(data / "eval"),
        max_seq_length=seq, max_predictions_per_seq=predictions, micro_batch_size=args.batch,
        eval_micro_batch_size=args.batch, num_workers=0, seed=args.seed,
    )  # fmt: skip
    module.setup("fit")
    torch.manual_seed(args.seed)
    model: Any
    if size.modern:  # masked positions only through head and decoder, as omnibert's head
        model = transformers.ModernBertForMaskedLM.from_pretrained(
            init, attn_implementation="sdpa", sparse_prediction=True
        )
    else:
        model = transformers.BertForPreTraining.from_pretrained(init, attn_implementation="sdpa")
    model.train()
    optimizer = Lamb(model.named_parameters(), lr=size.lr, weight_decay=0.01,
                     no_weight_decay=NO_WEIGHT_DECAY[size.modern])  # fmt: skip
    schedule = PolyWarmupLR(optimizer, total_steps=size.max_steps,
                            warmup_steps=size.warmup, power=1.0)  # fmt: skip
    samples, steps, next_eval = 0, 0, args.eval_every
    curve: list[tuple[float, int, int, float]] = []
    start = time.perf_counter()
    while steps < size.max_steps:
        for batch in module.train_dataloader():
            with _autocast(args.precision):
                loss = model(**_hf_inputs(batch, size.modern)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            steps += 1
            samples += int(batch["nsp_weights"].sum())
            if samples >= next_eval:
                next_eval += args.eval_every
                accuracy = hf_accuracy(model, module.val_dataloader(), args.precision, size.modern)
                curve.append((time.perf_counter() - start, samples, steps, accuracy))
                if accuracy >= size.target:
                    return {"seconds": curve[-1][0], "samples": samples, "steps": steps,
                            "rows_per_step": args.batch, "sequences_per_step": args.batch,
                            "curve": curve}  # fmt: skip
            if steps >= size.max_steps:
                break
    return {"seconds": None, "samples": samples, "steps": steps, "rows_per_step": args.batch,
            "sequences_per_step": args.batch, "curve": curve}  # fmt: skip
