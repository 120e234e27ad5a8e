"""The offline wheelhouse (scripts/wheelhouse.py, `make wheelhouse` / `make install-offline`).

The network test builds a real wheelhouse for this machine's Python and platform against a base
list (this environment's packages, minus Hydra, OmegaConf and antlr4, and with Lightning listed at
2.6.1, outside omnibert's range), installs it with no index into a fresh directory and runs
``omnibert-train --help`` from there. It needs a package index and is skipped, with the reason,
when none answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import wheelhouse

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "wheelhouse.py"


def test_base_list_reads_freeze_files_and_refuses_direct_references(tmp_path):
    base = tmp_path / "base.txt"
    base.write_text(
        "# pip list --format=freeze\nTorch==2.6.0\nlightning_utilities==0.15.3\n"
        "-e git+https://example.invalid/x#egg=x\n\nnumpy==1.26.4  # pinned\n"
    )
    assert wheelhouse.read_base(base) == {
        "torch": "2.6.0", "lightning-utilities": "0.15.3", "numpy": "1.26.4",
    }  # fmt: skip
    base.write_text("torch==2.6.0\nmylib @ file:///wheels/mylib-1.0-py3-none-any.whl\n")
    with pytest.raises(wheelhouse.WheelhouseError, match=r"base.txt:2: .*pip list --format=freeze"):
        wheelhouse.read_base(base)
    with pytest.raises(wheelhouse.WheelhouseError, match="cannot read the base list"):
        wheelhouse.read_base(tmp_path / "missing.txt")


def test_a_manylinux_target_accepts_every_older_manylinux_tag():
    tags = wheelhouse.platform_tags("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64" and "manylinux_2_17_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    assert wheelhouse.platform_tags("macosx_11_0_arm64") == ["macosx_11_0_arm64"]


def test_source_only_requirements_are_read_from_both_kinds_of_pip_failure():
    # pip 26's words when the sdist-only package surfaces as a conflict (seen building for 3.12)
    conflict = (
        "The conflict is caused by:\n"
        "    hydra-core 1.3.8 depends on antlr4-python3-runtime==4.9.*\n"
        "    hydra-core 1.3.7 depends on antlr4-python3-runtime==4.9.*\n\n"
        "Additionally, some packages in these conflicts have no matching distributions "
        "available for your environment:\n    antlr4-python3-runtime\n\n"
        "To fix this you could try to:\n"
    )
    assert wheelhouse.source_only_requirements(conflict) == ["antlr4-python3-runtime==4.9.*"]
    direct = "ERROR: Could not find a version that satisfies the requirement pysbd<0.4,>=0.3.4\n"
    assert wheelhouse.source_only_requirements(direct) == ["pysbd<0.4,>=0.3.4"]
    assert wheelhouse.source_only_requirements("ERROR: ResolutionImpossible") == []


def _fake_wheelhouse(tmp_path: Path, python_version: str) -> Path:
    house = tmp_path / "house"
    house.mkdir(parents=True)
    wheel = house / "demo_pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("demo_pkg/__init__.py", "")
        info = "demo_pkg-1.0.dist-info"
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    manifest = {
        "python_version": python_version,
        "platforms": ["any"],
        "extras": [],
        "base": {"file": None, "packages": {}},
        "replaced_from_base": [],
        "packages": [
            {"name": "demo-pkg", "version": "1.0", "file": wheel.name,
             "sha256": wheelhouse.sha256(wheel)},
        ],
    }  # fmt: skip
    (house / "wheelhouse.json").write_text(json.dumps(manifest))
    return house


def _install(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "install", *args], capture_output=True, text=True, timeout=120
    )


def test_install_refuses_a_damaged_wheel_and_another_python(tmp_path):
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    house = _fake_wheelhouse(tmp_path, here)
    (house / "demo_pkg-1.0-py3-none-any.whl").write_bytes(b"not a wheel any more")
    proc = _install("--wheelhouse", str(house), "--target", str(tmp_path / "t"))
    assert proc.returncode == 2
    assert "demo_pkg-1.0-py3-none-any.whl is missing or damaged" in proc.stderr
    other = _fake_wheelhouse(tmp_path / "b", "2.7")
    proc = _install("--wheelhouse", str(other), "--target", str(tmp_path / "t"))
    assert proc.returncode == 2 and "is for Python 2.7 and this is Python" in proc.stderr
    proc = _install("--wheelhouse", str(tmp_path / "nowhere"))
    assert proc.returncode == 2 and "wheelhouse.json is missing or unreadable" in proc.stderr
    assert not (tmp_path / "t").exists()


def test_install_offline_puts_the_wheels_in_a_target_directory(tmp_path):
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    house = _fake_wheelhouse(tmp_path, here)
    proc = _install("--wheelhouse", str(house), "--target", str(tmp_path / "t"))
    assert proc.returncode == 0, proc.stderr
    assert "1 packages into" in proc.stdout and "demo-pkg-1.0" in proc.stdout
    assert (tmp_path / "t" / "demo_pkg" / "__init__.py").is_file()


@pytest.fixture(scope="module")
def index_reachable(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Skip (with pip's reason) when no package index answers; the test never passes without one."""
    out = tmp_path_factory.mktemp("probe")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "-d", str(out), wheelhouse.PIP_SPEC],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        reason = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"no package index reachable, so no wheelhouse can be built: {reason}")


