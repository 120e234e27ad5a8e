#!/usr/bin/env bash
# The one command to run on a GPU machine lent without network (docs/accelerators/gpu.md):
#   bash scripts/gpu_check.sh OUT [--deadline 450] [--rehearse] [--steps install,probe,...]
# It needs the wheel bundle beside it (make gpu-bundle: .gpu-bundle/, copied with the checkout)
# and the machine's python3 with torch; everything else is in scripts/gpu_check.py.
set -u
here="$(cd "$(dirname "$0")" && pwd)"
exec "${PYTHON:-python3}" "$here/gpu_check.py" "$@"
