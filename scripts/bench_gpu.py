"""GPU pretraining throughput: omnibert against Hugging Face ``BertForPreTraining``.

For each sequence length (128 with 20 masks, 512 with 76) and each layout (unpacked rows,
online-packed rows), the batches come from omnibert's own wiring: ``omnibert-train``'s
config (``data=generated``, ``accelerator=gpu``) goes through ``omnibert.run.pretraining
.prepare``, so the plan, the precision (``auto``: bf16 where the GPU runs it), the compile
settings and the data module are the ones a training run uses. omnibert trains its
``BertForPreTraining`` with the step ``compile_only`` times (``AcceleratorPlugin._train_step``:
autocast forward, backward, optimiser step, synchronise) and the configured optimiser
(omnibert's LAMB, ``impl: auto`` = the Triton kernel on CUDA). The peer is Hugging Face's
``BertForPreTraining`` (SDPA attention, the same initial weights), compiled with the same
``torch.compile`` options, in the same autocast, trained by the same step function with the
same LAMB (omnibert's, on HF's parameters and names). It reads the same sequences: the very
same batches when unpacked; when omnibert packs, HF (which has no packed attention) gets the
unpacked rows of the same generated sequences. Both compute MLM over the masked positions
and NSP; HF scores every position (its design), omnibert only the masked ones.

Rounds alternate (omnibert then HF, HF then omnibert, ...), warm-up steps (compilation) are
not timed. Printed per implementation: sequences/s and real (non-padding) tokens/s per GPU,
MFU (dense BERT step FLOPs of the rows run, ``bert_pretraining_flops`` without the
last-layer pruning, over the device's dense bf16 peak from :data:`PEAK_BF16`), peak memory
(``torch.cuda.max_memory_allocated`` during its steps; both models and their optimiser state
are resident), the ratio omnibert/HF and the ratio to the published figures (seq 512:
NVIDIA DeepLearningExamples ≈ 207 sequences/s per A100-80GB unpacked, MLPerf Training 3.0 ≈
970 samples/s per H100 packed). Results go to ``--json`` (default
``outputs/bench_gpu/bench_gpu-<time>.json``).

    python scripts/bench_gpu.py                                   # BERT-large, both seqs
    python scripts/bench_gpu.py --seq 512 --packing online \\
        --length-histogram ../shared/data/wikipedia_seqlen_histogram_512.json
    python scripts/bench_gpu.py --smoke                           # tiny model, CPU, seconds
    python scripts/bench_gpu.py --smoke --lease                   # the lease's shape, CPU

``--length-histogram``: rows take that length distribution (Wikipedia's makes packing pay
~2x at 512); without it the generated rows follow the reference generator (90% full
length), where packing gains little. Needs ``transformers`` (the ``bench`` extra).

Cases: ``--cases MODEL:SEQ:PACKING[:HISTOGRAM],...`` (e.g. ``base:128:none,large:512:online:wiki``;
``wiki`` is the repo's ``tests/fixtures/wikipedia_seqlen_histogram_512.json``, anything else a
path; without one a case takes ``--length-histogram``) runs those, in that order; without it,
every ``--seq`` x ``--packing`` for ``--model``. A case may also set its attention and micro
batch, overriding ``--attention`` and ``--batch``:
``large:512:none:attention=varlen,large:512:online:wiki:batch=64``.

``--profile``: after the timed rounds, one more pass of each side's steps under
``torch.profiler`` (:func:`profile_pass`): on CUDA the kernels' device time by kind (matmul,
attention, normalisation, optimiser, copies, elementwise), how busy the device was over the
pass's wall time, and the top kernels; on a CPU the operators' own host time.

``--lease``: a short GPU lease (about 200 s on one H100): BERT-base seq 128 unpacked, then
BERT-large seq 512 unpacked, then BERT-large seq 512 online-packed with the Wikipedia
histogram; 1 warm-up pass, 3 rounds of 5 steps, per-layer compilation, ``--deadline 200``
(each of these gives way to its flag given explicitly; ``--cases``, or ``--model``/``--seq``/
``--packing``, to the lease's cases). With ``--smoke`` the lease's cases run with the tiny
model at seq 32 on the CPU.

``--compile-scope layers``: ``torch.compile`` each encoder layer (``model.bert.encoder.layer``,
the same path in both models) with the plugin's ``compile_model`` (its options) instead of the
whole model: dynamo compiles the layer's code once and every layer of the model reuses that
graph (omnibert compiles a second one for its last layer, which runs only the read rows), so
a cold start costs one or two layer graphs instead of a whole 24-layer model; the rest of each
model (embeddings, heads, loss) runs eagerly, on both sides alike. ``model`` (the default but
under ``--lease``) compiles the whole model as training does. Each case records the scope,
the options and the frames dynamo compiled per implementation.

Results survive a timeout: the JSON is (re)written atomically when the run starts and after
every case, and each case's report prints as soon as it is done. ``--deadline SECONDS`` (wall
clock from the start): a case is skipped (recorded under ``skipped`` with the reason) when
the time left is below a rough estimate from the cases already run (:func:`estimate_seconds`;
the first case always starts), and timed rounds stop early once the deadline has passed; the run then ends
normally. A case that raises is recorded under ``failed`` (the exit status is then 1) and the
next one runs.

    python scripts/bench_gpu.py --lease --deadline 220            # one H100, ~200 s
    python scripts/bench_gpu.py --cases large:512:online:wiki --compile-scope layers
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import os
import re
import signal
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import benchplot
import torch
from torch import Tensor, nn

#: the repository root (this file is scripts/bench_gpu.py): fixtures resolve from any cwd
REPO = Path(__file__).resolve().parents[1]
#: ``HISTOGRAM`` names a case may use instead of a path
HISTOGRAMS = {"wiki": REPO / "tests" / "fixtures" / "wikipedia_seqlen_histogram_512.json"}
#: dense bf16 tensor-core peak FLOP/s by device-name fragment (first match wins; NVIDIA data
#: sheets, without sparsity)
PEAK_BF16: tuple[tuple[str, float], ...] = (
    ("GH200", 989e12),
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("V100", 125e12),  # fp16 tensor cores (V100 has no bf16)
)
#: published per-GPU figures: (seq, packed) -> (sequences/s, source)
PUBLISHED: dict[tuple[int, bool], tuple[float, str]] = {
    (512, False): (207.0, "NVIDIA DeepLearningExamples phase 2, A100-80GB, mixed precision"),
    (512, True): (970.0, "MLPerf Training 3.0 NVIDIA, H100, phase 2 packed"),
}
PREDICTIONS = {128: 20, 512: 76}
MODELS = {  # layers, hidden, heads, intermediate
    "large": (24, 1024, 16, 4096),
    "base": (12, 768, 12, 3072),
    "tiny": (4, 128, 2, 512),  # 4 layers: the per-layer compile's reuse shows (frames < layers)
}
#: ``--lease``: the cases, most important first, and the settings it gives (module docstring)
LEASE_CASES = "base:128:none,large:512:none,large:512:online:wiki"
LEASE = {"steps": 5, "rounds": 3, "warmup": 1, "compile_scope": "layers", "deadline": 200.0}
#: ``--smoke``: the tiny model on the CPU for seconds
SMOKE = {"steps": 2, "rounds": 2, "warmup": 1, "batch": 4, "vocab": 512}
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


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a model size, a sequence length, a layout and the rows' lengths."""

    model: str
    seq: int
    packing: str
    histogram: str | None = None  # data.length_histogram; None: --length-histogram
    attention: str | None = None  # model.config.attention; None: --attention
    batch: int | None = None  # rows per step; None: --batch

    def label(self) -> str:
        name = f"BERT-{self.model} seq {self.seq}, packing {self.packing}"
        name += f", lengths {Path(self.histogram).name}" if self.histogram else ""
        return name + self.options()

    def options(self) -> str:
        """What this case sets beyond the command's flags, for labels (empty when nothing)."""
        text = f", attention {self.attention}" if self.attention else ""
        return text + (f", micro batch {self.batch}" if self.batch else "")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def parse_cases(text: str) -> list[Case]:
    """``MODEL:SEQ:PACKING[:HISTOGRAM][:attention=NAME][:batch=ROWS],...`` (module docstring)
    as :class:`Case` objects."""
    cases = []
    for spec in filter(None, (part.strip() for part in text.split(","))):
        fields = spec.split(":")
        if len(fields) < 3 or fields[0] not in MODELS or fields[2] not in ("none", "online"):
            raise SystemExit(
                f"bench_gpu: --cases entry {spec!r} is not MODEL:SEQ:PACKING[:HISTOGRAM] with "
                f"MODEL in {sorted(MODELS)} and PACKING none or online"
            )
        try:
            seq = int(fields[1])
        except ValueError:
            raise SystemExit(f"bench_gpu: --cases entry {spec!r}: SEQ must be an integer") from None
        options = dict(f.split("=", 1) for f in fields[3:] if "=" in f)
        plain = [f for f in fields[3:] if "=" not in f]
        unknown = sorted(set(options) - {"attention", "batch"})
        if unknown or len(plain) > 1 or not options.get("batch", "1").isdigit():
            raise SystemExit(
                f"bench_gpu: --cases entry {spec!r}: after PACKING come a histogram and "
                "attention=NAME or batch=ROWS (a positive integer), e.g. "
                "large:512:online:wiki:attention=varlen:batch=64"
            )
        histogram = None
        if plain and plain[0]:
            path = HISTOGRAMS.get(plain[0], Path(plain[0]))
            histogram = str(Path(path).resolve())
            if not Path(histogram).is_file():
                raise SystemExit(f"bench_gpu: --cases entry {spec!r}: no file {histogram}")
        batch = int(options["batch"]) if "batch" in options else None
        if batch == 0:
            raise SystemExit(f"bench_gpu: --cases entry {spec!r}: batch must be at least 1")
        cases.append(Case(fields[0], seq, fields[2], histogram, options.get("attention"), batch))
    if not cases:
        raise SystemExit("bench_gpu: --cases names no case")
    return cases


