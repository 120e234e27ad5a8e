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

A round is ``--steps`` micro batches of omnibert (and the peer's batches of the same
sequences), timed between two device synchronisations; no host sync inside it. ``update``:
``round`` (default: one optimiser update per round per side, as the recipes, which accumulate
128-256 micro batches per update, amortise it) or ``micro`` (one per micro batch). Rounds
alternate between the sides; compilation is in untimed warm-up passes.

Printed and recorded per side: **real (non-padding) tokens/s**, the primary figure;
sequences/s of the drawn sequences and, for packed rows, at the length histogram's mean
(real tokens/s over its mean length: what a long run over the whole data reaches; a case's
few hundred sequences have their own mean); MFU (dense BERT step FLOPs of the rows run over the
device's dense bf16 peak, :data:`PEAK_BF16`, whatever the precision); peak memory; and the
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
rewritten atomically after every case; a case that raises is recorded under ``failed``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from bench_gpu_profile import PROFILE_CATEGORIES, profile_lines, profile_pass
from bench_gpu_run import main
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
from torch import Tensor, nn

__all__ = ["PROFILE_CATEGORIES", "Case", "main", "parse", "parse_cases", "run_case"]

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
PREDICTIONS = {128: 20, 512: 76, 1024: 76}


@dataclasses.dataclass(frozen=True)
class Model:
    """A size: its shape, the conf/model preset of its other options (``None``: BERT's
    defaults) and its vocabulary (``None``: ``--vocab``)."""

    layers: int
    hidden: int
    heads: int
    intermediate: int
    preset: str | None = None
    vocab: int | None = None

    @property
    def modern(self) -> bool:
        return self.preset is not None


MODELS = {
    "large": Model(24, 1024, 16, 4096),
    "base": Model(12, 768, 12, 3072),
    "tiny": Model(4, 128, 2, 512),  # 4 layers: the per-layer compile's reuse shows
    # ModernBERT-base with its own tokenizer's 50,368 rows (conf/model/modernbert_base.yaml)
    "modernbert_base": Model(22, 768, 12, 1152, preset="modernbert_base", vocab=50368),
    "modern_tiny": Model(2, 128, 2, 192, preset="modern_tiny"),
}
#: ``--lease``: the cases, most important first, and the settings it gives (module docstring)
LEASE_CASES = "large:512:online:wiki,large:512:none,base:128:none"
LEASE = {"steps": 10, "rounds": 3, "warmup": 1, "compile_scope": "layers", "deadline": 200.0}
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
#: a case's KEY=VALUE fields: the values each takes (``None``: any)
CASE_KEYS: dict[str, tuple[str, ...] | None] = {
    "attention": None,
    "batch": None,  # a positive integer or probe
    "precision": None,
    "scope": ("model", "layers"),
    "graphs": ("on", "off"),
    "update": ("round", "micro"),
    "peer": ("hf", "none"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One measurement: a size, a sequence length, a layout, the rows' lengths and what the
    case sets beyond the command's flags (``None``: the flag's)."""

    model: str
    seq: int
    packing: str
    histogram: str | None = None
    attention: str | None = None
    batch: int | str | None = None  # rows per micro batch, or "probe"
    precision: str | None = None
    scope: str | None = None
    graphs: str | None = None
    update: str | None = None
    peer: str | None = None

    def fields(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in CASE_KEYS if getattr(self, k) is not None}

    def label(self) -> str:
        name = f"{self.model} seq {self.seq}, packing {self.packing}"
        name += f", lengths {Path(self.histogram).name}" if self.histogram else ""
        return name + self.options()

    def options(self) -> str:
        """What this case sets beyond the command's flags, for labels (empty when nothing)."""
        return "".join(f", {key} {value}" for key, value in self.fields().items())

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _refuse(spec: str, why: str) -> SystemExit:
    keys = ", ".join(f"{k}={'|'.join(v) if v else 'VALUE'}" for k, v in CASE_KEYS.items())
    return SystemExit(
        f"bench_gpu: --cases entry {spec!r}: {why}; after PACKING come a histogram and "
        f"KEY=VALUE fields ({keys}, batch a positive integer or probe), e.g. "
        "large:512:online:wiki:attention=varlen:batch=64"
    )


def parse_cases(text: str) -> list[Case]:
    """``MODEL:SEQ:PACKING[:HISTOGRAM][:KEY=VALUE...],...`` (module docstring) as cases."""
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
        if unknown := sorted(set(options) - set(CASE_KEYS)):
            raise _refuse(spec, f"unknown key(s) {unknown}")
        if len(plain) > 1:
            raise _refuse(spec, f"more than one histogram {plain}")
        for key, value in options.items():
            allowed = CASE_KEYS[key]
            if allowed is not None and value not in allowed:
                raise _refuse(spec, f"{key}={value} is not one of {'|'.join(allowed)}")
        batch: int | str | None = options.get("batch")
        if batch is not None and batch != "probe":
            if not str(batch).isdigit() or int(batch) < 1:
                raise _refuse(spec, f"batch={batch} is not a positive integer or probe")
            batch = int(batch)
        histogram = None
        if plain and plain[0]:
            path = HISTOGRAMS.get(plain[0], Path(plain[0]))
            histogram = str(Path(path).resolve())
            if not Path(histogram).is_file():
                raise SystemExit(f"bench_gpu: --cases entry {spec!r}: no file {histogram}")
        values = {k: v for k, v in options.items() if k != "batch"}
        cases.append(Case(fields[0], seq, fields[2], histogram, batch=batch, **values))
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


def micro_batch(args: argparse.Namespace, case: Case) -> int | None:
    """Rows per micro batch: the case's ``batch=``, else ``--batch``, else 128 at seq <= 128
    and 32 above; ``None`` for ``batch=probe`` (the plan chooses)."""
    if case.batch == "probe":
        return None
    return int(case.batch or args.batch or (128 if case.seq <= 128 else 32))


def setting(args: argparse.Namespace, case: Case, key: str) -> Any:
    """A case's own value of ``key``, else the command's (``--attention``, ``--precision``,
    ``--compile-scope``, ``--update``; ``graphs`` and ``peer`` have no flag)."""
    flag = {"scope": "compile_scope"}.get(key, key)
    return getattr(case, key) if getattr(case, key) is not None else getattr(args, flag, None)


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
    """Frames dynamo compiled and graphs it produced so far (``torch._dynamo`` counters)."""
    from torch._dynamo.utils import counters

    return {
        "frames": int(counters["frames"]["ok"]),
        "graphs": int(counters["stats"]["unique_graphs"]),
    }


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
            import json

            counts = json.loads(Path(histogram).read_text()).get("counts") or []
            seq = min(case.seq, max(i + 1 for i, c in enumerate(counts) if c))
    unpacked, left = unpack_batches(batches, rows, seq, predictions, device)
    how = (
        f"the sequences of omnibert's packed rows, one per row of {seq} tokens, {rows} rows "
        f"a batch ({left} left over: fewer than a batch)"
    )
    return unpacked, {"how": how, "left_over_sequences": left, "peer_seq": seq}


def run_case(
    args: argparse.Namespace, case: Case, root: Path, deadline_at: float | None = None
) -> dict[str, Any]:
    """Both sides on ``case``'s sequences (module docstring); timed rounds stop early once
    ``time.monotonic()`` passes ``deadline_at`` (at least one round runs)."""
    from omnibert.models import BertForPreTraining
    from omnibert.optim.build import build_optimizer

    started = time.monotonic()
    prepared = compose_run(args, case, root)
    plugin, plan, config = prepared.plugin, prepared.plan, prepared.plan.model
    precision, rows = plan.precision, plan.batch.micro_batch_size
    modern = MODELS[case.model].modern
    attention = str(setting(args, case, "attention") or config.attention)
    scope = setting(args, case, "scope")
    ours_batches = take_batches(prepared, args.steps)
    torch.manual_seed(args.seed)
    ours = on_device(lambda: BertForPreTraining(config), plugin.device).train()
    models: dict[str, nn.Module] = {"omnibert": ours}
    inputs: dict[str, list[Any]] = {"omnibert": ours_batches}
    contract = {"omnibert": ours_batches}
    sides = {"omnibert": "omnibert"}
    peer: dict[str, Any] | None = None
    if setting(args, case, "peer") != "none":
        contract["hf"], peer = peer_of(args, case, ours_batches, rows, plugin.device)
        theirs = hf_modernbert(ours) if modern else hf_bert(ours)
        models["hf"] = HFStep(theirs).to(plugin.device).train()
        convert = hf_modern_inputs if modern else hf_bert_inputs
        inputs["hf"] = [convert(b) for b in contract["hf"]]
        sides["hf"] = "hf-modern" if modern else "hf"
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
    update = setting(args, case, "update")
    setup_seconds = time.monotonic() - started
    print(
        f"  setup {setup_seconds:.1f} s: {precision}, micro batch {rows}, compile "
        f"{compiled['scope']}, CUDA graphs {'on' if graphs else 'off'}, update per {update}, "
        f"{args.warmup} warm-up pass(es), {args.rounds} rounds of {args.steps} steps",
        flush=True,
    )

    def steps(name: str) -> Callable[[], float]:
        model, optimizer, batches = models[name], optimizers[name], inputs[name]
        every = len(batches) if update == "round" else 1

        def run() -> float:
            plugin.synchronize()
            start = time.perf_counter()
            for index, batch in enumerate(batches, 1):
                if graphs:
                    torch.compiler.cudagraph_mark_step_begin()
                with plugin.autocast(precision):
                    loss = model(batch)["loss"]
                loss.backward()
                if index % every == 0:
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=not graphs)
            plugin.synchronize()
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
        print(f"  warmed up {name} in {warmup[name]:.1f} s; dynamo compiled "
              f"{dynamo[name]['frames']} frame(s), {dynamo[name]['graphs']} graph(s)", flush=True)  # fmt: skip
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    peak: dict[str, int | None] = dict.fromkeys(runners)
    timed_start, cut = time.monotonic(), False
    for r in range(args.rounds):
        if r and deadline_at is not None and time.monotonic() > deadline_at:
            cut = True
            print(f"  deadline passed: {r} of {args.rounds} rounds timed", flush=True)
            break
        for name in list(runners) if r % 2 == 0 else list(reversed(runners)):
            plugin.reset_peak_memory()
            seconds[name].append(runners[name]())
            measured, _ = plugin.peak_memory()
            if measured is not None:
                peak[name] = max(peak[name] or 0, measured)
    profiles = (
        {name: profile_pass(run, plugin) for name, run in runners.items()} if args.profile else {}
    )
    flops_peak, device_name = peak_flops(plugin.device)
    histogram = case.histogram or args.length_histogram
    mean_length = histogram_mean_length(histogram)
    out: dict[str, Any] = {
        "model": case.model,
        "seq": case.seq,
        "packing": case.packing,
        "attention": attention,
        "options": case.options().removeprefix(", "),
        "length_histogram": histogram,
        "histogram_mean_length": mean_length,
        "precision": precision,
        "kernels": plan.kernels,
        "micro_batch": rows,
        "micro_batch_reason": getattr(plan.batch, "micro_batch_reason", None),
        "device": device_name,
        "compile": compiled,
        "cuda_graphs": graphs,
        "update": update,
        "rounds": len(seconds["omnibert"]),
        "rounds_cut_by_deadline": cut,
        "same_sequences": peer,
    }
    for name in runners:
        median = statistics.median(seconds[name])
        f = batch_facts(contract[name], config)
        tokens_per_sec = f["real_tokens"] / median
        at_mean = None
        if name == "omnibert" and mean_length and (case.packing != "none" or attention == "varlen"):
            at_mean = tokens_per_sec / mean_length  # rows cost what they hold: module docstring
        out[name] = {
            "rounds_seconds": [round(s, 5) for s in seconds[name]],
            "real_tokens_per_sec": tokens_per_sec,
            "sequences_per_sec": f["sequences"] / median,
            "sequences_per_sec_at_histogram_mean": at_mean,
            "sequences_per_round": f["sequences"],
            "sequences_per_step": f["sequences"] / len(contract[name]),
            "mean_sequence_tokens": f["real_tokens"] / max(f["sequences"], 1),
            "micro_batches_per_round": len(contract[name]),
            "optimizer_updates_per_round": 1 if update == "round" else len(contract[name]),
            "mfu": None if flops_peak is None else f["flops"] / median / flops_peak,
            "peak_memory_bytes": peak[name],
            "warmup_seconds": round(warmup[name], 3),
            "dynamo": dynamo[name],
            "work": work(contract[name], config, sides[name], attention),
        }
        if name in profiles:
            out[name]["profile"] = profiles[name]
    if "hf" in runners:
        ratios = [
            (out["omnibert"]["sequences_per_round"] / a) / (out["hf"]["sequences_per_round"] / b)
            for a, b in zip(seconds["omnibert"], seconds["hf"], strict=True)
        ]
        out["ratio_sequences_per_sec"] = statistics.median(ratios)
        executed = out["hf"]["work"]["flops_executed"] / out["hf"]["sequences_per_round"]
        ours_executed = out["omnibert"]["work"]["flops_executed"]
        out["ratio_work_per_sequence"] = executed / (
            ours_executed / out["omnibert"]["sequences_per_round"]
        )
    published = PUBLISHED.get((case.seq, case.packing != "none"))
    if published is not None and case.model == "large":
        value, source = published
        ours_rate = out["omnibert"]["sequences_per_sec_at_histogram_mean"]
        ours_rate = ours_rate or out["omnibert"]["sequences_per_sec"]
        out["published"] = {"sequences_per_sec": value, "source": source}
        out["ratio_to_published"] = ours_rate / value
    out["seconds"] = {
        "setup": round(setup_seconds, 3),
        "warmup": round(sum(warmup.values()), 3),
        "timed": round(time.monotonic() - timed_start, 3),
        "total": round(time.monotonic() - started, 3),
    }
    return out


def report(case: dict[str, Any]) -> str:
    compiled = case.get("compile", {}).get("scope", "n/a")
    lines = [
        f"{case.get('model', '?')} seq {case['seq']} packing {case['packing']}"
        + (f" ({case['options']})" if case.get("options") else "")
        + f" micro batch {case['micro_batch']} {case['precision']} on {case['device']}, compile "
        f"{compiled}, update per {case.get('update')}, {case.get('rounds', '?')} rounds"
    ]
    for name in ("omnibert", "hf"):
        if name not in case:
            continue
        r = case[name]
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        mem = "n/a" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
        at_mean = r.get("sequences_per_sec_at_histogram_mean")
        lines.append(
            f"  {name:<9} {r['real_tokens_per_sec']:12.0f} real tokens/s  "
            f"{r['sequences_per_sec']:9.1f} sequences/s"
            + (f" ({at_mean:.1f} at the histogram's mean)" if at_mean else "")
            + f"  MFU {mfu:>6}  peak {mem} GiB  ({r['sequences_per_step']:.1f} sequences of "
            f"{r['mean_sequence_tokens']:.0f} tokens a micro batch; warm-up "
            f"{r.get('warmup_seconds', float('nan')):.1f} s)"
        )
        w = r["work"]
        lines.append(
            f"            work a round: {w['token_rows_through_encoder']} token rows through the "
            f"encoder, {w['mlm_positions_scored']} MLM positions scored, "
            f"{w['flops_executed'] / 1e12:.2f} TFLOP"
        )
    if "ratio_sequences_per_sec" in case:
        lines.append(
            f"  ratio omnibert/hf on the same sequences (median of rounds): "
            f"{case['ratio_sequences_per_sec']:.3f}; hf executes "
            f"{case['ratio_work_per_sequence']:.2f}x omnibert's FLOPs a sequence"
        )
    for name in ("omnibert", "hf"):
        if case.get(name, {}).get("profile"):
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


def step_work(args: argparse.Namespace, case: Case) -> float:
    """A step's work, up to a constant: layers x rows x seq x hidden x (12 hidden + 2 seq)."""
    spec = MODELS[case.model]
    rows = (micro_batch(args, case) or 64) * case.seq
    return float(spec.layers * rows * spec.hidden * (12 * spec.hidden + 2 * case.seq))


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
    scale = step_work(args, case) / step_work(args, ran)
    if ran.model != case.model:
        fixed, how = 1.25 * (seconds["setup"] + seconds["warmup"]), "x1.25"
    elif ran.seq != case.seq:
        fixed, how = seconds["setup"] + seconds["warmup"], "x1"
    else:
        fixed, how = seconds["setup"] + 0.5 * seconds["warmup"], "half the warm-up"
    estimate = fixed + seconds["timed"] * scale
    return estimate, (
        f"{ran.label()} took {seconds['total']:.0f} s: setup and warm-up {how}, timed rounds "
        f"x{scale:.2f} the work"
    )


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
    import benchplot

    benchplot.add_arguments(parser)
    add("--smoke", action="store_true", help="tiny model, vocab 512, seq 32, 2 rounds of 2 steps (CPU unless --device)")  # fmt: skip
    args = parser.parse_args(argv)
    product = any(getattr(args, k) is not None for k in ("model", "seq", "packing"))
    presets: list[dict[str, Any]] = []  # explicit flags, then --smoke, then --lease, then defaults
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


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
