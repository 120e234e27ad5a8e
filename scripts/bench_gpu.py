"""GPU pretraining throughput: omnibert against Hugging Face ``BertForPreTraining``.

For each sequence length (128 with 20 masks, 512 with 76) and each layout (unpacked rows,
online-packed rows), the batches come from omnibert's own wiring: ``omnibert-train``'s
config (``data=generated``, ``accelerator=gpu``) goes through ``omnibert.run.training
.prepare``, so the plan, the precision (``auto``: bf16 where the GPU runs it), the compile
settings and the data module are the ones a training run uses. omnibert trains its
``BertForPreTraining`` with the step ``compile_only`` times (``AcceleratorPlugin._train_step``:
autocast forward, backward, optimiser step, synchronise) and the configured optimiser
(omnibert's LAMB, ``impl: auto`` = the Triton kernel on CUDA). The peer is Hugging Face's
``BertForPreTraining`` (SDPA attention, the same initial weights), compiled with the same
``torch.compile`` options, in the same autocast, trained by the same step function with the
same LAMB (omnibert's, on HF's parameters and names). It reads the same sequences: the very
same batches when unpacked; when omnibert packs, HF (which has no packed attention) gets the
unpacked rows of the same generated sequences. Both compute MLM over the masked positions
and NSP; HF scores every position (its design), omnibert only the masked ones.

Rounds alternate (omnibert then HF, HF then omnibert, ...), warm-up steps (compilation) are
not timed. Printed per implementation: sequences/s and real (non-padding) tokens/s per GPU,
MFU (dense BERT step FLOPs of the rows run, ``bert_pretraining_flops`` without the
last-layer pruning, over the device's dense bf16 peak from :data:`PEAK_BF16`), peak memory
(``torch.cuda.max_memory_allocated`` during its steps; both models and their optimiser state
are resident), the ratio omnibert/HF and the ratio to the published figures (seq 512:
NVIDIA DeepLearningExamples ≈ 207 sequences/s per A100-80GB unpacked, MLPerf Training 3.0 ≈
970 samples/s per H100 packed). Results go to ``--json`` (default
``outputs/bench_gpu/bench_gpu-<time>.json``).

    python scripts/bench_gpu.py                                   # BERT-large, both seqs
    python scripts/bench_gpu.py --seq 512 --packing online \\
        --length-histogram ../shared/data/wikipedia_seqlen_histogram_512.json
    python scripts/bench_gpu.py --smoke                           # tiny model, CPU, seconds

``--length-histogram``: rows take that length distribution (Wikipedia's makes packing pay
~2x at 512); without it the generated rows follow the reference generator (90% full
length), where packing gains little. Needs ``transformers`` (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import benchplot
import torch
from torch import Tensor, nn

#: dense bf16 tensor-core peak FLOP/s by device-name fragment (first match wins; NVIDIA data
#: sheets, without sparsity)
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),  # fp16 tensor cores (V100 has no bf16)
)
#: published per-GPU figures: (seq, packed) -> (sequences/s, source)
PUBLISHED: dict[tuple[int, bool], tuple[float, str]] = {
    (512, False): (207.0, "NVIDIA DeepLearningExamples phase 2, A100-80GB, mixed precision"),
    (512, True): (970.0, "MLPerf Training 3.0 NVIDIA, H100, phase 2 packed"),
}
PREDICTIONS = {128: 20, 512: 76}
MODELS = {  # layers, hidden, heads, intermediate
    "large": (24, 1024, 16, 4096),
    "base": (12, 768, 12, 3072),
    "tiny": (2, 128, 2, 512),
}


def peak_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``name`` (:data:`PEAK_BF16`), or None."""
    return next((peak for fragment, peak in PEAK_BF16 if fragment in name), None)


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's dense bf16 peak and its name (``None`` when unknown, e.g. a CPU)."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    return peak_for_name(name), name


def micro_batch(args: argparse.Namespace, seq: int) -> int:
    """Rows per step: ``--batch``, else 128 at seq <= 128 and 32 above (BERT-large in bf16
    with both models resident fits an 80 GB GPU)."""
    return int(args.batch or (128 if seq <= 128 else 32))


