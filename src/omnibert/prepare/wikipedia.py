"""WikiExtractor output → one sentence per line, blank line between documents, N shards.

WikiExtractor (``python -m wikiextractor.WikiExtractor``, default ``<doc>`` output) writes
files ``AA/wiki_00``, ``AA/wiki_01``, ..., ``AB/wiki_00``, ... (``.bz2`` with ``--compress``),
each holding documents::

    <doc id="12" url="https://en.wikipedia.org/wiki?curid=12" title="Anarchism">
    Anarchism

    Anarchism is a political philosophy and movement ...
    </doc>

The first line of the body repeats the title and is dropped; every other non-empty line is a
paragraph that is split into sentences. Text is HTML-escaped by WikiExtractor's default
``--html-safe`` (which also keeps a literal ``</doc>`` in an article from ending it) and is
unescaped here after parsing.

Sharding is deterministic: a document goes to shard ``blake2b(id) % num_shards`` and, inside
a shard, documents keep (sorted input file, position in file) order, whatever the number of
processes. Input files are processed in parallel with at most ``2 * processes`` files' results
in flight, so memory is bounded by a few input files; shards are written under temporary
names and renamed only when every input has been read, so a failure leaves earlier outputs
untouched.
"""

from __future__ import annotations

import bz2
import gzip
import hashlib
import html
import io
import multiprocessing
import os
import re
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from multiprocessing.pool import AsyncResult
from pathlib import Path
from typing import TextIO

from tqdm import tqdm

from omnibert.errors import UserError
from omnibert.prepare.sentences import split_sentences

_DOC_OPEN = re.compile(r"^<doc(?P<attrs>\s.*)?>\s*$")
_DOC_CLOSE = re.compile(r"^</doc>\s*$")
_ATTR = re.compile(r'(\w+)="(.*?)"(?=\s+\w+="|\s*$)')


class WikiFormatError(UserError):
    """Input that is not WikiExtractor ``<doc>`` output; the message names file and line."""


@dataclass(frozen=True)
class WikiDocument:
    id: str
    url: str
    title: str
    #: the body between the ``<doc>`` and ``</doc>`` lines, title line included, unescaped.
    text: str
    source: str
    line: int


@dataclass(frozen=True)
class WikiSummary:
    """What :func:`prepare_wikipedia` wrote."""

    out_files: tuple[Path, ...]
    num_input_files: int
    num_documents_read: int
    num_documents_written: int
    num_documents_dropped: int
    num_sentences: int
    documents_per_shard: tuple[int, ...]
    num_bytes: int

    def __str__(self) -> str:
        return (
            f"wikipedia: {self.num_documents_written} documents ({self.num_sentences} sentences, "
            f"{self.num_bytes / 1e6:.1f} MB) from {self.num_input_files} files into "
            f"{len(self.out_files)} shards; {self.num_documents_dropped} of "
            f"{self.num_documents_read} documents dropped as too short"
        )


def find_extracted_files(inputs: Path | str | Sequence[Path | str]) -> list[Path]:
    """Files to read: given files as they are, directories searched recursively.

    In a directory, every non-hidden file whose name starts with ``wiki_`` counts (WikiExtractor
    names them ``wiki_00`` or ``wiki_00.bz2``), in sorted relative-path order.
    """
    roots = [inputs] if isinstance(inputs, str | Path) else list(inputs)
    files: list[Path] = []
    for root in map(Path, roots):
        if root.is_file():
            files.append(root)
            continue
        if not root.is_dir():
            raise FileNotFoundError(
                f"WikiExtractor output {str(root)!r} does not exist; run "
                "scripts/wikipedia/extract.sh first or point the input at its output directory."
            )
        found = sorted(
            (path.relative_to(root).as_posix(), path)
            for path in root.rglob("wiki_*")
            if path.is_file() and not any(p.startswith(".") for p in path.relative_to(root).parts)
        )
        if not found:
            raise FileNotFoundError(
                f"no WikiExtractor files (wiki_*) under {str(root)!r}; is it the directory "
                "given to WikiExtractor with -o?"
            )
        files.extend(path for _, path in found)
    return files


