"""The embedded demo corpus: Python standard-library docstrings as pretraining text.

Built at run time from the ``.py`` sources under ``sysconfig.get_paths()["stdlib"]``, read
with :mod:`ast` so that no module is imported (nothing runs, nothing has side effects).
Every module, class and function docstring of a reasonable size becomes one document, and
so does every plain-text ``help()`` topic of ``pydoc_data.topics`` (the language reference);
doctests, literal/code blocks, tables, lists, reST directives and signature lines are
dropped, and the remaining prose paragraphs are split into sentences.

Output is the reference input format (one sentence per line, one blank line between
documents) in ``train-0000i-of-0000N.txt`` parts plus a held-out ``eval.txt``. The result is
deterministic for a given Python installation: files are read in sorted order, documents
keep source order, exact duplicates keep their first occurrence, a document goes to eval
when a stable hash of its id falls below ``eval_fraction`` and train documents are dealt to
the parts round-robin.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import itertools
import multiprocessing
import os
import re
import sys
import sysconfig
import time
import tokenize
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from multiprocessing.pool import Pool
from pathlib import Path

from tqdm import tqdm

from omnibert.prepare.sentences import split_sentences

#: Directory names never read: tests, GUI/IDE code, vendored wheels, third-party packages.
SKIP_DIRS = frozenset(
    {
        "__pycache__",
        "site-packages",
        "dist-packages",
        "test",
        "tests",
        "idle_test",
        "idlelib",
        "tkinter",
        "turtledemo",
        "ensurepip",
        "__phello__",
    }
)
#: Modules skipped by name (side effects on import, encoded text, GUI).
SKIP_MODULES = frozenset({"antigravity", "this", "turtle", "__hello__"})

_PUNCT_ONLY = re.compile(r"^[\s\-=~^*+#_.:|`'\"<>]+$")
_BULLET = re.compile(r"^([-*+\u2022]|\(?\d+[.)]|\(?[a-zA-Z][.)]|#\.)\s")
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)(\s*->.*)?$")
_FIELD = re.compile(r"^:\w[^:]*:")
_ENDS_SENTENCE = re.compile(r"[.!?:][\"')\]]*$")
#: The module holding the plain-text help() topics (the language reference, as prose).
TOPICS_MODULE = "pydoc_data.topics"


@dataclass(frozen=True)
class CorpusSummary:
    """What :func:`build_embedded_corpus` wrote."""

    out_dir: Path
    train_files: tuple[Path, ...]
    eval_file: Path
    num_source_files: int
    num_unparsable_files: int
    num_duplicates_dropped: int
    num_train_documents: int
    num_eval_documents: int
    num_train_sentences: int
    num_eval_sentences: int
    num_bytes: int
    #: sha256 over all written files in order; equal across runs on the same Python.
    sha256: str
    python_version: str
    seconds: float

    def __str__(self) -> str:
        return (
            f"embedded corpus (Python {self.python_version} stdlib docstrings) in {self.out_dir}: "
            f"{self.num_train_documents} train / {self.num_eval_documents} eval documents, "
            f"{self.num_train_sentences} / {self.num_eval_sentences} sentences, "
            f"{self.num_bytes / 1e6:.2f} MB from {self.num_source_files} files "
            f"in {self.seconds:.1f} s (sha256 {self.sha256[:12]})"
        )


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def iter_stdlib_sources(root: Path | None = None) -> list[Path]:
    """Standard-library ``.py`` files in sorted (relative POSIX path) order, skips applied."""
    root = stdlib_dir() if root is None else root
    found: list[tuple[str, Path]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for name in filenames:
            if not name.endswith(".py") or name[:-3] in SKIP_MODULES:
                continue
            path = Path(dirpath, name)
            found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return [path for _, path in found]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts and parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) or path.stem


def iter_docstrings(tree: ast.Module, module: str) -> Iterator[tuple[str, str]]:
    """``(qualified name, cleaned docstring)`` for the module, its classes and functions."""
    doc = ast.get_docstring(tree, clean=True)
    if doc:
        yield module, doc

    def walk(body: Sequence[ast.stmt], prefix: str) -> Iterator[tuple[str, str]]:
        for node in body:
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}.{node.name}"
                text = ast.get_docstring(node, clean=True)
                if text:
                    yield name, text
                yield from walk(node.body, name)

    yield from walk(tree.body, module)


def iter_topics(tree: ast.Module, module: str) -> Iterator[tuple[str, str]]:
    """``(id, text)`` of the ``topics = {...}`` literal in :data:`TOPICS_MODULE`."""
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "topics" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(value, ast.Constant)
                    and isinstance(key.value, str)
                    and isinstance(value.value, str)
                ):
                    yield f"{module}:{key.value}", value.value


def _is_prose(lines: list[str]) -> bool:
    first = lines[0]
    if any(line[:1].isspace() for line in lines):  # code, literal blocks, field bodies
        return False
    if any(_PUNCT_ONLY.match(line) or ">>>" in line or "|" in line for line in lines):
        return False  # headings, tables, doctests
    if first.startswith(("..", "@", "$", "%")) or _FIELD.match(first) or _BULLET.match(first):
        return False  # reST directives, field lists, decorators, shells, lists
    if len(lines) == 1 and _SIGNATURE.match(first):
        return False
    text = " ".join(lines)
    if not _ENDS_SENTENCE.search(text) or len(text.split()) < 4:
        return False
    letters = sum(c.isalpha() for c in text)
    return letters >= 0.7 * sum(not c.isspace() for c in text)


def docstring_paragraphs(doc: str) -> list[str]:
    """The prose paragraphs of a cleaned docstring, each on one line."""
    paragraphs: list[str] = []
    block: list[str] = []
    for line in [*doc.splitlines(), ""]:
        if line.strip():
            block.append(line.rstrip())
            continue
        if block and _is_prose(block):
            paragraphs.append(" ".join(part.strip() for part in block))
        block = []
    return paragraphs


def docstring_sentences(doc: str) -> list[str]:
    return [s for paragraph in docstring_paragraphs(doc) for s in split_sentences(paragraph)]


#: A source file is read by ``1 + size // SPLIT_BYTES`` tasks, each splitting every k-th text,
#: so that one large file (the help topics) does not serialise the build.
SPLIT_BYTES = 48 * 1024

_Task = tuple[Path, Path, int, int, int, int]
_Documents = list[tuple[int, str, list[str]]]


def _file_documents(task: _Task) -> tuple[_Documents, bool]:
    """``(index, id, sentences)`` of one part of one source file; the flag: it parsed."""
    path, root, min_sentences, min_chars, part, parts = task
    try:
        with tokenize.open(path) as handle:
            source = handle.read()
        tree = ast.parse(source, filename=str(path))
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return [], False
    documents = []
    module = module_name(path, root)
    texts = iter_docstrings(tree, module)
    if module == TOPICS_MODULE:
        texts = itertools.chain(texts, iter_topics(tree, module))
    for index, (name, doc) in enumerate(texts):
        if index % parts != part:
            continue
        sentences = docstring_sentences(doc)
        if len(sentences) >= min_sentences and sum(map(len, sentences)) >= min_chars:
            documents.append((index, name, sentences))
    return documents, True


def is_eval_document(doc_id: str, eval_fraction: float) -> bool:
    """Stable split: the document's id hashed to [0, 1) and compared with the fraction."""
    digest = hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < eval_fraction


