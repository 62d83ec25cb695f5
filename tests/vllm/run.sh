#!/usr/bin/env bash
# Runs a tests/vllm script (e2e.py, test_engine.py) inside the vLLM CPU venv that
# scripts/install-vllm.sh makes:  tests/vllm/run.sh e2e.py [args]
# A missing venv is a FAILURE (CI must not skip this silently); KVTIER_SKIP_VLLM=1 skips
# it on purpose, and ctest reports that as Skipped, never as a pass.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
if [ "${KVTIER_SKIP_VLLM:-0}" = 1 ]; then
  echo "SKIPPED: KVTIER_SKIP_VLLM=1 (the vLLM tests were turned off on purpose)"
  exit 0
fi
if ! envs="$("$root/scripts/install-vllm.sh" --env)"; then
  echo "FAILED: no vLLM CPU venv: run scripts/install-vllm.sh first (scripts/test.sh does), or set" \
       "KVTIER_SKIP_VLLM=1 to skip this test on purpose" >&2
  exit 1
fi
eval "$envs"
script="$1"; shift
exec "$KVTIER_VLLM_VENV/bin/python" "$here/$script" "$@"