@pytest.mark.network
def test_wheelhouse_fetches_only_what_the_base_lacks_and_installs_offline(
    tmp_path, index_reachable
):
    freeze = subprocess.run(
        [sys.executable, "-m", "pip", "list", "--format=freeze", "--exclude-editable"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    drop = {"hydra-core", "omegaconf", "antlr4-python3-runtime", "lightning", "omnibert"}
    lines = [
        line for line in freeze.splitlines()
        if wheelhouse.canonical(line.split("==")[0]) not in drop
    ]  # fmt: skip
    # a base newer than omnibert's Lightning range (<2.6): the wheelhouse brings one inside it
    base = tmp_path / "base.txt"
    base.write_text("\n".join([*lines, "lightning==2.6.1"]) + "\n")
    house = tmp_path / "house"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "build", "--dest", str(house), "--base", str(base)],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((house / "wheelhouse.json").read_text())
    got = {item["name"]: item["version"] for item in manifest["packages"]}
    # the base's packages stay; antlr4 (a source distribution only) was built into a pure wheel
    assert set(got) == {"omnibert", "hydra-core", "omegaconf", "antlr4-python3-runtime",
                        "lightning"}, got  # fmt: skip
    assert got["lightning"].startswith("2.5.")
    assert manifest["replaced_from_base"] == ["lightning"]
    assert sorted(p.name for p in house.glob("*.whl")) == sorted(
        item["file"] for item in manifest["packages"]
    )
    assert (house / "install.py").is_file()

    # offline: the copy inside the wheelhouse installs it into a fresh directory
    target = tmp_path / "site"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_NO_INDEX"] = "1"
    proc = subprocess.run(
        [sys.executable, str(house / "install.py"), "--target", str(target)],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 packages into" in proc.stdout
    env["PYTHONPATH"] = str(target)
    where = subprocess.run(
        [sys.executable, "-c",
         "import omnibert, hydra, lightning; print(omnibert.__file__); print(hydra.__file__); "
         "print(lightning.__version__)"],
        capture_output=True, text=True, check=True, env=env, cwd=tmp_path,
    ).stdout.split()  # fmt: skip
    assert where[0].startswith(str(target)) and where[1].startswith(str(target))
    assert where[2] == got["lightning"]
    app = subprocess.run(
        [sys.executable, str(target / "bin" / "omnibert-train"), "--help"],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert app.returncode == 0, app.stdout + app.stderr
    assert "omnibert-train" in app.stdout or "pretrain" in app.stdout
