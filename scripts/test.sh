#!/usr/bin/env bash
# Installs the dependencies, builds kvtier with warnings as errors, and runs every test.
# GPU tests (ctest label "gpu") report "Skipped" with the reason where no GPU exists.
#   KVTIER_BUILD_DIR  build folder (default: build)
#   KVTIER_JOBS       parallel jobs (default: number of cores)
#   extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
build="${KVTIER_BUILD_DIR:-build}"
jobs="${KVTIER_JOBS:-$(nproc)}"
cmake -S . -B "$build" -G Ninja -DKVTIER_WERROR=ON ${KVTIER_CMAKE_ARGS:-}
ninja -C "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 600 "$@"
