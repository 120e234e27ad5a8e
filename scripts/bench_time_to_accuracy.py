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

The rounds are the harness's (:mod:`benchharness`, omnibert first on even rounds), a round's
region being a whole run; the figures are each run's own curve and time to the target
(:mod:`bench_time_to_accuracy_sides` holds the sizes and both sides). For each size it prints per-round times to the
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
import dataclasses
import platform
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import benchplot
import torch
import transformers
from bench_time_to_accuracy_sides import (
    MODERN_SIZES,
    NO_WEIGHT_DECAY,
    SIZES,
    Size,
    hf_modern_hits,
    initial_weights,
    label,
    preset_config,
    run_hf,
    run_omnibert,
)
from benchharness import Region, Turn, apply_presets, device_sync, run_rounds

from omnibert.accelerators.cpu_bf16 import bench_precision

__all__ = ["MODERN_SIZES", "NO_WEIGHT_DECAY", "SIZES", "describe", "hf_modern_hits",
           "initial_weights", "label", "main", "median_round", "preset_config", "recipe",
           "require_demo_data", "run_omnibert", "summarise"]  # fmt: skip


#: what no flag and no preset sets (the sizes' own target, LR, warmup and steps otherwise)
DEFAULTS = {"rounds": 3, "eval_every": 1600}


def smoke_preset(batch: int) -> dict[str, Any]:
    """``--smoke``: one round, at most 12 steps, evaluated at step 8 against a target any
    better-than-nothing accuracy reaches (it stops a side at that evaluation)."""
    return {"rounds": 1, "target": 1e-6, "max_steps": 12, "eval_every": 8 * batch}


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
    p.add_argument("--eval-every", type=int, default=None, help="training sequences (1600)")
    p.add_argument("--rounds", type=int, default=None, help="default 3")
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
        args.sizes = ["modern_tiny" if modern else "tiny"]
    # explicit flags win, then --smoke, then the defaults
    apply_presets(args, smoke_preset(args.batch) if args.smoke else None, DEFAULTS)
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


def race(
    args: argparse.Namespace, name: str, size: Size, init: Path, work: Path
) -> dict[str, list[dict[str, Any]]]:
    """``--rounds`` harness rounds of both sides to the target (the order alternating). A
    round's region is a whole run; the figure kept is each run's own curve and time to the
    target (its evaluations' clock), not the region's seconds: the loop is the harness's,
    the measurement a time-to-accuracy curve."""

    def omnibert(turn: Turn) -> dict[str, Any]:
        return run_omnibert(args, size, init, work, f"{name}-round{turn.index}")

    def huggingface(turn: Turn) -> dict[str, Any]:
        return run_hf(args, size, init)

    def ran(region: Region) -> None:
        print(describe(region.peer, region.turn.index, region.value), flush=True)

    rounds = run_rounds({"omnibert": omnibert, "huggingface": huggingface}, rounds=args.rounds,
                        sync=device_sync("cpu"), after_region=ran)  # fmt: skip
    return {side: rounds.values(side) for side in ("omnibert", "huggingface")}


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
            runs = race(args, name, size, init, work)
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