def compose_run(args: argparse.Namespace, seq: int, packing: str, root: Path) -> Any:
    """``omnibert.run.training.prepare`` of the training config for one case."""
    from omnibert.apps.compose import compose
    from omnibert.run.training import prepare

    layers, hidden, heads, inter = MODELS[args.model]
    rows = args.rows or max(1024, 8 * micro_batch(args, seq) * args.steps)
    overrides = [
        f"paths.output_root={root}",
        f"run_name=bench-{seq}-{packing}",
        "data=generated",
        "data.num_workers=0",
        f"data.vocab_size={args.vocab}",
        "data.num_eval_samples=0",
        f"data.num_train_samples={rows}",
        f"data.packing={packing}",
        f"data.pack.buffer_size={min(rows, 16384)}",
        f"data.seed={args.seed}",
        f"seed={args.seed}",
        f"phase.max_seq_length={seq}",
        f"phase.max_predictions_per_seq={args.predictions or PREDICTIONS.get(seq, seq // 6)}",
        f"phase.global_batch_size={micro_batch(args, seq)}",
        f"micro_batch_size={micro_batch(args, seq)}",
        "phase.max_steps=1000",
        f"accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"trainer.precision={args.precision}",
        f"optimizer={args.optimizer}",
        f"model.config.num_hidden_layers={layers}",
        f"model.config.hidden_size={hidden}",
        f"model.config.num_attention_heads={heads}",
        f"model.config.intermediate_size={inter}",
        f"model.config.max_position_embeddings={max(512, seq)}",
        "logger=none",
    ]
    if args.optimizer == "adamw":
        overrides.append("optimizer.lr=1e-4")
    if args.length_histogram:
        overrides.append(f"data.length_histogram={args.length_histogram}")
    if args.attention:
        overrides.append(f"model.config.attention={args.attention}")
    if args.compile is not None:
        overrides.append(f"accelerator.compile={str(args.compile).lower()}")
    return prepare(compose("pretrain", overrides))


def take_batches(prepared: Any, count: int) -> list[dict[str, Tensor]]:
    datamodule = prepared.datamodule
    datamodule.setup("fit")
    batches: list[dict[str, Tensor]] = []
    for batch in datamodule.train_dataloader():
        batches.append({k: v.to(prepared.plugin.device) for k, v in batch.items()})
        if len(batches) == count:
            return batches
    raise SystemExit(f"bench_gpu: only {len(batches)} batches; raise --rows")


