"""The fp8 convergence pair: the same N training steps in bf16 and in fp8 (``trainer.precision=
fp8``, torchao's float8 training) from the same initial weights on the same batches.

Both runs come from omnibert's own preparation (``omnibert.apps.compose.compose`` +
``omnibert.run.pretraining.job.prepare``) on real text (``--text stdlib``, the ``--lease``
default: the Python standard library's docstrings, the corpus ``make demo`` uses, built and
prepared by ``omnibert-prepare`` at the pair's sequence length with a vocab trained on it, in
seconds on the GPU host) or on generated rows (``--text generated``, ``--smoke``'s default,
with a length histogram): the bf16
run's plan gives the model, the batches (taken once, fed to both), the optimiser (omnibert's
LAMB at the phase's learning rate) and its warm-up schedule; the fp8 run's plan gives the
Linear layers swapped to fp8 (``omnibert.accelerators.float8``). Both models are compiled
alike and step in chunks taken in turns, each side with its own random-number state (the
same dropout masks on both sides): a chunk pair is a round of the harness (:mod:`benchharness`:
each side's chunk timed between two device synchronisations, the order alternating), with
no warm-up pass, since every step belongs to the curves. Each step's training loss is
recorded on both sides.

The tolerance is stated before the run (:data:`TOLERANCE`, printed first): over the last
``--tail`` steps (after the schedule's warm-up), fp8's mean loss within 1 % (relative) of
bf16's. A pair is only evidence when bf16 learned in that time: ``inconclusive`` when bf16's
mean loss over the tail is not at least :data:`MIN_DROP` below its first steps'. Generated
rows carry little to learn (uniform random tokens: a model can only learn to copy the masked
positions that show their own token, a small part of the loss), so a pair on them may well be
inconclusive; the verdict says so rather than calling a flat pair a pass. Real text is why the
lease prepares the docstrings. Real tokens/s of
each side are timed after its first chunk (compilation). ``--json`` is rewritten atomically
after every chunk pair; the record and the figure (both loss curves) go through
``benchplot``.

    python scripts/bench_fp8.py --lease                 # BERT-large seq 512 packed, 200 steps
    python scripts/bench_fp8.py --lease --model base    # BERT-base seq 128, 300 steps
    python scripts/bench_fp8.py --lease --deadline 240  # both sides cut at the same step
    python scripts/bench_fp8.py --smoke                 # tiny model, CPU, emulated fp8, seconds

``--deadline SECONDS`` (from the start): a chunk pair starts only when the last pair's time
still fits (the harness's ``fit_next_round``); both sides then hold the same number of steps.
A SIGTERM leaves the JSON marked interrupted with the steps that ran. The exit status is 0 when the
pair ran (the verdict is in the JSON and the printout), 1 when it failed to run.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchplot
import torch
from bench_gpu_cases import HISTOGRAMS, MODELS
from bench_gpu_measure import compile_scoped, raise_recompile_limit, take_batches
from bench_gpu_sides import on_device
from benchharness import Deadline, ResultsFile, Rounds, apply_presets, run_rounds

from omnibert.config import TrainConfig

#: fp8's mean training loss over the tail within this share of bf16's (stated before the run)
TOLERANCE = 0.01
#: bf16's tail mean must be this share below its first steps' mean, or the pair says nothing:
#: the curve must move more than the tolerance forgives (twice as much)
MIN_DROP = 2 * TOLERANCE
#: steps whose mean is the "first steps" loss
HEAD = 10
#: --lease presets: model, seq, packing, micro batch (rows), steps, the phase of the LR; each
#: encoder layer compiled (one layer graph reused by all: a short cold start, as bench_gpu's)
LEASE = {
    "large": {"seq": 512, "packing": "online", "batch": 32, "steps": 200, "phase": "phase2",
              "compile_scope": "layers"},
    "base": {"seq": 128, "packing": "none", "batch": 128, "steps": 300, "phase": "phase1",
             "compile_scope": "layers"},
}  # fmt: skip
#: --smoke: the tiny model at seq 32, eager on the CPU, emulated fp8, seconds
SMOKE = {"seq": 32, "packing": "online", "batch": 4, "steps": 16, "tail": 6, "chunk": 4,
         "vocab": 512, "phase": "phase1", "predictions": 5, "compile_scope": "off"}  # fmt: skip
#: what no flag and no preset set
DEFAULTS = {"tail": 50, "chunk": 10, "vocab": 30522, "compile_scope": "model"}


def rule(tail: int) -> str:
    return (
        f"fp8's mean training loss over the last {tail} steps within {TOLERANCE:.0%} (relative) "
        f"of bf16's, bf16's having fallen at least {MIN_DROP:.0%} from its first {HEAD} steps'"
    )


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def compare(bf16: list[float], fp8: list[float], warmup: int, tail: int) -> dict[str, Any]:
    """The verdict on two loss curves (module docstring), over the steps both have: ``pass``,
    ``fail`` or ``inconclusive``, with the figures it rests on. The tail is the last ``tail``
    steps after the warm-up (``warmup`` steps of the schedule, at least :data:`HEAD`)."""
    steps = min(len(bf16), len(fp8))
    skip = max(warmup, HEAD)
    window = min(tail, steps - skip)
    out: dict[str, Any] = {"steps": steps, "tail_steps": max(window, 0), "tolerance": TOLERANCE}
    if window < 1:
        reason = f"{steps} steps leave no tail after the first {skip}"
        return {**out, "verdict": "inconclusive", "reason": reason}
    tail_bf16, tail_fp8 = _mean(bf16[steps - window : steps]), _mean(fp8[steps - window : steps])
    difference = (tail_fp8 - tail_bf16) / tail_bf16
    drop = (_mean(bf16[:HEAD]) - tail_bf16) / _mean(bf16[:HEAD])
    out |= {
        "bf16_tail_mean": tail_bf16,
        "fp8_tail_mean": tail_fp8,
        "relative_difference": difference,
        "bf16_drop": drop,
        "fp8_drop": (_mean(fp8[:HEAD]) - tail_fp8) / _mean(fp8[:HEAD]),
        "max_step_relative_difference": max(
            abs(fp8[i] - bf16[i]) / bf16[i] for i in range(skip, steps)
        ),
    }
    if not all(math.isfinite(x) for x in fp8[:steps]):
        verdict, reason = "fail", "fp8's loss was not finite"
    elif abs(difference) > TOLERANCE:
        verdict, reason = "fail", f"{difference:+.2%} is outside ±{TOLERANCE:.0%}"
    elif drop < MIN_DROP:
        verdict, reason = (
            "inconclusive",
            f"bf16 fell {drop:.1%}, under {MIN_DROP:.0%}: too little learned",
        )
    else:
        verdict, reason = "pass", f"{difference:+.2%} within ±{TOLERANCE:.0%}"
    return {**out, "verdict": verdict, "reason": reason}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lease", action="store_true", help="the GPU preset (the default)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, seconds: CPU (emulated fp8) unless --device cuda")  # fmt: skip
    parser.add_argument("--model", choices=sorted(MODELS), default=None, help="large or base")
    parser.add_argument("--seq", type=int, default=None)
    parser.add_argument("--packing", choices=["none", "online"], default=None)
    parser.add_argument("--batch", type=int, default=None, help="micro batch, rows per step")
    parser.add_argument("--steps", type=int, default=None, help="steps per side")
    parser.add_argument("--tail", type=int, default=None, help="steps the verdict averages (50)")
    parser.add_argument("--chunk", type=int, default=None, help="steps per side per turn (10)")
    parser.add_argument("--recipe", choices=["tensorwise", "rowwise"], default="tensorwise")
    parser.add_argument("--emulate", action="store_true", help="trainer.fp8.emulate=true")
    parser.add_argument("--compile-scope", choices=["model", "layers", "off"], default=None,
                        help="torch.compile each encoder layer (lease), the model, or nothing")  # fmt: skip
    parser.add_argument("--attention", default=None, help="model.config.attention")
    parser.add_argument("--text", choices=["stdlib", "generated"], default=None,
                        help="real text (the stdlib's docstrings, prepared here; --lease) or "
                             "generated rows (--smoke)")  # fmt: skip
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--vocab", type=int, default=None, help="data.vocab_size (30522)")
    parser.add_argument("--predictions", type=int, default=None, help="masks per sequence")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--deadline", type=float, default=None, help="seconds from the start")
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a training-config override for both sides (repeatable)")  # fmt: skip
    parser.add_argument("--json", default=None, help="where the results go")
    benchplot.add_arguments(parser)
    args = parser.parse_args(argv)
    model = args.model or ("tiny" if args.smoke else "large")
    # explicit flags win, then --smoke, then the model's lease preset, then the defaults
    apply_presets(args, SMOKE if args.smoke else None, LEASE.get(model, LEASE["large"]), DEFAULTS)
    args.model = model
    args.text = args.text or ("generated" if args.smoke else "stdlib")
    if args.device == "auto":
        args.device = "cpu" if args.smoke else ("cuda" if torch.cuda.is_available() else "cpu")
    if args.lease and not args.smoke and args.device == "cpu":
        raise SystemExit("bench_fp8: --lease is the GPU's run (BERT-large in real fp8) and no "
                         "CUDA GPU is here; use --smoke on a CPU.")  # fmt: skip
    args.emulate = args.emulate or args.device == "cpu"  # real fp8 needs the GPU
    return args


def compose_side(args: argparse.Namespace, root: Path, precision: str) -> Any:
    """``prepare`` of the training config of one side (the same but for the precision)."""
    from omnibert.apps.compose import compose
    from omnibert.run.pretraining.job import prepare

    spec = MODELS[args.model]
    rows = max(1024, 3 * args.batch * args.steps)
    if args.text == "generated":
        histogram = HISTOGRAMS["wiki"] if not args.smoke else root / "lengths.json"
        data = ["data=generated", f"data.vocab_size={args.vocab}", "data.num_eval_samples=0",
                f"data.num_train_samples={rows}", f"data.length_histogram={histogram}"]  # fmt: skip
    else:  # the shards prepare_text wrote
        data = [f"data.train_path={root / 'text' / 'train'}", "data.eval_path=null",
                f"data.vocab_file={root / 'text' / 'vocab.txt'}"]  # fmt: skip
    overrides = [
        f"paths.output_root={root}", f"run_name=fp8-pair-{precision}", *data,
        "data.num_workers=0", f"data.packing={args.packing}",
        f"data.pack.buffer_size={min(rows, 16384)}", f"data.seed={args.seed}", f"seed={args.seed}",
        f"phase={args.phase}", "phase.init_from=null", f"phase.max_seq_length={args.seq}",
        f"phase.global_batch_size={args.batch}", f"micro_batch_size={args.batch}",
        f"phase.max_steps={args.steps}", f"accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"trainer.precision={precision}", "optimizer=lamb", "logger=none",
        f"model.config.num_hidden_layers={spec.layers}", f"model.config.hidden_size={spec.hidden}",
        f"model.config.num_attention_heads={spec.heads}",
        f"model.config.intermediate_size={spec.intermediate}",
        f"model.config.max_position_embeddings={max(512, args.seq)}",
    ]  # fmt: skip
    if args.predictions:
        overrides.append(f"phase.max_predictions_per_seq={args.predictions}")
    if precision == "fp8":
        overrides += [
            f"trainer.fp8.recipe={args.recipe}",
            f"trainer.fp8.emulate={args.emulate}".lower(),
        ]
    if args.device == "cpu":
        overrides += ["accelerator.allow_slow_bf16=true", "accelerator.compile=false"]
    if args.attention:
        overrides.append(f"model.config.attention={args.attention}")
    return prepare(TrainConfig.of(compose("pretrain", [*overrides, *args.override])))


#: masks per sequence the real text is prepared with, by sequence length (the phases')
TEXT_PREDICTIONS = {128: 20, 512: 76}


def prepare_text(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The stdlib docstrings (``omnibert.prepare.corpus``) as shards at the pair's sequence
    length, through ``omnibert-prepare`` (a vocab trained on them); what was made."""
    from omnibert.prepare.corpus import build_embedded_corpus

    started = time.monotonic()
    corpus = build_embedded_corpus(root / "corpus", num_train_files=4)
    # at least what 15 % masking of a full sequence needs (omnibert-prepare refuses fewer)
    needed = TEXT_PREDICTIONS.get(args.seq, math.ceil(0.15 * args.seq))
    predictions = max(args.predictions or 0, needed)
    args.predictions = predictions
    files = ",".join(str(p) for p in corpus.train_files)
    command = [sys.executable, "-c", "from omnibert.apps.prepare import main; main()",
               f"input_files=[{files}]", f"vocab_file={root / 'text' / 'vocab.txt'}",
               f"output_dir={root / 'text' / 'train'}", f"max_seq_length={args.seq}",
               f"max_predictions_per_seq={predictions}", "dupe_factor=5", "num_workers=4",
               "train_vocab.enabled=true", "train_vocab.vocab_size=8192",
               f"hydra.run.dir={root / 'text' / 'logs'}"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"omnibert-prepare failed ({done.returncode}): {done.stderr[-2000:]}")
    metadata = json.loads((root / "text" / "train" / "metadata.json").read_text())
    made = {
        "corpus": f"Python {corpus.python_version} stdlib docstrings",
        "documents": corpus.num_train_documents,
        "instances": metadata["counts"]["instances"],
        "seq": args.seq,
        "max_predictions_per_seq": predictions,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(f"bench_fp8: real text: {corpus} -> {made['instances']} instances at seq {args.seq} "
          f"in {made['seconds']} s", flush=True)  # fmt: skip
    return made


def versions(device: torch.device) -> dict[str, Any]:
    import torchao

    out = {"torch": torch.__version__, "torchao": torchao.__version__, "cuda": torch.version.cuda,
           "python": platform.python_version(), "device": "cpu", "driver": None}  # fmt: skip
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        out |= {"device": torch.cuda.get_device_name(device), "capability": f"{major}.{minor}"}
        with contextlib.suppress(OSError, subprocess.SubprocessError, IndexError):
            out["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20, check=True,
            ).stdout.split()[0]  # fmt: skip
    return out


class Side:
    """One precision's model, optimiser, schedule, random-number state and curve."""

    def __init__(self, name: str, prepared: Any, model: torch.nn.Module, args: Any) -> None:
        from omnibert.optim.build import build_optimizer, build_schedule

        config, self.plugin, self.name = prepared.config, prepared.plugin, name
        self.precision = prepared.plan.precision
        self.model = model.to(self.plugin.device).train()
        if args.compile_scope != "off":
            compile_scoped(self.model, args.compile_scope, self.plugin.compile_model)
        self.optimizer = build_optimizer(config.optimizer, self.model.named_parameters())
        self.schedule = build_schedule(config.schedule, self.optimizer, args.steps)
        cuda = self.plugin.device.type == "cuda"
        self.rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None)
        self.losses: list[float] = []

    def run(self, batches: list[dict[str, torch.Tensor]]) -> tuple[int, int]:
        """Steps over ``batches`` with this side's random-number state (a round's region);
        returns the real tokens and sequences they held."""
        torch.set_rng_state(self.rng[0])
        if self.rng[1] is not None:
            torch.cuda.set_rng_state_all(self.rng[1])
        losses = []
        for batch in batches:
            self.optimizer.zero_grad(set_to_none=True)
            with self.plugin.autocast(self.precision):
                loss = self.model(batch)["loss"]
            loss.backward()
            self.optimizer.step()
            self.schedule.step()
            losses.append(loss.detach().float())
        self.losses += torch.stack(losses).tolist()  # one host read per chunk
        cuda = self.rng[1] is not None
        self.rng = (torch.get_rng_state(), torch.cuda.get_rng_state_all() if cuda else None)
        tokens = sum(int((b["sequence_ids"] > 0).sum()) for b in batches)
        sequences = sum(int((b["nsp_weights"] > 0).sum()) for b in batches)
        return tokens, sequences

    def summary(self, rounds: Rounds) -> dict[str, Any]:
        """The curve and the rates of the chunks after the first (which holds the
        compilation), from the rounds' seconds and what each chunk held."""
        chunks = list(zip(rounds.seconds(self.name), rounds.values(self.name), strict=True))
        timed = chunks[1:]
        seconds = sum(c[0] for c in timed)
        rate = lambda i: sum(c[1][i] for c in timed) / seconds if seconds else None  # noqa: E731
        return {"precision": self.precision, "loss": self.losses, "real_tokens_per_sec": rate(0),
                "sequences_per_sec": rate(1), "timed_seconds": seconds,
                "first_chunk_seconds": chunks[0][0] if chunks else None}  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    args = parse(argv)
    print(f"bench_fp8: tolerance (stated before the run): {rule(args.tail)}", flush=True)
    from omnibert.accelerators.float8 import convert_to_float8
    from omnibert.models import BertForPreTraining

    path = Path(args.json or f"outputs/bench_fp8/bench_fp8-{time.strftime('%Y%m%d-%H%M%S')}.json")
    file = ResultsFile(path, {"command": {k: str(v) for k, v in vars(args).items()},
                              "tolerance": {"rule": rule(args.tail), "relative": TOLERANCE,
                                            "tail_steps": args.tail, "min_drop": MIN_DROP},
                              "status": "running"}, name="bench_fp8", started=started)  # fmt: skip
    results = file.data
    file.save()
    with file.interruptible(), tempfile.TemporaryDirectory(prefix="bench_fp8-") as tmp:
        root = Path(tmp)
        (root / "lengths.json").write_text(json.dumps({"counts": [1] * args.seq}))
        if args.text == "stdlib":
            results["text"] = prepare_text(args, root)
            file.save()
        bf16_run, fp8_run = (
            compose_side(args, root, "bf16-mixed"),
            compose_side(args, root, "fp8"),
        )
        plan, device = bf16_run.plan, bf16_run.plugin.device
        float8 = fp8_run.plan.float8
        results |= versions(device) | {
            "model": args.model, "seq": args.seq, "packing": args.packing,
            "micro_batch": args.batch, "steps_planned": args.steps, "recipe": args.recipe,
            "emulate": args.emulate, "compile_scope": args.compile_scope,
            "optimizer": {"lr": float(bf16_run.config.optimizer["lr"]), "phase": args.phase,
                          "warmup_steps": _warmup_steps(bf16_run.config, args.steps)},
            "float8": {"describe": float8.describe(), "fp8_layers": float8.fp8_layers,
                       "bf16_layers": float8.bf16_layers},
            "kernels": {"bf16": plan.kernels, "fp8": fp8_run.plan.kernels},
        }  # fmt: skip
        print(f"bench_fp8: {results['device']}, BERT-{args.model} seq {args.seq} packing "
              f"{args.packing}, micro batch {args.batch}, {args.steps} steps per side, LR "
              f"{results['optimizer']['lr']} ({args.phase}) with "
              f"{results['optimizer']['warmup_steps']} warm-up steps; fp8: "
              f"{float8.describe()}", flush=True)  # fmt: skip
        batches = take_batches(bf16_run, args.steps)  # the same batches for both sides
        raise_recompile_limit()
        torch.manual_seed(args.seed)
        initial = on_device(lambda: BertForPreTraining(plan.model), device)
        twin = copy.deepcopy(initial)  # the same initial weights
        convert_to_float8(twin, float8)
        sides = [Side("bf16", bf16_run, initial, args), Side("fp8", fp8_run, twin, args)]
        file.stage = "the chunk pairs"
        chunks = [batches[i : i + args.chunk] for i in range(0, args.steps, args.chunk)]

        def after_pair(index: int, rounds: Rounds) -> None:
            _record(results, sides, rounds, args)
            pair = sum(r.seconds for r in rounds.regions if r.turn.index == index)
            print(f"  step {len(sides[0].losses)}: bf16 {sides[0].losses[-1]:.4f}, fp8 "
                  f"{sides[1].losses[-1]:.4f} ({pair:.1f} s)", flush=True)  # fmt: skip
            file.save()

        peers = {
            side.name: (lambda turn, side=side: side.run(chunks[turn.index])) for side in sides
        }
        rounds = run_rounds(peers, rounds=len(chunks), sync=bf16_run.plugin.synchronize,
                            deadline=Deadline(args.deadline, start=started),
                            fit_next_round=True, after_round=after_pair)  # fmt: skip
        results["stopped_by_deadline"] = rounds.cut_by_deadline
        if rounds.cut_by_deadline:
            print(f"bench_fp8: deadline: stopped at {len(sides[0].losses)} steps per side",
                  flush=True)  # fmt: skip
    results = file.data
    file.save("done")
    verdict = results["comparison"]
    print(f"bench_fp8: {verdict['verdict']}: {verdict['reason']} ({verdict['steps']} steps, "
          f"tail {verdict['tail_steps']}); real tokens/s bf16 {_rate(results['bf16'])}, fp8 "
          f"{_rate(results['fp8'])}; results in {path}", flush=True)  # fmt: skip
    rec = record(args, results)
    steps = list(range(1, len(results["bf16"]["loss"]) + 1))
    fig = benchplot.curves(rec.title, "step", "training loss", {
        "bf16": (steps, results["bf16"]["loss"]), f"fp8 ({args.recipe})": (steps, results["fp8"]["loss"]),
    })  # fmt: skip
    benchplot.save(rec, fig, args.results_dir)
    return results


