"""TensorFlow 1 (Google / MLPerf) BERT checkpoints read without TensorFlow: the bundle reader
against checkpoints real TensorFlow wrote (tests/fixtures/tf1, see its README), the name
mapping against Hugging Face's BertForPreTraining, the refusals, the export app and training
from one (model.init_from + model.bert_config)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from omnibert.apps import export as export_app
from omnibert.apps.compose import compose
from omnibert.apps.train import run_or_exit
from omnibert.config import TrainConfig
from omnibert.convert.tf1 import (
    google_names,
    is_ignored,
    load_tf1_into,
    model_from_tf1,
    read_bert_config,
    resolve_bert_config,
)
from omnibert.convert.tf1_bundle import (
    TF1Checkpoint,
    TF1CheckpointError,
    is_tf1_checkpoint,
    masked_crc32c,
    read_tf1_checkpoint,
)
from omnibert.errors import UserError
from omnibert.formats.example_proto import read_varint
from omnibert.models import BertForPreTraining
from omnibert.run.pretraining.job import build_task, prepare

FIXTURE = Path(__file__).parents[1] / "fixtures" / "tf1"
PREFIX = FIXTURE / "model.ckpt-7"
SHARDED = FIXTURE / "sharded" / "model.ckpt-7"
BERT_CONFIG = FIXTURE / "bert_config.json"
DATA = PREFIX.with_name(PREFIX.name + ".data-00000-of-00001")
INDEX = PREFIX.with_name(PREFIX.name + ".index")
VOCAB = 100


@pytest.fixture(scope="module")
def expected() -> dict[str, np.ndarray]:
    with np.load(FIXTURE / "expected.npz") as npz:
        return {k: npz[k] for k in npz.files}


def model_variables(expected: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in expected.items() if ":" not in k and not is_ignored(k)}


def one_sentence(err: pytest.ExceptionInfo) -> str:
    text = str(err.value)
    assert "\n" not in text and text.endswith("."), text
    assert isinstance(err.value, UserError)
    return text


def copy_checkpoint(prefix: Path, to: Path) -> Path:
    """The checkpoint's files (and bert_config.json) copied under ``to``: its new prefix."""
    to.mkdir(parents=True, exist_ok=True)
    for path in prefix.parent.glob(prefix.name + ".*"):
        shutil.copy(path, to / path.name)
    shutil.copy(BERT_CONFIG, to / "bert_config.json")
    return to / prefix.name


