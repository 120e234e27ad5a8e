"""Run Google's reference ``create_pretraining_data.py`` in-process, without TensorFlow.

Used to produce the parity fixtures under ``tests/fixtures/reference/`` and by
``scripts/bench_prepare.py`` to time the reference next to omnibert.  The reference code is
never copied into this repository: point ``--reference-dir`` (or ``reference_dir``) at a
checkout of https://github.com/google-research/bert.

The reference only needs three things from TensorFlow to build instances: ``tf.flags``
(module-level flag definitions), ``tf.gfile.GFile`` (reading text) and ``tf.logging``.  This
module installs a stand-in ``tensorflow`` module that provides exactly those, with
``GFile.readline`` behaving like TensorFlow's ``BufferedInputStream::ReadLineAsString``: lines
end at ``\\n`` and every ``\\r`` byte is dropped; bytes are decoded as strict UTF-8.
"""

from __future__ import annotations

import argparse
import glob
import importlib
import json
import random
import sys
import types
from pathlib import Path
from typing import Any


class _Flags:
    def __init__(self) -> None:
        object.__setattr__(self, "_values", {})

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError as err:
            raise AttributeError(name) from err

    def __setattr__(self, name: str, value: Any) -> None:
        self._values[name] = value


def _make_flags_module(flag_values: _Flags) -> types.ModuleType:
    flags = types.ModuleType("tensorflow.flags")

    def define(name: str, default: Any, *_: Any, **__: Any) -> None:
        flag_values._values.setdefault(name, default)

    for kind in ("string", "bool", "boolean", "integer", "float"):
        setattr(flags, f"DEFINE_{kind}", define)
    flags.FLAGS = flag_values  # type: ignore[attr-defined]
    flags.mark_flag_as_required = lambda *_a, **_k: None  # type: ignore[attr-defined]
    return flags


class _GFile:
    """Text reader with TensorFlow's readline semantics (``\\n`` ends a line, ``\\r`` dropped)."""

    def __init__(self, path: str, mode: str = "r") -> None:
        if "r" not in mode:
            raise NotImplementedError("the stand-in GFile only reads")
        with open(path, "rb") as handle:
            data = handle.read().replace(b"\r", b"")
        self._lines = data.split(b"\n")
        if data.endswith(b"\n"):
            self._lines.pop()
        self._ends_with_newline = data.endswith(b"\n")
        self._next = 0

    def readline(self) -> str:
        if self._next >= len(self._lines):
            return ""
        raw = self._lines[self._next]
        self._next += 1
        last = self._next == len(self._lines)
        line = raw.decode("utf-8")
        return line if (last and not self._ends_with_newline) else line + "\n"

    def __enter__(self) -> _GFile:
        return self

    def __exit__(self, *_: Any) -> None:
        return None


def install_fake_tensorflow() -> _Flags:
    """Register a minimal ``tensorflow`` module (see the module docstring) and return FLAGS."""
    flag_values = _Flags()
    tf = types.ModuleType("tensorflow")
    tf.flags = _make_flags_module(flag_values)  # type: ignore[attr-defined]
    gfile = types.ModuleType("tensorflow.gfile")
    gfile.GFile = _GFile  # type: ignore[attr-defined]
    gfile.Glob = lambda pattern: sorted(glob.glob(pattern))  # type: ignore[attr-defined]
    tf.gfile = gfile  # type: ignore[attr-defined]
    logging = types.ModuleType("tensorflow.logging")
    logging.info = lambda *_a, **_k: None  # type: ignore[attr-defined]
    logging.set_verbosity = lambda *_a, **_k: None  # type: ignore[attr-defined]
    logging.INFO = 20  # type: ignore[attr-defined]
    tf.logging = logging  # type: ignore[attr-defined]
    sys.modules["tensorflow"] = tf
    return flag_values


def load_reference(reference_dir: str | Path) -> tuple[types.ModuleType, types.ModuleType, _Flags]:
    """Import the reference's ``tokenization`` and ``create_pretraining_data`` modules."""
    reference_dir = Path(reference_dir).resolve()
    if not (reference_dir / "create_pretraining_data.py").is_file():
        raise FileNotFoundError(
            f"{reference_dir} has no create_pretraining_data.py; point reference_dir at a "
            "checkout of github.com/google-research/bert."
        )
    flag_values = install_fake_tensorflow()
    sys.path.insert(0, str(reference_dir))
    try:
        for name in ("tokenization", "create_pretraining_data"):
            sys.modules.pop(name, None)
        tokenization = importlib.import_module("tokenization")
        cpd = importlib.import_module("create_pretraining_data")
    finally:
        sys.path.remove(str(reference_dir))
    return tokenization, cpd, flag_values


def reference_instances(
    reference_dir: str | Path,
    input_files: list[str],
    vocab_file: str,
    *,
    do_lower_case: bool = True,
    max_seq_length: int = 128,
    dupe_factor: int = 10,
    short_seq_prob: float = 0.1,
    masked_lm_prob: float = 0.15,
    max_predictions_per_seq: int = 20,
    random_seed: int = 12345,
    do_whole_word_mask: bool = False,
) -> list[dict[str, Any]]:
    """The reference's instances for ``input_files`` as omnibert rows (ids, unpadded)."""
    tokenization, cpd, flag_values = load_reference(reference_dir)
    flag_values.do_whole_word_mask = do_whole_word_mask
    tokenizer = tokenization.FullTokenizer(vocab_file=vocab_file, do_lower_case=do_lower_case)
    instances = cpd.create_training_instances(
        input_files,
        tokenizer,
        max_seq_length,
        dupe_factor,
        short_seq_prob,
        masked_lm_prob,
        max_predictions_per_seq,
        random.Random(random_seed),
    )
    return [
        {
            "input_ids": tokenizer.convert_tokens_to_ids(inst.tokens),
            "segment_ids": list(inst.segment_ids),
            "masked_lm_positions": list(inst.masked_lm_positions),
            "masked_lm_ids": tokenizer.convert_tokens_to_ids(inst.masked_lm_labels),
            "next_sentence_label": 1 if inst.is_random_next else 0,
        }
        for inst in instances
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference-dir", required=True)
    parser.add_argument("--input-file", required=True)
    parser.add_argument("--vocab-file", required=True)
    parser.add_argument("--output", required=True, help="JSON lines, one instance per line")
    parser.add_argument("--do-lower-case", type=int, default=1)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--dupe-factor", type=int, default=10)
    parser.add_argument("--short-seq-prob", type=float, default=0.1)
    parser.add_argument("--masked-lm-prob", type=float, default=0.15)
    parser.add_argument("--max-predictions-per-seq", type=int, default=20)
    parser.add_argument("--random-seed", type=int, default=12345)
    parser.add_argument("--do-whole-word-mask", type=int, default=0)
    args = parser.parse_args()
    rows = reference_instances(
        args.reference_dir,
        [args.input_file],
        args.vocab_file,
        do_lower_case=bool(args.do_lower_case),
        max_seq_length=args.max_seq_length,
        dupe_factor=args.dupe_factor,
        short_seq_prob=args.short_seq_prob,
        masked_lm_prob=args.masked_lm_prob,
        max_predictions_per_seq=args.max_predictions_per_seq,
        random_seed=args.random_seed,
        do_whole_word_mask=bool(args.do_whole_word_mask),
    )
    with open(args.output, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
