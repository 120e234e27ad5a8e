#!/usr/bin/env bash
# The Graphcore IPU environment of requirements-ipu.txt, WITHOUT poptorch (the Poplar SDK's
# wheel is not on PyPI), and the tests of the IPU code path in it.
#
#   scripts/envs/ipu_env.sh [ENV_DIR]       # default /tmp/omnibert-ipu-env (rebuilt each run)
#   PYTHON=/path/to/python3.10 scripts/envs/ipu_env.sh
#
# Python 3.10 and torch 2.0.1 as poptorch 3.4 pins it; PyPI's torch 2.0.1 wheel is the CUDA
# 11.7 build (it pulls the nvidia-*-cu11 packages, about 2.5 GB; no CPU-only 2.0.1 wheel is
# on PyPI) and runs on the CPU here. What a passing run proves: the dependency set resolves
# with torch 2.0.1 on Python 3.10; every torch / Lightning API the code names exists there
# (or is behind an omnibert.compat check); the IPU plugin and strategy drive the FAKE poptorch
# (tests/fakes/sdk) under Lightning 2.3; the training loader without torchdata resumes
# exactly, killed or from checkpoints. It proves nothing about real IPUs.
#
# Not run by the test suite: run it by hand after changing dependencies or the IPU path.

source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

ENV_DIR=${1:-/tmp/omnibert-ipu-env}
PY=$(find_python 3.10) || exit 1

build_env "$ENV_DIR" "$PY" "torch==2.0.1" "$REPO/requirements-ipu.txt" || {
    echo "ipu_env: the environment did not install" >&2
    exit 1
}
report_versions "$ENV_DIR"

step "APIs the code names, and mypy, under torch 2.0.1 / Lightning 2.3 / Python 3.10" \
    "$ENV_DIR/bin/python" "$REPO/scripts/envs/check_apis.py" --mypy
step "tests: IPU and HPU plugins against the fake SDKs, vendor optimisers, profiling" \
    run_tests "$ENV_DIR" tests/unit/test_accelerators_fake_sdk.py tests/unit/test_lamb_vendor.py \
    tests/e2e/test_profile.py
step "tests: the loader without torchdata, data module, samplers, exact resume" \
    run_tests "$ENV_DIR" tests/unit/test_loaders.py tests/unit/test_datamodule.py tests/unit/test_samplers.py \
    tests/e2e/test_packed_sampler.py tests/unit/test_packed.py tests/e2e/test_train_resume.py
step "tests: compatibility shims, FLOP counting, compile-only, LAMB, model, layout" \
    run_tests "$ENV_DIR" tests/unit/test_compat.py tests/unit/test_throughput.py \
    tests/e2e/test_compile_only.py tests/unit/test_lamb.py tests/unit/test_lamb_impls.py tests/unit/test_model.py \
    tests/e2e/test_layout.py
step "smoke: omnibert-train on the CPU" smoke_train "$ENV_DIR" ""
step "smoke: omnibert-train accelerator.compile=true (torch.compile on torch 2.0.1)" \
    smoke_train "$ENV_DIR" "" accelerator.compile=true
step "smoke: omnibert-train accelerator=ipu against the FAKE poptorch" \
    smoke_train "$ENV_DIR" "$REPO/tests/fakes/sdk" accelerator=ipu optimizer=lamb_poptorch \
    accelerator.device_iterations=2 val_every_n_steps=2
finish "ipu_env ($ENV_DIR)"
