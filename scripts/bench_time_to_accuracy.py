"""Time to a held-out masked-LM accuracy target: omnibert against Hugging Face BertForPreTraining
(BERT sizes) or ModernBertForMaskedLM (modern sizes).

What MLPerf measures is time to accuracy, not step time. For each model size both sides train the
same BERT from the same initial weights (a seeded omnibert model exported to a Hugging Face
directory that both load) on the same prepared rows (the demo corpus, `make demo`), with the same
optimiser (omnibert's LAMB, apex rules), schedule (linear warmup and decay), precision, threads and
**number of sequences per optimiser step**, evaluating masked-LM accuracy on the whole held-out
set every ``--eval-every`` training sequences and stopping at the size's target:

* omnibert: the real ``omnibert-train`` (MLPerf mode's cadence and stop, ``data.packing=online``,
  gathered masked-LM head). Packed rows hold about 1.7 sequences each on the demo data, so by
  default (``--batch-unit sequences``) its global batch counts sequences as MLPerf and Krell et al.
  count it: ``phase.global_batch_size=--batch`` runs ``--batch / sequences-per-row`` packed rows
  a step, the peer's ``--batch`` sequences on average. ``--batch-unit rows`` runs ``--batch``
  packed rows a step instead (about 1.7x the sequences of the peer's step at the same learning
  rate: a change of hyper-parameters, not only of speed); the output says which ran.
* Hugging Face: ``transformers.BertForPreTraining`` (SDPA attention) in a plain training loop over
  ``--batch`` unpacked sequences a step, its accuracy computed the same way (weighted sums over
  the set).

The modern sizes (``modern_tiny``, ``modern_mini``: conf/model's presets) run the same way,
masked-LM only (the presets have no next-sentence head; both sides ignore the demo rows' NSP
labels and segment ids, since the presets have no token types):

* initial weights: a seeded omnibert model of the preset, exported by omnibert's ModernBERT
  exporter (``omnibert.convert.modernbert``) as a ``ModernBertForMaskedLM`` directory;
* omnibert: ``omnibert-train model=<preset>`` from that directory, otherwise as above;
* Hugging Face: ``transformers.ModernBertForMaskedLM`` with ``attn_implementation="sdpa"`` and
  ``sparse_prediction=True`` (its head and decoder run on the masked positions only, as
  omnibert's gathered head does), fed ``input_ids`` and ``attention_mask`` of the unpacked
  rows, accuracy over the same held-out masked positions. Of transformers 5.24's ModernBERT
  attention implementations only ``eager`` and ``sdpa`` train on a CPU (``flex_attention``
  has no CPU backward, ``flash_attention_2/3`` need CUDA), and ``sdpa`` is the faster one.
  LAMB's trust ratio is per tensor: Hugging Face's fused ``attn.Wqkv`` gets one where
  omnibert's ``query`` / ``key`` / ``value`` get three, the one difference in the update.

Rounds alternate (omnibert first on even rounds). For each size it prints per-round times to the
target (evaluations included), the sequences and steps they took, the medians and the ratio of the
medians; a side that misses the target within the size's step budget prints its best accuracy and
the step it came at. Everything goes to benchplot's record
in ``--results-dir``: ``time_to_accuracy`` for the BERT sizes, ``time_to_accuracy_modern`` for
the modern ones.

    python scripts/bench_time_to_accuracy.py                      # tiny, mini, small; 3 rounds
    python scripts/bench_time_to_accuracy.py --model mini --rounds 5 --precision auto
    python scripts/bench_time_to_accuracy.py --batch-unit rows    # the equal-rows variant
    python scripts/bench_time_to_accuracy.py --model modern_mini  # against ModernBertForMaskedLM
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import benchplot
import torch
import transformers
from omegaconf import OmegaConf

from omnibert.accelerators.cpu_bf16 import bench_precision
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
#: target and LAMB learning rate for the demo data at 32 sequences a step. tiny and mini were
#: measured to reach 0.10 on both sides at step ~250 of 1,000, small at step ~200
#: (docs/pretraining/mlperf.md; the mini at LR 1e-2 stays at the unigram guess for 1,000
#: steps).
SIZES = {
    "tiny": Size(2, 128, 2, 512, target=0.10, lr=1e-2, warmup=50, max_steps=1000),
    "mini": Size(4, 256, 4, 1024, target=0.10, lr=4e-3, warmup=100, max_steps=1000),
    "small": Size(4, 512, 8, 2048, target=0.10, lr=2e-3, warmup=100, max_steps=1000),
}
#: The ModernBERT family scaled down (conf/model/modern_tiny.yaml: L2-H128-A2, GeGLU 192;
#: modern_mini.yaml: L4-H256-A4, GeGLU 384; the shapes are checked against the yaml by
#: tests/test_bench_time_to_accuracy.py), masked-LM only, with BERT's recipe: LAMB, linear
#: warmup and decay, 32 sequences a step, the same 0.10 target. modern_tiny at bert-tiny's LAMB
#: 1e-2 was measured to reach 0.10 on both sides (docs/modern.md#benchmarks, one round);
#: modern_mini takes bert-mini's 4e-3 (same L4-H256 shape): 0.10 at step ~200 on both sides (3 rounds).
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


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="outputs/demo", help="make demo's output directory")
    p.add_argument(
        "--model",
        default="tiny,mini,small",
        help=f"sizes, comma separated: {', '.join([*SIZES, *MODERN_SIZES])}",
    )
    p.add_argument("--target", type=float, help="override every size's target accuracy")
    p.add_argument("--lr", type=float, help="override every size's LAMB learning rate")
    p.add_argument("--warmup", type=int, help="override every size's warmup steps")
    p.add_argument("--max-steps", type=int, help="override every size's step budget")
    p.add_argument("--batch", type=int, default=32, help="global batch (see --batch-unit)")
    p.add_argument(
        "--batch-unit",
        choices=("sequences", "rows"),
        default="sequences",
        help="sequences: both sides run --batch sequences a step on average (default); rows: "
        "omnibert runs --batch packed rows a step",
    )
    p.add_argument("--eval-every", type=int, default=1600, help="training sequences")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--precision", choices=("32", "fp32", "bf16", "auto"), default="32")
    p.add_argument("--seed", type=int, default=1234)
    benchplot.add_arguments(p)
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a few steps of bert-tiny (modern-tiny with --model modern_tiny) to a low "
        "target, one round (keeps the script tested)",
    )
    args = p.parse_args(argv)
    args.sizes = [s.strip() for s in args.model.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES and s not in MODERN_SIZES]
    if unknown:
        p.error(f"--model {','.join(unknown)}: choose from {', '.join([*SIZES, *MODERN_SIZES])}")
    if args.smoke:
        modern = any(s in MODERN_SIZES for s in args.sizes)
        args.sizes, args.rounds = ["modern_tiny" if modern else "tiny"], 1
        # any better-than-nothing accuracy stops a side at its first evaluation (step 8)
        args.target = 1e-6 if args.target is None else args.target
        args.max_steps = args.max_steps or 12
        args.eval_every = min(args.eval_every, 8 * args.batch)
    args.precision = "fp32" if args.precision == "32" else args.precision
    return args


def recipe(args: argparse.Namespace, name: str) -> Size:
    size = MODERN_SIZES[name] if name in MODERN_SIZES else SIZES[name]
    overrides = {
        k: getattr(args, k)
        for k in ("target", "lr", "warmup", "max_steps")
        if getattr(args, k) is not None
    }
    return dataclasses.replace(size, **overrides)


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


def best(result: dict[str, Any]) -> tuple[float, int] | None:
    """The best evaluation (accuracy, step) of a run, None when it never evaluated."""
    if not result["curve"]:
        return None
    _, _, step, accuracy = max(result["curve"], key=lambda point: point[3])
    return accuracy, step


def describe(side: str, r: int, result: dict[str, Any]) -> str:
    if result["seconds"] is not None:
        head = f"{result['seconds']:.1f} s to target"
    else:
        got = best(result)
        head = "missed the target" + (
            f" (best {got[0]:.4f} at step {got[1]})" if got else " (never evaluated)"
        )
    return (
        f"  [{r}] {side:12s} {head}, {result['samples']:,} sequences, {result['steps']} steps "
        f"({result['rows_per_step']} rows ≈ {result['sequences_per_step']} sequences a step)"
    )


def summarise(size: str, recipe_: Size, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    fields = dataclasses.asdict(recipe_)
    if fields["preset"] is None:  # BERT sizes: the record as before modern sizes came
        del fields["preset"]
    out: dict[str, Any] = {"size": size, "recipe": fields}
    for side, results in runs.items():
        times = [r["seconds"] for r in results]
        reached = [t for t in times if t is not None]
        out[side] = {
            "rounds": results,
            "reached": len(reached),
            "median_seconds": statistics.median(reached) if len(reached) == len(times) else None,
            "median_samples": statistics.median(r["samples"] for r in results),
            "median_steps": statistics.median(r["steps"] for r in results),
            "best": [best(r) for r in results],
        }
    ours, theirs = out["omnibert"]["median_seconds"], out["huggingface"]["median_seconds"]
    out["ratio"] = None if ours is None or theirs is None else theirs / ours
    return out


def median_round(side: dict[str, Any]) -> dict[str, Any]:
    """The round whose time is the median (the first round when one missed)."""
    rounds = side["rounds"]
    if side["median_seconds"] is None:
        return rounds[0]
    ordered = sorted(rounds, key=lambda r: r["seconds"])
    return ordered[(len(ordered) - 1) // 2]


def save_record(args: argparse.Namespace, report: dict[str, Any], modern: bool = False) -> None:
    """``time_to_accuracy.json`` and ``.svg`` in ``--results-dir`` (benchplot's record), or
    ``time_to_accuracy_modern`` for the modern sizes (``report`` holds one family's sizes)."""
    peer = "ModernBertForMaskedLM (SDPA, sparse prediction)" if modern else "BertForPreTraining"
    rows = []
    for size in report["sizes"]:
        o, h = size["omnibert"], size["huggingface"]

        def cell(side: dict[str, Any]) -> str:
            if side["median_seconds"] is None:
                return f"reached in {side['reached']}/{len(side['rounds'])} rounds"
            return (
                f"{side['median_seconds']:.1f} s, {side['median_samples']:,.0f} seq, "
                f"{side['median_steps']:.0f} steps"
            )

        ratio = "—" if size["ratio"] is None else f"{size['ratio']:.2f}x"
        rows.append([label(size["size"]), str(size["recipe"]["target"]), cell(o), cell(h), ratio])
    fig = None
    if report["sizes"]:
        fig, axes = benchplot.figure(len(report["sizes"]))
        for ax, size in zip(axes, report["sizes"], strict=True):
            series = {}
            for side, legend in (("omnibert", "omnibert"), ("huggingface", "Hugging Face")):
                curve = median_round(size[side])["curve"]
                series[legend] = ([p[0] for p in curve], [p[3] for p in curve])
            benchplot.draw_curves(
                ax, label(size["size"]), "seconds", "held-out MLM accuracy", series,
                target=size["recipe"]["target"],
            )  # fmt: skip
    ratios = [f"{label(s['size'])} {s['ratio']:.2f}x" for s in report["sizes"] if s["ratio"]]
    record = benchplot.Record(
        name="time_to_accuracy_modern" if modern else "time_to_accuracy",
        title=f"Time to a held-out masked-LM accuracy: omnibert-train against Hugging Face {peer}",
        headline=(
            "omnibert faster to the target (median over rounds): " + ", ".join(ratios)
            if ratios
            else "no size reached its target on both sides in every round"
        ),
        command=report["command"],
        tables=[
            benchplot.Table(
                f"{report['batch']} {report['batch_unit']} a step, {report['precision']}, "
                f"{report['machine']['threads']} threads",
                ["model", "target", "omnibert (median)", "Hugging Face (median)", "ratio"],
                rows,
            )
        ],
        measurements=report,
    )
    benchplot.save(record, fig, args.results_dir)


def require_demo_data(data: Path) -> Path:
    """``make demo``'s layout (``train/``, ``eval/``, ``vocab.txt``), or one sentence naming
    what is missing and how to make it."""
    for needed in ("train", "eval", "vocab.txt"):
        if not (data / needed).exists():
            raise SystemExit(f"{data / needed} is missing: run `make demo` first (or --data).")
    return data


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    torch.set_num_threads(args.threads)
    data = require_demo_data(Path(args.data))
    args.precision, why = bench_precision(args.precision)
    unit = (
        f"{args.batch} sequences a step on both sides (omnibert: packed rows holding that many "
        "on average)"
        if args.batch_unit == "sequences"
        else f"{args.batch} packed rows a step for omnibert, {args.batch} sequences for HF "
        "(equal rows: omnibert's step holds more sequences)"
    )
    print(f"batch: {unit}; precision {args.precision} ({why}); {args.threads} threads; "
          f"eval every {args.eval_every} sequences; {args.rounds} rounds", flush=True)  # fmt: skip
    report: dict[str, Any] = {
        "command": " ".join(
            ["python scripts/bench_time_to_accuracy.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": {
            "processor": platform.processor() or platform.machine(),
            "threads": args.threads,
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
        "batch": args.batch,
        "batch_unit": args.batch_unit,
        "precision": args.precision,
        "eval_every": args.eval_every,
        "sizes": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for name in args.sizes:
            size = recipe(args, name)
            init = initial_weights(size, args.seed, work, data / "vocab.txt")
            peer = (
                "ModernBertForMaskedLM, attn_implementation=sdpa, sparse_prediction, MLM only"
                if size.modern
                else "BertForPreTraining, attn_implementation=sdpa"
            )
            print(f"{label(name)} (L{size.layers}-H{size.hidden}): target masked-LM accuracy "
                  f"{size.target}, LAMB lr {size.lr}, warmup {size.warmup}, at most "
                  f"{size.max_steps} steps; Hugging Face {peer}", flush=True)  # fmt: skip
            runs: dict[str, list[dict[str, Any]]] = {"omnibert": [], "huggingface": []}
            for r in range(args.rounds):
                order = ("omnibert", "huggingface") if r % 2 == 0 else ("huggingface", "omnibert")
                for side in order:
                    res = (run_omnibert(args, size, init, work, f"{name}-round{r}")
                           if side == "omnibert" else run_hf(args, size, init))  # fmt: skip
                    runs[side].append(res)
                    print(describe(side, r, res), flush=True)
            result = summarise(name, size, runs)
            report["sizes"].append(result)
            o, h = result["omnibert"], result["huggingface"]
            if result["ratio"] is not None:
                print(f"  {label(name)}: omnibert {o['median_seconds']:.1f} s, "
                      f"{o['median_samples']:,.0f} sequences, {o['median_steps']:.0f} steps; "
                      f"Hugging Face {h['median_seconds']:.1f} s, {h['median_samples']:,.0f} "
                      f"sequences, {h['median_steps']:.0f} steps (medians); omnibert "
                      f"{result['ratio']:.2f}x faster to {size.target}", flush=True)  # fmt: skip
            else:
                print(f"  {label(name)}: no ratio: omnibert reached the target in {o['reached']} "
                      f"of {args.rounds} rounds, Hugging Face in {h['reached']}", flush=True)  # fmt: skip
    for modern in (False, True):  # one record per family: the BERT record stays as it was
        sizes = [s for s in report["sizes"] if (s["size"] in MODERN_SIZES) == modern]
        if sizes:
            save_record(args, {**report, "sizes": sizes}, modern)
    return report


if __name__ == "__main__":
    main()
