#!/usr/bin/env bash
# Installs the dependencies, builds kvtier and starts kvtierd in the foreground on the
# bundled default config (host + NVMe tiers under ./kvtier-data; HBM too where a GPU
# exists). Ctrl-C (SIGINT) or SIGTERM drains and stops it.
#   KVTIER_CONFIG  config file (default: config/kvtier.toml)
#   extra arguments go to kvtierd, e.g. scripts/run.sh --set log.level=debug
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${KVTIER_BUILD_DIR:-build}"
cmake -S . -B "$build" -G Ninja ${KVTIER_CMAKE_ARGS:-} >/dev/null
ninja -C "$build" -j"${KVTIER_JOBS:-$(nproc)}" kvtierd kvtierctl
exec "$build/bin/kvtierd" --config "${KVTIER_CONFIG:-config/kvtier.toml}" "$@"
