"""One case of ``scripts/bench_gpu.py`` measured: both sides built from omnibert's own
preparation, compiled alike, timed in the harness's alternating rounds (:mod:`benchharness`:
each region between two device synchronisations, warm-up passes untimed), and the figures
of the case (real tokens/s, sequences/s, MFU on :mod:`omnibert.accelerators.peaks`' table,
peak memory, the work each side executes).

Public APIs only, but for dynamo's counters (:func:`dynamo_counts`): torch has no public
count of the frames and graphs it compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_gpu_cases import MODELS, PREDICTIONS, PUBLISHED, Case, micro_batch, setting
from bench_gpu_profile import profile_pass
from bench_gpu_sides import (
    HFStep,
    hf_bert,
    hf_bert_inputs,
    hf_modern_inputs,
    hf_modernbert,
    histogram_mean_length,
    on_device,
    unpack_batches,
    work,
)
from benchharness import Deadline, Region, Rounds, Turn, run_rounds
from torch import Tensor, nn

from omnibert.accelerators.peaks import device_peak_flops
from omnibert.config import TrainConfig


def compose_run(args: argparse.Namespace, case: Case, root: Path) -> Any:
    """``omnibert.run.pretraining.job.prepare`` of the training config for one case."""
    from omnibert.apps.compose import compose
    from omnibert.run.pretraining.job import prepare

    spec, seq, packing = MODELS[case.model], case.seq, case.packing
    rows = micro_batch(args, case)
    count = args.rows or max(1024, 8 * (rows or 64) * args.steps)
    vocab = args.vocab if args.smoke or spec.vocab is None else spec.vocab
    overrides = [f"model={spec.preset}"] if spec.preset else []
    overrides += [
        f"paths.output_root={root}",
        f"run_name=bench-{case.model}-{seq}-{packing}",
        "data=generated",
        "data.num_workers=0",
        f"data.vocab_size={vocab}",
        "data.num_eval_samples=0",
        f"data.num_train_samples={count}",
        f"data.packing={packing}",
        f"data.pack.buffer_size={min(count, 16384)}",
        f"data.seed={args.seed}",
        f"seed={args.seed}",
        f"phase.max_seq_length={seq}",
        f"phase.max_predictions_per_seq={args.predictions or PREDICTIONS.get(seq, seq // 6)}",
        # the micro batch as given, checked by prepare's memory estimate as a run's is; a
        # probed one is chosen among the divisors of the global batch
        f"phase.global_batch_size={rows or 1024}",
        "phase.max_steps=1000",
        f"accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"trainer.precision={setting(args, case, 'precision')}",
        f"optimizer={args.optimizer}",
        f"model.config.num_hidden_layers={spec.layers}",
        f"model.config.hidden_size={spec.hidden}",
        f"model.config.num_attention_heads={spec.heads}",
        f"model.config.intermediate_size={spec.intermediate}",
        f"model.config.max_position_embeddings={max(512, seq)}",
        "logger=none",
    ]
    overrides += [f"micro_batch_size={rows}"] if rows is not None else []
    if args.optimizer == "adamw":
        overrides.append("optimizer.lr=1e-4")
    if histogram := case.histogram or args.length_histogram:
        overrides.append(f"data.length_histogram={histogram}")
    if attention := setting(args, case, "attention"):
        overrides.append(f"model.config.attention={attention}")
    if args.compile is not None:
        overrides.append(f"accelerator.compile={str(args.compile).lower()}")
    if case.graphs is not None:
        overrides.append(f"accelerator.cuda_graphs={str(case.graphs == 'on').lower()}")
    overrides += args.override or []
    return prepare(TrainConfig.of(compose("pretrain", overrides)))


def take_batches(prepared: Any, count: int) -> list[dict[str, Tensor]]:
    datamodule = prepared.datamodule
    datamodule.setup("fit")
    batches: list[dict[str, Tensor]] = []
    for batch in datamodule.train_dataloader():
        batches.append({k: v.to(prepared.plugin.device) for k, v in batch.items()})
        if len(batches) == count:
            return batches
    raise SystemExit(f"bench_gpu: only {len(batches)} batches; raise --rows")


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder layers of omnibert's and Hugging Face's models (``bert.encoder.layer``,
    ModernBERT's ``model.layers``)."""
    root = getattr(model, "bert", None) or model.model  # type: ignore[union-attr]
    encoder = getattr(root, "encoder", root)
    layers = getattr(encoder, "layer", None) or encoder.layers
    assert isinstance(layers, nn.ModuleList) and len(layers) > 0
    return layers