def peak_for_name(name: str) -> float | None:
    """Dense bf16 peak FLOP/s of the GPU called ``name`` (:data:`PEAK_BF16`), or None."""
    return next((peak for fragment, peak in PEAK_BF16 if fragment in name), None)


def peak_flops(device: torch.device) -> tuple[float | None, str]:
    """The device's dense bf16 peak and its name (``None`` when unknown, e.g. a CPU)."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    return peak_for_name(name), name


def micro_batch(args: argparse.Namespace, case: Case) -> int:
    """Rows per step: the case's ``batch=``, else ``--batch``, else 128 at seq <= 128 and 32
    above (BERT-large in bf16 with both models resident fits an 80 GB GPU)."""
    return int(case.batch or args.batch or (128 if case.seq <= 128 else 32))


def attention(args: argparse.Namespace, case: Case) -> str | None:
    """``model.config.attention`` for a case: its ``attention=``, else ``--attention``, else
    ``None`` (the config's own)."""
    return case.attention or args.attention


def compose_run(args: argparse.Namespace, case: Case, root: Path) -> Any:
    """``omnibert.run.pretraining.prepare`` of the training config for one case."""
    from omnibert.apps.compose import compose
    from omnibert.run.pretraining import prepare

    seq, packing = case.seq, case.packing
    layers, hidden, heads, inter = MODELS[case.model]
    rows = args.rows or max(1024, 8 * micro_batch(args, case) * args.steps)
    overrides = [
        f"paths.output_root={root}",
        f"run_name=bench-{case.model}-{seq}-{packing}",
        "data=generated",
        "data.num_workers=0",
        f"data.vocab_size={args.vocab}",
        "data.num_eval_samples=0",
        f"data.num_train_samples={rows}",
        f"data.packing={packing}",
        f"data.pack.buffer_size={min(rows, 16384)}",
        f"data.seed={args.seed}",
        f"seed={args.seed}",
        f"phase.max_seq_length={seq}",
        f"phase.max_predictions_per_seq={args.predictions or PREDICTIONS.get(seq, seq // 6)}",
        f"phase.global_batch_size={micro_batch(args, case)}",
        f"micro_batch_size={micro_batch(args, case)}",
        # the micro batch as given, checked by prepare's memory estimate as a run's is
        "phase.max_steps=1000",
        f"accelerator={'gpu' if args.device == 'cuda' else 'cpu'}",
        f"trainer.precision={args.precision}",
        f"optimizer={args.optimizer}",
        f"model.config.num_hidden_layers={layers}",
        f"model.config.hidden_size={hidden}",
        f"model.config.num_attention_heads={heads}",
        f"model.config.intermediate_size={inter}",
        f"model.config.max_position_embeddings={max(512, seq)}",
        "logger=none",
    ]
    if args.optimizer == "adamw":
        overrides.append("optimizer.lr=1e-4")
    histogram = case.histogram or args.length_histogram
    if histogram:
        overrides.append(f"data.length_histogram={histogram}")
    if attention(args, case):
        overrides.append(f"model.config.attention={attention(args, case)}")
    if args.compile is not None:
        overrides.append(f"accelerator.compile={str(args.compile).lower()}")
    overrides += args.override or []
    return prepare(compose("pretrain", overrides))


def take_batches(prepared: Any, count: int) -> list[dict[str, Tensor]]:
    datamodule = prepared.datamodule
    datamodule.setup("fit")
    batches: list[dict[str, Tensor]] = []
    for batch in datamodule.train_dataloader():
        batches.append({k: v.to(prepared.plugin.device) for k, v in batch.items()})
        if len(batches) == count:
            return batches
    raise SystemExit(f"bench_gpu: only {len(batches)} batches; raise --rows")


class HFStep(nn.Module):
    """Hugging Face's model behind omnibert's step interface: ``forward(batch)["loss"]``."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
        return {"loss": self.model(**batch).loss}


def hf_batch(batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Unpacked rows of the data contract as HF inputs: labels -100 except at the masked
    positions, the attention mask from ``sequence_ids``, the first NSP label."""
    labels = torch.full_like(batch["input_ids"], -100)
    weights = batch["masked_lm_weights"] > 0
    rows = torch.arange(labels.shape[0], device=labels.device).unsqueeze(1)
    rows = rows.expand_as(batch["masked_lm_positions"])
    labels[rows[weights], batch["masked_lm_positions"][weights]] = batch["masked_lm_ids"][weights]
    return {
        "input_ids": batch["input_ids"],
        "token_type_ids": batch["segment_ids"],
        "position_ids": batch["position_ids"],
        "attention_mask": (batch["sequence_ids"] > 0).long(),
        "labels": labels,
        "next_sentence_label": batch["nsp_labels"][:, 0],
    }


def on_device(build: Callable[[], nn.Module], device: torch.device) -> nn.Module:
    """``build()`` with its tensors created on ``device`` (initialising BERT-large on the host
    takes seconds per model), or on the host and moved where that fails."""
    if device.type != "cpu":
        try:
            with device:
                return build()
        except Exception as err:  # any failure: the host path below
            print(f"  (built on the host: on {device} it failed: {err!r:.200})", flush=True)
    return build().to(device)


def hf_model(model: nn.Module) -> nn.Module:
    """HF ``BertForPreTraining`` (SDPA) with ``model``'s weights (the real vocab rows), on
    ``model``'s device."""
    import transformers

    config = model.config  # type: ignore[attr-defined]
    hf_config = transformers.BertConfig(**config.to_hf_dict())
    hf_config._attn_implementation = "sdpa"
    device = next(model.parameters()).device
    theirs = on_device(lambda: transformers.BertForPreTraining(hf_config), device)
    vocab = config.vocab_size
    state = {
        k: (v[:vocab] if v.shape[0] == config.padded_vocab_size else v)
        for k, v in model.state_dict().items()
    }
    theirs.load_state_dict(state, strict=True)
    return theirs


def encoder_layers(model: nn.Module) -> nn.ModuleList:
    """The encoder layers: ``model.bert.encoder.layer`` in omnibert's and in HF's
    ``BertForPreTraining`` alike."""
    layers = model.bert.encoder.layer  # type: ignore[union-attr]
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
    """Frames dynamo compiled and graphs it produced so far (``torch._dynamo`` counters)."""
    from torch._dynamo.utils import counters

    return {
        "frames": int(counters["frames"]["ok"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
    }


def raise_recompile_limit(limit: int = 64) -> None:
    """Dynamo keeps one cache per code object: every layer (and every case: new models, new
    shapes) adds its entries to the same ``forward``'s, past the default limit of 8 after a
    few cases, beyond which it would run the layer eagerly. Both models alike."""
    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name):
            setattr(config, name, max(int(getattr(config, name)), limit))
            return


def batch_facts(batches: list[dict[str, Tensor]], config: Any) -> dict[str, float]:
    """Sequences, real tokens and dense-step FLOPs of one pass over ``batches``."""
    from omnibert.callbacks.throughput import bert_pretraining_flops

    sequences = sum(int((b["nsp_weights"] > 0).sum()) for b in batches)
    tokens = sum(int((b["sequence_ids"] > 0).sum()) for b in batches)
    flops = 0
    for b in batches:
        rows, seq = b["input_ids"].shape
        preds, slots = b["masked_lm_positions"].shape[1], b["nsp_positions"].shape[1]
        flops += bert_pretraining_flops(config, rows, seq, preds, slots, prune_last_layer=False)
    return {"sequences": sequences, "real_tokens": tokens, "flops": float(flops)}


def run_case(
    args: argparse.Namespace, case: Case, root: Path, deadline_at: float | None = None
) -> dict[str, Any]:
    """Both models on ``case``'s batches (module docstring); timed rounds stop early once
    ``time.monotonic()`` passes ``deadline_at`` (at least one round runs)."""

    from omnibert.models import BertForPreTraining
    from omnibert.optim.build import build_optimizer

    started = time.monotonic()
    seq, packing = case.seq, case.packing
    prepared = compose_run(args, case, root)
    plugin, plan = prepared.plugin, prepared.plan
    precision = plan.precision
    ours_batches = take_batches(prepared, args.steps)
    if packing == "none":
        unpacked = ours_batches  # the very same batches
    else:  # HF has no packed attention: the unpacked rows of the same generated sequences
        unpacked = take_batches(
            compose_run(args, dataclasses.replace(case, packing="none"), root), args.steps
        )
    peer_batches = [hf_batch(b) for b in unpacked]
    config = plan.model
    torch.manual_seed(args.seed)
    ours = on_device(lambda: BertForPreTraining(config), plugin.device).train()
    theirs = HFStep(hf_model(ours)).to(plugin.device).train()
    compiled: dict[str, Any] = {"scope": "off (eager)"}
    if plugin.compile:
        what = compile_scoped(ours, args.compile_scope, plugin.compile_model)
        compile_scoped(theirs.model, args.compile_scope, plugin.compile_model)
        options = getattr(plugin, "compile_options", {})
        compiled = {"scope": args.compile_scope, "what": what, "options": dict(options)}
    optimizers = {
        name: build_optimizer(prepared.config.optimizer, model.named_parameters())
        for name, model in (("omnibert", ours), ("hf", theirs.model))
    }
    models: dict[str, nn.Module] = {"omnibert": ours, "hf": theirs}
    inputs = {"omnibert": ours_batches, "hf": peer_batches}
    facts = {"omnibert": batch_facts(ours_batches, config), "hf": batch_facts(unpacked, config)}
    graphs = bool(getattr(plugin, "uses_cuda_graphs", False))
    setup_seconds = time.monotonic() - started
    print(
        f"  setup {setup_seconds:.1f} s: {precision}, micro batch {micro_batch(args, case)}, "
        f"compile {compiled['scope']}"
        + (f" (options {compiled['options']})" if plugin.compile else "")
        + f", {args.warmup} warm-up pass(es), {args.rounds} rounds of {args.steps} steps",
        flush=True,
    )

    def steps(name: str) -> Callable[[], float]:
        def run() -> float:
            plugin.synchronize()
            start = time.perf_counter()
            for batch in inputs[name]:
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                plugin._train_step(models[name], batch, optimizers[name], precision)
            return time.perf_counter() - start

        return run

    runners = {name: steps(name) for name in models}
    warmup: dict[str, float] = {}
    dynamo: dict[str, dict[str, int]] = {}
    for name, run in runners.items():  # compile and warm up, untimed
        before, start = dynamo_counts(), time.monotonic()
        for _ in range(args.warmup):
            run()
        warmup[name] = time.monotonic() - start
        after = dynamo_counts()
        dynamo[name] = {key: after[key] - before[key] for key in after}
        print(
            f"  warmed up {name} ({args.warmup} x {args.steps} steps) in {warmup[name]:.1f} s; "
            f"dynamo compiled {dynamo[name]['frames']} frame(s), {dynamo[name]['graphs']} "
            "graph(s)",
            flush=True,
        )
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    peak: dict[str, int | None] = dict.fromkeys(runners)
    timed_start = time.monotonic()
    cut = False
    for r in range(args.rounds):
        if r and deadline_at is not None and time.monotonic() > deadline_at:
            cut = True
            print(f"  deadline passed: {r} of {args.rounds} rounds timed", flush=True)
            break
        order = list(runners) if r % 2 == 0 else list(reversed(runners))
        for name in order:
            plugin.reset_peak_memory()
            seconds[name].append(runners[name]())
            measured, _ = plugin.peak_memory()
            if measured is not None:
                peak[name] = max(peak[name] or 0, measured)
    profiles = (
        {name: profile_pass(run, plugin) for name, run in runners.items()} if args.profile else {}
    )
    flops_peak, device_name = peak_flops(plugin.device)
    out: dict[str, Any] = {
        "model": case.model,
        "seq": seq,
        "packing": packing,
        "attention": attention(args, case),
        "options": case.options().removeprefix(", "),
        "length_histogram": case.histogram or args.length_histogram,
        "precision": precision,
        "kernels": plan.kernels,
        "micro_batch": micro_batch(args, case),
        "device": device_name,
        "compile": compiled,
        "rounds": len(seconds["omnibert"]),
        "rounds_cut_by_deadline": cut,
    }
    for name in runners:
        median = statistics.median(seconds[name])
        f = facts[name]
        out[name] = {
            "rounds_seconds": [round(s, 5) for s in seconds[name]],
            "sequences_per_sec": f["sequences"] / median,
            "real_tokens_per_sec": f["real_tokens"] / median,
            "sequences_per_step": f["sequences"] / args.steps,
            "mfu": None if flops_peak is None else f["flops"] / median / flops_peak,
            "peak_memory_bytes": peak[name],
            "warmup_seconds": round(warmup[name], 3),
            "dynamo": dynamo[name],
        }
        if name in profiles:
            out[name]["profile"] = profiles[name]
    ratios = [
        (facts["omnibert"]["sequences"] / a) / (facts["hf"]["sequences"] / b)
        for a, b in zip(seconds["omnibert"], seconds["hf"], strict=True)
    ]
    out["ratio_sequences_per_sec"] = statistics.median(ratios)
    published = PUBLISHED.get((seq, packing != "none"))
    if published is not None and case.model == "large":
        value, source = published
        out["published"] = {"sequences_per_sec": value, "source": source}
        out["ratio_to_published"] = out["omnibert"]["sequences_per_sec"] / value
    out["seconds"] = {
        "setup": round(setup_seconds, 3),
        "warmup": round(sum(warmup.values()), 3),
        "timed": round(time.monotonic() - timed_start, 3),
        "total": round(time.monotonic() - started, 3),
    }
    return out


#: kernel or operator names -> where a step's time goes (the first match wins)
PROFILE_CATEGORIES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("attention", re.compile(r"flash|fmha|attention|attn|sdpa|varlen", re.I)),
    ("optimizer", re.compile(r"lamb|adam|multi_tensor", re.I)),
    (
        "matmul",
        re.compile(r"gemm|matmul|cutlass|xmma|nvjet|cublas|aten::(mm|addmm|bmm|linear)$", re.I),
    ),
    ("normalization", re.compile(r"norm", re.I)),
    ("copy and fill", re.compile(r"copy|memcpy|memset|fill|aten::cat$", re.I)),
    ("elementwise and reductions", re.compile(r"^triton_|elementwise|vectorized|reduce", re.I)),
)


def profile_pass(run: Callable[[], float], plugin: Any, top: int = 10) -> dict[str, Any]:
    """One more pass of a side's steps under ``torch.profiler``: where its time goes.

    On CUDA it counts the kernels' device time; elsewhere the operators' own host time.
    ``busy`` is that time over the pass's wall time: well under 1 on a GPU means the device
    waits for the host (kernel launches, eager Python)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = plugin.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    with profile(activities=activities):  # the profiler's own start-up, outside the pass
        torch.ones(1, device=plugin.device).add_(1)
    with profile(activities=activities) as prof:
        wall = run()
    times: dict[str, tuple[float, int]] = {}
    for event in prof.key_averages():
        if event.device_type != (DeviceType.CUDA if cuda else DeviceType.CPU):
            continue
        seconds = (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1e6
        if seconds > 0:
            times[event.key] = (seconds, event.count)
    total = sum(seconds for seconds, _ in times.values())
    shares = dict.fromkeys([name for name, _ in PROFILE_CATEGORIES] + ["other"], 0.0)
    for key, (seconds, _) in times.items():
        found = (name for name, pattern in PROFILE_CATEGORIES if pattern.search(key))
        shares[next(found, "other")] += seconds
    ranked = sorted(times.items(), key=lambda item: -item[1][0])[:top]
    return {
        "what": "CUDA kernels, device time" if cuda else "operators, own host time",
        "wall_seconds": round(wall, 6),
        "counted_seconds": round(total, 6),
        "busy": total / wall if wall > 0 else None,
        "shares": {k: round(v / total, 4) for k, v in shares.items() if v > 0} if total else {},
        "top": [
            {"name": key[:160], "seconds": round(s, 6), "share": round(s / total, 4), "calls": n}
            for key, (s, n) in ranked
        ],
    }


def profile_lines(name: str, prof: Mapping[str, Any], top: int = 5) -> list[str]:
    shares = ", ".join(
        f"{k} {v:.0%}" for k, v in sorted(prof["shares"].items(), key=lambda kv: -kv[1])
    )
    busy = "n/a" if prof["busy"] is None else f"{prof['busy']:.0%}"
    lines = [
        f"  profile {name}: {prof['what']} {prof['counted_seconds'] * 1e3:.1f} ms of "
        f"{prof['wall_seconds'] * 1e3:.1f} ms wall (busy {busy}); {shares}"
    ]
    lines += [
        f"    {item['share']:6.1%} {item['calls']:5d}x {item['name'][:110]}"
        for item in prof["top"][:top]
    ]
    return lines


def step_work(args: argparse.Namespace, case: Case) -> float:
    """A step's work, up to a constant: layers x rows x seq x hidden x (12 hidden + 2 seq)."""
    layers, hidden, _, _ = MODELS[case.model]
    rows = micro_batch(args, case) * case.seq
    return float(layers * rows * hidden * (12 * hidden + 2 * case.seq))


def estimate_seconds(
    args: argparse.Namespace, case: Case, done: list[tuple[Case, dict[str, float]]]
) -> tuple[float, str] | None:
    """A rough time for ``case`` from the cases run (``(case, seconds)``), and whence; None
    before the first. From the last case of the same model (else the last case): its setup
    and warm-up (mostly compilation, which grows little with the model: x1.25 for another
    model) plus its timed rounds scaled by the step's work; where the model and the sequence
    length are the same, half its warm-up (dynamo reuses the compiled layers of those
    shapes: all of HF's, omnibert's but its last layer's)."""
    if not done:
        return None
    same = [(c, s) for c, s in done if c.model == case.model]
    ran, seconds = (same or done)[-1]
    work = step_work(args, case) / step_work(args, ran)
    if ran.model != case.model:
        fixed, how = 1.25 * (seconds["setup"] + seconds["warmup"]), "x1.25"
    elif ran.seq != case.seq:
        fixed, how = seconds["setup"] + seconds["warmup"], "x1"
    else:
        fixed, how = seconds["setup"] + 0.5 * seconds["warmup"], "half the warm-up"
    estimate = fixed + seconds["timed"] * work
    return estimate, (
        f"{ran.label()} took {seconds['total']:.0f} s: setup and warm-up {how}, timed rounds "
        f"x{work:.2f} the work"
    )


def report(case: Mapping[str, Any]) -> str:
    compiled = case.get("compile", {}).get("scope", "n/a")
    lines = [
        f"BERT-{case.get('model', '?')} seq {case['seq']} packing {case['packing']}"
        + (f" attention {case['attention']}" if case.get("attention") else "")
        + " micro batch "
        f"{case['micro_batch']} {case['precision']} on {case['device']}, compile {compiled}, "
        f"{case.get('rounds', '?')} rounds"
    ]
    for name in ("omnibert", "hf"):
        r = case[name]
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        mem = "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
        lines.append(
            f"  {name:<9} {r['sequences_per_sec']:10.1f} sequences/s  "
            f"{r['real_tokens_per_sec']:12.0f} real tokens/s  MFU {mfu:>6}  peak {mem} GiB  "
            f"({r['sequences_per_step']:.1f} sequences per step; warm-up "
            f"{r.get('warmup_seconds', float('nan')):.1f} s)"
        )
    lines.append(f"  ratio omnibert/hf (median of rounds): {case['ratio_sequences_per_sec']:.3f}")
    for name in ("omnibert", "hf"):
        if case[name].get("profile"):
            lines += profile_lines(name, case[name]["profile"])
    if "published" in case:
        pub = case["published"]
        lines.append(
            f"  ratio to published {pub['sequences_per_sec']:.0f} sequences/s per GPU "
            f"({pub['source']}): {case['ratio_to_published']:.3f}"
        )
    if "seconds" in case:
        s = case["seconds"]
        lines.append(
            f"  case took {s['total']:.1f} s (setup {s['setup']:.1f}, warm-up {s['warmup']:.1f}, "
            f"timed {s['timed']:.1f})"
        )
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(MODELS), default=None,
                        help="model of every --seq x --packing case (default large)")  # fmt: skip
    parser.add_argument("--seq", type=int, nargs="+", default=None, help="default 128 512")
    parser.add_argument("--packing", nargs="+", default=None, choices=["none", "online"],
                        help="default none online")  # fmt: skip
    parser.add_argument("--cases", default=None,
                        help="MODEL:SEQ:PACKING[:HISTOGRAM],... run in this order")  # fmt: skip
    parser.add_argument("--lease", action="store_true",
                        help="the short GPU preset; explicit flags win")  # fmt: skip
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start: skip cases that would not fit")  # fmt: skip
    parser.add_argument("--compile-scope", choices=["model", "layers"], default=None,
                        help="compile the whole model (default) or each encoder layer")  # fmt: skip
    parser.add_argument("--batch", type=int, default=None,
                        help="micro batch in rows (default: 128 at seq <= 128, else 32)")  # fmt: skip
    parser.add_argument("--predictions", type=int, default=None, help="masks per sequence")
    parser.add_argument("--steps", type=int, default=None, help="steps per timed round (10)")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds (6)")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed passes over the steps (2)"
    )
    parser.add_argument("--rows", type=int, default=None, help="generated training rows")
    parser.add_argument("--precision", default="auto", help="trainer.precision")
    parser.add_argument("--optimizer", choices=["lamb", "adamw"], default="lamb",
                        help="the same optimiser (omnibert's) for both models")  # fmt: skip
    parser.add_argument("--attention", default=None,
                        help="model.config.attention, where the model has the key")  # fmt: skip
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="accelerator.compile (default: the accelerator's, on for gpu)")  # fmt: skip
    parser.add_argument("--override", action="append", default=None, metavar="KEY=VALUE",
                        help="a training-config override (repeatable)")  # fmt: skip
    parser.add_argument("--length-histogram", default=None, help="data.length_histogram")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--vocab", type=int, default=None, help="data.vocab_size (30522)")
    parser.add_argument("--seed", type=int, default=12345)
    parser.add_argument("--json", default=None, help="where to write the results")
    parser.add_argument("--profile", action="store_true",
                        help="after the timed rounds, one more pass of each side under "
                             "torch.profiler: kernel time by kind, busy fraction, top kernels")  # fmt: skip
    benchplot.add_arguments(parser)
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, vocab 512, seq 32, 2 rounds of 2 steps (CPU unless --device)")  # fmt: skip
    args = parser.parse_args(argv)
    product = any(getattr(args, k) is not None for k in ("model", "seq", "packing"))
    # explicit flags, then --smoke, then --lease, then the defaults
    presets: list[Mapping[str, Any]] = []
    if args.smoke:
        presets.append({**SMOKE, "model": "tiny", "seq": [32]})
    if args.lease:
        presets.append(LEASE)
    presets.append(DEFAULTS)
    for key in {k for preset in presets for k in preset}:
        if getattr(args, key, None) is None:
            setattr(args, key, next((p[key] for p in presets if key in p), None))
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


