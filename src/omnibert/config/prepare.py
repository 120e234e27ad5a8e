"""``omnibert-prepare``'s config, defined once: :class:`PrepareConfig` is the schema Hydra
composes ``conf/prepare.yaml`` against (types, naming the key); the app reads the composed
config and checks the ranges before any work
(:func:`omnibert.apps.prepare.check_prepare`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from omegaconf import MISSING

__all__ = ["PrepareConfig", "PreparePack", "TrainVocab"]


@dataclass
class TrainVocab:
    """``train_vocab``: a WordPiece vocab trained on the input first (conf/prepare.yaml)."""

    enabled: bool = False
    vocab_size: int = 30522
    min_frequency: int = 2


@dataclass
class PreparePack:
    """``pack``: an offline pack index of the output (conf/prepare.yaml)."""

    enabled: bool = False
    algorithm: str = "nnlshp"
    max_sequences_per_pack: int = 3
    max_predictions_per_pack: Optional[int] = None  # noqa: UP045 (OmegaConf reads it)
    name: Optional[str] = None  # noqa: UP045
    overwrite: bool = False
    options: dict[str, Any] = field(default_factory=dict)


@dataclass
class PrepareConfig:
    """The root of ``conf/prepare.yaml`` (its comments say what each key does)."""

    input_files: Any = MISSING  # a list of patterns, or one comma-separated string
    input_format: str = "text"
    vocab_file: str = MISSING
    output_dir: str = MISSING
    do_lower_case: bool = True
    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    short_seq_prob: float = 0.1
    dupe_factor: int = 10
    random_seed: int = 12345
    do_whole_word_mask: bool = False
    next_sentence: bool = True
    num_workers: int = 1
    eval_samples: Optional[int] = None  # noqa: UP045
    overwrite: bool = False
    max_shard_size: Any = "500MB"  # "500MB" or a byte count
    progress: bool = True
    train_vocab: TrainVocab = field(default_factory=TrainVocab)
    pack: PreparePack = field(default_factory=PreparePack)
