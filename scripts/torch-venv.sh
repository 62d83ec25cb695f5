#!/usr/bin/env bash
# Makes (once per machine) a small virtual environment with the CPU build of torch and
# numpy, transformers and pytest, for the Python tests that need torch without a GPU
# (tests/engines, the transformers CPU entry). Prints the
# environment's python on stdout. Idempotent: a venv whose torch imports is kept.
#   KVTIER_TORCH_VENV  where the venv lives (default: ~/.cache/kvtier/torch-venv)
#   KVTIER_TORCH_SPEC  the torch requirement (default: torch==2.13.0)
#   KVTIER_PYTHON      the interpreter the venv is made from (default: python3 on PATH)
set -euo pipefail
venv="${KVTIER_TORCH_VENV:-$HOME/.cache/kvtier/torch-venv}"
spec="${KVTIER_TORCH_SPEC:-torch==2.13.0}"
py="${KVTIER_PYTHON:-python3}"
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch, numpy, transformers, pytest' >/dev/null 2>&1; then
  echo "$venv/bin/python"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
# One maker at a time: parallel ctest entries and a concurrent scripts/test.sh share it.
exec 9>"$venv.lock"
flock 9
if ! { [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import torch, numpy, transformers, pytest' >/dev/null 2>&1; }; then
  rm -rf "$venv"
  "$py" -m venv "$venv" >&2
  "$venv/bin/python" -m pip install --quiet "$spec" numpy transformers pytest >&2
  "$venv/bin/python" -c 'import torch, numpy, transformers, pytest' >&2
fi
echo "$venv/bin/python"
