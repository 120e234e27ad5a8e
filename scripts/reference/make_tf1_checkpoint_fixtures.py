"""Write ``tests/fixtures/tf1/``: tiny Google-BERT checkpoints saved by real TensorFlow 1 code.

Usage (TensorFlow stays out of omnibert's venv; a throwaway one is enough)::

    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install tensorflow-cpu==2.16.1 numpy
    /tmp/tfenv/bin/python scripts/reference/make_tf1_checkpoint_fixtures.py

The graph is built with ``tf.compat.v1`` variables and saved with ``tf.compat.v1.train.Saver``
(checkpoint format V2), the API MLPerf's ``model.ckpt-28252`` was written with. It holds every
variable of Google's ``modeling.py`` ``BertModel`` + pretraining heads under Google's names
(a 2-layer, 16-wide BERT with a 100-token vocab), an ``adam_m`` and ``adam_v`` slot for each
(as Google's and MLPerf's LAMB/Adam optimisers name them) and an int64 ``global_step``, all
with seeded values. Written:

* ``model.ckpt-7.index`` + ``model.ckpt-7.data-00000-of-00001``: one shard;
* ``sharded/model.ckpt-7.index`` + ``.data-0000{0,1}-of-00002``: the same variables split over
  two devices (``Saver(sharded=True)``, two CPU devices), so the data lies in two shards;
* ``dtypes/model.ckpt.*``: a few variables of the other dtypes the reader supports;
* ``bert_config.json``: Google's format; ``expected.npz``: every variable as TensorFlow reads
  it back from the saved checkpoint (``tf.train.load_checkpoint``), the values the tests
  compare with bit for bit.

No ``.meta`` graph is written (it is not needed to read weights and would dominate the size).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np
import tensorflow as tf

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "tf1"
STEP = 7
BERT_CONFIG = {
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 16,
    "initializer_range": 0.02,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "type_vocab_size": 2,
    "vocab_size": 100,
}


def google_variables(config: dict[str, int]) -> dict[str, tuple[int, ...]]:
    """Every trainable variable of Google's BERT pretraining graph: name -> shape."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    shapes: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (config["vocab_size"], hidden),
        "bert/embeddings/token_type_embeddings": (config["type_vocab_size"], hidden),
        "bert/embeddings/position_embeddings": (config["max_position_embeddings"], hidden),
    }

    def dense(scope: str, n_in: int, n_out: int) -> None:
        shapes[f"{scope}/kernel"] = (n_in, n_out)
        shapes[f"{scope}/bias"] = (n_out,)

    def layer_norm(scope: str) -> None:
        shapes[f"{scope}/LayerNorm/beta"] = (hidden,)
        shapes[f"{scope}/LayerNorm/gamma"] = (hidden,)

    layer_norm("bert/embeddings")
    for i in range(config["num_hidden_layers"]):
        base = f"bert/encoder/layer_{i}"
        for part in ("query", "key", "value"):
            dense(f"{base}/attention/self/{part}", hidden, hidden)
        dense(f"{base}/attention/output/dense", hidden, hidden)
        layer_norm(f"{base}/attention/output")
        dense(f"{base}/intermediate/dense", hidden, inter)
        dense(f"{base}/output/dense", inter, hidden)
        layer_norm(f"{base}/output")
    dense("bert/pooler/dense", hidden, hidden)
    dense("cls/predictions/transform/dense", hidden, hidden)
    layer_norm("cls/predictions/transform")
    shapes["cls/predictions/output_bias"] = (config["vocab_size"],)
    shapes["cls/seq_relationship/output_weights"] = (2, hidden)
    shapes["cls/seq_relationship/output_bias"] = (2,)
    return shapes


