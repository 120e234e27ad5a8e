"""The documentation site's generated pages: the configuration reference covers every key of
conf/ with its default and comment; benchmark markers expand from the scripts' JSON records."""

from __future__ import annotations

import re
from pathlib import Path

import benchplot
import pytest
import yaml
from docsite import benchmark_pages, config_reference

CONF = Path(__file__).resolve().parents[2] / "conf"


def _flatten(node: object, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(node, dict):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            out[path] = value
            if isinstance(value, dict):
                out.update(_flatten(value, path))
    return out


def _sections(page: str) -> dict[str, list[tuple[str, str]]]:
    """conf-relative file -> its rows (key, default) of the key tables."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    in_keys = False
    for line in page.splitlines():
        m = re.match(r"^`conf/(\S+\.yaml)`", line)
        if m:
            current, in_keys = m.group(1), False
            sections[current] = []
            continue
        if line.startswith("| key |"):
            in_keys = True
            continue
        if line.startswith("#"):
            in_keys = False
        if current and in_keys and line.startswith("| `"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line)[1:-1]]
            sections[current].append((cells[0].strip("`"), cells[1].strip("`").replace("\\|", "|")))
    return sections


def test_configuration_reference_covers_every_key_of_conf_with_its_default():
    page = config_reference.render(CONF)
    sections = _sections(page)
    files = sorted(p.relative_to(CONF).as_posix() for p in CONF.rglob("*.yaml"))
    assert sorted(sections) == files
    missing, wrong = [], []
    for rel in files:
        text = (CONF / rel).read_text()
        data = yaml.safe_load(text) or {}
        data.pop("defaults", None)
        rows = dict(sections[rel])
        # where Hydra puts the file's keys: its group's path, or its `# @package` directive
        package = rel.rsplit("/", 1)[0].replace("/", ".") if "/" in rel else ""
        directive = re.search(r"^# @package (\S+)", text, re.MULTILINE)
        if directive:
            package = "" if directive.group(1) == "_global_" else directive.group(1)
        for key, value in _flatten(data).items():
            path = f"{package}.{key}" if package else key
            if path not in rows:
                missing.append(f"{rel}: {path}")
                continue
            if not isinstance(value, dict) or not value:
                shown = rows[path]
                if yaml.safe_load(shown) != value and not (value is None and shown == "null"):
                    wrong.append(f"{rel}: {key} = {value!r} shown as {shown!r}")
    assert not missing, f"keys missing from the configuration reference: {missing}"
    assert not wrong, wrong


def test_configuration_reference_takes_comments_from_the_yaml():
    page = config_reference.render(CONF)
    row = next(line for line in page.splitlines() if line.startswith("| `accelerator.threads` |"))
    assert "intra-op threads per process" in row
    assert "## Group `accelerator`" in page and "### `accelerator=gpu`" in page


def test_configuration_reference_of_a_small_conf_dir(tmp_path):
    (tmp_path / "app.yaml").write_text(
        "# The app: what it does.\n"
        "# Second line of the description.\n"
        "defaults:\n"
        "  # where the model comes from\n"
        "  - model: small\n"
        "  - _self_\n"
        "\n"
        "# how many steps\n"
        "steps: 10  # at least 1\n"
        "nested:\n"
        "  # a list\n"
        "  items: [1, 2]\n"
        "  name: 'quoted'\n"
    )
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "small.yaml").write_text("# A small model.\nlayers: 2\n")
    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "quick.yaml").write_text(
        "# @package _global_\n# Quick run.\nsteps: 3\nmodel:\n  layers: 1\n"
    )
    page = config_reference.render(tmp_path)
    assert "The app: what it does. Second line of the description." in page
    assert "- `model: small` — where the model comes from\n- `_self_`\n" in page
    assert "| `steps` | `10` | how many steps at least 1 |" in page
    assert "| `nested.items` | `[1, 2]` | a list |" in page
    assert '| `nested.name` | `"quoted"` |  |' in page
    assert "| `model.layers` | `2` |  |" in page  # a group option's keys under its package
    assert "| `model.layers` | `1` |  |" in page  # @package _global_: from the root
    assert "keys at the top level of the config (`@package _global_`)" in page


def test_benchmark_marker_expands_from_the_record_the_script_saved(tmp_path):
    record = benchplot.Record(
        name="demo",
        title="omnibert against its peer",
        headline="omnibert 2.00x the peer",
        tables=[benchplot.Table("per round", ["round", "ratio"], [["0", "2.00x"], ["1", "1.50x"]])],
        measurements={"ratio": [2.0, 1.5]},
    )
    figure = benchplot.bars(
        "t", "seq/s", ["a"], {"omnibert": [2.0], "peer": [1.0]}, ratio_of=("omnibert", "peer")
    )
    written = benchplot.save(record, figure, tmp_path)
    assert [p.name for p in written] == ["demo.json", "demo.svg"]
    assert written[1].read_text().lstrip().startswith("<?xml")
    page = benchmark_pages.expand("# B\n\n<!-- benchmark: demo -->\n", tmp_path, "benchmarks/")
    assert "**omnibert 2.00x the peer**" in page
    assert "![omnibert against its peer](benchmarks/demo.svg)" in page
    assert "| 1 | 1.50x |" in page
    assert "```bash\npython " in page  # the command line that ran
    assert "at start" in page  # the machine line
    with pytest.raises(benchmark_pages.MissingRecord, match=r"other\.json is missing"):
        benchmark_pages.expand("<!-- benchmark: other -->\n", tmp_path, "benchmarks/")


def test_the_benchmarks_page_renders_from_the_committed_records():
    docs = Path(__file__).resolve().parents[2] / "docs"
    page = (docs / "benchmarks.md").read_text()
    markers = benchmark_pages.MARKER.findall(page)
    assert markers, "the benchmarks page shows no recorded run"
    rendered = benchmark_pages.expand(page, docs / "benchmarks", "benchmarks/")
    for name in markers:
        record = benchplot.load(docs / "benchmarks" / f"{name}.json")
        assert record.headline in rendered and record.command in rendered
        assert (docs / "benchmarks" / str(record.figure)).is_file()
