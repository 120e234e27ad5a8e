"""Time to a held-out masked-LM accuracy target: omnibert against Hugging Face BertForPreTraining.

What MLPerf measures is time to accuracy, not step time. Both sides train the same BERT from
the same initial weights (a seeded omnibert model exported to a Hugging Face directory that
both load) on the same prepared rows (the demo corpus, `make demo`), with the same optimiser
(omnibert's LAMB, apex rules), schedule (linear warmup and decay) and global batch of
sequences, evaluating masked-LM accuracy on the whole held-out set every `--eval-every`
training sequences and stopping at `--target`:

* omnibert: the real `omnibert-train` (MLPerf mode's cadence and stop, `data.packing=online`,
  gathered masked-LM head);
* Hugging Face: `transformers.BertForPreTraining` (SDPA attention) in a plain training loop over
  the same unpacked batches, its accuracy computed the same way (weighted sums over the set).

Runs alternate (omnibert first on even rounds). Prints the time from the first step to the
evaluation that reached the target (evaluations included), the sequences it took and the ratio.

    python scripts/bench_time_to_accuracy.py --rounds 2
    python scripts/bench_time_to_accuracy.py --target 0.12 --model mini
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from omnibert.apps.compose import compose
from omnibert.apps.train import run as train
from omnibert.convert.hf import export_hf
from omnibert.data.datamodule import PretrainingDataModule
from omnibert.data.sources import ArrowSource
from omnibert.models import BertConfig, BertForPreTraining
from omnibert.optim import Lamb, PolyWarmupLR

SIZES = {"tiny": (2, 128, 2, 512), "mini": (4, 256, 4, 1024)}  # layers, hidden, heads, ffn


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default="outputs/demo", help="make demo's output directory")
    p.add_argument("--model", choices=sorted(SIZES), default="tiny")
    p.add_argument("--target", type=float, default=0.10)
    p.add_argument("--batch", type=int, default=32, help="global batch in sequences")
    p.add_argument("--lr", type=float, default=1e-2)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--max-steps", type=int, default=1000)
    p.add_argument("--eval-every", type=int, default=1600, help="training sequences")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args()


def initial_weights(args: argparse.Namespace, work: Path, vocab_file: Path) -> Path:
    layers, hidden, heads, ffn = SIZES[args.model]
    vocab_size = sum(1 for _ in vocab_file.open(encoding="utf-8"))
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, intermediate_size=ffn)  # fmt: skip
    export_hf(BertForPreTraining(config), work / "init", vocab_file)
    return work / "init"


def run_omnibert(args: argparse.Namespace, init: Path, work: Path, name: str) -> dict[str, Any]:
    layers, hidden, heads, ffn = SIZES[args.model]
    data = Path(args.data)
    cfg = compose("pretrain", [
        "experiment=mlperf_smoke", f"paths.output_root={work}", f"run_name={name}",
        f"data.train_path={data / 'train'}", f"data.eval_path={data / 'eval'}",
        f"data.vocab_file={data / 'vocab.txt'}", "data.packing=online", "data.num_workers=0",
        f"model.init_from={init}", f"model.config.num_hidden_layers={layers}",
        f"model.config.hidden_size={hidden}", f"model.config.num_attention_heads={heads}",
        f"model.config.intermediate_size={ffn}", "optimizer=lamb", "schedule=linear_warmup",
        f"phase.global_batch_size={args.batch}", f"phase.max_steps={args.max_steps}",
        f"phase.lr.lamb={args.lr}", f"phase.warmup_steps={args.warmup}",
        f"mlperf.target_accuracy={args.target}", f"mlperf.eval_every_samples={args.eval_every}",
        "callbacks=minimal", "logger=none", "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false", f"seed={args.seed}",
    ])  # fmt: skip
    summary = train(cfg, work / f"{name}-out")
    m = summary["mlperf"]
    return {"seconds": m["seconds_to_target"], "samples": m["samples_to_target"],
            "steps": summary["steps"], "evals": len(m["evaluations"])}  # fmt: skip


def _hf_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    labels = torch.full_like(batch["input_ids"], -100)
    weights = batch["masked_lm_weights"] > 0
    rows = torch.arange(labels.shape[0])[:, None].expand_as(weights)
    labels[rows[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    return {
        "input_ids": batch["input_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "token_type_ids": batch["segment_ids"],
        "labels": labels,
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def hf_accuracy(model: Any, loader: Any) -> float:
    correct = total = 0.0
    model.eval()
    with torch.no_grad():
        for batch in loader:
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


def run_hf(args: argparse.Namespace, init: Path) -> dict[str, Any]:
    data = Path(args.data)
    module = PretrainingDataModule(
        source=ArrowSource, train_path=str(data / "train"), eval_path=str(data / "eval"),
        max_seq_length=128, max_predictions_per_seq=20, micro_batch_size=args.batch,
        eval_micro_batch_size=args.batch, num_workers=0, seed=args.seed,
    )  # fmt: skip
    module.setup("fit")
    torch.manual_seed(args.seed)
    model = transformers.BertForPreTraining.from_pretrained(init, attn_implementation="sdpa")
    model.train()
    optimizer = Lamb(model.named_parameters(), lr=args.lr, weight_decay=0.01,
                     no_weight_decay=["bias", "LayerNorm", "layer_norm"])  # fmt: skip
    schedule = PolyWarmupLR(optimizer, total_steps=args.max_steps,
                            warmup_steps=args.warmup, power=1.0)  # fmt: skip
    samples, steps, next_eval = 0, 0, args.eval_every
    start = time.perf_counter()
    while steps < args.max_steps:
        for batch in module.train_dataloader():
            loss = model(**_hf_inputs(batch)).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            schedule.step()
            steps += 1
            samples += int(batch["nsp_weights"].sum())
            if samples >= next_eval:
                next_eval += args.eval_every
                if hf_accuracy(model, module.val_dataloader()) >= args.target:
                    return {"seconds": time.perf_counter() - start, "samples": samples,
                            "steps": steps}  # fmt: skip
            if steps >= args.max_steps:
                break
    return {"seconds": None, "samples": samples, "steps": steps}


def main() -> None:
    args = parse()
    torch.set_num_threads(args.threads)
    data = Path(args.data)
    for needed in ("train", "eval", "vocab.txt"):
        if not (data / needed).exists():
            raise SystemExit(f"{data / needed} is missing: run `make demo` first (or --data).")
    results: dict[str, list[dict[str, Any]]] = {"omnibert": [], "huggingface": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        init = initial_weights(args, work, data / "vocab.txt")
        print(f"bert-{args.model}, target masked-LM accuracy {args.target}, global batch "
              f"{args.batch} sequences, LAMB lr {args.lr}, eval every {args.eval_every} "
              f"sequences, {args.threads} threads")  # fmt: skip
        for r in range(args.rounds):
            order = ("omnibert", "huggingface") if r % 2 == 0 else ("huggingface", "omnibert")
            for side in order:
                res = (run_omnibert(args, init, work, f"round{r}") if side == "omnibert"
                       else run_hf(args, init))  # fmt: skip
                results[side].append(res)
                secs = "not reached" if res["seconds"] is None else f"{res['seconds']:.1f} s"
                print(f"[{r}] {side:12s} {secs}, {res['samples']:,} sequences, "
                      f"{res['steps']} steps", flush=True)  # fmt: skip
    ours = [r["seconds"] for r in results["omnibert"]]
    theirs = [r["seconds"] for r in results["huggingface"]]
    if None in ours or None in theirs:
        print("a run did not reach the target; raise --max-steps or lower --target")
        return
    ratios = [t / o for o, t in zip(ours, theirs, strict=True)]
    print(
        f"time to {args.target}: omnibert {statistics.median(ours):.1f} s, Hugging Face "
        f"{statistics.median(theirs):.1f} s (medians); omnibert is "
        f"{statistics.median(ratios):.2f}x faster (per round {', '.join(f'{x:.2f}' for x in ratios)})"
    )


if __name__ == "__main__":
    main()
