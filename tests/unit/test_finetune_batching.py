"""Dynamic padding of fine-tuning batches (omnibert.finetune.batching): a batch cut to its
longest row gives the loss and outputs of the full-width batch; evaluation runs rows longest
first and returns them in input order; the run's loader cuts its batches; data.padding is
checked before compute."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from finetune_data import mrpc_file

from omnibert.apps import finetune
from omnibert.apps.compose import compose
from omnibert.config import FinetuneConfig, FinetuneData
from omnibert.errors import UserError
from omnibert.finetune.batching import TrimPadding, length_order, trimmed_length
from omnibert.finetune.tokenizer import FineTuneInputError
from omnibert.run.finetuning.outputs import logits
from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

TINY = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)  # fmt: skip
WIDTH = 48
LENGTHS = [5, 48, 17, 9, 30, 9, 1, 23, 40, 12, 33]


def batch(lengths: list[int], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = len(lengths)
    mask = torch.zeros(n, WIDTH, dtype=torch.long)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    ids = torch.randint(5, 99, (n, WIDTH), generator=g) * mask
    segments = (torch.arange(WIDTH) >= 4).long().expand(n, WIDTH) * mask
    return {"input_ids": ids, "segment_ids": segments.contiguous(), "attention_mask": mask}


def task(kind: str) -> torch.nn.Module:
    torch.manual_seed(3)
    common = dict(model_config=TINY, optimizer={"lr": 1e-3}, schedule=None, total_steps=1)
    if kind == "qa":
        return QuestionAnsweringTask(**common)  # type: ignore[arg-type]
    return SequenceClassificationTask(**common, num_labels=3)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def mrpc_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mrpc")
    return mrpc_file(tmp / "train.tsv", 16, seed=1), mrpc_file(tmp / "dev.tsv", 8, seed=2)


def test_trimmed_length_rounds_up_to_the_multiple_and_never_past_the_width():
    mask = batch([5, 17, 9])["attention_mask"]
    assert trimmed_length(mask, 8) == 24
    assert trimmed_length(mask, 1) == 17
    assert trimmed_length(mask, 32) == 32
    assert trimmed_length(batch([47])["attention_mask"], 8) == WIDTH  # 48, not 56
    assert trimmed_length(batch([0, 0])["attention_mask"], 8) == 8


def test_the_collate_cuts_row_tensors_only_and_max_length_keeps_the_width():
    rows = batch([5, 17, 9])
    items = [{**{k: v[i] for k, v in rows.items()}, "labels": torch.tensor(i)} for i in range(3)]
    cut = TrimPadding(8)(items)
    assert {k: tuple(v.shape) for k, v in cut.items()} == {
        "input_ids": (3, 24), "segment_ids": (3, 24), "attention_mask": (3, 24), "labels": (3,)
    }  # fmt: skip
    assert torch.equal(cut["input_ids"], rows["input_ids"][:, :24])
    full = TrimPadding.of(FinetuneData(padding="max_length", pad_to_multiple_of=8))(items)
    assert full["input_ids"].shape == (3, WIDTH)
    with pytest.raises(ValueError, match="pad_to_multiple_of=0"):
        TrimPadding(0)


def test_length_order_runs_longest_first_and_covers_every_row_once():
    mask = batch(LENGTHS)["attention_mask"]
    order = list(length_order(mask, 4))
    assert [len(b) for b in order] == [4, 4, 3]
    flat = torch.cat(order).tolist()
    assert sorted(flat) == list(range(len(LENGTHS)))
    assert [LENGTHS[i] for i in flat] == sorted(LENGTHS, reverse=True)
    assert flat.index(3) < flat.index(5)  # equal lengths keep input order


def test_the_qa_loss_of_a_cut_batch_equals_the_full_width_loss():
    qa = task("qa")
    rows = batch(LENGTHS)
    rows["start_positions"] = torch.tensor([min(2, n - 1) for n in LENGTHS])
    rows["end_positions"] = torch.tensor([n - 1 for n in LENGTHS])
    full = qa.training_step(rows, 0)
    cut = qa.training_step(TrimPadding(8).trim(rows), 0)
    assert cut.shape == () and torch.isfinite(cut)
    torch.testing.assert_close(cut, full, rtol=1e-5, atol=1e-6)
    # the padding columns of the full batch take no probability: moving their logits does
    # not move the loss (the unmasked Hugging Face loss would)
    start, end = qa(rows)
    moved = qa.model.loss(start + 5 * (1 - rows["attention_mask"]), end,
                          rows["start_positions"], rows["end_positions"],
                          rows["attention_mask"])  # fmt: skip
    torch.testing.assert_close(moved, full, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("kind", ["qa", "classification"])
def test_length_ordered_logits_equal_the_full_width_ones_in_input_order(kind):
    model = task(kind)
    rows = batch(LENGTHS, seed=1)
    full = logits(model, rows, 4, trim=TrimPadding(enabled=False))
    cut = logits(model, rows, 4)
    seen: list[tuple[int, int]] = []
    cut_again = logits(model, rows, 4, progress=lambda done, n: seen.append((done, n)))
    assert seen == [(4, 11), (8, 11), (11, 11)]
    if kind == "classification":
        assert full.shape == cut.shape == (len(LENGTHS), 3)
        np.testing.assert_allclose(cut, full, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(cut, cut_again)
        return
    for full_part, cut_part in zip(full, cut, strict=True):
        assert full_part.shape == cut_part.shape == (len(LENGTHS), WIDTH)
        for row, length in enumerate(LENGTHS):
            np.testing.assert_allclose(cut_part[row, :length], full_part[row, :length],
                                       rtol=1e-4, atol=1e-5)  # fmt: skip
            # what no batch computed is -inf: no answer starts or ends in padding
            width = -(-max(x for x in LENGTHS if x <= 48) // 8) * 8
            assert np.isneginf(cut_part[row, width:]).all()


def test_the_run_loader_cuts_each_batch_to_its_longest_row(tmp_path, tiny_hf, mrpc_files):
    train, _ = mrpc_files
    base = ["task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
            f"paths.output_root={tmp_path}", "task.batch_size=4", "task.max_seq_length=64",
            "logger=none"]  # fmt: skip
    from omnibert.run.finetuning.job import build, prepare

    widths = {}
    for padding in ("longest", "max_length"):
        prepared = prepare(
            FinetuneConfig.of(
                compose("finetune", [*base, f"data.padding={padding}"]), FineTuneInputError
            )
        )
        run = build(prepared, tmp_path / padding)
        run.prepared.datamodule.trainer = None
        loader = run.prepared.datamodule.train_dataloader()
        widths[padding] = {int(b["input_ids"].shape[1]) for b in loader}
        longest = int(prepared.job.train_tensors["attention_mask"].sum(1).max())
    assert widths["max_length"] == {64}
    assert max(widths["longest"]) == -(-longest // 8) * 8 < 64
    assert all(w % 8 == 0 for w in widths["longest"])


def test_a_bad_padding_key_is_refused_naming_it(tmp_path, tiny_hf, mrpc_files):
    train, _ = mrpc_files
    base = ["task=mrpc", f"data.train_file={train}", f"model.init_from={tiny_hf}",
            f"paths.output_root={tmp_path}"]  # fmt: skip
    with pytest.raises(UserError, match=re.escape("data.padding='dynamic' is not one of")):
        finetune.run(compose("finetune", [*base, "data.padding=dynamic"]))
    with pytest.raises(UserError, match=re.escape("data.pad_to_multiple_of=0 must be")):
        finetune.run(compose("finetune", [*base, "data.pad_to_multiple_of=0"]))
    assert not (tmp_path / "mrpc-seed42").exists()
