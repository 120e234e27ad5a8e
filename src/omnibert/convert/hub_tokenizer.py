"""The tokenizer files of a Hugging Face export, and the same tokenizer for omnibert's own
masked-word predictions (:mod:`omnibert.run.tools.fill_mask`).

* ``tokenizer.json``: a fast WordPiece tokenizer built with the ``tokenizers`` library from
  the run's ``vocab.txt`` (the reference's reading of it: :class:`~omnibert.tokenization.vocab.
  Vocab`), with BERT's normalizer (clean text, Chinese characters split, lower-casing and
  accent stripping exactly when the model was trained lower-cased), pre-tokenizer, ``##``
  word pieces of at most 100 characters, the ``[CLS] A [SEP] B [SEP]`` post-processor and the
  five special tokens. Both families get it: a ModernBERT export has no other tokenizer
  (transformers' ModernBERT class reads ``tokenizer.json`` only).
* ``tokenizer_config.json``: ``model_max_length`` = the model's positions (without it
  transformers assumes 1e30 and ``truncation=True`` truncates nothing), ``do_lower_case`` /
  ``strip_accents`` as trained, the special tokens; a ModernBERT export names
  ``model_input_names`` without ``token_type_ids`` (its model has no token types).
* ``special_tokens_map.json``: the special tokens, where older readers look for them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from omnibert.tokenization.vocab import Vocab, VocabError

__all__ = [
    "SPECIAL_TOKENS",
    "TOKENIZER_FILES",
    "tokenizer_problem",
    "wordpiece_tokenizer",
    "write_tokenizer_files",
]

#: The special tokens of every BERT vocab, as Hugging Face's tokenizers name them.
SPECIAL_TOKENS = {
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "pad_token": "[PAD]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
}
#: What :func:`write_tokenizer_files` writes, in the order an export lists its files.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
#: Google's WordPiece gives [UNK] for a word longer than this (tokenizers' default too).
_MAX_WORD_CHARS = 100


def tokenizer_problem(vocab_file: str | Path) -> str | None:
    """Why ``vocab_file`` cannot make a BERT tokenizer (it lacks a special token), or None."""
    try:
        Vocab.from_file(vocab_file)
    except VocabError as err:
        return str(err)
    return None


def wordpiece_tokenizer(vocab_file: str | Path, lower_case: bool) -> Any:
    """A ``tokenizers.Tokenizer``: BERT's WordPiece over ``vocab_file`` (module docstring),
    lower-casing and stripping accents when ``lower_case``."""
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = Vocab.from_file(vocab_file)
    tokenizer = Tokenizer(
        WordPiece(
            dict(vocab.token_to_id),
            unk_token=SPECIAL_TOKENS["unk_token"],
            continuing_subword_prefix="##",
            max_input_chars_per_word=_MAX_WORD_CHARS,
        )
    )
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=lower_case, lowercase=lower_case
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    cls, sep = SPECIAL_TOKENS["cls_token"], SPECIAL_TOKENS["sep_token"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls}:0 $A:0 {sep}:0",
        pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
        special_tokens=[(cls, vocab.token_to_id[cls]), (sep, vocab.token_to_id[sep])],
    )
    # special: never split, never lower-cased ("[MASK]" in a text stays the mask token)
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS.values()]
    )
    return tokenizer


def write_tokenizer_files(
    out: Path, vocab_file: str | Path, *, lower_case: bool, max_length: int, token_types: bool
) -> list[Path]:
    """Write :data:`TOKENIZER_FILES` into ``out`` (module docstring); ``token_types``: the
    model reads ``token_type_ids`` (BERT; not ModernBERT). Returns the paths written."""
    paths = [out / name for name in TOKENIZER_FILES]
    wordpiece_tokenizer(vocab_file, lower_case).save(str(paths[0]))
    config: dict[str, Any] = {
        "tokenizer_class": "BertTokenizer",
        "do_lower_case": lower_case,
        # BertTokenizer strips accents exactly when it lower-cases (strip_accents null); said
        # explicitly, as omnibert's tokenizers do
        "strip_accents": lower_case,
        "tokenize_chinese_chars": True,
        "model_max_length": max_length,
        **SPECIAL_TOKENS,
    }
    if not token_types:
        config["model_input_names"] = ["input_ids", "attention_mask"]
    paths[1].write_text(json.dumps(config, indent=2) + "\n")
    paths[2].write_text(json.dumps(SPECIAL_TOKENS, indent=2) + "\n")
    return paths
