"""The wheel bundle for a GPU machine without network: ``make gpu-bundle``.

Builds, here, into ``.gpu-bundle/`` (ignored by git; it travels with the working tree), the
wheels that the GPU device image lacks (``scripts/gpu_bundle.txt``, for its Python and
platform: 3.12, manylinux x86_64) and omnibert's own wheel built from this checkout, with
``bundle.json`` (every wheel with its version, size and sha256, and a digest of the project
files the omnibert wheel was built from, so ``scripts/gpu_check.py`` can refuse a stale one)
and a size report. ``scripts/gpu_check.py`` installs it there with ``--no-index --no-deps``.

    python scripts/gpu_bundle.py                       # = make gpu-bundle
    python scripts/gpu_bundle.py --project-only        # omnibert's wheel alone (no index needed)

Standard library only (and pip), like ``scripts/wheelhouse.py``, whose helpers it uses.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import wheelhouse
from wheelhouse import ROOT, WheelhouseError, canonical, platform_tags, run, sha256

REQUIREMENTS = Path(__file__).with_name("gpu_bundle.txt")
DEST = ROOT / ".gpu-bundle"
MANIFEST = "bundle.json"
#: the device image's Python and platform (docs/accelerators/gpu.md)
PYTHON_VERSION = "3.12"
PLATFORM = "manylinux_2_28_x86_64"
#: the bundle must stay small: it travels with the working tree (64 MiB in all)
SIZE_LIMIT = 16 * 2**20
#: the distributions the device image has (the device tool's KINDS.md, read on a machine
#: running it on 2026-11-17); what the GPU path imports is either here or in the bundle
IMAGE_PACKAGES = frozenset((
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal",
    "annotated-doc", "anyio", "attrs", "botorch", "build", "certifi", "charset-normalizer",
    "chex", "click", "cloudpickle", "cmake", "colorama", "contourpy", "coverage",
    "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x", "cycler",
    "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch",
    "grpcio", "h11", "h5py", "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize",
    "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax", "jax-cuda13-pjrt",
    "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib", "kiwisolver",
    "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite",
    "lxml", "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson",
    "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict", "multipledispatch",
    "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja", "numba", "numba-cuda",
    "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile",
    "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse", "nvidia-cusparselt-cu13",
    "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink", "nvidia-nvshmem-cu13",
    "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "optax", "opt-einsum", "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging",
    "pandas", "pathspec", "patsy", "peft", "pillow", "pip", "pluggy", "portalocker",
    "prometheus-client", "propcache", "protobuf", "psutil", "pyarrow", "pybind11",
    "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions", "pytest",
    "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist",
    "python-dateutil", "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu",
    "safetensors", "scikit-build-core", "scikit-image", "scikit-learn", "scipy", "seaborn",
    "sentencepiece", "sentence-transformers", "setuptools", "shellingham", "simplejson", "six",
    "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm",
    "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric",
    "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer",
    "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug",
    "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
))  # fmt: skip
#: sdist-only requirements, built here into pure-Python wheels
SOURCE_ONLY = {"antlr4-python3-runtime"}


def requirements(path: Path = REQUIREMENTS) -> list[str]:
    """``name==version`` lines of the requirements file (comments and blanks skipped)."""
    out = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*==[^\s;]+", line):
            raise WheelhouseError(f"{path}:{number}: {line!r} is not a `name==version` pin.")
        out.append(line)
    return out


def project_digest(root: Path = ROOT) -> str:
    """sha256 over the files omnibert's wheel is built from (paths and contents)."""
    digest = hashlib.sha256()
    for name in wheelhouse.PROJECT_FILES:
        top = root / name
        files = sorted(p for p in top.rglob("*") if p.is_file()) if top.is_dir() else [top]
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc" or ".egg-info" in str(path):
                continue
            digest.update(str(path.relative_to(root)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


def fetch(pins: list[str], dest: Path, python_version: str, platform: str) -> None:
    """Download the binary wheels of ``pins`` for the target, and build the sdist-only ones."""
    binary = [p for p in pins if canonical(p.split("==")[0]) not in SOURCE_ONLY]
    platforms = [a for tag in platform_tags(platform) for a in ("--platform", tag)]
    run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
         "--implementation", "cp", "--python-version", python_version, *platforms,
         "-d", str(dest), *binary],
        f"downloading {len(binary)} wheels for Python {python_version} (is an index reachable?)",
    )  # fmt: skip
    for pin in pins:
        if canonical(pin.split("==")[0]) in SOURCE_ONLY:
            wheelhouse.build_pure_wheel(pin, dest, platform)


def build(dest: Path, *, project_only: bool, python_version: str, platform: str) -> dict:
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    pins = [] if project_only else requirements()
    if pins:
        fetch(pins, dest, python_version, platform)
    with tempfile.TemporaryDirectory(prefix="omnibert-bundle-") as tmp:
        project = wheelhouse.build_project_wheel(dest, Path(tmp), isolated=False)
    packages = []
    for wheel in sorted(dest.glob("*.whl")):
        name, version = wheelhouse.wheel_name_version(wheel)
        packages.append({"name": name, "version": version, "file": wheel.name,
                         "bytes": wheel.stat().st_size, "sha256": sha256(wheel)})  # fmt: skip
    wanted = {canonical(p.split("==")[0]) for p in pins} | {"omnibert"}
    missing = wanted - {p["name"] for p in packages}
    if missing:
        raise WheelhouseError(f"no wheel came for {', '.join(sorted(missing))}.")
    total = sum(p["bytes"] for p in packages)
    manifest = {
        "python_version": python_version,
        "platform": platform,
        "project_wheel": project.name,
        "project_digest": project_digest(),
        "total_bytes": total,
        "packages": packages,
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", default=str(DEST), help="the bundle directory")
    parser.add_argument("--python-version", default=PYTHON_VERSION)
    parser.add_argument("--platform", default=PLATFORM)
    parser.add_argument("--project-only", action="store_true",
                        help="omnibert's wheel alone (a rehearsal where the rest is installed)")  # fmt: skip
    args = parser.parse_args(argv)
    try:
        manifest = build(Path(args.dest), project_only=args.project_only,
                         python_version=args.python_version, platform=args.platform)  # fmt: skip
    except WheelhouseError as exc:
        print(f"gpu_bundle: {exc}", file=sys.stderr)
        return 2
    total = manifest["total_bytes"]
    print(f"gpu_bundle: {len(manifest['packages'])} wheels, {total / 2**20:.2f} MiB in "
          f"{args.dest} (limit {SIZE_LIMIT / 2**20:.0f} MiB) for Python "
          f"{manifest['python_version']} on {manifest['platform']}")  # fmt: skip
    for item in sorted(manifest["packages"], key=lambda p: -p["bytes"]):
        print(f"  {item['bytes'] / 2**10:8.0f} KiB  {item['name']}=={item['version']}")
    if total > SIZE_LIMIT:
        print(f"gpu_bundle: the bundle is over {SIZE_LIMIT / 2**20:.0f} MiB; drop what the GPU "
              f"path does not import from {REQUIREMENTS.name}.", file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
