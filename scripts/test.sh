#!/usr/bin/env bash
# Installs the dependencies, builds kvtier with warnings as errors, and runs every test.
# GPU tests (ctest label "gpu") report "Skipped" with the reason where no GPU exists.
#   KVTIER_BUILD_DIR  build folder (default: build)
#   KVTIER_JOBS       parallel jobs (default: number of cores)
#   KVTIER_SKIP_VLLM  1: neither install vLLM's CPU build nor run the vLLM tests (ctest label
#                     "vllm" then reports them Skipped); by default scripts/install-vllm.sh
#                     makes its venv (cached per machine: seconds once it is there, about
#                     3-5 min from nothing) and the tests run
#   extra arguments go to ctest, e.g. scripts/test.sh -L unit
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# The CPU torch tests (tests/engines, the transformers CPU entry) run under a venv with
# torch's CPU build: vLLM's venv has one (and pytest); without vLLM, a small torch venv.
if [ "${KVTIER_SKIP_VLLM:-0}" != 1 ]; then
  KVTIER_TORCH_PYTHON="$(scripts/install-vllm.sh)/bin/python"
else
  KVTIER_TORCH_PYTHON="$(scripts/torch-venv.sh)"
fi
export KVTIER_TORCH_PYTHON KVTIER_REQUIRE_TORCH=1
build="${KVTIER_BUILD_DIR:-build}"
jobs="${KVTIER_JOBS:-$(nproc)}"
cmake -S . -B "$build" -G Ninja -DKVTIER_WERROR=ON ${KVTIER_CMAKE_ARGS:-}
ninja -C "$build" -j"$jobs"
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
