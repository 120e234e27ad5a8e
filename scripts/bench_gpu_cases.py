"""The cases of ``scripts/bench_gpu.py``: the model sizes, the ``--cases`` grammar
(``MODEL:SEQ:PACKING[:HISTOGRAM][:KEY=VALUE...]``), what a case sets beyond the command's
flags, and how long a case is estimated to take (for ``--deadline``)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

#: the repository root (this file is scripts/bench_gpu_cases.py): fixtures resolve from any cwd
REPO = Path(__file__).resolve().parents[1]
#: ``HISTOGRAM`` names a case may use instead of a path
HISTOGRAMS = {"wiki": REPO / "tests" / "fixtures" / "wikipedia_seqlen_histogram_512.json"}
#: published per-GPU figures: (seq, packed) -> (sequences/s, source)
PUBLISHED: dict[tuple[int, bool], tuple[float, str]] = {
    (512, False): (207.0, "NVIDIA DeepLearningExamples phase 2, A100-80GB, mixed precision"),
    (512, True): (970.0, "MLPerf Training 3.0 NVIDIA, H100, phase 2 packed"),
}
#: masks per sequence by sequence length (the phases'), else seq // 6
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
