#!/usr/bin/env bash
# ctest entry for test_lmcache.py: runs it under the venv scripts/lmcache-venv.sh makes (once
# per machine, cached: LMCache 0.5.6 built for the CPU from its sdist; $KVTIER_LMCACHE_PYTHON
# overrides it). If that venv cannot be made the entry fails; KVTIER_LMCACHE_OPTIONAL=1 skips.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="${KVTIER_LMCACHE_PYTHON:-}"
if [ -z "$py" ]; then
  if ! py="$("$here/../../scripts/lmcache-venv.sh")"; then
    if [ "${KVTIER_LMCACHE_OPTIONAL:-0}" = 1 ]; then
      echo "SKIPPED: scripts/lmcache-venv.sh could not make the lmcache venv"
      exit 0
    fi
    echo "FAILED: scripts/lmcache-venv.sh could not make the lmcache venv (KVTIER_LMCACHE_OPTIONAL=1 skips)"
    exit 1
  fi
fi
# LMCache reads its own working directory for config files: run from a neutral one.
cd /
exec "$py" "$here/test_lmcache.py" "$@"
