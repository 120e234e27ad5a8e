"""An offline wheelhouse: every wheel omnibert needs that a base environment lacks, and its installer.

Compute nodes of most clusters reach no package index. On a machine that does (any OS, any
Python), ``build`` downloads into one directory the wheels a *target* environment needs — for the
target's Python version and platform, not this machine's — and ``install`` installs them there with
no index::

    # here, with an index: the target is a CUDA container whose packages are listed in base.txt
    # (made there with `pip list --format=freeze > base.txt`)
    python scripts/wheelhouse.py build --dest wheelhouse --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 --base base.txt
    # there, offline: into the active environment, or into a directory for PYTHONPATH
    python wheelhouse/install.py                       # = make install-offline WHEELHOUSE=wheelhouse
    python wheelhouse/install.py --target /scratch/omnibert-site

How the set is chosen: pip resolves omnibert (the wheel built from this checkout, with the extras
asked for) for the target's Python and platform in an empty interpreter in which every package of
the base list is *installed* (a metadata-only stand-in at the base's version). So a base package that
satisfies omnibert's ranges is kept and not downloaded (a CUDA container's torch, Triton, numpy,
pyarrow), and one outside them is replaced by a version inside (a base with Lightning 2.6 gets the
newest Lightning below 2.6). Without ``--base``, the base is torch alone: everything but torch is
fetched (torch comes from the cluster's own build, or ``pip install torch==...``). A package that
exists on the index only as a source distribution (e.g. ``antlr4-python3-runtime``, which Hydra
needs) is built here into a wheel, and accepted only when that wheel is pure Python.

The directory gets ``wheelhouse.json`` (target, base, every wheel with its version), the wheels, and
``install.py`` (a copy of this script), so the cluster needs nothing but that directory.

Standard library only (and pip): it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "wheelhouse.json"
#: pip >= 25 resolves with --platform/--python-version under --dry-run (23.x needs --target,
#: which ignores installed packages: the base list would be fetched again)
PIP_SPEC = "pip>=25,<27"
#: what pip wheel needs to build omnibert's wheel from a copy of the checkout
PROJECT_FILES = ("pyproject.toml", "README.md", "src", "kernels", "conf")
#: torch's stand-in version when the base list has none (omnibert's own CPU pin)
DEFAULT_TORCH = "2.13.0"


class WheelhouseError(Exception):
    """A problem the user fixes (a file, a value, the network): one sentence, exit 2."""


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_base(path: Path) -> dict[str, str]:
    """``{canonical name: version}`` from a ``pip freeze`` / ``pip list --format=freeze`` file.

    ``name==version`` lines are read; comments, options (``-e``, ``--index-url``) and blank lines
    are skipped; ``name @ url`` lines (direct references, whose version pip freeze does not say)
    are refused with the command that gives versions.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise WheelhouseError(
            f"cannot read the base list {path} ({exc.strerror}); pass --base / BASE= a file made "
            "in the target environment with `pip list --format=freeze > base.txt`."
        ) from None
    base: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*===?\s*([^\s;]+)", line)
        if match is None:
            raise WheelhouseError(
                f"{path}:{number}: {raw.strip()!r} is not a `name==version` line; make the base "
                "list with `pip list --format=freeze` (pip freeze writes `name @ url` for "
                "packages installed from files)."
            )
        base[canonical(match.group(1))] = match.group(3)
    return base


def platform_tags(platform: str) -> list[str]:
    """Every platform tag a ``manylinux_2_N_<arch>`` system also accepts, newest first.

    pip matches ``--platform`` exactly, so a manylinux_2_28 target must also name 2_27 ... 2_17 and
    the legacy aliases (manylinux2014 = 2_17, manylinux2010 = 2_12, manylinux1 = 2_5). Other tags
    (macosx_..., win_amd64, linux_x86_64) are passed as they are.
    """
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    if match is None:
        return [platform]
    major, minor, arch = int(match.group(1)), int(match.group(2)), match.group(3)
    if major != 2:
        return [platform]
    tags = [f"manylinux_2_{n}_{arch}" for n in range(minor, 4, -1)]
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    tags += [f"{alias}_{arch}" for n, alias in aliases.items() if n <= minor]
    return tags


