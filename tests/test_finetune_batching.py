"""Dynamic padding (data.padding=longest): a batch is cut to its longest real row rounded up to
the multiple, the labels untouched; the logits of real tokens and the classification outputs
equal those of the full-length batch in the input order, with rows run shortest first."""

from __future__ import annotations

import numpy as np
import torch

from omnibert.finetune.batching import TrimPadding, trimmed_length
from omnibert.run.finetuning import logits
from omnibert.tasks import QuestionAnsweringTask, SequenceClassificationTask

TINY = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64)  # fmt: skip


def _rows(lengths: list[int], width: int = 40) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    n = len(lengths)
    mask = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).long()
    ids = torch.randint(5, 120, (n, width), generator=gen) * mask
    segments = (torch.arange(width)[None, :] >= 4).long() * mask
    return {"input_ids": ids, "segment_ids": segments, "attention_mask": mask,
            "start_positions": torch.tensor(lengths) - 1}  # fmt: skip


def test_a_batch_is_cut_to_its_longest_row_rounded_up():
    rows = _rows([5, 11, 9])
    batch = TrimPadding(8)([{k: v[i] for k, v in rows.items()} for i in range(3)])
    assert batch["input_ids"].shape == (3, 16) and batch["attention_mask"].shape == (3, 16)
    assert torch.equal(batch["input_ids"], rows["input_ids"][:, :16])
    assert torch.equal(batch["start_positions"], rows["start_positions"])
    assert trimmed_length(rows["attention_mask"], 8) == 16
    assert trimmed_length(_rows([40])["attention_mask"], 64) == 40  # never wider than S
    full = TrimPadding(8, enabled=False)([{k: v[i] for k, v in rows.items()} for i in range(3)])
    assert full["input_ids"].shape == (3, 40)


def test_trimmed_bucketed_logits_equal_the_full_length_ones_in_input_order():
    torch.manual_seed(0)
    rows = _rows([30, 6, 17, 9, 40, 12, 3])
    rows.pop("start_positions")
    real = rows["attention_mask"].numpy().astype(bool)
    qa = QuestionAnsweringTask(TINY)
    full = logits(qa, rows, 3, trim=TrimPadding(8, enabled=False))
    cut = logits(qa, rows, 3)
    for a, b in zip(full, cut, strict=True):
        np.testing.assert_allclose(b[real], a[real], atol=1e-5, rtol=1e-5)
        assert np.isneginf(b[~real & (np.arange(40)[None, :] >= 8)]).any()  # cut columns
    classifier = SequenceClassificationTask(TINY, recipe={"num_labels": 3})
    full = logits(classifier, rows, 3, trim=TrimPadding(8, enabled=False))
    np.testing.assert_allclose(logits(classifier, rows, 3), full, atol=1e-5, rtol=1e-5)