def compile_scoped(model: nn.Module, scope: str, compile_model: Callable[[nn.Module], Any]) -> str:
    """Compile ``model`` (``scope="model"``) or each of its encoder layers (``"layers"``)
    with ``compile_model`` (the plugin's: its ``torch.compile`` options, in place); what was
    compiled, in words."""
    if scope == "model":
        compile_model(model)
        return "model"
    if scope != "layers":
        raise ValueError(f"compile scope {scope!r} is not model or layers")
    layers = encoder_layers(model)
    for layer in layers:
        compile_model(layer)
    return f"layers ({len(layers)} encoder layers, each compiled in place)"


def dynamo_counts() -> dict[str, int]:
    """Frames dynamo compiled and graphs it produced so far (``torch._dynamo``'s counters:
    torch has no public API for them)."""
    from torch._dynamo.utils import counters

    return {
        "frames": int(counters["frames"]["ok"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
    }


def raise_recompile_limit(limit: int = 64) -> None:
    """Dynamo keeps one cache per code object: every layer (and every case: new models, new
    shapes) adds its entries to the same ``forward``'s, past the default limit of 8 after a
    few cases, beyond which it would run the layer eagerly. Both models alike. The public
    ``torch.compiler.config.recompile_limit`` where torch has it, else dynamo's own setting
    (older torch, before the public alias)."""
    config: Any = getattr(torch.compiler, "config", None)
    if config is None or not hasattr(config, "recompile_limit"):
        config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), limit))
            return


def free_memory() -> None:
    """Drop the finished case's models, optimiser state and batches before the next."""
    gc.collect()
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def batch_facts(batches: list[dict[str, Tensor]], config: Any) -> dict[str, float]:
    """Sequences, real tokens and dense-step FLOPs (MFU's count) of one pass over ``batches``."""
    from omnibert.callbacks.throughput import bert_pretraining_flops

    sequences = sum(int((b["nsp_weights"] > 0).sum()) for b in batches)
    tokens = sum(int((b["sequence_ids"] > 0).sum()) for b in batches)
    flops = 0
    for b in batches:
        rows, seq = b["input_ids"].shape
        preds, slots = b["masked_lm_positions"].shape[1], b["nsp_positions"].shape[1]
        flops += bert_pretraining_flops(config, rows, seq, preds, slots, prune_last_layer=False)
    return {"sequences": sequences, "real_tokens": tokens, "flops": float(flops)}


