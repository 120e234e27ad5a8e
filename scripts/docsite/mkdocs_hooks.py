"""MkDocs hooks (``hooks:`` in mkdocs.yml): pages generated from the repository at build time.

* ``reference/configuration.md`` from ``conf/`` (``config_reference.render``);
* ``<!-- benchmark: NAME -->`` markers in a page replaced by the last measured run of that
  benchmark, read from ``docs/benchmarks/NAME.json`` (``benchmark_pages.render``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

_SCRIPTS = Path(__file__).resolve().parents[1]
if str(_SCRIPTS) not in sys.path:
    sys.path.insert(0, str(_SCRIPTS))

from docsite import config_reference  # noqa: E402

ROOT = _SCRIPTS.parent
CONFIG_PAGE = "reference/configuration.md"


def on_files(files: Any, config: Any) -> Any:
    """Add the generated configuration reference to the site's files."""
    from mkdocs.structure.files import File

    content = config_reference.render(ROOT / "conf")
    files.append(File.generated(config, CONFIG_PAGE, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Expand ``<!-- benchmark: NAME -->`` markers from ``docs/benchmarks/NAME.json``."""
    from mkdocs.exceptions import PluginError

    from docsite import benchmark_pages

    if "<!-- benchmark:" not in markdown:
        return markdown
    docs_dir = Path(config["docs_dir"])
    records = docs_dir / "benchmarks"
    prefix = os.path.relpath("benchmarks", os.path.dirname(page.file.src_uri) or ".")
    try:
        return benchmark_pages.expand(markdown, records, f"{Path(prefix).as_posix()}/")
    except benchmark_pages.MissingRecord as err:
        raise PluginError(str(err)) from err


_SPHINX_ROLE = re.compile(r":(?:py:)?(?:func|class|mod|meth|attr|data|exc|obj):<code>~?")


def on_page_content(html: str, page: Any, config: Any, files: Any) -> str:
    """Docstrings use Sphinx roles (``:class:`Lamb```), which Markdown renders as the role's
    name before the code (and ``~`` inside it): drop them, keep the code."""
    return _SPHINX_ROLE.sub("<code>", html)