def local_platform() -> str:
    """This machine's newest platform tag (``manylinux_2_N_<arch>`` on glibc Linux)."""
    import platform as _platform
    import sysconfig

    arch = _platform.machine()
    libc, version = _platform.libc_ver()
    if sys.platform.startswith("linux") and libc == "glibc" and version:
        major, minor = version.split(".")[:2]
        return f"manylinux_{major}_{minor}_{arch}"
    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def run(cmd: Sequence[str], what: str, env: dict[str, str] | None = None) -> str:
    """Run a pip command; its failure becomes one sentence with pip's last lines."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        raise WheelhouseError(f"{what} failed (pip exit {proc.returncode}):\n{tail}")
    return proc.stdout


def pip_wheel_for_resolution(work: Path) -> Path:
    """A wheel of a recent pip (``PIP_SPEC``), run as ``python <wheel>/pip`` in a bare venv."""
    out = work / "pip"
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "-d", str(out), PIP_SPEC],
        f"downloading {PIP_SPEC} (the wheelhouse needs a package index: is one reachable?)",
    )  # fmt: skip
    (wheel,) = out.glob("pip-*.whl")
    return wheel


def build_project_wheel(dest: Path, work: Path, *, isolated: bool = True) -> Path:
    """omnibert's wheel, built from a copy of the checkout (nothing written into the checkout);
    ``isolated=False`` builds with this environment's setuptools (no index needed)."""
    src = work / "project"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in PROJECT_FILES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy(path, src / name)
    for old in dest.glob("omnibert-*.whl"):
        old.unlink()
    isolation = [] if isolated else ["--no-build-isolation"]
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(dest),
         str(src)],
        "building omnibert's wheel" + ("" if isolated else " (with this environment's setuptools)"),
    )  # fmt: skip
    (wheel,) = dest.glob("omnibert-*.whl")
    return wheel


def write_stand_ins(site: Path, base: dict[str, str]) -> None:
    """Metadata-only installed distributions: pip takes each base package as installed."""
    for name, version in base.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8"
        )
        (info / "INSTALLER").write_text("omnibert-wheelhouse\n", encoding="utf-8")