def seeded_values(shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """Model variables and their two slots, with distinct seeded values (biases non-zero)."""
    rng = np.random.default_rng(20240607)
    values: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        values[name] = rng.normal(0.0, 0.2, size=shape).astype(np.float32)
        values[f"{name}/adam_m"] = rng.normal(0.0, 1e-3, size=shape).astype(np.float32)
        values[f"{name}/adam_v"] = rng.uniform(0.0, 1e-5, size=shape).astype(np.float32)
    return values


def save(values: dict[str, np.ndarray], prefix: Path, *, sharded: bool) -> None:
    """Create the variables with ``tf.compat.v1`` and save them with ``Saver`` at ``STEP``."""
    v1 = tf.compat.v1
    graph = tf.Graph()
    with graph.as_default():
        names = sorted(values)
        variables = []
        for i, name in enumerate(names):
            # sharded: alternate the variables over two CPU devices; Saver writes one shard each
            device = f"/cpu:{i % 2}" if sharded else "/cpu:0"
            with tf.device(device):
                variables.append(v1.get_variable(name, initializer=tf.constant(values[name])))
        with tf.device("/cpu:0"):
            step = v1.train.get_or_create_global_step()
            set_step = step.assign(STEP)
        saver = v1.train.Saver(sharded=sharded)
        config = v1.ConfigProto(device_count={"CPU": 2})
        with v1.Session(graph=graph, config=config) as session:
            session.run(v1.global_variables_initializer())
            session.run(set_step)
            prefix.parent.mkdir(parents=True, exist_ok=True)
            written = saver.save(session, str(prefix), global_step=STEP, write_meta_graph=False)
    print("saved", written)


def save_dtypes(prefix: Path) -> dict[str, np.ndarray]:
    """A checkpoint of the non-float32 dtypes the reader supports."""
    v1 = tf.compat.v1
    rng = np.random.default_rng(7)
    wanted = {
        "half": rng.normal(size=(3, 5)).astype(np.float16),
        "bfloat16": rng.normal(size=(4, 2)).astype(np.float32),
        "double": rng.normal(size=(6,)),
        "int32": rng.integers(-1000, 1000, size=(2, 3)).astype(np.int32),
        "scope/int64": rng.integers(-(2**40), 2**40, size=(5,)),
        "scalar": np.float32(3.25),
    }
    graph = tf.Graph()
    with graph.as_default():
        for name, value in wanted.items():
            initial = tf.constant(value)
            if name == "bfloat16":
                initial = tf.cast(initial, tf.bfloat16)
            v1.get_variable(name, initializer=initial)
        saver = v1.train.Saver()
        with v1.Session(graph=graph) as session:
            session.run(v1.global_variables_initializer())
            prefix.parent.mkdir(parents=True, exist_ok=True)
            saver.save(session, str(prefix), write_meta_graph=False)
    reader = tf.train.load_checkpoint(str(prefix))
    out = {}
    for name in wanted:
        tensor = reader.get_tensor(name)
        # numpy has no bfloat16: store the float32 values (bfloat16 widens to float32 exactly)
        out[name] = np.asarray(tensor, dtype=np.float32) if name == "bfloat16" else tensor
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    out: Path = args.out
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    values = seeded_values(google_variables(BERT_CONFIG))
    save(values, out / "model.ckpt", sharded=False)
    save(values, out / "sharded" / "model.ckpt", sharded=True)
    prefix = out / f"model.ckpt-{STEP}"
    reader = tf.train.load_checkpoint(str(prefix))
    saved = {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}
    assert set(saved) == {*values, "global_step"}, sorted(set(saved) ^ {*values, "global_step"})
    for name, value in values.items():
        assert saved[name].tobytes() == value.tobytes(), name
    sharded = tf.train.load_checkpoint(str(out / "sharded" / f"model.ckpt-{STEP}"))
    for name, value in saved.items():
        assert sharded.get_tensor(name).tobytes() == value.tobytes(), name
    dtypes = save_dtypes(out / "dtypes" / "model.ckpt")
    np.savez_compressed(
        out / "expected.npz",
        **saved,
        **{f"dtypes:{k}": v for k, v in dtypes.items()},
    )
    (out / "bert_config.json").write_text(json.dumps(BERT_CONFIG, indent=2, sort_keys=True) + "\n")
    for stale in out.rglob("checkpoint"):  # the Saver's bookkeeping file: not needed
        stale.unlink()
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total} bytes) with TensorFlow {tf.__version__}")


if __name__ == "__main__":
    main()
