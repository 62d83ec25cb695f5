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
# Python tests that need torch without a GPU (tests/engines) use a venv with torch's CPU
# build, made once per machine; with KVTIER_REQUIRE_TORCH=1 a missing torch fails them.
KVTIER_TORCH_PYTHON="$(scripts/torch-venv.sh)"
export KVTIER_TORCH_PYTHON KVTIER_REQUIRE_TORCH=1
# tests/sglang runs under a venv with the sglang package (scripts/sglang-venv.sh, once per
# machine); made here so that its ctest entry does not spend its time limit installing.
KVTIER_SGLANG_PYTHON="$(scripts/sglang-venv.sh)"
export KVTIER_SGLANG_PYTHON
# tests/lmcache: LMCache built for the CPU from its sdist (scripts/lmcache-venv.sh, once per
# machine: 6.5 to 11 minutes on 2 busy cores).
KVTIER_LMCACHE_PYTHON="$(scripts/lmcache-venv.sh)"
export KVTIER_LMCACHE_PYTHON
ctest --test-dir "$build" --output-on-failure -j"$jobs" --timeout 600 "$@"

# Reliability extras (docs/reliability.md), each in its own build folder, after the main
# suite passed:
#   scripts/sanitize.sh  ASan+UBSan (build-asan) and TSan (build-tsan) builds of the unit
#                        and integration tests: 16 min here on 2 cores shared with other
#                        builds (10 CPU-minutes; about 7 min on 2 idle cores)
#   scripts/fuzz.sh      libFuzzer targets (build-fuzz), 30 s each: 5.5 min (2.3 min build)
# KVTIER_SKIP_SANITIZERS=1 / KVTIER_SKIP_FUZZ=1 skip them (e.g. for a quick local run).
if [ "${KVTIER_SKIP_SANITIZERS:-0}" != 1 ]; then
  scripts/sanitize.sh
fi
if [ "${KVTIER_SKIP_FUZZ:-0}" != 1 ]; then
  scripts/fuzz.sh
fi
