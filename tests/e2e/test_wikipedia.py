"""WikiExtractor ``<doc>`` parsing, preprocessing and sharding on small hand-written fixtures."""

from __future__ import annotations

import bz2
import os
import shutil
import subprocess
import sys
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import pytest

from omnibert.prepare.wikipedia import (
    WikiFormatError,
    document_sentences,
    find_extracted_files,
    iter_documents,
    prepare_wikipedia,
    shard_of,
)

WIKI = Path(__file__).parents[1] / "fixtures" / "wiki"
EXTRACTED = WIKI / "extracted"
REPO = Path(__file__).resolve().parents[2]


def _documents_of(text: str) -> list[str]:
    return [doc.strip("\n") for doc in text.split("\n\n") if doc.strip()]


def _kept_documents(root: Path) -> dict[str, str]:
    """id -> expected document text, from the parser and sentence splitter directly."""
    kept = {}
    for path in find_extracted_files(root):
        for doc in iter_documents(path):
            lines = document_sentences(doc)
            if len(lines) >= 2 and sum(map(len, lines)) >= 100:
                kept[doc.id] = "\n".join(lines)
    return kept


def _compressed_copy(tmp_path: Path) -> Path:
    root = tmp_path / "compressed"
    for path in find_extracted_files(EXTRACTED):
        target = root / path.relative_to(EXTRACTED).with_name(path.name + ".bz2")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bz2.compress(path.read_bytes()))
    return root


def test_nested_files_are_found_in_sorted_order_and_others_ignored(tmp_path: Path) -> None:
    root = tmp_path / "extracted"
    shutil.copytree(EXTRACTED, root)
    (root / "AA" / ".wiki_99.swp").write_text("junk")
    (root / "README").write_text("not a wiki file")
    found = [p.relative_to(root).as_posix() for p in find_extracted_files(root)]
    assert found == ["AA/wiki_00", "AA/wiki_01", "AB/wiki_00"]


def test_documents_are_parsed_with_attributes_unescaped_and_body() -> None:
    docs = list(iter_documents(EXTRACTED / "AA" / "wiki_00"))
    assert [d.id for d in docs] == ["12", "25", "39"]
    assert docs[0].url == "https://en.wikipedia.org/wiki?curid=12"
    assert docs[1].title == 'Autism "Spectrum"'
    assert docs[0].text.splitlines()[0] == "Anarchism"
    assert "red & black" in docs[0].text  # WikiExtractor's --html-safe escaping undone
    assert [d.line for d in docs] == [1, 9, 15]
    escaped = list(iter_documents(EXTRACTED / "AA" / "wiki_00", unescape=False))
    assert "red &amp; black" in escaped[0].text


def test_escaped_end_tag_in_text_does_not_end_the_document() -> None:
    docs = list(iter_documents(EXTRACTED / "AA" / "wiki_01"))
    assert [d.id for d in docs] == ["290", "303"]
    assert "said </doc> in the middle" in docs[0].text


def test_sentences_drop_title_headings_and_empty_lines() -> None:
    doc = next(iter_documents(EXTRACTED / "AA" / "wiki_00"))
    assert document_sentences(doc) == [
        "Anarchism is a political philosophy and movement that is sceptical of authority.",
        "It rejects all involuntary, coercive forms of hierarchy.",
        "The word comes from the Greek language.",
        "Dr. Smith wrote about it in 1900, i.e. a long time ago.",
        "Its symbol is often drawn in red & black.",
    ]


def test_bz2_files_give_the_same_documents_and_shards(tmp_path: Path) -> None:
    compressed = _compressed_copy(tmp_path)
    assert [p.name for p in find_extracted_files(compressed)] == [
        "wiki_00.bz2",
        "wiki_01.bz2",
        "wiki_00.bz2",
    ]
    plain_docs = [d.text for p in find_extracted_files(EXTRACTED) for d in iter_documents(p)]
    bz2_docs = [d.text for p in find_extracted_files(compressed) for d in iter_documents(p)]
    assert bz2_docs == plain_docs
    a = prepare_wikipedia(EXTRACTED, tmp_path / "a", 2, processes=1, progress=False)
    b = prepare_wikipedia(compressed, tmp_path / "b", 2, processes=1, progress=False)
    assert [p.read_bytes() for p in a.out_files] == [p.read_bytes() for p in b.out_files]


def test_every_kept_document_lands_in_exactly_one_shard(tmp_path: Path) -> None:
    summary = prepare_wikipedia(EXTRACTED, tmp_path / "out", 3, processes=1, progress=False)
    expected = _kept_documents(EXTRACTED)
    assert summary.num_documents_read == 8
    assert summary.num_documents_dropped == 1  # "Albedo is short."
    assert summary.num_documents_written == len(expected) == 7
    by_text = {text: doc_id for doc_id, text in expected.items()}
    seen: Counter[str] = Counter()
    for shard, path in enumerate(summary.out_files):
        assert path.name == f"wiki-{shard:05d}-of-00003.txt"
        docs = _documents_of(path.read_text(encoding="utf-8"))
        assert len(docs) == summary.documents_per_shard[shard]
        for doc in docs:
            doc_id = by_text[doc]
            assert shard_of(doc_id, 3) == shard
            seen[doc_id] += 1
    assert seen == Counter(expected.keys())


