"""Real (non-padding) tokens per second of pretraining steps, packed against unpacked.

Same model, weights, precision, optimiser (AdamW), threads and row shape ``[batch, S]`` on
both sides; only the rows differ: unpacked rows hold one sequence each, packed rows the
sequences that ``data.packing=online`` puts together (NNLSHP, K=3, windows of
``--buffer`` sequences). Batches are collated before timing. The rounds are the harness's
(:mod:`benchharness`): a round is each side's ``--steps`` steps in turn, the order
alternating; the ``--warmup`` steps are a warm-up pass, not timed. Prints
each side's real tokens/s per round, then the ratio over all rounds (real tokens / seconds,
the estimator that matters: a round holds few unpacked sequences, so its own ratio swings
with their lengths), the median per-round ratio and the slots (B·S) per second of each side
(equal when a packed row costs what an unpacked one does: a dense attention backend; with
``attention=auto`` at seq 512 on a CPU, ``varlen``, the encoder runs real tokens only and an
unpacked row costs about its fill). The record's note names the attention that ran.

Two workloads, as issue 4 asks:

    # seq 512, lengths drawn from the Wikipedia histogram (Graphcore's, in ../shared/data)
    python scripts/bench_packing_train.py --seq 512 --predictions 76 --batch 2
    # seq 128 on the demo corpus (make demo writes outputs/demo/train)
    python scripts/bench_packing_train.py --seq 128 --predictions 20 --batch 8 \\
        --data outputs/demo/train
"""

from __future__ import annotations

import argparse
import itertools
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import benchplot
import torch
from benchharness import Turn, device_sync, run_rounds

from omnibert.accelerators.cpu_bf16 import bench_precision
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.models.attention_choice import resolve_attention

SIZES = {"tiny": (2, 128, 2, 512), "small": (4, 512, 8, 2048), "base": (12, 768, 12, 3072)}
HISTOGRAM = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/wikipedia_seqlen_histogram_512.json"
)