@pytest.mark.parametrize("prefix", [PREFIX, SHARDED], ids=["one-shard", "two-shards"])
def test_every_variable_equals_what_tensorflow_saved(prefix: Path, expected) -> None:
    assert is_tf1_checkpoint(prefix) and not is_tf1_checkpoint(FIXTURE)
    checkpoint = TF1Checkpoint(prefix)
    assert checkpoint.num_shards == (2 if prefix == SHARDED else 1)
    tensors = read_tf1_checkpoint(prefix)
    saved = {k: v for k, v in expected.items() if ":" not in k}
    assert sorted(tensors) == sorted(saved)
    for name, value in saved.items():
        got = tensors[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name
    assert tensors["global_step"].dtype == np.int64 and int(tensors["global_step"]) == 7
    # 46 weights of a 2-layer BERT, an adam_m and adam_v slot for each, and global_step
    assert len(model_variables(expected)) == 46 and len(saved) == 46 * 3 + 1


def test_other_dtypes_tensorflow_wrote(expected) -> None:
    tensors = read_tf1_checkpoint(FIXTURE / "dtypes" / "model.ckpt")
    dtypes = {k.split(":", 1)[1]: v for k, v in expected.items() if k.startswith("dtypes:")}
    assert sorted(tensors) == sorted(dtypes)
    for name, value in dtypes.items():
        assert tensors[name].dtype == value.dtype and tensors[name].shape == value.shape, name
        assert tensors[name].tobytes() == value.tobytes(), name
    assert {str(tensors[k].dtype) for k in ("half", "bfloat16", "double")} == {
        "float16",
        "float32",  # bfloat16 widened exactly
        "float64",
    }


def test_mapping_by_hand_and_ignored_state(expected) -> None:
    model = model_from_tf1(PREFIX)  # bert_config.json found next to the checkpoint
    config = model.config
    assert (config.vocab_size, config.padded_vocab_size, config.num_hidden_layers) == (100, 104, 2)
    query = expected["bert/encoder/layer_1/attention/self/query/kernel"]  # [in, out]
    weight = model.bert.encoder.layer[1].attention.self.query.weight  # [out, in]
    assert torch.equal(weight, torch.from_numpy(query.T.copy()))
    assert weight[3, 5].item() == float(query[5, 3])
    nsp = expected["cls/seq_relationship/output_weights"]  # [2, hidden]: not transposed
    assert torch.equal(model.cls.seq_relationship.weight, torch.from_numpy(nsp))
    gamma = expected["bert/encoder/layer_0/output/LayerNorm/gamma"]
    assert torch.equal(model.bert.encoder.layer[0].output.LayerNorm.weight, torch.from_numpy(gamma))
    words = model.bert.embeddings.word_embeddings.weight
    assert torch.equal(words[:VOCAB], torch.from_numpy(expected["bert/embeddings/word_embeddings"]))
    assert not words[VOCAB:].any() and not model.cls.predictions.bias[VOCAB:].any()
    assert model.cls.predictions.decoder.weight is words  # tied
    bias = expected["cls/predictions/output_bias"]
    assert torch.equal(model.cls.predictions.bias[:VOCAB], torch.from_numpy(bias))
    # every slot and the step counter are ignored; nothing else is
    assert is_ignored("bert/pooler/dense/kernel/adam_m") and is_ignored("global_step")
    assert is_ignored("bert/pooler/dense/kernel/LAMB_1") and is_ignored("good_steps")
    assert not is_ignored("bert/pooler/dense/kernel")
    report = load_tf1_into(BertForPreTraining(config), SHARDED)
    assert "46 tensors of BERT L2-H16 (vocab 100, padded to 104) loaded" in report
    assert "93 optimiser/step variable(s) ignored" in report


def random_inputs(batch: int = 3, seq: int = 12) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(5)
    ids = torch.randint(1, VOCAB, (batch, seq), generator=gen)
    segments = torch.randint(0, 2, (batch, seq), generator=gen)
    attention = torch.ones(batch, seq, dtype=torch.long)
    attention[1, 8:] = 0
    return ids, segments, attention


def test_export_app_matches_transformers(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(VOCAB)))
    out = tmp_path / "hf"
    cfg = compose(
        "export",
        [f"ckpt={PREFIX}", f"bert_config={BERT_CONFIG}", f"vocab_file={vocab}", f"out={out}",
         "heads=pretraining"],
    )  # fmt: skip
    export_app.run(cfg)
    assert sorted(p.name for p in out.iterdir()) == [
        "README.md",  # the model card (no tokenizer files: this vocab has no [CLS] ...)
        "config.json",
        "model.safetensors",
        "vocab.txt",
    ]
    hf, info = transformers.BertForPreTraining.from_pretrained(str(out), output_loading_info=True)
    assert not any(info.values()), info
    assert json.loads((out / "config.json").read_text())["vocab_size"] == VOCAB
    ours = model_from_tf1(PREFIX, BERT_CONFIG).eval()
    ids, segments, attention = random_inputs()
    batch, seq = ids.shape
    positions = torch.arange(seq).expand(batch, seq)
    with torch.no_grad():
        got = ours(
            {
                "input_ids": ids,
                "segment_ids": segments,
                "position_ids": positions,
                "sequence_ids": attention,
                "masked_lm_positions": positions,
                "masked_lm_ids": ids,
                "masked_lm_weights": attention.float(),
                "nsp_positions": torch.zeros(batch, 1, dtype=torch.long),
                "nsp_labels": torch.zeros(batch, 1, dtype=torch.long),
                "nsp_weights": torch.ones(batch, 1),
            },
            return_logits=True,
        )
        want = hf.eval()(input_ids=ids, token_type_ids=segments, attention_mask=attention)
    real = attention.bool()
    torch.testing.assert_close(
        got["mlm_logits"][..., :VOCAB][real], want.prediction_logits[real], rtol=1e-5, atol=1e-5
    )
    torch.testing.assert_close(
        got["nsp_logits"][:, 0], want.seq_relationship_logits, rtol=1e-5, atol=1e-5
    )
    # the HF weights are the checkpoint's (a transposed kernel, checked by hand)
    kernel = read_tf1_checkpoint(PREFIX, ["bert/encoder/layer_0/intermediate/dense/kernel"])
    assert torch.equal(
        hf.bert.encoder.layer[0].intermediate.dense.weight,
        torch.from_numpy(kernel["bert/encoder/layer_0/intermediate/dense/kernel"].T.copy()),
    )