def open_text(path: Path) -> TextIO:
    """Open a plain, ``.bz2`` or ``.gz`` file for reading UTF-8 text."""
    if path.suffix == ".bz2":
        return io.TextIOWrapper(bz2.BZ2File(path, "rb"), encoding="utf-8")
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _parse_attrs(attrs: str, where: str) -> dict[str, str]:
    parsed = dict(_ATTR.findall(attrs.strip()))
    if "id" not in parsed:
        raise WikiFormatError(f"{where}: <doc> line has no id attribute; got <doc{attrs}>.")
    return parsed


def iter_documents(path: Path | str, unescape: bool = True) -> Iterator[WikiDocument]:
    """Stream the documents of one WikiExtractor file (plain or compressed)."""
    path = Path(path)
    name = str(path)
    current: dict[str, str] | None = None
    body: list[str] = []
    start = 0
    number = 0
    try:
        with open_text(path) as handle:
            for number, raw in enumerate(handle, start=1):
                line = raw.rstrip("\n")
                where = f"{name}:{number}"
                if line.startswith("<doc") and (opened := _DOC_OPEN.match(line)):
                    if current is not None:
                        raise WikiFormatError(
                            f"{where}: <doc> inside the document opened at line {start} that "
                            "has no </doc>; the file is truncated or not WikiExtractor output."
                        )
                    current = _parse_attrs(opened.group("attrs") or "", where)
                    body = []
                    start = number
                elif _DOC_CLOSE.match(line):
                    if current is None:
                        raise WikiFormatError(f"{where}: </doc> without an opening <doc>.")
                    text = "\n".join(body)
                    yield WikiDocument(
                        id=current["id"],
                        url=current.get("url", ""),
                        title=html.unescape(current.get("title", "")),
                        text=html.unescape(text) if unescape else text,
                        source=name,
                        line=start,
                    )
                    current = None
                elif current is not None:
                    body.append(line)
                elif line.strip():
                    raise WikiFormatError(
                        f"{where}: text outside <doc>...</doc> ({line[:40]!r}); expected "
                        "WikiExtractor's default <doc> output (not --json or --text)."
                    )
    except (OSError, EOFError, UnicodeDecodeError) as err:
        raise WikiFormatError(
            f"{name}: cannot be read after line {number} ({type(err).__name__}: {err}); "
            "the file is corrupt or truncated, re-run the extraction for it."
        ) from err
    if current is not None:
        raise WikiFormatError(
            f"{name}: the document opened at line {start} has no </doc> before the end of "
            "the file; the file is truncated, re-run the extraction for it."
        )


def document_sentences(
    doc: WikiDocument, backend: str = "pysbd", min_line_words: int = 3
) -> list[str]:
    """The document's sentences; the title line, empty lines and lines of fewer than
    ``min_line_words`` words (WikiExtractor's section headings, ``History.``) dropped."""
    lines = [line.strip() for line in doc.text.split("\n")]
    lines = [line for line in lines if line]
    if lines and lines[0] == doc.title.strip():
        lines = lines[1:]
    lines = [line for line in lines if len(line.split()) >= min_line_words]
    return [sentence for line in lines for sentence in split_sentences(line, backend)]


