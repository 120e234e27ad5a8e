"""Benchmark results on the site: ``<!-- benchmark: NAME -->`` in a page becomes the last
measured run of that benchmark, from ``docs/benchmarks/NAME.json`` written by the script
(``scripts/benchplot.py``): its headline, the figure, the tables, the command and the machine.
A marker whose record is missing fails the build.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

_SCRIPTS = Path(__file__).resolve().parents[1]
if str(_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(_SCRIPTS))

import benchplot  # noqa: E402

MARKER = re.compile(r"^<!-- benchmark: ([A-Za-z0-9_-]+) -->$", re.MULTILINE)


class MissingRecord(Exception):
    """A page names a benchmark whose JSON record is not under docs/benchmarks/."""


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def render(record: benchplot.Record, figure_url: str | None) -> str:
    """One benchmark's results as Markdown."""
    out = [f"**{record.headline}**", ""]
    if figure_url:
        out += [f"![{record.title}]({figure_url})", ""]
    for table in record.tables:
        if table.title:
            out += [f"*{table.title}*", ""]
        out.append("| " + " | ".join(_cell(c) for c in table.columns) + " |")
        out.append("|" + "---|" * len(table.columns))
        out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
        out.append("")
    for note in record.notes:
        out += [note, ""]
    out += [
        "Measured with",
        "",
        "```bash",
        record.command,
        "```",
        "",
        f"on {benchplot.describe_machine(record.machine)}.",
        "",
    ]
    return "\n".join(out)


def expand(markdown: str, records_dir: Path, url_prefix: str) -> str:
    """Replace every marker with its record; ``url_prefix`` is the records directory as the
    page links it (e.g. ``benchmarks/``)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        path = records_dir / f"{name}.json"
        if not path.is_file():
            raise MissingRecord(
                f"benchmark record {path} is missing: run the benchmark with "
                f"--results-dir {records_dir} (see the page) or remove the marker"
            )
        record = benchplot.load(path)
        figure = f"{url_prefix}{record.figure}" if record.figure else None
        if record.figure and not (records_dir / record.figure).is_file():
            raise MissingRecord(f"{path} names the figure {record.figure}, which is missing")
        return render(record, figure)

    return MARKER.sub(one, markdown)
