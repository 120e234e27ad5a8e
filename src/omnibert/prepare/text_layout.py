"""Whether a text input file looks hard-wrapped instead of one sentence per line.

``omnibert-prepare``'s text format (Google's ``create_pretraining_data.py``) is one sentence
per line with a blank line between documents. A file wrapped at a fixed width (a licence, a
plain-text book, an e-mail) reads without error in that format, but every wrapped line
becomes a "sentence" and every paragraph a "document", so it deserves a warning.

The heuristic (:func:`wrap_report`), on the first :data:`SAMPLE_BYTES` of the file:

* the *width* is the 95th percentile of the lengths of the non-blank lines (tabs expanded,
  trailing spaces dropped): about the column a wrapping editor filled up to;
* an *inner* line is a non-blank line followed by a non-blank line (the last line of a
  paragraph says nothing about wrapping);
* an inner line *breaks mid-sentence near the width* when it does not end with
  sentence-final punctuation (``. ! ? : ;`` or an ellipsis, closing quotes and brackets
  after it allowed) and is at least :data:`NEAR_WIDTH` of the width long (a filled line is
  short of the width by less than the next word, ragged right included).

The file looks hard-wrapped when the width is at most :data:`MAX_WIDTH` (editors and
licences wrap at 70-80 columns, sentences run longer), it has at least
:data:`MIN_INNER_LINES` inner lines, and at least :data:`MIN_WRAPPED_FRACTION` of them
break mid-sentence near the width. One sentence per line fails on most lines (they end
with a full stop) and on the rest (sentence lengths vary widely, so most lines are far
shorter than the longest); a hard-wrapped paragraph passes on all its lines but the last.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

__all__ = ["WrapReport", "wrap_report", "wrapped_warning"]

SAMPLE_BYTES = 1 << 20  # the head of a file: enough lines to judge, bounded time for any size
MIN_INNER_LINES = 20
MIN_WRAPPED_FRACTION = 0.5
NEAR_WIDTH = 0.75
MAX_WIDTH = 132
_CLOSERS = "\"')]}»”’"
_FINAL = (".", "!", "?", ":", ";", "…")


@dataclass(frozen=True)
class WrapReport:
    """What :func:`wrap_report` measured on one file."""

    path: str
    width: int
    inner_lines: int
    wrapped_lines: int

    @property
    def fraction(self) -> float:
        return self.wrapped_lines / self.inner_lines if self.inner_lines else 0.0

    @property
    def hard_wrapped(self) -> bool:
        return (
            self.width <= MAX_WIDTH
            and self.inner_lines >= MIN_INNER_LINES
            and self.fraction >= MIN_WRAPPED_FRACTION
        )


def _ends_sentence(line: str) -> bool:
    return line.rstrip(_CLOSERS).endswith(_FINAL)


def layout_of(lines: list[str], path: str = "") -> WrapReport:
    """The measurements of the module docstring on ``lines`` (without line ends)."""
    lines = [line.expandtabs().rstrip() for line in lines]
    lengths = sorted(len(line) for line in lines if line.strip())
    if not lengths:
        return WrapReport(path, 0, 0, 0)
    width = lengths[min(len(lengths) - 1, math.ceil(0.95 * len(lengths)) - 1)]
    inner = wrapped = 0
    for line, following in itertools.pairwise(lines):
        if not line.strip() or not following.strip():
            continue
        inner += 1
        if not _ends_sentence(line) and len(line) >= NEAR_WIDTH * width:
            wrapped += 1
    return WrapReport(path, width, inner, wrapped)


def wrap_report(path: str | Path) -> WrapReport:
    """:func:`layout_of` the head of a text file (undecodable bytes replaced: reading it
    properly, and refusing what is not UTF-8, is the workers' job)."""
    with open(path, "rb") as handle:
        head = handle.read(SAMPLE_BYTES)
    lines = head.decode("utf-8", errors="replace").replace("\r", "").split("\n")
    if len(head) == SAMPLE_BYTES:
        lines = lines[:-1]  # cut inside a line
    return layout_of(lines, str(path))


def wrapped_warning(paths: list[Path]) -> str | None:
    """One sentence about the input files that look hard-wrapped, or None."""
    found = [r for r in (wrap_report(p) for p in paths) if r.hard_wrapped]
    if not found:
        return None
    first = found[0]
    names = ", ".join(r.path for r in found[:3]) + (
        f" and {len(found) - 3} more" if len(found) > 3 else ""
    )
    what = "looks" if len(found) == 1 else "look"
    return (
        f"input file{'s' if len(found) > 1 else ''} {names} {what} hard-wrapped, not one "
        f"sentence per line ({first.path}: {first.fraction:.0%} of the lines inside its "
        f"paragraphs break mid-sentence near a width of {first.width} characters), so every line "
        "becomes a sentence and every paragraph a document; join each paragraph's lines and "
        "put one sentence per line (a blank line between documents) first."
    )