def wheel_requirement(wheel: Path, name: str) -> str | None:
    """The ``Requires-Dist`` line of ``name`` in a wheel's METADATA (without markers)."""
    with zipfile.ZipFile(wheel) as zf:
        (meta,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
        for line in zf.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:"):
                req = line.split(":", 1)[1].split(";", 1)[0].strip()
                if canonical(re.split(r"[\s<>=!~\[(]", req, maxsplit=1)[0]) == name:
                    return req
    return None


def resolve(
    project_wheel: Path,
    extras: Sequence[str],
    base: dict[str, str],
    python_version: str,
    platforms: Sequence[str],
    find_links: Path,
    work: Path,
) -> list[tuple[str, str]]:
    """``[(name, version)]`` pip would install on the target, sdist-only pure packages built."""
    pip = pip_wheel_for_resolution(work)
    venv = work / "resolver-env"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], "creating a bare venv")
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = work / "base-site"
    write_stand_ins(site, base)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIP_REQUIRE"))}
    env["PYTHONPATH"] = str(site)
    target = f"{project_wheel}[{','.join(extras)}]" if extras else str(project_wheel)
    platform_args = [a for p in platforms for a in ("--platform", p)]
    # every base package pinned, so the others are chosen to fit it (an older datasets for an
    # older pyarrow) rather than the newest release replacing it; a pin omnibert's ranges
    # exclude is dropped when pip names it in a conflict, and that package is fetched
    pinned = dict(base)
    constraints = work / "base-constraints.txt"
    built: set[str] = set()
    for _attempt in range(len(base) + 8):
        constraints.write_text(
            "".join(f"{name}=={version}\n" for name, version in pinned.items()), encoding="utf-8"
        )
        report = work / "report.json"
        cmd = [
            str(python), f"{pip}/pip", "install", "--dry-run", "--report", str(report),
            "--only-binary=:all:", "--implementation", "cp", "--python-version", python_version,
            *platform_args, "--find-links", str(find_links), "--constraint", str(constraints),
            target,
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode == 0:
            data = json.loads(report.read_text(encoding="utf-8"))
            return [
                (canonical(item["metadata"]["name"]), item["metadata"]["version"])
                for item in data["install"]
            ]
        message = proc.stderr + proc.stdout
        conflicting = {
            canonical(name)
            for name in re.findall(
                r"The user requested \(constraint\) ([A-Za-z0-9._-]+?)==", message
            )
        }
        if "torch" in conflicting:
            raise WheelhouseError(
                f"the base's torch {base['torch']} is outside omnibert's range; install a torch "
                "inside it on the target (pyproject.toml: torch>=2.1,<2.14) and list it in the base."
            )
        if conflicting & pinned.keys():
            for name in conflicting:
                pinned.pop(name, None)
            continue
        missing = source_only_requirements(message)
        if not missing or set(missing) <= built:
            tail = "\n".join(
                line for line in message.strip().splitlines() if not line.startswith("WARNING")
            )
            raise WheelhouseError(
                f"pip could not resolve omnibert for Python {python_version} on "
                f"{platforms[0]} against the base list:\n{tail}"
            )
        for requirement in missing:
            if requirement not in built:
                built.add(requirement)
                build_pure_wheel(requirement, find_links, platforms[0])
    raise WheelhouseError("pip's resolution did not settle (too many conflicts or source builds).")


def source_only_requirements(message: str) -> list[str]:
    """The requirements pip found no wheel for, from its resolution failure.

    pip says either "Could not find a version that satisfies the requirement NAME<spec>" or, when
    the failure surfaces as a conflict, lists the names under "have no matching distributions
    available" with the dependants' "... depends on NAME<spec>" lines above.
    """
    found = re.findall(r"satisfies the requirement (\S+)", message)
    block = re.search(r"no matching distributions available[^\n]*\n((?:[ \t]+\S+\n?)+)", message)
    for name in block.group(1).split() if block else []:
        spec = re.search(rf"depends on ({re.escape(name)}[^\s,]*)", message)
        found.append(spec.group(1) if spec else name)
    return list(dict.fromkeys(found))


def build_pure_wheel(requirement: str, dest: Path, platform: str) -> None:
    """Build a source-only requirement into a wheel here; refuse one that is not pure Python."""
    before = set(dest.glob("*.whl"))
    run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-binary=:all:", "-q", "-w",
         str(dest), requirement],
        f"building {requirement} from its source distribution",
    )  # fmt: skip
    for wheel in set(dest.glob("*.whl")) - before:
        if not wheel.name.endswith("-none-any.whl"):
            wheel.unlink()
            raise WheelhouseError(
                f"{requirement} has no wheel for {platform} on the index and its source builds "
                f"a platform-specific wheel here ({wheel.name}); build it on a {platform} "
                "machine with `pip wheel` and put it in the wheelhouse."
            )


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def wheel_name_version(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return canonical(name), version


def build(args: argparse.Namespace) -> int:
    dest = Path(args.dest).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    if args.base:
        base = read_base(Path(args.base))
        if "omnibert" in base:
            del base["omnibert"]
    else:
        base = {}
    if "torch" not in base:
        base["torch"] = args.torch_version
        print(
            f"wheelhouse: the base names no torch; torch {args.torch_version} is taken as "
            "installed (--torch-version), so no torch wheel is fetched"
        )
    platforms = platform_tags(local_platform() if args.platform == "local" else args.platform)
    with tempfile.TemporaryDirectory(prefix="omnibert-wheelhouse-") as tmp:
        work = Path(tmp)
        project = build_project_wheel(dest, work)
        torch_req = wheel_requirement(project, "torch")
        print(f"wheelhouse: built {project.name} (torch requirement: {torch_req})")
        wanted = resolve(project, args.extras, base, args.python_version, platforms, dest, work)
    others = [(n, v) for n, v in wanted if n != "omnibert"]
    have = {wheel_name_version(p): p for p in dest.glob("*.whl")}
    fetch = [f"{n}=={v}" for n, v in others if (n, v) not in have]
    if fetch:
        run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
             "--implementation", "cp", "--python-version", args.python_version,
             *[a for p in platforms for a in ("--platform", p)], "-d", str(dest), *fetch],
            f"downloading {len(fetch)} wheels",
        )  # fmt: skip
    have = {wheel_name_version(p): p for p in dest.glob("*.whl")}
    wanted_keys = {(canonical(n), v) for n, v in wanted}
    for key, path in have.items():  # wheels of an earlier build that this one does not need
        if key not in wanted_keys:
            path.unlink()
    packages = []
    for name, version in sorted(wanted):
        (path,) = [p for (n, v), p in have.items() if n == name and v == version]
        packages.append(
            {"name": name, "version": version, "file": path.name, "sha256": sha256(path)}
        )
    replaced = sorted(n for n, _ in others if n in base)
    manifest = {
        "python_version": args.python_version,
        "platforms": platforms,
        "extras": list(args.extras),
        "base": {"file": str(args.base) if args.base else None, "packages": base},
        "replaced_from_base": replaced,
        "packages": packages,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    shutil.copy(Path(__file__), dest / "install.py")
    size = sum(p.stat().st_size for p in dest.glob("*.whl"))
    print(
        f"wheelhouse: {len(packages)} wheels ({size / 2**20:.1f} MiB) in {dest} for Python "
        f"{args.python_version} on {platforms[0]}; kept from the base: "
        f"{len(base) - len(replaced)} packages"
        + (f"; replaced from the base (outside omnibert's ranges): {', '.join(replaced)}"
           if replaced else "")
    )  # fmt: skip
    for item in packages:
        print(f"  {item['name']}=={item['version']}")
    print(f"install it offline with: python {dest / 'install.py'} [--target DIR]")
    return 0


def read_manifest(wheelhouse: Path) -> dict:
    path = wheelhouse / MANIFEST
    try:
        manifest: dict = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise WheelhouseError(
            f"{path} is missing or unreadable ({exc}); pass WHEELHOUSE= / --wheelhouse the "
            "directory `make wheelhouse` wrote."
        ) from None
    for item in manifest["packages"]:
        wheel = wheelhouse / item["file"]
        if not wheel.is_file() or sha256(wheel) != item["sha256"]:
            raise WheelhouseError(
                f"{wheel} is missing or damaged (sha256 differs from {MANIFEST}); copy the "
                "wheelhouse again or rebuild it with `make wheelhouse`."
            )
    return manifest


def install(args: argparse.Namespace) -> int:
    wheelhouse = Path(args.wheelhouse).resolve()
    manifest = read_manifest(wheelhouse)
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != manifest["python_version"]:
        raise WheelhouseError(
            f"this wheelhouse is for Python {manifest['python_version']} and this is Python "
            f"{here}; run it with that Python, or build one with PYVER={here}."
        )
    wheels = [str(wheelhouse / item["file"]) for item in manifest["packages"]]
    cmd = [sys.executable, "-m", "pip", "install", "--no-index", "--no-cache-dir",
           "--disable-pip-version-check"]  # fmt: skip
    if args.target:
        # a directory for PYTHONPATH: exactly the wheelhouse, the base packages come from the
        # interpreter's environment (pip --target ignores installed packages: no resolution)
        target = Path(args.target).resolve()
        cmd += ["--no-deps", "--upgrade", "--target", str(target), *wheels]
    else:
        # the active environment: pip checks the wheelhouse against what is installed
        extras = manifest["extras"]
        spec = "omnibert" + (f"[{','.join(extras)}]" if extras else "")
        cmd += ["--find-links", str(wheelhouse), spec]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-8:])
        raise WheelhouseError(
            f"installing from {wheelhouse} failed (pip exit {proc.returncode}); if pip names a "
            "package it cannot find, this environment lacks one the base list said it has "
            f"(rebuild with BASE= its `pip list --format=freeze`):\n{tail}"
        )
    done = [line for line in proc.stdout.splitlines() if line.startswith("Successfully installed")]
    installed = done[0].split()[2:] if done else []
    where = args.target or sys.prefix
    print(f"install-offline: {len(installed)} packages into {where} with no index:")
    for item in installed:
        print(f"  {item}")
    if args.target:
        print(
            f"use them with: export PYTHONPATH={Path(args.target).resolve()}${{PYTHONPATH:+:"
            f"$PYTHONPATH}}; the apps are in {Path(args.target).resolve() / 'bin'}"
        )
    return 0


