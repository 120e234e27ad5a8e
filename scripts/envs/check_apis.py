"""Does every library API omnibert's code names exist in THIS interpreter's packages?

Run it with a vendor environment's Python (``scripts/envs/ipu_env.sh`` and ``hpu_env.sh`` do)
to find what the shared code uses that the vendor's older torch / Lightning / Python lacks.
It parses ``src/omnibert`` and ``kernels/omnibert_kernels`` (omnibert itself is not imported)
and resolves here:

1. every import statement, at module level or inside functions (not under
   ``if TYPE_CHECKING:``, which never runs);
2. every attribute chain rooted at an imported name: ``torch.utils.flop_counter.FlopCounterMode``,
   ``nn.Module``, ``F.scaled_dot_product_attention``, ``ProfilerActivity.HPU``;
3. the keyword arguments of calls to those where the callee has a Python signature or is
   ``torch.load`` (whose extra keywords would silently reach ``pickle``): ``torch.load(mmap=...)``;
4. names read in a module that it binds nowhere and that are no builtin here
   (``ExceptionGroup`` on Python 3.10).

Methods called on objects (``model.compile()``) are invisible to this scan; ``--mypy`` also
runs mypy in this environment (``--python-version`` of this interpreter), whose types come
from the installed torch, Lightning and NumPy. Its errors that say an API is missing or
called differently (:data:`API_ERRORS`: no such attribute, unexpected keyword, not
callable, ...) count as missing APIs; the others are differences in how precisely older
stubs type the same API (an array's shape, an ignore the newer stubs need) and are listed.

A line whose comment contains ``compat:`` uses a newer API on purpose, behind a check of
its existence (see ``omnibert.compat``); it is listed as guarded, not as missing. Imports
inside ``try: ... except ImportError`` or ``contextlib.suppress(ImportError)`` (optional
packages) and the vendor SDKs (``poptorch``, ``habana_frameworks``, ``lightning_habana``:
not installable here; the plugins check for them before any compute) are counted apart.
Exit status 1 when anything else is missing.

    python scripts/envs/check_apis.py [--root REPO] [--mypy] [--verbose]
"""

from __future__ import annotations

import argparse
import ast
import builtins
import importlib
import inspect
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCES = ("src/omnibert", "kernels/omnibert_kernels")
VENDOR_SDKS = ("poptorch", "habana_frameworks", "lightning_habana")
_IMPORT_ERRORS = ("ImportError", "ModuleNotFoundError")
#: mypy error codes that mean "this API does not exist here, or not with this signature"
API_ERRORS = frozenset(
    {"attr-defined", "call-arg", "call-overload", "operator", "name-defined", "import",
     "import-not-found", "valid-type", "union-attr"}
)  # fmt: skip
_MISSING = object()


@dataclass
class Use:
    """One use of a library name: ``path`` (dotted), where, and the keywords of a call."""

    path: str
    file: str
    line: int
    keywords: tuple[str, ...] = ()
    guarded: bool = False
    optional: bool = False


@dataclass
class Report:
    missing: list[tuple[Use, str]] = field(default_factory=list)
    guarded: list[tuple[Use, str]] = field(default_factory=list)
    optional: list[tuple[Use, str]] = field(default_factory=list)
    vendor: list[tuple[Use, str]] = field(default_factory=list)
    checked: int = 0
    names: set[str] = field(default_factory=set)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(node: ast.AST) -> bool:
    """``try:`` with an ``except ImportError`` handler, or ``with suppress(ImportError):``."""
    if isinstance(node, ast.Try):
        for handler in node.handlers:
            kinds = handler.type
            names = kinds.elts if isinstance(kinds, ast.Tuple) else [kinds]
            if any(isinstance(n, ast.Name) and n.id in _IMPORT_ERRORS for n in names):
                return True
    if isinstance(node, ast.With):
        for item in node.items:
            call = item.context_expr
            if (
                isinstance(call, ast.Call)
                and (_dotted(call.func) or [""])[-1] == "suppress"
                and any(isinstance(a, ast.Name) and a.id in _IMPORT_ERRORS for a in call.args)
            ):
                return True
    return False


