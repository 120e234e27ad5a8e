"""The configuration reference: every config file under ``conf/``, every key with its default
and the comment above it (and beside it) in the YAML.

Parsed with PyYAML's node API, whose marks give each key's line, so the comment lines just
above a key are its description. The page is built from the files on every ``make docs``,
so it cannot drift from them; ``tests/unit/test_docs_site.py`` checks that it covers every key.

    python scripts/docsite/config_reference.py [conf_dir]   # print the page's Markdown
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PRIMARY_ORDER = ["pretrain", "prepare", "finetune", "eval", "export", "predict"]
_PACKAGE = re.compile(r"^#\s*@package\s+(\S+)")


@dataclass
class Key:
    """One key of a config file: its full dotted path once composed, default and comment."""

    path: str
    default: str
    comment: list[str]  # the comment's lines; indented ones are examples


@dataclass
class ConfigFile:
    """One YAML file under conf/: a primary config or one option of a group."""

    relpath: str  # e.g. "accelerator/cpu.yaml"
    group: str | None  # e.g. "accelerator", "hydra/launcher"; None for primary configs
    option: str  # file stem
    package: str  # where its keys land in the composed config ("" = the root)
    description: list[str]  # the comment lines at the top of the file
    keys: list[Key] = field(default_factory=list)
    defaults: list[Key] = field(default_factory=list)


def _comment_text(line: str) -> str:
    """The text after ``#``, keeping the indentation that marks an example line."""
    text = line.strip()[1:]
    return text[1:] if text.startswith(" ") else text


def _header(lines: list[str]) -> tuple[list[str], int]:
    """The comment block at the top of a file (its description) and the line after it."""
    out: list[str] = []
    i = 0
    while i < len(lines) and lines[i].strip().startswith("#"):
        if not _PACKAGE.match(lines[i].strip()):
            out.append(_comment_text(lines[i]))
        i += 1
    return out, i


def _above(lines: list[str], line: int, header_end: int) -> list[str]:
    """The comment lines directly above 0-based ``line`` (not the file's header)."""
    out: list[str] = []
    i = line - 1
    while i >= header_end and lines[i].strip().startswith("#"):
        out.append(_comment_text(lines[i]))
        i -= 1
    return list(reversed(out))


def _beside(lines: list[str], node: yaml.Node) -> list[str]:
    """A comment after a scalar value on its line (``key: 3  # why``)."""
    if not isinstance(node, yaml.ScalarNode):
        return []
    rest = lines[node.end_mark.line][node.end_mark.column :]
    m = re.match(r"\s+#\s?(.*)$", rest)
    return [m.group(1).strip()] if m else []


def _default(node: yaml.Node, text: str) -> str:
    if isinstance(node, yaml.ScalarNode):
        if node.style in ("'", '"'):
            return json.dumps(node.value)
        return node.value if node.value != "" else "null"
    if node.flow_style:  # as written: [a, b], {k: v}
        return " ".join(text[node.start_mark.index : node.end_mark.index].split())
    # a block collection: its value written on one line
    return json.dumps(yaml.constructor.SafeConstructor().construct_object(node, deep=True))


def _walk(
    node: yaml.MappingNode,
    prefix: str,
    lines: list[str],
    text: str,
    header_end: int,
    out: list[Key],
) -> None:
    for key_node, value_node in node.value:
        key = str(key_node.value)
        path = f"{prefix}.{key}" if prefix else key
        comment = _above(lines, key_node.start_mark.line, header_end)
        comment += _beside(lines, value_node)
        if isinstance(value_node, yaml.MappingNode) and value_node.value:
            out.append(Key(path, "", comment))
            _walk(value_node, path, lines, text, header_end, out)
        else:
            out.append(Key(path, _default(value_node, text), comment))


def _defaults(node: yaml.SequenceNode, lines: list[str], text: str, header_end: int) -> list[Key]:
    out = []
    for item in node.value:
        if isinstance(item, yaml.MappingNode):
            (k, v), *_ = item.value
            name, default = str(k.value), _default(v, text)
        else:
            name, default = str(item.value), ""
        comment = _above(lines, item.start_mark.line, header_end)
        comment += _beside(lines, item.value[0][1] if isinstance(item, yaml.MappingNode) else item)
        out.append(Key(name, default, comment))
    return out


def parse_file(conf_dir: Path, path: Path) -> ConfigFile:
    """Parse one config file into its keys (full dotted paths), defaults and comments."""
    rel = path.relative_to(conf_dir).as_posix()
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    group = None if "/" not in rel else rel.rsplit("/", 1)[0]
    package = "" if group is None else group.replace("/", ".")
    for line in lines:
        if not line.strip().startswith("#"):
            break
        m = _PACKAGE.match(line.strip())
        if m:
            package = {"_global_": "", "_group_": package}.get(m.group(1), m.group(1))
    description, header_end = _header(lines)
    cf = ConfigFile(rel, group, path.stem, package, description)
    root = yaml.compose(text, Loader=yaml.SafeLoader)
    if root is None:
        return cf
    if not isinstance(root, yaml.MappingNode):
        raise ValueError(f"{path}: a config file must hold a mapping")
    body = []
    for key_node, value_node in root.value:
        if key_node.value == "defaults" and isinstance(value_node, yaml.SequenceNode):
            cf.defaults = _defaults(value_node, lines, text, header_end)
        else:
            body.append((key_node, value_node))
    root.value = body
    _walk(root, package, lines, text, header_end, cf.keys)
    return cf