def parse(argv: Iterable[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    b = sub.add_parser("build", help="download the wheels a target environment lacks")
    b.add_argument("--dest", default="wheelhouse", help="the wheelhouse directory")
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    b.add_argument("--python-version", default=here, help="target Python, e.g. 3.12")
    b.add_argument(
        "--platform",
        default="local",
        help="target platform tag, e.g. manylinux_2_28_x86_64 (older manylinux tags are "
        "added); local: this machine's",
    )
    b.add_argument("--base", help="`pip list --format=freeze` of the target environment")
    b.add_argument("--extras", default="", help="omnibert extras, comma separated (e.g. gpu)")
    b.add_argument(
        "--torch-version", default=DEFAULT_TORCH, help="torch assumed when the base has none"
    )
    i = sub.add_parser("install", help="install a wheelhouse with no index")
    i.add_argument(
        "--wheelhouse",
        default=str(Path(__file__).resolve().parent),
        help="the wheelhouse directory (default: the one this script is in)",
    )
    i.add_argument("--target", help="install into this directory (for PYTHONPATH) instead")
    words = list(argv) if argv is not None else sys.argv[1:]
    if not words or words[0] not in ("build", "install", "-h", "--help"):
        words = ["install", *words]  # `python wheelhouse/install.py [--target DIR]` installs
    args = parser.parse_args(words)
    if args.command == "build":
        args.extras = [e for e in args.extras.split(",") if e]
    return args


def main(argv: Iterable[str] | None = None) -> int:
    args = parse(argv)
    try:
        return build(args) if args.command == "build" else install(args)
    except WheelhouseError as exc:
        print(f"wheelhouse: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
