"""A non-editable install works: the wheel holds every module, the configs (conf/ shipped as
the package omnibert.conf, found through Hydra's pkg:// search path) and the console scripts.
(Installing that wheel into a fresh venv and running omnibert-train from it was done by hand;
see the README's Development section.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel pip builds from a copy of the project (no build/ written into the checkout)."""
    src = tmp_path_factory.mktemp("project")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in ("src", "kernels", "conf"):
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns(
            "__pycache__", "*.egg-info"))  # fmt: skip
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(src)],
        check=True, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    (path,) = out.glob("omnibert-*.whl")
    return zipfile.ZipFile(path)


def test_the_wheel_holds_every_module_and_config(wheel):
    names = set(wheel.namelist())
    modules = {p.relative_to(ROOT / "src").as_posix() for p in (ROOT / "src").rglob("*.py")}
    modules |= {
        p.relative_to(ROOT / "kernels").as_posix() for p in (ROOT / "kernels").rglob("*.py")
    }
    configs = {"omnibert/conf/" + p.relative_to(ROOT / "conf").as_posix()
               for p in (ROOT / "conf").rglob("*") if p.suffix in (".yaml", ".py")}  # fmt: skip
    assert modules - names == set()
    assert configs - names == set()
    assert "omnibert/conf/pretrain.yaml" in configs and "omnibert/py.typed" in names
    assert not [n for n in names if n.startswith(("tests/", "scripts/", "conf/"))]


def test_the_wheel_installs_the_console_scripts(wheel):
    (entry,) = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    text = wheel.read(entry).decode()
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for name, target in scripts.items():
        assert f"{name} = {target}" in text
    assert set(scripts) >= {"omnibert-prepare", "omnibert-train", "omnibert-export"}