def collect(conf_dir: Path) -> list[ConfigFile]:
    """Every YAML file under ``conf_dir``: primary configs first, then groups by name."""
    files = [parse_file(conf_dir, p) for p in sorted(conf_dir.rglob("*.yaml"))]
    rank = {name: i for i, name in enumerate(PRIMARY_ORDER)}
    primary = sorted(
        (f for f in files if f.group is None), key=lambda f: (rank.get(f.option, 99), f.option)
    )
    groups = sorted((f for f in files if f.group is not None), key=lambda f: (f.group, f.option))
    return primary + groups


_CODE = re.compile(r"(`[^`]*`)")


def _escape(text: str) -> str:
    """Plain comment text for a table cell: code spans kept, Markdown/HTML specials escaped."""
    parts = _CODE.split(text)
    for i, part in enumerate(parts):
        if i % 2 == 0:
            part = part.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            part = re.sub(r"([\\*_\[\]|])", r"\\\1", part)
        else:
            part = part.replace("|", "\\|")
        parts[i] = part
    return "".join(parts)


def _is_example(line: str) -> bool:
    return line.startswith("  ")


def _cell(comment: list[str]) -> str:
    """Comment lines as one table cell: prose joined, example lines as code on their own line."""
    out: list[str] = []
    prose: list[str] = []
    for line in [*comment, ""]:
        if line.strip() and not _is_example(line):
            prose.append(line.strip())
            continue
        if prose:
            out.append(_escape(" ".join(prose)))
            prose = []
        if _is_example(line):
            out.append(_code(" ".join(line.split())))
    return "<br>".join(out)


def _paragraphs(comment: list[str]) -> list[str]:
    """A file's header comment as Markdown: prose paragraphs, example lines as a code block."""
    out: list[str] = []
    prose: list[str] = []
    code: list[str] = []
    for line in [*comment, ""]:
        if _is_example(line):
            if prose:
                out += [_escape(" ".join(prose)), ""]
                prose = []
            code.append(line[2:])
            continue
        if code:
            out += ["```text", *code, "```", ""]
            code = []
        if line.strip():
            prose.append(line.strip())
        elif prose:
            out += [_escape(" ".join(prose)), ""]
            prose = []
    return out


def _code(value: str) -> str:
    if not value:
        return ""
    value = value.replace("|", "\\|")
    fence = "``" if "`" in value else "`"
    return f"{fence}{value}{fence}"


def _table(keys: list[Key], key_title: str) -> list[str]:
    rows = [f"| {key_title} | default | description |", "|---|---|---|"]
    for k in keys:
        rows.append(f"| `{k.path}` | {_code(k.default)} | {_cell(k.comment)} |")
    return rows


def _section(cf: ConfigFile, level: str) -> list[str]:
    title = f"`{cf.option}.yaml`" if cf.group is None else f"`{cf.group}={cf.option}`"
    out = [f"{level} {title}", "", f"`conf/{cf.relpath}`"]
    if cf.package and cf.group is not None and cf.package != cf.group.replace("/", "."):
        out[-1] += f", keys under `{cf.package}`"
    elif cf.group is not None and not cf.package:
        out[-1] += ", keys at the top level of the config (`@package _global_`)"
    out.append("")
    out += _paragraphs(cf.description)
    if cf.defaults:
        out += ["Defaults list (what it composes, in order):", ""]
        for entry in cf.defaults:
            item = f"{entry.path}: {entry.default}" if entry.default else entry.path
            comment = _cell(entry.comment)
            out.append(f"- `{item}`" + (f" — {comment}" if comment else ""))
        out.append("")
    if cf.keys:
        out += [*_table(cf.keys, "key"), ""]
    return out


def render(conf_dir: Path) -> str:
    """The whole reference page as Markdown."""
    files = collect(conf_dir)
    out = [
        "# Configuration reference",
        "",
        "Generated from `conf/` by `scripts/docsite/config_reference.py` every time the site "
        "is built: every config file, every key with its default and the comment above it in "
        "the YAML. Keys are shown with their full path in the composed config, as you would "
        "override them on the command line (`accelerator.threads=2`); a group is chosen with "
        "`<group>=<option>` (`accelerator=gpu`). A default such as `${phase.max_steps}` is an "
        "interpolation: the key follows the one it names.",
        "",
        "## Primary configs",
        "",
        "One per app: `omnibert-train` composes `pretrain.yaml`, `omnibert-prepare` "
        "`prepare.yaml`, `omnibert-finetune` `finetune.yaml`, `omnibert-eval` `eval.yaml`, "
        "`omnibert-export` `export.yaml`, `omnibert-predict` `predict.yaml`.",
        "",
    ]
    for cf in files:
        if cf.group is None:
            out += _section(cf, "###")
    group = None
    for cf in files:
        if cf.group is None:
            continue
        if cf.group != group:
            group = cf.group
            options = ", ".join(f"`{f.option}`" for f in files if f.group == group)
            out += [f"## Group `{group}`", "", f"Options: {options}.", ""]
        out += _section(cf, "###")
    return "\n".join(out).rstrip() + "\n"


def main() -> None:
    conf = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parents[2] / "conf"
    sys.stdout.write(render(conf))


if __name__ == "__main__":
    main()
