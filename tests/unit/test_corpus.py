"""The embedded stdlib-docstring corpus and the sentence splitter it uses."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from omnibert.prepare.corpus import (
    CorpusSummary,
    build_embedded_corpus,
    docstring_paragraphs,
    docstring_sentences,
    is_eval_document,
    iter_stdlib_sources,
    stdlib_dir,
)
from omnibert.prepare.sentences import SentenceSplitterError, split_sentences

#: real stdlib modules copied into a small fake stdlib so the tests run in seconds.
SAMPLE_MODULES = [
    "__future__.py",
    "bisect.py",
    "calendar.py",
    "difflib.py",
    "fractions.py",
    "heapq.py",
    "json/__init__.py",
    "json/decoder.py",
    "shlex.py",
    "string.py",
    "textwrap.py",
]
SENTINEL = "This docstring must never reach the corpus because its module is skipped."


@pytest.fixture(scope="module")
def fake_stdlib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stdlib")
    for name in SAMPLE_MODULES:
        source = stdlib_dir() / name
        if source.is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(source, root / name)
    skipped = f'"""{SENTINEL} It has two sentences to pass the size filter."""\n'
    for name in ["test/test_x.py", "idlelib/run.py", "site-packages/pkg.py", "antigravity.py"]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(skipped)
    (root / "broken.py").write_text('"""Not Python 3."""\nprint "hello"\n')
    return root


@pytest.fixture(scope="module")
def built(fake_stdlib: Path, tmp_path_factory: pytest.TempPathFactory) -> CorpusSummary:
    out = tmp_path_factory.mktemp("corpus")
    return build_embedded_corpus(
        out, num_train_files=3, eval_fraction=0.2, source_root=fake_stdlib, processes=1,
        progress=False,
    )  # fmt: skip


def _documents(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [doc for doc in text.rstrip("\n").split("\n\n") if doc]


def test_skip_rules_and_sorted_order(fake_stdlib: Path, built: CorpusSummary) -> None:
    names = [p.relative_to(fake_stdlib).as_posix() for p in iter_stdlib_sources(fake_stdlib)]
    assert names == sorted(names)
    assert not any(n.startswith(("test/", "idlelib/", "site-packages/")) for n in names)
    assert "antigravity.py" not in names and "broken.py" in names
    assert built.num_unparsable_files == 1
    for path in [*built.train_files, built.eval_file]:
        assert SENTINEL not in path.read_text(encoding="utf-8")


def test_format_one_sentence_per_line_blank_line_between_documents(
    built: CorpusSummary,
) -> None:
    assert [p.name for p in built.train_files] == [
        "train-00000-of-00003.txt",
        "train-00001-of-00003.txt",
        "train-00002-of-00003.txt",
    ]
    total_docs = total_sentences = 0
    for path in [*built.train_files, built.eval_file]:
        text = path.read_text(encoding="utf-8")
        assert text.endswith("\n") and not text.startswith("\n") and "\n\n\n" not in text
        for doc in _documents(path):
            lines = doc.split("\n")
            assert len(lines) >= 2  # min_sentences
            assert all(line and line == line.strip() for line in lines)
            assert not any(line.startswith(">>>") for line in lines)
            total_sentences += len(lines)
        total_docs += len(_documents(path))
    assert total_docs == built.num_train_documents + built.num_eval_documents
    assert total_sentences == built.num_train_sentences + built.num_eval_sentences
    assert built.num_train_documents > 50 and built.num_eval_documents > 5


def test_train_parts_are_dealt_round_robin(built: CorpusSummary) -> None:
    sizes = [len(_documents(p)) for p in built.train_files]
    assert sum(sizes) == built.num_train_documents
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_eval_is_disjoint_from_train(built: CorpusSummary) -> None:
    train = {doc for p in built.train_files for doc in _documents(p)}
    evals = set(_documents(built.eval_file))
    assert evals and train and not train & evals
    # no duplicate documents at all
    assert len(train) == built.num_train_documents and len(evals) == built.num_eval_documents


def test_build_is_deterministic_and_independent_of_processes(
    built: CorpusSummary, fake_stdlib: Path, tmp_path: Path
) -> None:
    again = build_embedded_corpus(
        tmp_path, num_train_files=3, eval_fraction=0.2, source_root=fake_stdlib, processes=2,
        progress=False,
    )  # fmt: skip
    assert again.sha256 == built.sha256
    first = [*built.train_files, built.eval_file]
    second = [*again.train_files, again.eval_file]
    assert [p.read_bytes() for p in first] == [p.read_bytes() for p in second]


def test_eval_split_is_a_stable_hash_of_the_id() -> None:
    ids = [f"module{i}.func" for i in range(4000)]
    chosen = [is_eval_document(i, 0.05) for i in ids]
    assert chosen == [is_eval_document(i, 0.05) for i in ids]
    assert 120 < sum(chosen) < 280
    assert not any(is_eval_document(i, 0.0) for i in ids)


def test_docstring_cleaning_keeps_prose_only() -> None:
    doc = "\n".join(
        [
            "fetch(url, timeout=None) -> bytes",
            "",
            "Fetch a resource over the network and return its body. Redirects are",
            "followed until the limit is reached.",
            "",
            ">>> fetch('http://example.com')[:5]",
            "b'<html'",
            "",
            "Example::",
            "",
            "    data = fetch(url)",
            "",
            "=====  =====",
            "col    value",
            "=====  =====",
            "",
            "- a bullet item that is not prose",
            "",
            ":param url: the address.",
            "",
            "Timeouts are given in seconds.",
        ]
    )
    assert docstring_paragraphs(doc) == [
        "Fetch a resource over the network and return its body. Redirects are followed "
        "until the limit is reached.",
        "Timeouts are given in seconds.",
    ]
    assert docstring_sentences(doc) == [
        "Fetch a resource over the network and return its body.",
        "Redirects are followed until the limit is reached.",
        "Timeouts are given in seconds.",
    ]


@pytest.mark.parametrize("backend", ["pysbd", "blingfire"])
def test_split_sentences(backend: str) -> None:
    if backend == "blingfire":
        pytest.importorskip("blingfire")
    text = "Dr. Smith  went to\nWashington.  He arrived at 5 p.m. on Monday! Did it rain? The .pyc file stays."
    assert split_sentences(text, backend) == [
        "Dr. Smith went to Washington.",
        "He arrived at 5 p.m. on Monday!",
        "Did it rain?",
        "The .pyc file stays.",
    ]
    assert split_sentences("   \n ", backend) == []


def test_unknown_sentence_backend_is_a_clear_error() -> None:
    with pytest.raises(SentenceSplitterError, match="unknown sentence backend 'nltk'"):
        split_sentences("Some text.", "nltk")


def test_bad_arguments_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_train_files"):
        build_embedded_corpus(tmp_path, num_train_files=0)
    with pytest.raises(ValueError, match="eval_fraction"):
        build_embedded_corpus(tmp_path, eval_fraction=1.0)