def peer_of(
    args: argparse.Namespace, case: Case, batches: list[dict[str, Tensor]], rows: int, device: Any
) -> tuple[list[dict[str, Tensor]], dict[str, Any]]:
    """The peer's contract batches of the same sequences, and how they were made."""
    predictions = args.predictions or PREDICTIONS.get(case.seq, case.seq // 6)
    longest = int(max(int((b["sequence_ids"] == 1).sum(dim=1).max()) for b in batches))
    if case.packing == "none":
        return batches, {"how": "the very same batches", "left_over_sequences": 0}
    seq = case.seq if not MODELS[case.model].modern else min(case.seq, max(longest, 8))
    if MODELS[case.model].modern:  # rows as long as the data's longest sequence
        histogram = case.histogram or args.length_histogram
        if histogram:
            counts = json.loads(Path(histogram).read_text()).get("counts") or []
            seq = min(case.seq, max(i + 1 for i, c in enumerate(counts) if c))
    unpacked, left = unpack_batches(batches, rows, seq, predictions, device)
    how = (
        f"the sequences of omnibert's packed rows, one per row of {seq} tokens, {rows} rows "
        f"a batch ({left} left over: fewer than a batch)"
    )
    return unpacked, {"how": how, "left_over_sequences": left, "peer_seq": seq}


@dataclasses.dataclass
class Sides:
    """A case's two sides (or omnibert alone), built and compiled, before any step."""

    prepared: Any
    models: dict[str, nn.Module]
    inputs: dict[str, list[Any]]  # what each model's forward takes
    contract: dict[str, list[dict[str, Tensor]]]  # the same as contract batches (the work)
    kinds: dict[str, str]  # omnibert, hf or hf-modern (bench_gpu_sides.work)
    peer: dict[str, Any] | None  # how the peer's batches were made
    compiled: dict[str, Any]
    graphs: bool
    optimizers: dict[str, Any]
    attention: str
    update: str


def build_sides(args: argparse.Namespace, case: Case, root: Path) -> Sides:
    """omnibert's model and batches from the training config, the peer with its weights on
    the same sequences, both compiled with the plugin's options and given omnibert's
    optimiser."""
    from omnibert.models import BertForPreTraining
    from omnibert.optim.build import build_optimizer

    prepared = compose_run(args, case, root)
    plugin, config = prepared.plugin, prepared.plan.model
    scope = setting(args, case, "scope")
    ours_batches = take_batches(prepared, args.steps)
    torch.manual_seed(args.seed)
    ours = on_device(lambda: BertForPreTraining(config), plugin.device).train()
    models: dict[str, nn.Module] = {"omnibert": ours}
    inputs: dict[str, list[Any]] = {"omnibert": ours_batches}
    contract = {"omnibert": ours_batches}
    kinds = {"omnibert": "omnibert"}
    peer: dict[str, Any] | None = None
    if setting(args, case, "peer") != "none":
        rows = prepared.plan.batch.micro_batch_size
        contract["hf"], peer = peer_of(args, case, ours_batches, rows, plugin.device)
        modern = MODELS[case.model].modern
        models["hf"] = HFStep(hf_modernbert(ours) if modern else hf_bert(ours))
        models["hf"] = models["hf"].to(plugin.device).train()
        convert = hf_modern_inputs if modern else hf_bert_inputs
        inputs["hf"] = [convert(b) for b in contract["hf"]]
        kinds["hf"] = "hf-modern" if modern else "hf"
    compiled: dict[str, Any] = {"scope": "off (eager)"}
    if plugin.compile:
        what = compile_scoped(ours, scope, plugin.compile_model)
        if "hf" in models:
            compile_scoped(models["hf"].model, scope, plugin.compile_model)  # type: ignore[arg-type]
        options = dict(getattr(plugin, "compile_options", {}))
        compiled = {"scope": scope, "what": what, "options": options}
    graphs = bool(getattr(plugin, "uses_cuda_graphs", False))
    optimizers = {
        name: build_optimizer(prepared.config.optimizer, getattr(m, "model", m).named_parameters())
        for name, m in models.items()
    }
    if graphs:  # the gradients exist before the first replay: each backward adds into them
        for model in models.values():
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
    attention = str(setting(args, case, "attention") or config.attention)
    return Sides(prepared, models, inputs, contract, kinds, peer, compiled, graphs, optimizers,
                 attention, setting(args, case, "update"))  # fmt: skip


def side_steps(sides: Sides, name: str) -> Callable[[Turn], None]:
    """One side's region: forward and backward of every micro batch, the optimiser once per
    round (``update=round``) or per micro batch; no host sync inside."""
    model, optimizer, batches = sides.models[name], sides.optimizers[name], sides.inputs[name]
    plugin, precision = sides.prepared.plugin, sides.prepared.plan.precision
    every = len(batches) if sides.update == "round" else 1

    def run(turn: Turn) -> None:
        for index, batch in enumerate(batches, 1):
            if sides.graphs:
                torch.compiler.cudagraph_mark_step_begin()
            with plugin.autocast(precision):
                loss = model(batch)["loss"]
            loss.backward()
            if index % every == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=not sides.graphs)

    return run


def run_case(
    args: argparse.Namespace, case: Case, root: Path, deadline: Deadline | None = None
) -> dict[str, Any]:
    """Both sides on ``case``'s sequences (bench_gpu's docstring) in the harness's rounds,
    timed between the plugin's synchronisations; the rounds stop early once ``deadline`` has
    passed (at least one runs). Peak memory is reset before and read after each timed region,
    dynamo's counts taken around each side's warm-up passes."""
    started = time.monotonic()
    sides = build_sides(args, case, root)
    plan, plugin = sides.prepared.plan, sides.prepared.plugin
    setup_seconds = time.monotonic() - started
    print(
        f"  setup {setup_seconds:.1f} s: {plan.precision}, micro batch "
        f"{plan.batch.micro_batch_size}, compile {sides.compiled['scope']}, CUDA graphs "
        f"{'on' if sides.graphs else 'off'}, update per {sides.update}, {args.warmup} warm-up "
        f"pass(es), {args.rounds} rounds of {args.steps} steps",
        flush=True,
    )
    runners = {name: side_steps(sides, name) for name in sides.models}
    dynamo = {name: {"frames": 0, "graphs": 0} for name in runners}
    warmup = dict.fromkeys(runners, 0.0)
    peak: dict[str, int | None] = dict.fromkeys(runners)
    before_warmup: dict[str, dict[str, int]] = {}

    def before_region(name: str, turn: Turn) -> None:
        if turn.warmup and turn.index == 0:
            before_warmup[name] = dynamo_counts()
        plugin.reset_peak_memory()

    def after_region(region: Region) -> None:
        name, turn = region.peer, region.turn
        if not turn.warmup:
            measured, _ = plugin.peak_memory()
            if measured is not None:
                peak[name] = max(peak[name] or 0, measured)
            return
        warmup[name] += region.seconds
        if turn.index == args.warmup - 1:  # the side's last warm-up pass
            after = dynamo_counts()
            dynamo[name] = {key: after[key] - before_warmup[name][key] for key in after}
            print(f"  warmed up {name} in {warmup[name]:.1f} s; dynamo compiled "
                  f"{dynamo[name]['frames']} frame(s), {dynamo[name]['graphs']} graph(s)",
                  flush=True)  # fmt: skip

    rounds_started = time.monotonic()
    rounds = run_rounds(runners, rounds=args.rounds, warmup=args.warmup, sync=plugin.synchronize,
                        deadline=deadline, before_region=before_region,
                        after_region=after_region)  # fmt: skip
    timed = time.monotonic() - rounds_started - sum(warmup.values())
    if rounds.cut_by_deadline:
        print(f"  deadline passed: {rounds.rounds} of {args.rounds} rounds timed", flush=True)
    profiles = (
        {name: profile_pass(run, plugin) for name, run in runners.items()} if args.profile else {}
    )
    out = figures(args, case, sides, rounds)
    for name in runners:
        out[name] |= {"peak_memory_bytes": peak[name], "warmup_seconds": round(warmup[name], 3),
                      "dynamo": dynamo[name]}  # fmt: skip
        if name in profiles:
            out[name]["profile"] = profiles[name]
    out["seconds"] = {
        "setup": round(setup_seconds, 3),
        "warmup": round(sum(warmup.values()), 3),
        "timed": round(timed, 3),
        "total": round(time.monotonic() - started, 3),
    }
    return out


