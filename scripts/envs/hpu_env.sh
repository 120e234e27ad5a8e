#!/usr/bin/env bash
# The Intel Gaudi environment of requirements-hpu.txt as far as PyPI has it, and the tests of
# the HPU code path in it.
#
#   scripts/envs/hpu_env.sh [ENV_DIR]       # default /tmp/omnibert-hpu-env (rebuilt each run)
#   PYTHON=/path/to/python3.10 scripts/envs/hpu_env.sh
#
# Target: Intel Gaudi software 1.21 (PyTorch 2.6.0, Lightning 2.5.1, Python 3.10 on Ubuntu
# 22.04: Intel's "Support Matrix v1.21.0"). Intel's torch build and habana_frameworks are
# not on PyPI: PyPI's torch 2.6.0 stands in (its default Linux wheel is the CUDA 12.4 build,
# which pulls the nvidia-*-cu12 packages; it runs on the CPU here), and lightning-habana
# 1.6.0 comes from PyPI. What a passing run proves: the dependency set resolves with torch
# 2.6.0 on Python 3.10; every torch / Lightning API the code names exists there; the HPU
# plugin drives the FAKE habana_frameworks / lightning_habana (tests/fakes/sdk) under
# Lightning 2.5.1; smoke trainings run on the CPU. It proves nothing about real Gaudi devices.
#
# Not run by the test suite: run it by hand after changing dependencies or the HPU path.

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ENV_DIR=${1:-/tmp/omnibert-hpu-env}
PY=$(find_python 3.10) || exit 1

build_env "$ENV_DIR" "$PY" "torch==2.6.0" "$REPO/requirements-hpu.txt" || {
    echo "hpu_env: the environment did not install" >&2
    exit 1
}
report_versions "$ENV_DIR"

lightning_habana_imports() {
    # the real package (not the fake): it imports without habana_frameworks, HPU_AVAILABLE False
    "$ENV_DIR/bin/python" -W ignore -c "import lightning_habana as lh, lightning; \
print(f'lightning_habana {lh.__version__} imports with lightning {lightning.__version__}; \
HPU_AVAILABLE={lh.HPU_AVAILABLE}')"
}

step "APIs the code names, and mypy, under torch 2.6 / Lightning 2.5.1 / Python 3.10" \
    "$ENV_DIR/bin/python" "$REPO/scripts/envs/check_apis.py" --mypy
step "the real lightning-habana from PyPI imports with this Lightning" lightning_habana_imports
step "tests: HPU (and IPU) plugins against the fake SDKs, vendor optimisers, profiling" \
    run_tests "$ENV_DIR" tests/unit/test_accelerators_fake_sdk.py tests/unit/test_lamb_vendor.py \
    tests/e2e/test_profile.py
step "tests: compatibility shims, loaders, exact resume, FLOP counting, compile-only, LAMB" \
    run_tests "$ENV_DIR" tests/unit/test_compat.py tests/unit/test_loaders.py tests/unit/test_datamodule.py \
    tests/e2e/test_train_resume.py tests/unit/test_throughput.py tests/e2e/test_compile_only.py \
    tests/unit/test_lamb.py tests/unit/test_lamb_impls.py tests/unit/test_model.py tests/e2e/test_layout.py
# the fake lightning_habana classes only record their arguments (no Lightning strategy to
# train with), so the end-to-end runs are on the CPU: the shared code under torch 2.6
step "smoke: omnibert-train on the CPU" smoke_train "$ENV_DIR" ""
step "smoke: omnibert-train accelerator.compile=true (nn.Module.compile on torch 2.6)" \
    smoke_train "$ENV_DIR" "" accelerator.compile=true
finish "hpu_env ($ENV_DIR)"
