"""`make demo`: data preparation, pretraining, evaluation and export, end to end on CPU.

1. build the embedded corpus (Python standard-library docstrings: 2 train files + eval.txt);
2. ``omnibert-prepare`` trains a WordPiece vocab on it and writes seq-128 training shards
   with 2 worker processes, then the held-out evaluation set (first 1,000 instances of eval.txt);
3. ``omnibert-train experiment=demo`` pretrains bert-tiny with LAMB (MLM + NSP) and evaluates
   masked-LM accuracy on the whole held-out set;
4. ``omnibert-export heads=pretraining`` writes a Hugging Face ``BertForPreTraining``
   repository (weights, tokenizer, a model card with the run's metrics and recipe);
5. prints a summary: steps, time, held-out masked-LM accuracy next to always predicting the
   most frequent masked token, throughput, and where everything went.

Everything lands in ``outputs/demo/``; a second run reuses the data and resumes the training
run from its last checkpoint (which, when finished, only re-evaluates).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "demo"
RUNS = OUT / "runs"  # omnibert-train's paths.output_root: RUNS/demo/checkpoints/last.ckpt


def run(args: list[str]) -> None:
    print("$ " + " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=ROOT)


def main() -> None:
    from majority_baseline import majority_baseline

    from omnibert.prepare.corpus import build_embedded_corpus

    start = time.perf_counter()
    corpus = build_embedded_corpus(OUT / "corpus", num_train_files=2)
    print(corpus)
    bindir = Path(sys.executable).parent
    vocab = OUT / "vocab.txt"
    train_files = ",".join(str(p) for p in corpus.train_files)
    common = [
        f"vocab_file={vocab}",
        "max_seq_length=128",
        "max_predictions_per_seq=20",
        "dupe_factor=5",
        "hydra.run.dir=outputs/demo/logs/prepare-${now:%Y-%m-%d_%H-%M-%S}",
    ]
    prepare = str(bindir / "omnibert-prepare")
    run(
        [
            prepare,
            f"input_files='{train_files}'",
            f"output_dir={OUT / 'train'}",
            "num_workers=2",
            "train_vocab.enabled=true",
            "train_vocab.vocab_size=8192",
            *common,
        ]
    )
    run(
        [
            prepare,
            f"input_files=[{corpus.eval_file}]",
            f"output_dir={OUT / 'eval'}",
            "eval_samples=1000",
            *common,
        ]
    )
    prepared = time.perf_counter()

    last = RUNS / "demo" / "checkpoints" / "last.ckpt"
    # where omnibert-train puts an invocation's logs and summary.json by default, so that
    # omnibert-export finds the run's metrics for the model card
    train_log = RUNS / "demo" / "hydra" / time.strftime("%Y-%m-%d_%H-%M-%S")
    run(
        [
            str(bindir / "omnibert-train"),
            "experiment=demo",
            f"paths.output_root={RUNS}",
            f"hydra.run.dir={train_log}",
            *(["ckpt_path=last"] if last.is_file() else []),
        ]
    )
    trained = time.perf_counter()
    hf_dir = OUT / "hf"
    run(
        [
            str(bindir / "omnibert-export"),
            f"ckpt={last}",
            f"out={hf_dir}",
            "heads=pretraining",  # with the NSP head: omnibert-eval scores it like the .ckpt
            "overwrite=true",
            "hydra.run.dir=outputs/demo/logs/export-${now:%Y-%m-%d_%H-%M-%S}",
        ]
    )

    summary = json.loads((train_log / "summary.json").read_text())
    validation = summary["validation"]
    speed = summary["throughput"]
    baseline = majority_baseline(OUT / "train", OUT / "eval")
    meta = json.loads((OUT / "train" / "metadata.json").read_text())
    accuracy = validation["val/mlm_acc"]
    print()
    print("demo summary")
    print(
        f"  data          {meta['counts']['instances']:,} training instances (seq 128) from "
        f"{meta['counts']['documents']:,} documents, vocab {meta['vocab']['size']:,} tokens "
        f"({prepared - start:.0f} s)"
    )
    print(
        f"  training      bert-tiny, {summary['steps']} LAMB steps of "
        f"{summary['plan']['batch']['global_batch_size']} sequences in {summary['fit_seconds']:.0f} s"
        + (
            f", {speed['samples_per_sec']:.0f} sequences/s, "
            f"{speed['real_tokens_per_sec']:,.0f} real tokens/s"
            if speed.get("samples_per_sec")
            else ""
        )
    )
    print(
        f"  held-out MLM  accuracy {accuracy:.3f} on {baseline.eval_masked:,} masked tokens; "
        f"always predicting the training set's most frequent masked token scores "
        f"{baseline.accuracy:.3f} ({accuracy / baseline.accuracy:.1f}x), the eval set's own "
        f"{summary['mlm_majority_baseline']:.3f} (majority baseline)"
    )
    print(
        f"  held-out NSP  accuracy {validation['val/nsp_acc']:.3f} (majority baseline "
        f"{summary['nsp_majority_baseline']:.3f}: always the eval set's most frequent label)"
    )
    print(f"  checkpoints   {summary['checkpoint_dir']}")
    print(f"  export        {hf_dir} (transformers.AutoModelForPreTraining.from_pretrained)")
    print(
        f"  total         {time.perf_counter() - start:.0f} s "
        f"(prepare {prepared - start:.0f} s, train+eval {trained - prepared:.0f} s)"
    )
    if accuracy <= baseline.accuracy:
        sys.exit("demo: the trained model did not beat the majority-token baseline")


if __name__ == "__main__":
    main()