def _write_atomically(path: Path, documents: list[list[str]]) -> bytes:
    data = "\n\n".join("\n".join(doc) for doc in documents)
    payload = (data + "\n").encode("utf-8") if data else b""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(payload)
    os.replace(tmp, path)
    return payload


def build_embedded_corpus(
    out_dir: Path,
    num_train_files: int = 2,
    eval_fraction: float = 0.05,
    *,
    min_sentences: int = 2,
    min_chars: int = 120,
    processes: int | None = None,
    source_root: Path | None = None,
    progress: bool = True,
) -> CorpusSummary:
    """Write the stdlib-docstring corpus to ``out_dir`` and return what was written.

    ``processes`` defaults to the CPU count (at most 8); 0 or 1 runs in this process.
    """
    if num_train_files < 1:
        raise ValueError(f"num_train_files must be at least 1, got {num_train_files}.")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in [0, 1), got {eval_fraction}.")
    start = time.perf_counter()
    root = stdlib_dir() if source_root is None else Path(source_root)
    sources = iter_stdlib_sources(root)
    if not sources:
        raise FileNotFoundError(f"no Python sources found under {str(root)!r}.")
    tasks: list[_Task] = []
    for path in sources:
        parts = 1 + path.stat().st_size // SPLIT_BYTES
        tasks.extend((path, root, min_sentences, min_chars, part, parts) for part in range(parts))
    processes = min(os.cpu_count() or 1, 8) if processes is None else processes

    train: list[list[str]] = []
    evals: list[list[str]] = []
    seen: set[str] = set()
    unparsable = duplicates = 0
    bar = tqdm(total=len(tasks), desc="stdlib docstrings", unit="file", disable=not progress)
    pool_context: AbstractContextManager[Pool | None] = (
        multiprocessing.get_context("spawn").Pool(processes) if processes > 1 else nullcontext()
    )
    with pool_context as pool:
        results = pool.imap(_file_documents, tasks) if pool else map(_file_documents, tasks)
        pending: _Documents = []
        for task, (documents, parsed) in zip(tasks, results, strict=True):
            bar.update(1)
            pending.extend(documents)
            part, parts = task[4:]
            if part < parts - 1:
                continue
            unparsable += not parsed
            pending.sort(key=lambda item: item[0])
            for _, doc_id, sentences in pending:
                key = "\n".join(sentences)
                if key in seen:
                    duplicates += 1
                    continue
                seen.add(key)
                (evals if is_eval_document(doc_id, eval_fraction) else train).append(sentences)
            pending = []
    bar.close()

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    train_files = []
    num_bytes = 0
    for index in range(num_train_files):
        path = out_dir / f"train-{index:05d}-of-{num_train_files:05d}.txt"
        payload = _write_atomically(path, train[index::num_train_files])
        digest.update(payload)
        num_bytes += len(payload)
        train_files.append(path)
    eval_file = out_dir / "eval.txt"
    payload = _write_atomically(eval_file, evals)
    digest.update(payload)
    num_bytes += len(payload)
    return CorpusSummary(
        out_dir=out_dir,
        train_files=tuple(train_files),
        eval_file=eval_file,
        num_source_files=len(sources),
        num_unparsable_files=unparsable,
        num_duplicates_dropped=duplicates,
        num_train_documents=len(train),
        num_eval_documents=len(evals),
        num_train_sentences=sum(map(len, train)),
        num_eval_sentences=sum(map(len, evals)),
        num_bytes=num_bytes,
        sha256=digest.hexdigest(),
        python_version=".".join(map(str, sys.version_info[:3])),
        seconds=time.perf_counter() - start,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--num-train-files", type=int, default=2)
    parser.add_argument("--eval-fraction", type=float, default=0.05)
    parser.add_argument("--processes", type=int, default=None)
    args = parser.parse_args(argv)
    summary = build_embedded_corpus(
        args.out_dir, args.num_train_files, args.eval_fraction, processes=args.processes
    )
    print(summary)


if __name__ == "__main__":
    main()