def test_output_format_one_sentence_per_line_blank_line_between_documents(
    tmp_path: Path,
) -> None:
    summary = prepare_wikipedia(EXTRACTED, tmp_path, 1, processes=1, progress=False)
    text = summary.out_files[0].read_text(encoding="utf-8")
    assert text.endswith(".\n") and not text.startswith("\n")
    assert "\n\n\n" not in text
    lines = text.split("\n")[:-1]
    assert all(line == line.strip() for line in lines)
    assert sum(1 for line in lines if not line) == summary.num_documents_written - 1
    assert len([line for line in lines if line]) == summary.num_sentences
    assert "Anarchism" not in lines and "History." not in lines


def test_sharding_does_not_depend_on_processes_or_file_layout(tmp_path: Path) -> None:
    serial = prepare_wikipedia(EXTRACTED, tmp_path / "serial", 4, processes=1, progress=False)
    parallel = prepare_wikipedia(EXTRACTED, tmp_path / "par", 4, processes=2, progress=False)
    assert [p.read_bytes() for p in serial.out_files] == [
        p.read_bytes() for p in parallel.out_files
    ]
    # All documents in one file: same shard for each document.
    merged = tmp_path / "merged" / "wiki_00"
    merged.parent.mkdir()
    merged.write_text(
        "".join(p.read_text() for p in find_extracted_files(EXTRACTED)), encoding="utf-8"
    )
    one_file = prepare_wikipedia(merged.parent, tmp_path / "one", 4, processes=1, progress=False)
    for a, b in zip(serial.out_files, one_file.out_files, strict=True):
        assert sorted(_documents_of(a.read_text())) == sorted(_documents_of(b.read_text()))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('<doc id="1" url="u" title="T">\nT\n\nText.\n', "line 1 has no </doc>"),
        ("</doc>\n", "</doc> without an opening <doc>"),
        ('stray text\n<doc id="1" url="u" title="T">\nT\n</doc>\n', "text outside <doc>"),
        ('<doc id="1" url="u" title="T">\nT\n<doc id="2" url="u" title="U">\n', "no </doc>"),
        ('<doc url="u" title="T">\nT\n</doc>\n', "no id attribute"),
        ('{"id": "1", "text": "json output"}\n', "not --json"),
    ],
)
def test_malformed_input_names_the_file(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "AA" / "wiki_07"
    path.parent.mkdir()
    path.write_text(content, encoding="utf-8")
    with pytest.raises(WikiFormatError, match=message) as info:
        list(iter_documents(path))
    assert str(path) in str(info.value)


def test_corrupt_bz2_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "wiki_00.bz2"
    path.write_bytes(bz2.compress((EXTRACTED / "AA" / "wiki_00").read_bytes())[:60])
    with pytest.raises(WikiFormatError, match="corrupt or truncated") as info:
        list(iter_documents(path))
    assert str(path) in str(info.value)


def test_bad_file_in_a_parallel_run_stops_it_and_keeps_earlier_outputs(tmp_path: Path) -> None:
    root = tmp_path / "extracted"
    shutil.copytree(EXTRACTED, root)
    out = tmp_path / "out"
    first = prepare_wikipedia(root, out, 2, processes=1, progress=False)
    before = [p.read_bytes() for p in first.out_files]
    bad = root / "AB" / "wiki_01"
    bad.write_text('<doc id="9" url="u" title="T">\nT\nno end\n', encoding="utf-8")
    with pytest.raises(WikiFormatError, match="no </doc>") as info:
        prepare_wikipedia(root, out, 2, processes=2, progress=False)
    assert str(bad) in str(info.value)
    assert [p.read_bytes() for p in first.out_files] == before
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in first.out_files)


def test_missing_input_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"extract\.sh"):
        find_extracted_files(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no WikiExtractor files"):
        find_extracted_files(tmp_path / "empty")


def test_preprocess_script_writes_shards(tmp_path: Path) -> None:
    script = REPO / "scripts" / "wikipedia" / "preprocess.py"
    result = subprocess.run(
        [
            sys.executable,
            str(script),
            str(EXTRACTED),
            str(tmp_path),
            "--num-shards",
            "2",
            "--processes",
            "1",
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "7 documents" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "wiki-00000-of-00002.txt",
        "wiki-00001-of-00002.txt",
    ]


def _wikiextractor_at_least_3_1() -> bool:
    try:
        major, minor = (int(x) for x in version("wikiextractor").split(".")[:2])
    except PackageNotFoundError:
        return False
    return (major, minor) >= (3, 1)


@pytest.mark.skipif(
    not _wikiextractor_at_least_3_1() or shutil.which("bash") is None,
    reason="needs wikiextractor>=3.1 (the 'wiki' extra) and bash",
)
def test_extract_script_output_is_read_by_the_parser(tmp_path: Path) -> None:
    dump = tmp_path / "mini-pages-articles.xml.bz2"
    dump.write_bytes(bz2.compress((WIKI / "mini-pages-articles.xml").read_bytes()))
    env = {**os.environ, "PYTHON": sys.executable, "PROCESSES": "1", "COMPRESS": "1"}
    script = REPO / "scripts" / "wikipedia" / "extract.sh"
    result = subprocess.run(
        ["bash", str(script), str(dump), str(tmp_path / "x"), "--no-templates", "--quiet"],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    files = find_extracted_files(tmp_path / "x")
    assert [p.name for p in files] == ["wiki_00.bz2"]
    docs = list(iter_documents(files[0]))
    assert [(d.id, d.title) for d in docs] == [
        ("12", "Anarchism"),
        ("25", 'Autism "Spectrum"'),
        ("39", "Albedo"),  # the last article, which wikiextractor 3.0.x lost
    ]
    assert document_sentences(docs[0])[-1] == "An editor once typed </doc> here."