def _warmup_steps(config: Any, steps: int) -> int:
    schedule = config.schedule or {}
    if schedule.get("warmup_steps") is not None:
        return int(schedule["warmup_steps"])
    return int(float(schedule.get("warmup_proportion") or 0) * steps)


def _record(results: dict[str, Any], sides: list[Side], rounds: Rounds, args: Any) -> None:
    for side in sides:
        results[side.name] = side.summary(rounds)
    results["steps_run"] = len(sides[0].losses)
    warmup = results["optimizer"]["warmup_steps"]
    results["comparison"] = compare(sides[0].losses, sides[1].losses, warmup, args.tail)
    bf16, fp8 = (results[s]["real_tokens_per_sec"] for s in ("bf16", "fp8"))
    results["fp8_over_bf16_tokens_per_sec"] = fp8 / bf16 if bf16 and fp8 else None


def _rate(side: dict[str, Any]) -> str:
    rate = side.get("real_tokens_per_sec")
    return "n/a" if rate is None else f"{rate:,.0f}"


def record(args: argparse.Namespace, results: dict[str, Any]) -> Any:
    """The run as a :class:`benchplot.Record` (both curves' figures and the verdict)."""
    verdict = results["comparison"]
    rows = [[side, f"{verdict.get(f'{side}_tail_mean', float('nan')):.4f}", _rate(results[side]),
             str(len(results[side]["loss"]))] for side in ("bf16", "fp8")]  # fmt: skip
    ratio = results.get("fp8_over_bf16_tokens_per_sec")
    return benchplot.Record(
        name=f"fp8-{args.model}-seq{args.seq}" + ("-smoke" if args.smoke else ""),
        title=f"BERT-{args.model} seq {args.seq}: fp8 ({args.recipe}"
        f"{', emulated' if args.emulate else ''}) against bf16 on {results['device']}",
        headline=f"{verdict['verdict']}: {verdict['reason']}; fp8/bf16 real tokens/s "
        + ("n/a" if ratio is None else f"{ratio:.2f}x"),
        command=benchplot.command_line(), machine=benchplot.machine(),
        tables=[benchplot.Table(f"tolerance: {results['tolerance']['rule']}",
                                ["side", "tail mean loss", "real tokens/s", "steps"], rows)],
        measurements=results,
    )  # fmt: skip


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except Exception as err:  # one line and status 1; the JSON holds what ran
        print(f"bench_fp8: failed: {err!r}", file=sys.stderr)
        raise SystemExit(1) from err
