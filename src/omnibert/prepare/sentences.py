"""Offline sentence splitting for the one-sentence-per-line pretraining format.

Two rule-based back ends, both offline and deterministic:

- ``"pysbd"`` (default): pure Python, always installed (a core dependency), and slow.
- ``"blingfire"``: a finite-state splitter in a bundled native library, much faster, with
  near-identical splits on prose (docs/data/wikipedia.md has both rates). It is an
  optional install (``pip install blingfire``) meant for full Wikipedia; its wheel bundles
  x86-64 (and macOS/Windows) binaries only.

The back end is always chosen explicitly, never by what happens to be installed, so the same
input gives the same lines on every machine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import cache
from typing import Literal

from omnibert.errors import UserError

SentenceBackend = Literal["pysbd", "blingfire"]
BACKENDS: tuple[str, ...] = ("pysbd", "blingfire")

_WHITESPACE = re.compile(r"\s+")


class SentenceSplitterError(UserError):
    """A sentence back end that is unknown or not installed."""


def normalize_whitespace(text: str) -> str:
    """Collapse every run of whitespace (newlines included) to one space and strip the ends."""
    return _WHITESPACE.sub(" ", text).strip()


@cache
def _splitter(backend: str) -> Callable[[str], list[str]]:
    if backend == "pysbd":
        import pysbd

        segmenter = pysbd.Segmenter(language="en", clean=False)
        return lambda text: [str(s) for s in segmenter.segment(text)]
    if backend == "blingfire":
        try:
            import blingfire
        except ImportError as err:  # pragma: no cover - depends on the environment
            raise SentenceSplitterError(
                "sentence backend 'blingfire' is not installed; run `pip install blingfire` "
                "or use sentence_backend=pysbd."
            ) from err
        return lambda text: str(blingfire.text_to_sentences(text)).split("\n")
    raise SentenceSplitterError(
        f"unknown sentence backend {backend!r}; choose one of {', '.join(BACKENDS)}."
    )


def split_sentences(text: str, backend: SentenceBackend | str = "pysbd") -> list[str]:
    """Split one paragraph of text into sentences.

    Whitespace (including newlines) is normalised to single spaces first, so a paragraph that
    was wrapped over several lines splits the same as one long line. A break that a back end
    puts where the text has no space (pysbd splits ``The .pyc file`` after the dot) is undone:
    sentences are separated by whitespace. Returned sentences are stripped, never empty, and
    contain no newline.
    """
    text = normalize_whitespace(text)
    if not text:
        return []
    out: list[str] = []
    position = 0
    for segment in _splitter(backend)(text):
        segment = segment.strip()
        if not segment:
            continue
        start = text.find(segment, position)
        if start < 0:  # the back end changed the text; keep its segment as it is
            out.append(normalize_whitespace(segment))
            continue
        if out and start > 0 and not text[start - 1].isspace():
            out[-1] = out[-1] + text[position:start] + segment
        else:
            out.append(segment)
        position = start + len(segment)
    return out
