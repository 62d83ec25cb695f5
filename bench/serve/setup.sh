#!/usr/bin/env bash
# Installs bench/serve/requirements.txt into the vLLM venv that scripts/install-vllm.sh made
# ($KVTIER_VLLM_VENV, set by `eval "$(scripts/install-vllm.sh --env)"`), without changing
# what vLLM already installed there (pip's default: satisfied requirements stay).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="${KVTIER_VLLM_VENV:-$("$here/../../scripts/install-vllm.sh")}"
if "$venv/bin/python" -c 'import matplotlib' >/dev/null 2>&1; then
  echo "bench/serve: matplotlib already in $venv"
  exit 0
fi
"$venv/bin/pip" install --disable-pip-version-check -q --no-compile -r "$here/requirements.txt"
"$venv/bin/python" -c 'import matplotlib; print("bench/serve: matplotlib", matplotlib.__version__, "in", "'"$venv"'")'