def write_json(path: Path, results: Mapping[str, Any]) -> None:
    """``results`` to ``path`` atomically: a temporary file beside it, then ``os.replace``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    os.replace(tmp, path)


class Terminated(BaseException):
    """SIGTERM (``timeout``): the JSON is written with what ran, then the run ends."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated(f"signal {signum}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    started = time.monotonic()
    args = parse(argv)
    import transformers

    cases: list[Case] = args.case_list
    deadline_at = None if args.deadline is None else started + args.deadline
    path = Path(args.json or f"outputs/bench_gpu/bench_gpu-{time.strftime('%Y%m%d-%H%M%S')}.json")
    command = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    command["case_list"] = [c.to_dict() for c in cases]
    results: dict[str, Any] = {
        "command": command,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "status": "running",
        "compile_scope": args.compile_scope,
        "deadline_seconds": args.deadline,
        "elapsed_seconds": 0.0,
        "cases": [],
        "skipped": [],
        "failed": [],
        "pending": [c.to_dict() for c in cases],
    }

    def save(status: str | None = None) -> None:
        if status is not None:
            results["status"] = status
        results["elapsed_seconds"] = round(time.monotonic() - started, 3)
        write_json(path, results)

    save()
    print(
        f"bench_gpu: {len(cases)} case(s) on {args.device}, compile scope {args.compile_scope}, "
        f"deadline {args.deadline if args.deadline is not None else 'none'} s; results in {path}",
        flush=True,
    )
    raise_recompile_limit()
    previous = signal.signal(signal.SIGTERM, _terminate)
    done: list[tuple[Case, dict[str, float]]] = []
    current = "the start"
    try:
        with tempfile.TemporaryDirectory(prefix="bench_gpu-") as tmp:
            if args.smoke and args.length_histogram is None:  # lengths 5..seq alike: packing packs
                uniform = Path(tmp) / "uniform_lengths.json"
                uniform.write_text(json.dumps({"counts": [1] * max(c.seq for c in cases)}))
                args.length_histogram = str(uniform)
            for index, case in enumerate(cases):
                results["pending"] = [c.to_dict() for c in cases[index + 1 :]]
                left = None if deadline_at is None else deadline_at - time.monotonic()
                estimate = estimate_seconds(args, case, done)
                if left is not None and estimate is not None and left < estimate[0]:
                    reason = (
                        f"deadline: {left:.0f} s left of {args.deadline:.0f} s, estimate "
                        f"{estimate[0]:.0f} s ({estimate[1]})"
                    )
                    print(f"bench_gpu: skipped {case.label()}: {reason}", flush=True)
                    results["skipped"].append({**case.to_dict(), "reason": reason})
                    save()
                    continue
                print(f"bench_gpu: {case.label()} ...", flush=True)
                current = case.label()
                try:
                    out = run_case(args, case, Path(tmp), deadline_at)
                except Exception as err:  # recorded, the next case runs
                    text = traceback.format_exc()
                    print(f"bench_gpu: {case.label()} FAILED: {err!r}\n{text}", flush=True)
                    results["failed"].append(
                        {**case.to_dict(), "error": repr(err), "traceback": text[-4000:]}
                    )
                    save()
                    continue
                finally:
                    free_memory()
                current = f"the cases after {case.label()}"
                done.append((case, out["seconds"]))
                results["cases"].append(out)
                save()
                print(report(out), flush=True)
                print(
                    f"bench_gpu: {len(results['cases'])} case(s) written to {path} "
                    f"({time.monotonic() - started:.0f} s elapsed)",
                    flush=True,
                )
    except (Terminated, KeyboardInterrupt) as err:
        save(f"interrupted ({err!r}) during {current}")
        print(f"bench_gpu: interrupted; {len(results['cases'])} case(s) in {path}", flush=True)
        raise SystemExit(143) from None
    finally:
        signal.signal(signal.SIGTERM, previous)
    results["pending"] = []
    save("done")
    print(
        f"bench_gpu: results in {path} ({len(results['cases'])} done, "
        f"{len(results['skipped'])} skipped, {len(results['failed'])} failed, "
        f"{results['elapsed_seconds']:.0f} s)",
        flush=True,
    )
    if results["cases"]:
        rec = record(args, results["cases"], results)
        benchplot.save(rec, figure(rec), args.results_dir)
    return results


