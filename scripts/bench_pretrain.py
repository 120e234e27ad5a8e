"""Pretraining step throughput: omnibert's BertForPreTraining against Hugging Face's.

Both models train (forward + backward + ``torch.optim.AdamW`` step) on the same pre-generated,
unpacked batches of the data contract (HF gets the same tokens with ``labels`` = -100 except at
the masked positions), with the same initial weights, precision, torch threads and AdamW.
The rounds are the harness's (:mod:`benchharness`): a round is each model's ``--steps`` steps
in turn, the order alternating, so drift in machine load hits both alike; the ``--warmup``
steps of each are a warm-up pass, not timed. Prints each model's tokens/s (real, non-padding
tokens) per round, the medians and the median of the per-round ratios, and the same per
CPU-second of the process over the same regions (a check when other work shares the
machine).

    python scripts/bench_pretrain.py                              # BERT-base, seq 128, 20 masks
    python scripts/bench_pretrain.py --model tiny --rounds 3      # quick smoke run
    python scripts/bench_pretrain.py --precision fp32 --threads 2

Needs ``transformers`` (the ``bench`` extra) for the peer.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Callable

import benchplot
import torch
import transformers
from benchharness import Region, Rounds, Turn, device_sync, run_rounds

from omnibert.accelerators.cpu_bf16 import bench_precision
from omnibert.models import BertConfig, BertForPreTraining

SIZES = {  # layers, hidden, heads, intermediate
    "tiny": (2, 128, 2, 512),
    "mini": (4, 256, 4, 1024),
    "small": (4, 512, 8, 2048),
    "medium": (8, 512, 8, 2048),
    "base": (12, 768, 12, 3072),
    "large": (24, 1024, 16, 4096),
}
CLS, SEP, MASK, FIRST_WORD = 101, 102, 103, 999


def make_batch(
    gen: torch.Generator, batch: int, seq: int, predictions: int, vocab: int
) -> dict[str, torch.Tensor]:
    """One unpacked batch shaped like create_pretraining_data output (random tokens)."""
    input_ids = torch.zeros(batch, seq, dtype=torch.long)
    segment_ids = torch.zeros(batch, seq, dtype=torch.long)
    position_ids = torch.zeros(batch, seq, dtype=torch.long)
    sequence_ids = torch.zeros(batch, seq, dtype=torch.long)
    positions = torch.zeros(batch, predictions, dtype=torch.long)
    labels = torch.zeros(batch, predictions, dtype=torch.long)
    weights = torch.zeros(batch, predictions)
    for row in range(batch):
        # 90% of instances aim at the full length, 10% at a random short one (short_seq_prob)
        target = (
            seq
            if torch.rand((), generator=gen) < 0.9
            else int(torch.randint(8, seq, (), generator=gen))
        )
        length = max(8, target - int(torch.randint(0, 12, (), generator=gen)))
        tokens = torch.randint(FIRST_WORD, vocab, (length,), generator=gen)
        split = int(torch.randint(2, length - 2, (), generator=gen))
        tokens[0], tokens[split], tokens[length - 1] = CLS, SEP, SEP
        input_ids[row, :length] = tokens
        segment_ids[row, split + 1 : length] = 1
        position_ids[row, :length] = torch.arange(length)
        sequence_ids[row, :length] = 1
        candidates = [i for i in range(1, length - 1) if i != split]
        count = min(predictions, max(1, round(length * 0.15)))
        chosen = sorted(
            candidates[int(i)] for i in torch.randperm(len(candidates), generator=gen)[:count]
        )
        positions[row, :count] = torch.tensor(chosen)
        labels[row, :count] = input_ids[row, chosen]
        weights[row, :count] = 1.0
        input_ids[row, chosen] = MASK
    return {
        "input_ids": input_ids,
        "segment_ids": segment_ids,
        "position_ids": position_ids,
        "sequence_ids": sequence_ids,
        "masked_lm_positions": positions,
        "masked_lm_ids": labels,
        "masked_lm_weights": weights,
        "nsp_positions": torch.zeros(batch, 1, dtype=torch.long),
        "nsp_labels": torch.randint(0, 2, (batch, 1), generator=gen),
        "nsp_weights": torch.ones(batch, 1),
    }


def hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    labels = torch.full_like(batch["input_ids"], -100)
    real = batch["masked_lm_weights"] > 0
    for row in range(labels.shape[0]):
        labels[row, batch["masked_lm_positions"][row][real[row]]] = batch["masked_lm_ids"][row][
            real[row]
        ]
    return {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["segment_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "labels": labels,
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def build_models(config: BertConfig) -> tuple[BertForPreTraining, transformers.BertForPreTraining]:
    ours = BertForPreTraining(config)
    hf_config = transformers.BertConfig(**config.to_hf_dict(), attn_implementation="sdpa")
    theirs = transformers.BertForPreTraining(hf_config)
    vocab = config.vocab_size  # HF keeps the real vocab; copy the same initial weights over
    state = {
        k: (v[:vocab] if v.shape[0] == config.padded_vocab_size else v)
        for k, v in ours.state_dict().items()
    }
    theirs.load_state_dict(state, strict=True)
    return ours.train(), theirs.train()


def make_step(
    model: torch.nn.Module, inputs: list, precision: str, adamw: str
) -> Callable[[int], float]:
    impl = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, **impl[adamw])
    is_hf = isinstance(model, transformers.PreTrainedModel)

    def step(i: int) -> float:
        autocast = (
            torch.autocast("cpu", dtype=torch.bfloat16)
            if precision == "bf16"
            else contextlib.nullcontext()
        )
        optimizer.zero_grad(set_to_none=True)
        with autocast:
            loss = model(**inputs[i]).loss if is_hf else model(inputs[i])["loss"]
        loss.backward()
        optimizer.step()
        return float(loss.detach())

    return step


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(SIZES), default="base")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--predictions", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8, help="micro batch (sequences per step)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    parser.add_argument(
        "--precision",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="auto: bf16 where this CPU runs it natively (AVX512-BF16/AMX), else fp32",
    )
    parser.add_argument(
        "--adamw",
        choices=["fused", "foreach", "for-loop"],
        default="fused",
        help="torch.optim.AdamW implementation (the same for both models)",
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--vocab", type=int, default=30522)
    parser.add_argument("--seed", type=int, default=0)
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    args.precision, why = bench_precision(args.precision)
    print(f"precision {args.precision}: {why}", flush=True)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    layers, hidden, heads, ffn = SIZES[args.model]
    config = BertConfig(
        vocab_size=args.vocab,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=max(512, args.seq),
    )
    gen = torch.Generator().manual_seed(args.seed)
    batches = [
        make_batch(gen, args.batch, args.seq, args.predictions, args.vocab)
        for _ in range(args.steps)
    ]
    tokens = sum(int((b["sequence_ids"] > 0).sum()) for b in batches)
    ours, theirs = build_models(config)
    steps = {
        "omnibert": make_step(ours, batches, args.precision, args.adamw),
        "hf": make_step(theirs, [hf_inputs(b) for b in batches], args.precision, args.adamw),
    }
    print(
        f"BERT-{args.model} seq {args.seq} P {args.predictions} batch {args.batch} "
        f"{args.precision} AdamW {args.adamw} threads {torch.get_num_threads()} torch {torch.__version__} "
        f"transformers {transformers.__version__}; {tokens} real tokens per round of {args.steps} steps"
    )

    def steps_of(step: Callable[[int], float]) -> Callable[[Turn], list[float]]:
        def region(turn: Turn) -> list[float]:  # the warm-up pass: --warmup steps
            return [step(i % args.steps) for i in range(args.warmup if turn.warmup else args.steps)]

        return region

    rates: dict[str, list[float]] = {name: [] for name in steps}
    cpu_rates: dict[str, list[float]] = {name: [] for name in steps}

    def after_round(index: int, rounds: Rounds) -> None:
        for name in steps:
            rates[name].append(tokens / rounds.seconds(name)[-1])
            cpu_rates[name].append(tokens / rounds.cpu_seconds(name)[-1])
        print(
            f"round {index}: "
            + "  ".join(f"{n} {rates[n][-1]:8.1f} tok/s" for n in steps)
            + f"  ratio {rates['omnibert'][-1] / rates['hf'][-1]:.3f}"
            + f"  (per CPU-second {cpu_rates['omnibert'][-1] / cpu_rates['hf'][-1]:.3f})",
            flush=True,
        )

    def warmed_up(region: Region) -> None:
        if region.turn.warmup:
            print(f"warm-up {region.peer}: losses {', '.join(f'{x:.3f}' for x in region.value)}")

    run_rounds(
        {name: steps_of(step) for name, step in steps.items()},
        rounds=args.rounds,
        warmup=1 if args.warmup else 0,
        sync=device_sync("cpu"),
        after_round=after_round,
        after_region=warmed_up,
    )
    ratios = [a / b for a, b in zip(rates["omnibert"], rates["hf"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpu_rates["omnibert"], cpu_rates["hf"], strict=True)]
    print(
        f"median tokens/s: omnibert {statistics.median(rates['omnibert']):.1f}, "
        f"hf {statistics.median(rates['hf']):.1f}; median ratio omnibert/hf "
        f"{statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
    )
    best = {name: max(values) for name, values in rates.items()}
    print(
        f"best round tokens/s: omnibert {best['omnibert']:.1f}, hf {best['hf']:.1f}; "
        f"ratio {best['omnibert'] / best['hf']:.3f}"
    )
    print(
        f"median tokens per CPU-second (all threads; less sensitive to other load): omnibert "
        f"{statistics.median(cpu_rates['omnibert']):.1f}, hf "
        f"{statistics.median(cpu_rates['hf']):.1f}; median ratio "
        f"{statistics.median(cpu_ratios):.3f}"
    )
    setup = (
        f"BERT-{args.model}, seq {args.seq}, {args.predictions} masks, batch {args.batch}, "
        f"{args.precision}, AdamW {args.adamw}, {torch.get_num_threads()} threads, "
        f"transformers {transformers.__version__}"
    )
    benchplot.save_throughput(
        args.results_dir,
        f"pretrain-{args.model}-seq{args.seq}-{args.precision}",
        "Pretraining step throughput against Hugging Face BertForPreTraining",
        setup,
        rates,
        ratios,
        extra={"per_cpu_second_ratios": cpu_ratios},
        unit="real tokens/s",
    )


if __name__ == "__main__":
    main()