def shard_of(doc_id: str, num_shards: int) -> int:
    """Deterministic shard of a document, independent of file layout and processes."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % num_shards


@dataclass(frozen=True)
class _FileResult:
    #: per shard, the documents of this file in order, each its sentences joined by newlines.
    shards: list[list[str]]
    read: int
    dropped: int
    sentences: int


def _process_file(task: tuple[Path, int, str, int, int]) -> _FileResult:
    path, num_shards, backend, min_sentences, min_chars = task
    shards: list[list[str]] = [[] for _ in range(num_shards)]
    read = dropped = sentences = 0
    for doc in iter_documents(path):
        read += 1
        lines = document_sentences(doc, backend)
        if len(lines) < min_sentences or sum(map(len, lines)) < min_chars:
            dropped += 1
            continue
        sentences += len(lines)
        shards[shard_of(doc.id, num_shards)].append("\n".join(lines))
    return _FileResult(shards, read, dropped, sentences)


def shard_file_names(prefix: str, num_shards: int) -> list[str]:
    return [f"{prefix}-{i:05d}-of-{num_shards:05d}.txt" for i in range(num_shards)]


def prepare_wikipedia(
    inputs: Path | str | Sequence[Path | str],
    out_dir: Path | str,
    num_shards: int,
    *,
    processes: int | None = None,
    sentence_backend: str = "pysbd",
    min_sentences: int = 2,
    min_chars: int = 100,
    prefix: str = "wiki",
    progress: bool = True,
) -> WikiSummary:
    """Read WikiExtractor output and write ``num_shards`` one-sentence-per-line files.

    Documents with fewer than ``min_sentences`` sentences or ``min_chars`` characters are
    dropped. ``processes`` defaults to the CPU count; 0 or 1 runs in this process.
    """
    if num_shards < 1:
        raise ValueError(f"num_shards must be at least 1, got {num_shards}.")
    files = find_extracted_files(inputs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    names = shard_file_names(prefix, num_shards)
    finals = [out / name for name in names]
    temps = [out / f".{name}.tmp" for name in names]
    tasks = [(path, num_shards, sentence_backend, min_sentences, min_chars) for path in files]
    processes = (os.cpu_count() or 1) if processes is None else processes

    per_shard = [0] * num_shards
    read = dropped = sentences = 0
    bar = tqdm(total=len(files), desc="wikipedia", unit="file", disable=not progress)
    try:
        with ExitStack() as stack:
            handles = [stack.enter_context(open(t, "w", encoding="utf-8")) for t in temps]
            for result in _ordered_results(tasks, processes):
                read += result.read
                dropped += result.dropped
                sentences += result.sentences
                for shard, documents in enumerate(result.shards):
                    for document in documents:
                        if per_shard[shard]:
                            handles[shard].write("\n")
                        handles[shard].write(document + "\n")
                        per_shard[shard] += 1
                bar.update(1)
                bar.set_postfix(documents=sum(per_shard), refresh=False)
    except BaseException:
        for tmp in temps:
            tmp.unlink(missing_ok=True)
        raise
    finally:
        bar.close()
    for tmp, final in zip(temps, finals, strict=True):
        os.replace(tmp, final)
    return WikiSummary(
        out_files=tuple(finals),
        num_input_files=len(files),
        num_documents_read=read,
        num_documents_written=sum(per_shard),
        num_documents_dropped=dropped,
        num_sentences=sentences,
        documents_per_shard=tuple(per_shard),
        num_bytes=sum(path.stat().st_size for path in finals),
    )


def _ordered_results(
    tasks: list[tuple[Path, int, str, int, int]], processes: int
) -> Iterator[_FileResult]:
    """Results in task order, at most ``2 * processes`` tasks submitted but not consumed."""
    if processes <= 1 or len(tasks) <= 1:
        yield from map(_process_file, tasks)
        return
    # spawn: the caller may hold threads (torch, tokenizers) that fork would copy mid-state.
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        window: deque[AsyncResult[_FileResult]] = deque()
        pending = iter(tasks)
        for task in pending:
            window.append(pool.apply_async(_process_file, (task,)))
            if len(window) >= 2 * processes:
                break
        while window:
            result = window.popleft().get()
            following = next(pending, None)
            if following is not None:
                window.append(pool.apply_async(_process_file, (following,)))
            yield result