def batches(args: argparse.Namespace, packing: str) -> tuple[list[dict[str, Any]], int]:
    """``--warmup + rounds × steps`` collated training batches and the model's vocab size."""
    pack = {"buffer_size": args.buffer, "algorithm": args.algorithm}
    common: dict[str, Any] = {
        "max_seq_length": args.seq,
        "max_predictions_per_seq": args.predictions,
        "micro_batch_size": args.batch,
        "num_workers": 0,
        "seed": args.seed,
        "packing": packing,
        "pack": pack,
    }
    from omnibert.data.datamodule import PretrainingDataModule
    from omnibert.data.generated import GeneratedSource
    from omnibert.data.sources import ArrowSource

    module: Any
    if args.data:
        module = PretrainingDataModule(
            source=ArrowSource, train_path=args.data, eval_path=None, **common
        )
    else:
        module = PretrainingDataModule(
            source=GeneratedSource,
            vocab_size=30522,
            num_train_samples=args.samples,
            length_histogram=str(args.histogram),
            **common,
        )
    module.check()
    needed = args.warmup + args.rounds * args.steps
    loader = module.train_dataloader()
    stream: Iterator[dict[str, Any]] = itertools.chain.from_iterable(itertools.repeat(loader))
    return list(itertools.islice(stream, needed)), module.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(SIZES), default="base")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--predictions", type=int, default=76)
    parser.add_argument("--batch", type=int, default=2, help="rows per step (both sides)")
    parser.add_argument("--data", help="omnibert-prepare output dir (default: generated rows)")
    parser.add_argument("--histogram", type=Path, default=HISTOGRAM)
    parser.add_argument("--samples", type=int, default=20000, help="generated rows")
    parser.add_argument("--buffer", type=int, default=16384)
    parser.add_argument("--algorithm", default="nnlshp")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per side per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: bf16 where this CPU runs it natively (AVX512-BF16/AMX), else fp32",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--seed", type=int, default=0)
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    args.precision, why = bench_precision(args.precision)
    print(f"precision {args.precision}: {why}", flush=True)
    torch.set_num_threads(args.threads)

    data = {name: batches(args, name) for name in ("none", "online")}
    vocab = data["none"][1]
    layers, hidden, heads, inner = SIZES[args.model]
    config = BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=inner,
        max_position_embeddings=max(512, args.seq),
    )
    torch.manual_seed(args.seed)
    first = BertForPreTraining(config)
    models = {"none": first, "online": BertForPreTraining(config)}
    models["online"].load_state_dict(first.state_dict())
    optimizers = {k: torch.optim.AdamW(m.parameters(), lr=1e-5) for k, m in models.items()}
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16")

    def steps(name: str) -> Any:
        def region(turn: Turn) -> tuple[int, int]:
            """The pass's steps (the warm-up's first, then each round's own batches); the
            real tokens and sequences they held."""
            first = 0 if turn.warmup else args.warmup + turn.index * args.steps
            held = data[name][0][first : first + (args.warmup if turn.warmup else args.steps)]
            for batch in held:
                with autocast:
                    loss = models[name](batch)["loss"]
                loss.backward()
                optimizers[name].step()
                optimizers[name].zero_grad(set_to_none=True)
            real = sum(int((b["sequence_ids"] > 0).sum()) for b in held)
            return real, sum(int(b["nsp_weights"].sum()) for b in held)

        return region

    fill = {
        name: sum(int((b["sequence_ids"] > 0).sum()) for b in data[name][0])
        / (len(data[name][0]) * args.batch * args.seq)
        for name in models
    }
    print(
        f"bert-{args.model}, seq {args.seq}, {args.batch} rows per step, {args.precision}, "
        f"{args.threads} threads; rows filled: unpacked {fill['none']:.3f}, packed "
        f"{fill['online']:.3f} ({args.algorithm}, K=3, buffer {args.buffer})"
    )
    rounds = run_rounds({name: steps(name) for name in models}, rounds=args.rounds,
                        warmup=1 if args.warmup else 0, sync=device_sync("cpu"))  # fmt: skip
    rates = {
        name: [real / seconds for (real, _), seconds in
               zip(rounds.values(name), rounds.seconds(name), strict=True)]
        for name in models
    }  # fmt: skip
    sequences = {name: sum(seqs for _, seqs in rounds.values(name)) for name in models}
    totals = {name: (sum(rounds.seconds(name)), sum(r for r, _ in rounds.values(name)))
              for name in models}  # fmt: skip
    for r in range(rounds.rounds):
        print(f"round {r}: unpacked {rates['none'][r]:8.1f}  packed {rates['online'][r]:8.1f}"
              f" real tokens/s  ratio {rates['online'][r] / rates['none'][r]:.2f}x")  # fmt: skip
    ratios = [p / u for p, u in zip(rates["online"], rates["none"], strict=True)]
    overall = {name: totals[name][1] / totals[name][0] for name in models}
    steps = args.rounds * args.steps
    slots = {name: steps * args.batch * args.seq / totals[name][0] for name in models}
    print(
        f"all rounds: real tokens/s unpacked {overall['none']:.1f}, packed "
        f"{overall['online']:.1f}: ratio {overall['online'] / overall['none']:.2f}x "
        f"(median per round {statistics.median(ratios):.2f}x, min {min(ratios):.2f}, max "
        f"{max(ratios):.2f}); slots/s unpacked {slots['none']:.1f}, packed "
        f"{slots['online']:.1f}; sequences per step unpacked {sequences['none'] / steps:.2f}, "
        f"packed {sequences['online'] / steps:.2f}"
    )
    setup = (
        f"bert-{args.model}, seq {args.seq}, {args.batch} rows per step, {args.precision}, "
        f"{args.threads} threads; rows filled unpacked {fill['none']:.3f}, packed "
        f"{fill['online']:.3f} ({args.algorithm}, K=3, buffer {args.buffer})"
    )
    benchplot.save_throughput(
        args.results_dir,
        f"packing-train-{args.model}-seq{args.seq}",
        "Packed against unpacked pretraining steps: real (non-padding) tokens per second",
        setup,
        {"packed": rates["online"], "unpacked": rates["none"]},
        ratios,
        extra={"overall_real_tokens_per_s": overall, "slots_per_s": slots, "fill": fill,
               "sequences_per_step": {k: v / steps for k, v in sequences.items()}},
        unit="real tokens/s",
        ours="packed",
        peer="unpacked",
        headline=f"packed {overall['online']:.1f} real tokens/s, unpacked "
        f"{overall['none']:.1f}: {overall['online'] / overall['none']:.2f}x over all rounds "
        f"(median per round {statistics.median(ratios):.2f}x); rows filled {fill['none']:.3f} "
        f"unpacked, {fill['online']:.3f} packed",
        notes=[row_cost_note(slots, resolve_attention(config.attention, "cpu",
                                                      config.attention_probs_dropout_prob > 0,
                                                      args.seq))],
    )  # fmt: skip


def row_cost_note(slots: dict[str, float], attention: str) -> str:
    """What a packed row cost against an unpacked one, from the slots (rows x S) per second of
    each side, and the attention that ran: with ``varlen`` the encoder runs the real tokens
    only, so an unpacked row costs its fill and packing gains little; with a dense backend a
    row costs its shape and the gain is the fill."""
    cost = slots["none"] / slots["online"]  # a packed row's time over an unpacked row's
    measured = (f"slots/s unpacked {slots['none']:.1f}, packed {slots['online']:.1f}: a packed "
                f"row took {cost:.2f}x an unpacked row's time (attention {attention})")  # fmt: skip
    if abs(cost - 1) <= 0.1:
        return f"{measured}; a row costs its shape, so the gain is the fill."
    if attention == "varlen":
        return (
            f"{measured}; varlen runs the encoder on real tokens only, so an unpacked row "
            "costs about its fill: packing gains little over it (padding is computed on neither side)."
        )
    return f"{measured}."


if __name__ == "__main__":
    main()
