#!/usr/bin/env bash
# ctest entry for test_sglang.py: runs it under the venv scripts/sglang-venv.sh makes (once
# per machine, cached; $KVTIER_SGLANG_PYTHON overrides it). If that venv cannot be made the
# entry fails; KVTIER_SGLANG_OPTIONAL=1 turns a missing sglang into a skip instead.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${KVTIER_SGLANG_PYTHON:-}"
if [ -z "$py" ]; then
  if ! py="$("$here/../../scripts/sglang-venv.sh")"; then
    if [ "${KVTIER_SGLANG_OPTIONAL:-0}" = 1 ]; then
      echo "SKIPPED: scripts/sglang-venv.sh could not make the sglang venv"
      exit 0
    fi
    echo "FAILED: scripts/sglang-venv.sh could not make the sglang venv (KVTIER_SGLANG_OPTIONAL=1 skips)"
    exit 1
  fi
fi
exec "$py" "$here/test_sglang.py" "$@"