def snappy_flagged(index: bytes) -> bytes:
    """The index with its first data block's trailer saying "snappy" (checksum recomputed)."""
    footer = len(index) - 48
    _, pos = read_varint(index, footer, footer + 40)  # metaindex offset, size
    _, pos = read_varint(index, pos, footer + 40)
    block_offset, pos = read_varint(index, pos, footer + 40)  # the index block
    _, pos = read_varint(index, block_offset, footer)  # its first entry: shared (0) ...
    key_length, pos = read_varint(index, pos, footer)  # ... the key's length ...
    _, pos = read_varint(index, pos, footer)  # ... the value's length, the key, the value
    pos += key_length
    data_offset, pos = read_varint(index, pos, footer)  # the first data block's handle
    data_size, _ = read_varint(index, pos, footer)
    end = data_offset + data_size
    out = bytearray(index)
    out[end] = 1
    out[end + 1 : end + 5] = masked_crc32c(bytes(out[data_offset : end + 1])).to_bytes(4, "little")
    return bytes(out)


def test_corrupt_truncated_and_missing_files_are_refused(tmp_path: Path) -> None:
    flipped = copy_checkpoint(PREFIX, tmp_path / "flipped")
    data = bytearray(DATA.read_bytes())
    checkpoint = TF1Checkpoint(flipped)
    entry = checkpoint.entries["bert/pooler/dense/kernel"]
    data[entry.offset + 5] ^= 0x40
    Path(f"{flipped}.data-00000-of-00001").write_bytes(bytes(data))
    assert checkpoint.read("bert/embeddings/word_embeddings").shape == (VOCAB, 16)  # untouched
    with pytest.raises(TF1CheckpointError) as err:
        checkpoint.read("bert/pooler/dense/kernel")
    text = one_sentence(err)
    assert "data-00000-of-00001 is corrupt" in text and "bert/pooler/dense/kernel" in text
    model = BertForPreTraining(read_bert_config(BERT_CONFIG))
    with pytest.raises(TF1CheckpointError):
        load_tf1_into(model, flipped)

    truncated = copy_checkpoint(PREFIX, tmp_path / "truncated")
    shard = Path(f"{truncated}.data-00000-of-00001")
    shard.write_bytes(DATA.read_bytes()[: DATA.stat().st_size // 2])
    with pytest.raises(TF1CheckpointError) as err:
        load_tf1_into(BertForPreTraining(read_bert_config(BERT_CONFIG)), truncated)
    assert f"{shard} is truncated" in one_sentence(err)

    index = copy_checkpoint(PREFIX, tmp_path / "index")
    Path(f"{index}.index").write_bytes(INDEX.read_bytes()[:-10])
    with pytest.raises(TF1CheckpointError) as err:
        TF1Checkpoint(index)
    assert "index" in one_sentence(err) and "truncated" in str(err.value)
    raw = bytearray(INDEX.read_bytes())
    raw[40] ^= 0x01  # inside the first data block: its block checksum fails
    Path(f"{index}.index").write_bytes(bytes(raw))
    with pytest.raises(TF1CheckpointError) as err:
        TF1Checkpoint(index)
    assert "crc32c" in one_sentence(err)

    # a snappy-compressed block (TensorFlow never writes one): refused as such, not misread
    Path(f"{index}.index").write_bytes(snappy_flagged(INDEX.read_bytes()))
    with pytest.raises(TF1CheckpointError) as err:
        TF1Checkpoint(index)
    assert "snappy-compressed" in one_sentence(err)

    missing = copy_checkpoint(SHARDED, tmp_path / "missing")
    Path(f"{missing}.data-00001-of-00002").unlink()
    with pytest.raises(TF1CheckpointError) as err:
        TF1Checkpoint(missing)
    assert f"{missing}.data-00001-of-00002 is missing" in one_sentence(err)


def test_shape_mismatch_and_unknown_variable_are_refused(tmp_path: Path) -> None:
    wider = tmp_path / "bert_config.json"
    wider.write_text(json.dumps({**json.loads(BERT_CONFIG.read_text()), "intermediate_size": 48}))
    model = BertForPreTraining(read_bert_config(wider))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(TF1CheckpointError) as err:
        load_tf1_into(model, PREFIX)
    text = one_sentence(err)
    assert "intermediate/dense/kernel of shape (16, 32) but the model needs (16, 48)" in text
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    # a checkpoint with one more layer than its bert_config.json says: an unknown variable
    fewer = tmp_path / "fewer.json"
    fewer.write_text(json.dumps({**json.loads(BERT_CONFIG.read_text()), "num_hidden_layers": 1}))
    with pytest.raises(TF1CheckpointError) as err:
        model_from_tf1(PREFIX, fewer)
    assert "e.g. bert/encoder/layer_1/" in one_sentence(err)
    alone = copy_checkpoint(PREFIX, tmp_path / "alone")
    assert resolve_bert_config(alone, None) == alone.parent / "bert_config.json"
    (alone.parent / "bert_config.json").unlink()
    with pytest.raises(TF1CheckpointError) as err:
        resolve_bert_config(alone, None)
    assert "pass bert_config=" in one_sentence(err)


def test_export_app_refusals(tmp_path: Path, capsys) -> None:
    out = tmp_path / "hf"
    cfg = compose("export", [f"ckpt={FIXTURE}", f"out={out}"])
    with pytest.raises(UserError) as err:
        export_app.run(cfg)
    assert f"e.g. {PREFIX}" in one_sentence(err)  # a directory: the prefix it holds
    cfg = compose("export", [f"ckpt={FIXTURE / 'model.ckpt'}", f"out={out}"])
    with pytest.raises(UserError) as err:
        export_app.run(cfg)
    assert f"e.g. {PREFIX}" in one_sentence(err)  # the step left out
    alone = copy_checkpoint(PREFIX, tmp_path / "alone")
    (alone.parent / "bert_config.json").unlink()
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"tok{i}\n" for i in range(VOCAB)))
    cfg = compose("export", [f"ckpt={alone}", f"out={out}", f"vocab_file={vocab}"])
    with pytest.raises(UserError) as err:
        export_app.run(cfg)
    assert "pass bert_config=" in one_sentence(err)
    assert not out.exists()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "omnibert.apps.export",
            f"ckpt={alone}",
            f"out={out}",
            f"hydra.run.dir={tmp_path / 'hydra'}",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no vocab.txt next to it" in lines[0], result.stderr
    assert not out.exists()