def figure(rec: Any) -> Any:
    """Sequences/s per case, omnibert beside Hugging Face, the ratio above each pair (log
    scale: seq 128 and seq 512 rates differ tenfold)."""
    (table,) = rec.tables
    rows = table.rows
    series = {
        "omnibert": [float(r[1]) if r[1] != "n/a" else None for r in rows],
        "Hugging Face": [float(r[2]) if r[2] != "n/a" else None for r in rows],
    }
    groups = [r[0].replace(", ", "\n") for r in rows]
    return benchplot.bars(rec.title, "sequences/s per device", groups, series,
                          ratio_of=("omnibert", "Hugging Face"), log=True)  # fmt: skip


def free_memory() -> None:
    """Drop the finished case's models, optimiser state and batches before the next."""
    gc.collect()
    if torch.cuda.is_available():
        with contextlib.suppress(Exception):
            torch.cuda.empty_cache()


def record(args: argparse.Namespace, cases: list[dict[str, Any]], results: Any) -> Any:
    """The run as a :class:`benchplot.Record` (the site's benchmark pages read those)."""

    def cell(value: float | None, fmt: str) -> str:
        return "n/a" if value is None else format(value, fmt)

    models = list(dict.fromkeys(c.get("model", args.model) for c in cases))

    def label(c: Mapping[str, Any]) -> str:
        name = f"seq {c['seq']}, {c['packing']}"
        name += f", {c['options']}" if c.get("options") else ""
        return name if len(models) == 1 else f"BERT-{c['model']} {name}"

    rows = [
        [
            label(c),
            cell(c["omnibert"]["sequences_per_sec"], ".1f"),
            cell(c["hf"]["sequences_per_sec"], ".1f"),
            f"{c['ratio_sequences_per_sec']:.2f}x",
            cell(c["omnibert"]["real_tokens_per_sec"], ".0f"),
            cell(c["omnibert"]["mfu"], ".1%"),
            cell(c.get("ratio_to_published"), ".2f"),
        ]
        for c in cases
    ]
    device = cases[0]["device"] if cases else "none"
    headline = "; ".join(f"{r[0]}: {r[3]} omnibert/hf" for r in rows)
    return benchplot.Record(
        name="gpu-" + "-".join(models) + ("-smoke" if args.smoke else ""),
        title=f"BERT-{'/'.join(models)} pretraining step on {device}: omnibert against "
        "Hugging Face",
        headline=headline,
        command=benchplot.command_line(),
        machine=benchplot.machine(),
        tables=[
            benchplot.Table(
                f"sequences/s per device ({cases[0]['precision'] if cases else ''}, compile "
                f"{cases[0]['compile']['scope'] if cases else ''})",
                [
                    "case",
                    "omnibert seq/s",
                    "hf seq/s",
                    "ratio",
                    "omnibert real tokens/s",
                    "omnibert MFU",
                    "vs published",
                ],
                rows,
            )
        ],
        measurements=results,
    )


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