def _optional_imports(tree: ast.AST) -> set[int]:
    """ids of the import nodes inside a block that catches ImportError."""
    found: set[int] = set()
    for node in ast.walk(tree):
        if _catches_import_error(node):
            for stmt in node.body:  # type: ignore[attr-defined]
                for inner in ast.walk(stmt):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        found.add(id(inner))
    return found


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: skips ``if TYPE_CHECKING:`` bodies and annotations (the
    modules use ``from __future__ import annotations``, so annotations are strings)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        for name, value in ast.iter_fields(node):
            if name in ("annotation", "returns"):
                continue
            if isinstance(value, list):
                stack.extend(v for v in value if isinstance(v, ast.AST))
            elif isinstance(value, ast.AST):
                stack.append(value)


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return parts[::-1]
    return None


def _module_of(file: Path, root: Path) -> str:
    rel = file.relative_to(root).with_suffix("")
    parts = [p for p in rel.parts if p not in ("src", "kernels")]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def scan_file(file: Path, root: Path) -> tuple[list[Use], set[str]]:
    """The library names ``file`` uses and the names it reads but never binds."""
    source = file.read_text()
    tree = ast.parse(source, str(file))
    lines = source.splitlines()
    rel = str(file.relative_to(root))
    module = _module_of(file, root)
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    nodes = list(_runtime_nodes(tree))

    def guarded(line: int, end: int | None = None) -> bool:
        return any("compat:" in lines[i - 1] for i in range(line, (end or line) + 1))

    aliases: dict[str, str] = {}  # local name -> dotted library path
    optional_names: set[str] = set()  # local names bound by optional imports
    optional_nodes = _optional_imports(tree)
    uses: list[Use] = []
    for node in nodes:
        optional = id(node) in optional_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                uses.append(Use(alias.name, rel, node.lineno, guarded=guarded(node.lineno),
                                optional=optional))  # fmt: skip
                local = alias.asname or alias.name.split(".")[0]
                aliases[local] = alias.name if alias.asname else local
                if optional:
                    optional_names.add(local)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                if alias.name == "*":
                    continue
                path = f"{base}.{alias.name}"
                uses.append(Use(path, rel, node.lineno, guarded=guarded(node.lineno),
                                optional=optional))  # fmt: skip
                aliases[alias.asname or alias.name] = path
                if optional:
                    optional_names.add(alias.asname or alias.name)

    # attribute chains and calls rooted at an imported name
    for node in nodes:
        if isinstance(node, ast.Call):
            parts = _dotted(node.func)
            if parts and parts[0] in aliases:
                path = ".".join([aliases[parts[0]], *parts[1:]])
                keywords = tuple(k.arg for k in node.keywords if k.arg)
                end = getattr(node, "end_lineno", node.lineno)
                uses.append(Use(path, rel, node.lineno, keywords, guarded(node.lineno, end),
                                parts[0] in optional_names))  # fmt: skip
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            parts = _dotted(node)
            if parts and parts[0] in aliases:
                path = ".".join([aliases[parts[0]], *parts[1:]])
                uses.append(Use(path, rel, node.lineno, guarded=guarded(node.lineno),
                                optional=parts[0] in optional_names))  # fmt: skip

    # names read that nothing binds (a builtin of a newer Python)
    bound = set(aliases)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            bound.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            bound.update(node.names)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            bound.add(node.name)
    free = {
        n.id
        for n in nodes
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound
    }
    return uses, {f"{rel}: {name}" for name in free if not hasattr(builtins, name)}


