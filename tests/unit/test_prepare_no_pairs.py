"""``omnibert-prepare next_sentence=false``: instances for an MLM-only model. Each is
``[CLS] A [SEP]`` with ``A`` a contiguous run of one document's tokens (segment 0, label 0),
masked by the reference's rules; metadata.json records ``next_sentence: false``; the
default's output and identity are unchanged (the bit-exact tests in test_instances.py and
test_prepare.py)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import datasets
import numpy as np
import pytest

from omnibert.apps.compose import compose
from omnibert.data.integrity import repair_command
from omnibert.prepare.instances import (
    InstanceSettings,
    create_instances,
    read_lines,
    tokenize_documents,
)
from omnibert.prepare.metadata import fingerprint
from omnibert.prepare.pipeline import prepare
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab

REFERENCE = Path(__file__).parents[1] / "fixtures" / "reference"
WIKI = REFERENCE / "wiki_like.txt"


def _documents(vocab: Vocab):
    tokenizer = BertTokenizer(vocab, do_lower_case=True)
    return tokenize_documents(read_lines(WIKI), tokenizer.tokenize_lines)


def _doc_texts(docs) -> list[str]:
    """Each document's tokens as ",1,2,3," (a row's run is found by substring)."""
    out = []
    for d in range(docs.num_documents):
        a, b = docs.seg_offsets[docs.doc_offsets[d]], docs.seg_offsets[docs.doc_offsets[d + 1]]
        out.append("," + ",".join(map(str, docs.tokens[a:b].tolist())) + ",")
    return out


@pytest.mark.parametrize("whole_word", [False, True])
def test_every_instance_is_one_segment_of_a_document_masked_at_the_rate(
    bert_vocab_file: Path, whole_word: bool
):
    vocab = Vocab.from_file(bert_vocab_file)
    docs = _documents(vocab)
    settings = InstanceSettings(max_seq_length=64, max_predictions_per_seq=20,
                                masked_lm_prob=0.3, dupe_factor=2, do_whole_word_mask=whole_word,
                                next_sentence=False)  # fmt: skip
    instances = create_instances(docs, vocab, settings)
    texts = _doc_texts(docs)
    assert len(instances) > 20
    masked = tokens = 0
    for i in range(len(instances)):
        row = instances.row(i)
        ids, positions = list(row["input_ids"]), row["masked_lm_positions"]
        n = len(ids)
        assert 3 <= n <= 64
        assert row["segment_ids"] == [0] * n and row["next_sentence_label"] == 0
        assert ids[0] == vocab.cls_id and ids[-1] == vocab.sep_id
        wanted = min(20, max(1, int(np.rint(n * 0.3))))
        # whole words: a word that would overshoot the count is skipped, so at most that
        assert len(positions) == wanted if not whole_word else 1 <= len(positions) <= wanted
        assert positions == sorted(positions) and 0 not in positions and n - 1 not in positions
        original = ids[:]
        for p, label in zip(positions, row["masked_lm_ids"], strict=True):
            original[p] = label
        assert vocab.sep_id not in original[1:-1]
        if whole_word:  # a masked ## piece's word is masked whole (from the row's start)
            for p in positions:
                if p > 1 and vocab.is_subword[original[p]]:
                    assert p - 1 in positions
        run = "," + ",".join(map(str, original[1:-1])) + ","
        assert any(run in text for text in texts), f"row {i} is not a run of one document"
        masked, tokens = masked + len(positions), tokens + n
    assert masked / tokens == pytest.approx(0.3, abs=0.02)


def test_without_short_rows_the_chunks_tile_each_document(bert_vocab_file: Path):
    vocab = Vocab.from_file(bert_vocab_file)
    docs = _documents(vocab)
    settings = InstanceSettings(max_seq_length=48, max_predictions_per_seq=10, dupe_factor=1,
                                short_seq_prob=0.0, next_sentence=False)  # fmt: skip
    instances = create_instances(docs, vocab, settings)
    lengths = instances.lengths - 2
    assert int(lengths.sum()) == docs.num_tokens  # every token once, none twice
    assert (lengths <= 46).all()
    # a document of L tokens gives ceil(L / 46) chunks
    per_doc = [int(np.diff(docs.seg_offsets[docs.doc_offsets[[d, d + 1]]])[0])
               for d in range(docs.num_documents)]  # fmt: skip
    assert len(instances) == sum(-(-size // 46) for size in per_doc)


def test_the_default_and_earlier_data_keep_their_identity(bert_vocab_file: Path):
    vocab = Vocab.from_file(bert_vocab_file)
    default, single = InstanceSettings(), InstanceSettings(next_sentence=False)
    assert "next_sentence" not in default.record()
    assert single.record()["next_sentence"] is False
    # the default's fingerprint is the one computed before the key existed: the record of
    # the reference's flags only
    assert fingerprint(default, vocab, True, ["x"]) != fingerprint(single, vocab, True, ["x"])
    record = default.record()
    assert set(record) == {"max_seq_length", "max_predictions_per_seq", "masked_lm_prob",
                           "short_seq_prob", "dupe_factor", "random_seed",
                           "do_whole_word_mask"}  # fmt: skip


def test_prepare_records_it_and_training_reads_it_without_a_warning(
    bert_vocab_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    settings = InstanceSettings(max_seq_length=32, max_predictions_per_seq=10,
                                masked_lm_prob=0.3, dupe_factor=1, next_sentence=False)  # fmt: skip
    out = tmp_path / "train"
    prepare([str(WIKI)], bert_vocab_file, out, settings, progress=False)
    meta = json.loads((out / "metadata.json").read_text())
    assert meta["settings"]["next_sentence"] is False
    assert meta["settings"]["masked_lm_prob"] == 0.3
    assert meta["counts"]["random_next"] == 0
    assert "next_sentence=false" in repair_command(meta, out)
    rows = datasets.load_from_disk(str(out))
    assert set(rows["next_sentence_label"]) == {0}
    assert all(set(s) == {0} for s in rows["segment_ids"])
    # re-running the same command is a no-op (the identity matches)
    again = prepare([str(WIKI)], bert_vocab_file, out, settings, progress=False)
    assert again.already_complete
    # the default's record: no next_sentence key (as every earlier metadata.json)
    plain = tmp_path / "plain"
    prepare([str(WIKI)], bert_vocab_file, plain, InstanceSettings(max_seq_length=32,
            max_predictions_per_seq=10, dupe_factor=1), progress=False)  # fmt: skip
    assert "next_sentence" not in json.loads((plain / "metadata.json").read_text())["settings"]

    # the data loads for training, checked, without a warning
    from omnibert.data.datamodule import PretrainingDataModule

    cfg = compose("pretrain", [f"data.train_path={out}", "data.eval_path=null",
                               f"data.vocab_file={bert_vocab_file}", "phase.max_seq_length=32",
                               "phase.max_predictions_per_seq=10",
                               f"paths.output_root={tmp_path}"])  # fmt: skip
    data = dict(cfg.data)
    data.pop("_target_")
    from hydra.utils import instantiate

    source = instantiate(cfg.data.source)
    with caplog.at_level(logging.WARNING):
        module = PretrainingDataModule(
            source=source,
            **{k: v for k, v in data.items() if k != "source"},
            micro_batch_size=4,
        )
        module.check()
    assert module.num_train_samples == len(rows)
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_the_app_takes_the_key(bert_vocab_file: Path, tmp_path: Path):
    from omnibert.apps import prepare as prepare_app

    cfg = compose("prepare", [f"input_files=[{WIKI}]", f"vocab_file={bert_vocab_file}",
                              f"output_dir={tmp_path / 'out'}", "max_seq_length=32",
                              "max_predictions_per_seq=10", "masked_lm_prob=0.3",
                              "dupe_factor=1", "next_sentence=false", "progress=false"])  # fmt: skip
    prepare_app.run(cfg)
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["settings"]["next_sentence"] is False