def train_overrides(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "experiment=smoke",
        f"paths.output_root={tmp_path}",
        f"model.init_from={PREFIX}",
        f"model.bert_config={BERT_CONFIG}",
        "model.config.hidden_size=16",
        "model.config.num_hidden_layers=2",
        "model.config.intermediate_size=32",
        f"data.vocab_size={VOCAB}",
        "phase.max_steps=2",
        *extra,
    ]


def test_training_starts_from_a_tf1_checkpoint(tmp_path: Path, expected) -> None:
    cfg = compose("pretrain", train_overrides(tmp_path))
    prepared = prepare(TrainConfig.of(cfg))
    assert prepared.plan.init_bert_config == str(BERT_CONFIG)
    task, loaded = build_task(prepared)
    assert loaded.startswith(f"TensorFlow checkpoint {PREFIX}: 46 tensors"), loaded
    assert task.hparams["init_bert_config"] == str(BERT_CONFIG)
    query = expected["bert/encoder/layer_0/attention/self/query/kernel"]
    assert torch.equal(
        task.model.bert.encoder.layer[0].attention.self.query.weight,
        torch.from_numpy(query.T.copy()),
    )
    state = task.model.state_dict()
    for name, (param, transpose) in google_names(task.config).items():
        value = torch.from_numpy((expected[name].T if transpose else expected[name]).copy())
        assert torch.equal(state[param][: value.shape[0]], value), name
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = run_or_exit(cfg, tmp_path / "run")
    finally:
        torch.set_num_threads(threads)
    assert summary["steps"] == 2
    assert summary["plan"]["init_from"] == str(PREFIX)
    saved = torch.load(summary["last_checkpoint"], map_location="cpu", weights_only=True)
    assert saved["hyper_parameters"]["init_bert_config"] == str(BERT_CONFIG)
    trained = saved["state_dict"]["model.bert.encoder.layer.0.attention.self.query.weight"]
    assert trained.shape == (16, 16) and not torch.equal(trained, torch.from_numpy(query.T.copy()))


def test_training_refuses_a_tf1_checkpoint_of_another_architecture(tmp_path: Path) -> None:
    cfg = compose("pretrain", train_overrides(tmp_path, "model.config.hidden_size=32"))
    with pytest.raises(UserError) as err:
        prepare(TrainConfig.of(cfg))
    text = one_sentence(err)
    assert "hidden_size=16 (this model: 32)" in text and str(BERT_CONFIG) in text
    cfg = compose("pretrain", train_overrides(tmp_path, "model.init_from=null"))
    with pytest.raises(UserError) as err:
        prepare(TrainConfig.of(cfg))
    assert "model.bert_config" in one_sentence(err)
    missing = copy_checkpoint(SHARDED, tmp_path / "missing")
    Path(f"{missing}.data-00000-of-00002").unlink()
    cfg = compose("pretrain", train_overrides(tmp_path, f"model.init_from={missing}"))
    with pytest.raises(UserError) as err:
        prepare(TrainConfig.of(cfg))  # before any model is built
    assert "data-00000-of-00002 is missing" in one_sentence(err)
