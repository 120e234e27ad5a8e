"""GPU pretraining throughput: omnibert against Hugging Face on the same sequences.

Each case's batches come from omnibert's own wiring: ``omnibert-train``'s config
(``data=generated`` with a length histogram, ``accelerator=gpu``) goes through
``omnibert.run.pretraining.job.prepare``, so the plan, the precision (``auto``: bf16 where the GPU
runs it), the compile settings, the micro batch and the data module are a training run's. The
sequences are drawn once, with a fixed seed, and **both sides read the same sequences**:
unpacked, the very same batches; packed, Hugging Face (which has no packed attention) reads
exactly the sequences of omnibert's packed rows, one per row (:mod:`bench_gpu_sides`). The peer
is ``BertForPreTraining`` (SDPA) for BERT sizes and ``ModernBertForMaskedLM`` (SDPA, sparse
prediction) for the modern ones, with omnibert's initial weights, the same ``torch.compile``
options and autocast, the same optimiser (omnibert's LAMB on its parameters) and the same
number of optimiser updates per round.

A round is the harness's (:mod:`benchharness`, the same in every benchmark): each side's
region, ``--steps`` micro batches of omnibert (and the peer's batches of the same
sequences), timed between two device synchronisations, no host sync inside; the sides
alternate; compilation is in untimed warm-up passes. ``update``: ``round`` (default: one
optimiser update per round per side, as the recipes, which accumulate 128-256 micro batches
per update, amortise it) or ``micro`` (one per micro batch).

Printed and recorded per side: **real (non-padding) tokens/s**, the primary figure;
sequences/s of the drawn sequences and, for packed rows, at the length histogram's mean
(real tokens/s over its mean length: what a long run over the whole data reaches; a case's
few hundred sequences have their own mean); MFU (dense BERT step FLOPs of the rows run over the
device's dense bf16 peak, :data:`omnibert.accelerators.peaks.PEAK_BF16`, whatever the
precision); peak memory; and the
**work** each side executes for the same sequences (token rows through the encoder, masked-LM
positions scored, matrix-product FLOPs): Hugging Face's ``BertForPreTraining`` scores every
position, omnibert the masked ones. Ratios: omnibert/peer on the same sequences; with
``peer=none`` (ablations) each case against the first case of the run; at seq 512 against the
published figures (NVIDIA DeepLearningExamples ≈ 207 sequences/s per A100-80GB unpacked,
MLPerf Training 3.0 ≈ 970 samples/s per H100 packed).

    python scripts/bench_gpu.py --lease --deadline 220         # one H100: 3 cases
    python scripts/bench_gpu.py --cases large:512:online:wiki,large:512:none
    python scripts/bench_gpu.py --cases modernbert_base:1024:online:wiki
    python scripts/bench_gpu.py --smoke                        # tiny model, CPU, seconds

Cases: ``--cases MODEL:SEQ:PACKING[:HISTOGRAM][:KEY=VALUE...],...`` run in that order (``wiki``
= ``tests/fixtures/wikipedia_seqlen_histogram_512.json``, anything else a path). Keys:
``attention=NAME`` (``model.config.attention``), ``batch=ROWS|probe`` (``probe``: no
``micro_batch_size``, omnibert's plan chooses), ``precision=P`` (``trainer.precision``, e.g.
``fp8``), ``scope=model|layers`` (compile the whole model or each encoder layer),
``graphs=on|off`` (``accelerator.cuda_graphs``), ``update=round|micro``, ``peer=hf|none``.
Without ``--cases``: every ``--seq`` x ``--packing`` of ``--model``.

``--compile-scope layers`` compiles each encoder layer with the plugin's options instead of
the whole model: dynamo compiles the layer's code once and every layer reuses it (omnibert
compiles a second graph for its last layer, which runs the read rows only), so a cold start
costs one or two layer graphs; the embeddings, heads and loss then run eagerly on both sides.

``--profile``: one more pass of each side under ``torch.profiler`` (:mod:`bench_gpu_profile`).
``--lease``: BERT-large seq 512 packed (Wikipedia lengths), unpacked, then BERT-base seq 128;
1 warm-up pass, 3 rounds of 10 steps, per-layer compilation, ``--deadline 200``; explicit flags
win. ``--deadline SECONDS``: a case the time left cannot hold (:func:`estimate_seconds`) is
skipped with the reason, and timed rounds stop once it has passed. The JSON (``--json``) is
rewritten atomically after every case (a SIGTERM leaves it marked interrupted, with the
cases that ran); a case that raises is recorded under ``failed``. The modules beside this
one: :mod:`bench_gpu_cases` (the ``--cases`` grammar, the sizes, the estimates),
:mod:`bench_gpu_measure` (one case: both sides built, the rounds, the figures),
:mod:`bench_gpu_sides` (the peer on the same sequences, the work), :mod:`bench_gpu_profile`
(``--profile``) and :mod:`bench_gpu_record` (the printed lines and the record).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import benchplot
import torch
from bench_gpu_cases import HISTOGRAMS, MODELS, Case, micro_batch, parse_cases, setting
from bench_gpu_cases import estimate_seconds as estimate_seconds
from bench_gpu_measure import (
    compile_scoped,
    compose_run,
    free_memory,
    raise_recompile_limit,
    run_case,
    take_batches,
)
from bench_gpu_record import against_first, figure, record, report
from benchharness import Deadline, ResultsFile, apply_presets

__all__ = ["HISTOGRAMS", "MODELS", "Case", "compile_scoped", "compose_run", "main",
           "micro_batch", "parse", "parse_cases", "run_case", "setting", "take_batches"]  # fmt: skip

#: ``--lease``: the cases, most important first, and the settings it gives (module docstring)
LEASE_CASES = "large:512:online:wiki,large:512:none,base:128:none"
LEASE = {"steps": 10, "rounds": 3, "warmup": 1, "compile_scope": "layers", "deadline": 200.0}
#: ``--smoke``: the tiny model on the CPU for seconds
SMOKE = {"steps": 2, "rounds": 2, "warmup": 1, "batch": 4, "vocab": 512, "model": "tiny",
         "seq": [32]}  # fmt: skip
#: the defaults of the flags the presets fill in (``None`` on the command line = not given)
DEFAULTS = {
    "model": "large",
    "seq": [128, 512],
    "packing": ["none", "online"],
    "steps": 10,
    "rounds": 6,
    "warmup": 2,
    "vocab": 30522,
    "compile_scope": "model",
    "deadline": None,
}


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--model", choices=sorted(MODELS), default=None, help="model of every --seq x --packing case (default large)")  # fmt: skip
    add("--seq", type=int, nargs="+", default=None, help="default 128 512")
    add("--packing", nargs="+", default=None, choices=["none", "online"], help="default none online")  # fmt: skip
    add("--cases", default=None, help="MODEL:SEQ:PACKING[:HISTOGRAM][:KEY=VALUE...],... in this order")  # fmt: skip
    add("--lease", action="store_true", help="the short GPU preset; explicit flags win")
    add("--deadline", type=float, default=None, help="seconds from the start: skip cases that would not fit")  # fmt: skip
    add("--compile-scope", choices=["model", "layers"], default=None, help="compile the whole model (default) or each encoder layer")  # fmt: skip
    add("--batch", type=int, default=None, help="micro batch in rows (default: 128 at seq <= 128, else 32)")  # fmt: skip
    add("--predictions", type=int, default=None, help="masks per sequence")
    add("--steps", type=int, default=None, help="micro batches of omnibert per timed round (10)")
    add("--rounds", type=int, default=None, help="timed rounds (6)")
    add("--warmup", type=int, default=None, help="untimed passes over the steps (2)")
    add("--update", choices=["round", "micro"], default="round", help="one optimiser update per round (default) or per micro batch")  # fmt: skip
    add("--rows", type=int, default=None, help="generated training rows")
    add("--precision", default="auto", help="trainer.precision")
    add("--optimizer", choices=["lamb", "adamw"], default="lamb", help="the same optimiser (omnibert's) for both models")  # fmt: skip
    add("--attention", default=None, help="model.config.attention, where the model has the key")  # fmt: skip
    add("--compile", action=argparse.BooleanOptionalAction, default=None, help="accelerator.compile (default: the accelerator's, on for gpu)")  # fmt: skip
    add("--override", action="append", default=None, metavar="KEY=VALUE", help="a training-config override (repeatable)")  # fmt: skip
    add("--length-histogram", default=None, help="data.length_histogram")
    add("--device", choices=["auto", "cuda", "cpu"], default="auto")
    add("--vocab", type=int, default=None, help="data.vocab_size (30522)")
    add("--seed", type=int, default=12345)
    add("--json", default=None, help="where to write the results")
    add("--profile", action="store_true", help="after the timed rounds, one more pass of each side under torch.profiler")  # fmt: skip
    benchplot.add_arguments(parser)
    add("--smoke", action="store_true", help="tiny model, vocab 512, seq 32, 2 rounds of 2 steps (CPU unless --device)")  # fmt: skip
    args = parser.parse_args(argv)
    product = any(getattr(args, k) is not None for k in ("model", "seq", "packing"))
    # explicit flags, then --smoke, then --lease, then the defaults
    apply_presets(args, SMOKE if args.smoke else None, LEASE if args.lease else None, DEFAULTS)
    if args.cases:
        cases = parse_cases(args.cases)
    elif args.lease and not (product and not args.smoke):  # --model/--seq/--packing win
        cases = parse_cases(LEASE_CASES)
        if args.smoke:  # the lease's shape with the tiny model
            cases = [dataclasses.replace(c, model="tiny", seq=args.seq[0]) for c in cases]
    else:
        cases = [Case(args.model, seq, packing) for seq in args.seq for packing in args.packing]
    args.case_list = cases
    if args.length_histogram:
        args.length_histogram = str(Path(args.length_histogram).resolve())
    if args.smoke and args.device == "auto":
        args.device = "cpu"
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The cases in order under the deadline, the JSON rewritten after every case (a case
    that raises is recorded and the next one runs), then the record and its figure."""
    import transformers

    args = parse(argv)
    deadline = Deadline(args.deadline)
    cases: list[Case] = args.case_list
    path = Path(args.json or f"outputs/bench_gpu/bench_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    command = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    command["case_list"] = [c.to_dict() for c in cases]
    results = ResultsFile(path, {
        "command": command, "torch": torch.__version__, "cuda": torch.version.cuda,
        "transformers": transformers.__version__, "status": "running",
        "compile_scope": args.compile_scope, "deadline_seconds": args.deadline,
        "elapsed_seconds": 0.0, "cases": [], "skipped": [], "failed": [],
        "pending": [c.to_dict() for c in cases],
    }, name="bench_gpu")  # fmt: skip
    data = results.data
    results.save()
    print(
        f"bench_gpu: {len(cases)} case(s) on {args.device}, compile scope {args.compile_scope}, "
        f"deadline {args.deadline if args.deadline is not None else 'none'} s; results in {path}",
        flush=True,
    )
    raise_recompile_limit()
    done: list[tuple[Case, dict[str, float]]] = []
    results.stage = "the start"
    with results.interruptible(), tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
        if args.smoke and args.length_histogram is None:  # lengths 1..seq alike: packing packs
            uniform = Path(tmp) / "uniform_lengths.json"
            uniform.write_text(json.dumps({"counts": [1] * max(c.seq for c in cases)}))
            args.length_histogram = str(uniform)
        for index, case in enumerate(cases):
            data["pending"] = [c.to_dict() for c in cases[index + 1 :]]
            reason = deadline.skip_reason(estimate_seconds(args, case, done))
            if reason is not None:
                print(f"bench_gpu: skipped {case.label()}: {reason}", flush=True)
                data["skipped"].append({**case.to_dict(), "reason": reason})
                results.save()
                continue
            print(f"bench_gpu: {case.label()} ...", flush=True)
            results.stage = case.label()
            try:
                out = run_case(args, case, Path(tmp), deadline)
            except Exception as err:  # recorded, the next case runs
                text = traceback.format_exc()
                print(f"bench_gpu: {case.label()} FAILED: {err!r}\n{text}", flush=True)
                data["failed"].append(
                    {**case.to_dict(), "error": repr(err), "traceback": text[-4000:]}
                )
                results.save()
                continue
            finally:
                free_memory()
            results.stage = f"the cases after {case.label()}"
            done.append((case, out["seconds"]))
            data["cases"].append(out)
            against_first(data["cases"])
            results.save()
            print(report(out), flush=True)
            if index:
                print(f"  against the first case: {out['ratio_to_first_case']:.3f}x its "
                      "real tokens/s", flush=True)  # fmt: skip
            print(f"bench_gpu: {len(data['cases'])} case(s) written to {path} "
                  f"({deadline.elapsed():.0f} s elapsed)", flush=True)  # fmt: skip
    data["pending"] = []
    results.save("done")
    print(
        f"bench_gpu: results in {path} ({len(data['cases'])} done, "
        f"{len(data['skipped'])} skipped, {len(data['failed'])} failed, "
        f"{data['elapsed_seconds']:.0f} s)",
        flush=True,
    )
    if data["cases"]:
        rec = record(args, data["cases"], data)
        benchplot.save(rec, figure(rec), args.results_dir)
    return data


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
