#!/usr/bin/env bash
# ctest entry for test_pages.py (group cpu or gpu) with a python that has torch:
# $KVTIER_TORCH_PYTHON, else the venv scripts/torch-venv.sh makes (when it is there), else
# python3 on PATH; the gpu group uses $KVTIER_GPU_PYTHON or python3 (the GPU machine's, with
# its CUDA torch). scripts/test.sh makes the venv
# and sets KVTIER_REQUIRE_TORCH=1, so in CI a missing torch fails instead of skipping.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv_py="${KVTIER_TORCH_VENV:-$HOME/.cache/kvtier/torch-venv}/bin/python"
py="${KVTIER_TORCH_PYTHON:-}"
# The gpu group wants the machine's CUDA torch, not the CPU venv.
# Where that python has no torch (a build machine without a GPU), the CPU venv's python
# runs the group, which then reports Skipped (no CUDA device) rather than a missing torch.
if [ "${1:-}" = gpu ]; then
  py="${KVTIER_GPU_PYTHON:-$(command -v python3)}"
  if ! "$py" -c 'import torch' >/dev/null 2>&1 && [ -n "${KVTIER_TORCH_PYTHON:-}" ]; then
    py="$KVTIER_TORCH_PYTHON"
  fi
fi
if [ -z "$py" ]; then
  if [ -x "$venv_py" ]; then py="$venv_py"; else py="$(command -v python3)"; fi
fi
exec "$py" "$here/test_pages.py" "$@"
