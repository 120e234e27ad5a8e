"""`make demo`: the data pipeline end to end on the embedded corpus, as a user would run it.

1. build the embedded corpus (Python standard-library docstrings: 2 train files + eval.txt);
2. ``omnibert-prepare`` trains a WordPiece vocab on it and writes seq-128 training shards
   with 2 worker processes;
3. ``omnibert-prepare`` writes the held-out evaluation set (first 1,000 instances of eval.txt);
4. loads both with ``datasets.load_from_disk`` and prints a summary.

Everything lands in ``outputs/demo/``; a second run reuses what is already there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "outputs" / "demo"


def run(args: list[str]) -> None:
    print("$ " + " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=ROOT)


def main() -> None:
    import datasets

    from omnibert.data.corpus import build_embedded_corpus

    start = time.perf_counter()
    corpus = build_embedded_corpus(OUT / "corpus", num_train_files=2)
    print(corpus)
    prepare = str(Path(sys.executable).with_name("omnibert-prepare"))
    vocab = OUT / "vocab.txt"
    train_files = ",".join(str(p) for p in corpus.train_files)
    common = [
        f"vocab_file={vocab}",
        "max_seq_length=128",
        "max_predictions_per_seq=20",
        "dupe_factor=5",
        "hydra.run.dir=outputs/demo/logs/${now:%Y-%m-%d_%H-%M-%S}",
    ]
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
    train = datasets.load_from_disk(str(OUT / "train"))
    evaluation = datasets.load_from_disk(str(OUT / "eval"))
    meta = json.loads((OUT / "train" / "metadata.json").read_text())
    hist = meta["sequence_length_histogram"]
    full = hist[-1] / max(1, sum(hist))
    print()
    print("demo summary")
    print(f"  vocab:        {vocab} ({meta['vocab']['size']} tokens)")
    print(
        f"  train shards: {OUT / 'train'}: {len(train):,} instances, {meta['counts']['tokens']:,} tokens"
    )
    print(
        f"                {full:.0%} of instances fill all 128 positions (shorter ones carry padding; packing recovers it)"
    )
    print(f"  eval set:     {OUT / 'eval'}: {len(evaluation):,} instances")
    print(
        f"  first train instance: {len(train[0]['input_ids'])} tokens, masked at {train[0]['masked_lm_positions']}"
    )
    print(f"  load with:    datasets.load_from_disk('{OUT / 'train'}')")
    print(f"  total:        {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