class HFStep(nn.Module):
    """Hugging Face's model behind omnibert's step interface: ``forward(batch)["loss"]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {"loss": self.model(**batch).loss}


def hf_batch(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Unpacked rows of the data contract as HF inputs: labels -100 except at the masked
    positions, the attention mask from ``sequence_ids``, the first NSP label."""
    labels = torch.full_like(batch["input_ids"], -100)
    weights = batch["masked_lm_weights"] > 0
    rows = torch.arange(labels.shape[0], device=labels.device).unsqueeze(1)
    rows = rows.expand_as(batch["masked_lm_positions"])
    labels[rows[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    return {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["segment_ids"],
        "position_ids": batch["position_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "labels": labels,
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def hf_model(model: nn.Module) -> nn.Module:
    """HF ``BertForPreTraining`` (SDPA) with ``model``'s weights (the real vocab rows)."""
    import transformers

    config = model.config  # type: ignore[attr-defined]
    hf_config = transformers.BertConfig(**config.to_hf_dict())
    hf_config._attn_implementation = "sdpa"
    theirs = transformers.BertForPreTraining(hf_config)
    vocab = config.vocab_size
    state = {
        k: (v[:vocab] if v.shape[0] == config.padded_vocab_size else v)
        for k, v in model.state_dict().items()
    }
    theirs.load_state_dict(state, strict=True)
    return theirs


def batch_facts(batches: list[dict[str, Tensor]], config: Any) -> dict[str, float]:
    """Sequences, real tokens and dense-step FLOPs of one pass over ``batches``."""
    from omnibert.callbacks.throughput import bert_pretraining_flops

    sequences = sum(int((b["nsp_weights"] > 0).sum()) for b in batches)
    tokens = sum(int((b["sequence_ids"] > 0).sum()) for b in batches)
    flops = 0
    for b in batches:
        rows, seq = b["input_ids"].shape
        preds, slots = b["masked_lm_positions"].shape[1], b["nsp_positions"].shape[1]
        flops += bert_pretraining_flops(config, rows, seq, preds, slots, prune_last_layer=False)
    return {"sequences": sequences, "real_tokens": tokens, "flops": float(flops)}


def run_case(args: argparse.Namespace, seq: int, packing: str, root: Path) -> dict[str, Any]:
    from hydra.utils import instantiate

    from omnibert.models import BertConfig, BertForPreTraining

    prepared = compose_run(args, seq, packing, root)
    plugin, plan = prepared.plugin, prepared.plan
    precision = plan.precision
    ours_batches = take_batches(prepared, args.steps)
    if packing == "none":
        unpacked = ours_batches  # the very same batches
    else:  # HF has no packed attention: the unpacked rows of the same generated sequences
        unpacked = take_batches(compose_run(args, seq, "none", root), args.steps)
    peer_batches = [hf_batch(b) for b in unpacked]
    config = BertConfig(**{**prepared.c["model"]["config"], "vocab_size": plan.vocab_size})
    torch.manual_seed(args.seed)
    ours = BertForPreTraining(config).to(plugin.device).train()
    theirs = HFStep(hf_model(ours)).to(plugin.device).train()
    if plugin.compile:
        plugin.compile_model(ours)
        plugin.compile_model(theirs.model)
    optimizers = {
        name: instantiate(prepared.c["optimizer"], _convert_="all")(model.named_parameters())
        for name, model in (("omnibert", ours), ("hf", theirs.model))
    }
    models: dict[str, nn.Module] = {"omnibert": ours, "hf": theirs}
    inputs = {"omnibert": ours_batches, "hf": peer_batches}
    facts = {"omnibert": batch_facts(ours_batches, config), "hf": batch_facts(unpacked, config)}
    graphs = bool(getattr(plugin, "uses_cuda_graphs", False))

    def steps(name: str) -> Callable[[], float]:
        def run() -> float:
            plugin.synchronize()
            start = time.perf_counter()
            for batch in inputs[name]:
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                plugin._train_step(models[name], batch, optimizers[name], precision)
            return time.perf_counter() - start

        return run

    runners = {name: steps(name) for name in models}
    for name, run in runners.items():  # compile and warm up, untimed
        for _ in range(args.warmup):
            run()
        print(f"  warmed up {name} ({args.warmup} x {args.steps} steps)", flush=True)
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    peak: dict[str, int | None] = dict.fromkeys(runners)
    for r in range(args.rounds):
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for name in order:
            plugin.reset_peak_memory()
            seconds[name].append(runners[name]())
            measured, _ = plugin.peak_memory()
            if measured is not None:
                peak[name] = max(peak[name] or 0, measured)
    flops_peak, device_name = peak_flops(plugin.device)
    out: dict[str, Any] = {
        "seq": seq,
        "packing": packing,
        "precision": precision,
        "kernels": plan.kernels,
        "micro_batch": micro_batch(args, seq),
        "device": device_name,
    }
    for name in runners:
        median = statistics.median(seconds[name])
        f = facts[name]
        out[name] = {
            "rounds_seconds": [round(s, 5) for s in seconds[name]],
            "sequences_per_sec": f["sequences"] / median,
            "real_tokens_per_sec": f["real_tokens"] / median,
            "sequences_per_step": f["sequences"] / args.steps,
            "mfu": None if flops_peak is None else f["flops"] / median / flops_peak,
            "peak_memory_bytes": peak[name],
        }
    ratios = [
        (facts["omnibert"]["sequences"] / a) / (facts["hf"]["sequences"] / b)
        for a, b in zip(seconds["omnibert"], seconds["hf"], strict=True)
    ]
    out["ratio_sequences_per_sec"] = statistics.median(ratios)
    published = PUBLISHED.get((seq, packing != "none"))
    if published is not None:
        value, source = published
        out["published"] = {"sequences_per_sec": value, "source": source}
        out["ratio_to_published"] = out["omnibert"]["sequences_per_sec"] / value
    return out


def report(case: Mapping[str, Any]) -> str:
    lines = [
        f"seq {case['seq']} packing {case['packing']} micro batch {case['micro_batch']} "
        f"{case['precision']} on {case['device']}"
    ]
    for name in ("omnibert", "hf"):
        r = case[name]
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        mem = "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
        lines.append(
            f"  {name:<9} {r['sequences_per_sec']:10.1f} sequences/s  "
            f"{r['real_tokens_per_sec']:12.0f} real tokens/s  MFU {mfu:>6}  peak {mem} GiB  "
            f"({r['sequences_per_step']:.1f} sequences per step)"
        )
    lines.append(f"  ratio omnibert/hf (median of rounds): {case['ratio_sequences_per_sec']:.3f}")
    if "published" in case:
        pub = case["published"]
        lines.append(
            f"  ratio to published {pub['sequences_per_sec']:.0f} sequences/s per GPU "
            f"({pub['source']}): {case['ratio_to_published']:.3f}"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default="large")
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--packing", nargs="+", default=["none", "online"],
                        choices=["none", "online"])  # fmt: skip
    parser.add_argument("--batch", type=int, default=None,
                        help="micro batch in rows (default: 128 at seq <= 128, else 32)")  # fmt: skip
    parser.add_argument("--predictions", type=int, default=None, help="masks per sequence")
    parser.add_argument("--steps", type=int, default=10, help="steps per timed round")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2, help="untimed passes over the steps")
    parser.add_argument("--rows", type=int, default=None, help="generated training rows")
    parser.add_argument("--precision", default="auto", help="trainer.precision")
    parser.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb",
                        help="the same optimiser (omnibert's) for both models")  # fmt: skip
    parser.add_argument("--attention", default=None,
                        help="model.config.attention, where the model has the key")  # fmt: skip
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="accelerator.compile (default: the accelerator's, on for gpu)")  # fmt: skip
    parser.add_argument("--length-histogram", default=None, help="data.length_histogram")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--vocab", type=int, default=30522, help="data.vocab_size")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--json", default=None, help="where to write the results")
    benchplot.add_arguments(parser)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, vocab 512, seq 32, 2 rounds of 2 steps (CPU unless --device)")  # fmt: skip
    args = parser.parse_args(argv)
    if args.smoke:
        args.model, args.seq, args.vocab = "tiny", [32], 512
        args.steps, args.rounds, args.warmup = 2, 2, 1
        args.batch = args.batch or 4
        if args.device == "auto":
            args.device = "cpu"
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    cases = []
    with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        if args.smoke and args.length_histogram is None:  # lengths 5..seq alike: packing packs
            uniform = Path(tmp) / "uniform_lengths.json"
            uniform.write_text(json.dumps({"counts": [1] * max(args.seq)}))
            args.length_histogram = str(uniform)
        for seq in args.seq:
            for packing in args.packing:
                print(f"bench_gpu: seq {seq}, packing {packing} ...", flush=True)
                case = run_case(args, seq, packing, Path(tmp))
                print(report(case), flush=True)
                cases.append(case)
    import transformers

    results = {
        "command": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "cases": cases,
    }
    path = Path(args.json or f"outputs/bench_gpu/bench_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=2) + "\n")
    print(f"bench_gpu: results in {path}", flush=True)
    benchplot.save(record(args, cases, results), None, args.results_dir)
    return results


def record(args: argparse.Namespace, cases: list[dict[str, Any]], results: Any) -> Any:
    """The run as a :class:`benchplot.Record` (the site's benchmark pages read those)."""

    def cell(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    rows = [
        [
            f"seq {c['seq']}, {c['packing']}",
            cell(c["omnibert"]["sequences_per_sec"], ".1f"),
            cell(c["hf"]["sequences_per_sec"], ".1f"),
            f"{c['ratio_sequences_per_sec']:.2f}x",
            cell(c["omnibert"]["real_tokens_per_sec"], ".0f"),
            cell(c["omnibert"]["mfu"], ".1%"),
            cell(c.get("ratio_to_published"), ".2f"),
        ]
        for c in cases
    ]
    device = cases[0]["device"] if cases else "none"
    headline = "; ".join(f"{r[0]}: {r[3]} omnibert/hf" for r in rows)
    return benchplot.Record(
        name=f"gpu-{args.model}" + ("-smoke" if args.smoke else ""),
        title=f"BERT-{args.model} pretraining step on {device}: omnibert against Hugging Face",
        headline=headline,
        command=benchplot.command_line(),
        machine=benchplot.machine(),
        tables=[
            benchplot.Table(
                f"sequences/s per device ({cases[0]['precision'] if cases else ''})",
                [
                    "case",
                    "omnibert seq/s",
                    "hf seq/s",
                    "ratio",
                    "omnibert real tokens/s",
                    "omnibert MFU",
                    "vs published",
                ],
                rows,
            )
        ],
        measurements=results,
    )


if __name__ == "__main__":
    main()