def figures(args: argparse.Namespace, case: Case, sides: Sides, rounds: Rounds) -> dict[str, Any]:
    """The case's record: what ran, each side's rates, MFU and work from the rounds'
    seconds, the ratios on the same sequences and against the published figures."""
    plan, config = sides.prepared.plan, sides.prepared.plan.model
    flops_peak, device_name = device_peak_flops(sides.prepared.plugin.device)
    histogram = case.histogram or args.length_histogram
    mean_length = histogram_mean_length(histogram)
    out: dict[str, Any] = {
        "model": case.model,
        "seq": case.seq,
        "packing": case.packing,
        "attention": sides.attention,
        "options": case.options().removeprefix(", "),
        "length_histogram": histogram,
        "histogram_mean_length": mean_length,
        "precision": plan.precision,
        "kernels": plan.kernels,
        "micro_batch": plan.batch.micro_batch_size,
        "micro_batch_reason": getattr(plan.batch, "micro_batch_reason", None),
        "device": device_name,
        "compile": sides.compiled,
        "cuda_graphs": sides.graphs,
        "update": sides.update,
        "rounds": rounds.rounds,
        "rounds_cut_by_deadline": rounds.cut_by_deadline,
        "same_sequences": sides.peer,
    }
    for name, batches in sides.contract.items():
        median = rounds.median(name)
        f = batch_facts(batches, config)
        tokens_per_sec = f["real_tokens"] / median
        at_mean = None
        packed_like = case.packing != "none" or sides.attention == "varlen"
        if name == "omnibert" and mean_length and packed_like:
            at_mean = tokens_per_sec / mean_length  # rows cost what they hold: bench_gpu's doc
        out[name] = {
            "rounds_seconds": [round(s, 5) for s in rounds.seconds(name)],
            "real_tokens_per_sec": tokens_per_sec,
            "sequences_per_sec": f["sequences"] / median,
            "sequences_per_sec_at_histogram_mean": at_mean,
            "sequences_per_round": f["sequences"],
            "sequences_per_step": f["sequences"] / len(batches),
            "mean_sequence_tokens": f["real_tokens"] / max(f["sequences"], 1),
            "micro_batches_per_round": len(batches),
            "optimizer_updates_per_round": 1 if sides.update == "round" else len(batches),
            "mfu": None if flops_peak is None else f["flops"] / median / flops_peak,
            "work": work(batches, config, sides.kinds[name], sides.attention),
        }
    if "hf" in sides.contract:
        ours, theirs = out["omnibert"]["sequences_per_round"], out["hf"]["sequences_per_round"]
        ratios = [
            (ours / a) / (theirs / b)
            for a, b in zip(rounds.seconds("omnibert"), rounds.seconds("hf"), strict=True)
        ]
        out["ratio_sequences_per_sec"] = statistics.median(ratios)
        executed = out["hf"]["work"]["flops_executed"] / theirs
        out["ratio_work_per_sequence"] = executed / (
            out["omnibert"]["work"]["flops_executed"] / ours
        )
    published = PUBLISHED.get((case.seq, case.packing != "none"))
    if published is not None and case.model == "large":
        value, source = published
        ours_rate = out["omnibert"]["sequences_per_sec_at_histogram_mean"]
        ours_rate = ours_rate or out["omnibert"]["sequences_per_sec"]
        out["published"] = {"sequences_per_sec": value, "source": source}
        out["ratio_to_published"] = ours_rate / value
    return out