def resolve(path: str) -> Any:
    """The object ``path`` names here (importing its longest importable module prefix), or
    ``_MISSING``."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(name)
        except ImportError:
            continue
        except Exception:  # a module that fails to import for another reason
            return _MISSING
        for attr in parts[cut:]:
            try:
                obj = getattr(obj, attr)
            except AttributeError:
                # a submodule that is not imported by its parent yet
                try:
                    obj = importlib.import_module(f"{getattr(obj, '__name__', name)}.{attr}")
                except ImportError:
                    return _MISSING
        return obj
    return _MISSING


def _unknown_keywords(obj: Any, path: str, keywords: tuple[str, ...]) -> list[str]:
    if not keywords:
        return []
    if path == "torch.load":  # **pickle_load_args would swallow unknown keywords
        from torch.serialization import load

        params = inspect.signature(load).parameters
        return [k for k in keywords if k not in params]
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):  # a builtin without a Python signature
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [k for k in keywords if k not in params]


def check(root: Path, own: str = "omnibert") -> Report:
    report = Report()
    uses: list[Use] = []
    for source in SOURCES:
        for file in sorted((root / source).rglob("*.py")):
            found, free = scan_file(file, root)
            uses += found
            report.names |= free
    seen: dict[tuple[str, tuple[str, ...]], str | None] = {}
    for use in uses:
        if use.path.split(".")[0] in (own, "omnibert_kernels"):
            continue  # our own code (imported by the tests instead)
        key = (use.path, use.keywords)
        if key not in seen:
            obj = resolve(use.path)
            if obj is _MISSING:
                seen[key] = "not found"
            else:
                bad = _unknown_keywords(obj, use.path, use.keywords)
                seen[key] = f"no keyword {', '.join(bad)}" if bad else None
        report.checked += 1
        problem = seen[key]
        if problem is None:
            continue
        if use.path.split(".")[0] in VENDOR_SDKS:
            report.vendor.append((use, problem))
        elif use.guarded:
            report.guarded.append((use, problem))
        elif use.optional:
            report.optional.append((use, problem))
        else:
            report.missing.append((use, problem))
    return report


def _grouped(found: list[tuple[Use, str]]) -> list[str]:
    """One line per (name, problem) with every place it is used."""
    places: dict[tuple[str, str], list[str]] = {}
    for use, problem in found:
        places.setdefault((use.path, problem), []).append(f"{use.file}:{use.line}")
    return [
        f"{path} ({problem}) at {', '.join(sorted(set(where)))}"
        for (path, problem), where in sorted(places.items())
    ]


def run_mypy(root: Path) -> tuple[list[str], list[str], list[str]]:
    """mypy's errors here: ``(missing APIs, guarded, stub differences)``. An error is guarded
    when its line carries a ``compat:`` comment (a newer API behind a check); an error whose
    code is not in :data:`API_ERRORS` is a stub difference."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--python-version", version, "--no-incremental"],
        cwd=root,
        capture_output=True,
        text=True,
    )
    unguarded: list[str] = []
    guarded: list[str] = []
    stubs: list[str] = []
    pattern = r"^(?P<file>[^:]+):(?P<line>\d+): error: .*\[(?P<code>[a-z-]+)\]$"
    for line in done.stdout.splitlines():
        found = re.match(pattern, line)
        if not found:
            continue
        source = (root / found["file"]).read_text().splitlines()[int(found["line"]) - 1]
        if "compat:" in source:
            guarded.append(line)
        elif found["code"] in API_ERRORS:
            unguarded.append(line)
        else:
            stubs.append(line)
    if done.returncode not in (0, 1) or (done.returncode == 1 and not unguarded + guarded + stubs):
        unguarded.append(f"mypy failed to run: {(done.stdout + done.stderr).strip()[-2000:]}")
    return unguarded, guarded, stubs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    parser.add_argument("--verbose", action="store_true", help="list optional uses too")
    parser.add_argument("--mypy", action="store_true", help="also type-check with mypy here")
    args = parser.parse_args(argv)
    report = check(args.root)
    versions = []
    for dist in ("torch", "lightning", "numpy", "datasets", "pyarrow", "torchmetrics"):
        try:
            versions.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{dist} -")
    print(f"check_apis: Python {sys.version.split()[0]}, {', '.join(versions)}")
    missing = _grouped(report.missing)
    for line in missing:
        print(f"  MISSING {line}")
    for name in sorted(report.names):
        print(f"  MISSING name {name} (bound nowhere, no builtin here)")
    for label, found in (("guarded", report.guarded), ("optional", report.optional)):
        for line in _grouped(found) if args.verbose or label == "guarded" else []:
            print(f"  {label} {line}")
    count = len({(u.path, p) for u, p in report.vendor})
    print(
        f"check_apis: {report.checked} uses of library names checked; missing: "
        f"{len(missing) + len(report.names)}, guarded by a compat check: "
        f"{len(_grouped(report.guarded))}, optional packages absent: "
        f"{len(_grouped(report.optional))}, vendor SDK names not checked: {count}"
    )
    failed = bool(missing or report.names)
    if args.mypy:
        unguarded, guarded_errors, stubs = run_mypy(args.root)
        for label, lines in (("MYPY", unguarded), ("mypy guarded", guarded_errors),
                             ("mypy stub difference", stubs)):  # fmt: skip
            for line in lines:
                print(f"  {label} {line}")
        print(
            f"check_apis: mypy --python-version {sys.version_info.major}."
            f"{sys.version_info.minor}: {len(unguarded)} missing APIs, {len(guarded_errors)} "
            f"on compat: lines, {len(stubs)} stub differences"
        )
        failed = failed or bool(unguarded)
    return 1 if failed else 0


if __name__ == "__main__":
    import importlib.metadata

    sys.exit(main())
