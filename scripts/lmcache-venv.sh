#!/usr/bin/env bash
# Makes (once per machine) the virtual environment the LMCache plugin's tests run in: the CPU
# build of torch, LMCache built from its sdist for the CPU (NO_GPU_EXT=1: its common C++
# extensions only; the PyPI wheels are CUDA builds) and LMCache's pure-Python requirements.
# Prints the environment's python on stdout. Idempotent: a venv where lmcache's connector
# package imports is kept.
#   KVTIER_LMCACHE_VENV  where the venv lives (default: ~/.cache/kvtier/lmcache-venv)
#   KVTIER_LMCACHE_VER   the LMCache version (default: 0.5.6; its build pins torch 2.13.0)
#   KVTIER_PYTHON        the interpreter the venv is made from (default: python3 on PATH)
#
#   scripts/lmcache-venv.sh --beside-vllm VLLM_VENV
#       also makes an environment where LMCache and vLLM import together (the serving
#       benchmark's LMCache row, bench/serve/run_matrix.py): a venv whose path is VLLM_VENV's
#       site-packages, then this venv's, so vLLM's versions of what both use (torch, numpy,
#       transformers) win and LMCache's own packages come from here; both venvs hold the
#       same CPU torch. Prints that environment's `vllm` on stdout. It lives at
#       "$KVTIER_LMCACHE_VENV-vllm-<vLLM venv's folder name>".
set -euo pipefail
beside=""
if [ "${1:-}" = "--beside-vllm" ]; then
  beside="${2:?--beside-vllm needs the folder of the vLLM venv}"
  [ -x "$beside/bin/vllm" ] || { echo "lmcache-venv: no vllm in $beside/bin" >&2; exit 1; }
fi
venv="${KVTIER_LMCACHE_VENV:-$HOME/.cache/kvtier/lmcache-venv}"
ver="${KVTIER_LMCACHE_VER:-0.5.6}"
py="${KVTIER_PYTHON:-python3}"
probe='from lmcache.v1.storage_backend.connector import CreateConnector'
ok() { [ -x "$venv/bin/python" ] && (cd / && "$venv/bin/python" -c "$probe") >/dev/null 2>&1; }
beside_vllm() {
  local both="$venv-vllm-$(basename "$beside")" sp
  local probe2='import vllm, lmcache.integration.vllm.vllm_v1_adapter'
  if ! { [ -x "$both/bin/vllm" ] && (cd / && VLLM_TARGET_DEVICE=cpu "$both/bin/python" -c "$probe2") >/dev/null 2>&1; }; then
    rm -rf "$both"
    "$py" -m venv "$both" >&2
    sp="$("$both/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    # .pth files are read in name order: vLLM's packages first, then LMCache's.
    "$beside/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$sp/a-vllm.pth"
    "$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$sp/b-lmcache.pth"
    sed "1s|^#!.*|#!$both/bin/python|" "$beside/bin/vllm" > "$both/bin/vllm"
    chmod +x "$both/bin/vllm"
    (cd / && VLLM_TARGET_DEVICE=cpu "$both/bin/python" -c "$probe2") >&2
  fi
  echo "$both/bin/vllm"
}
if ok; then
  if [ -n "$beside" ]; then beside_vllm; else echo "$venv/bin/python"; fi
  exit 0
fi
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if ! ok; then
  rm -rf "$venv"
  "$py" -m venv "$venv" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  # LMCache's build requirements (its pyproject.toml), installed here for --no-build-isolation.
  "${pip[@]}" torch==2.13.0 numpy ninja 'packaging>=24.2' 'setuptools>=77.0.3,<81' 'setuptools_scm>=8' \
    grpcio==1.78.0 grpcio-tools==1.78.0 wheel >&2
  src="$(mktemp -d)"
  trap 'rm -rf "$src"' EXIT
  (cd "$src" && NO_GPU_EXT=1 "$venv/bin/python" -m pip download --quiet --no-deps --no-build-isolation --no-binary :all: \
     "lmcache==$ver" -d . >&2)
  tar xzf "$src"/lmcache-"$ver".tar.gz -C "$src"
  (cd "$src/lmcache-$ver" && NO_GPU_EXT=1 MAX_JOBS="$(nproc)" "${pip[@]}" --no-build-isolation --no-deps . >&2)
  # Its runtime requirements, less the CUDA-only and cloud ones, with torch held at the CPU build.
  grep -v '^#\|^torch$\|cufile\|nvtx\|google-\|awscrt\|^pytest\|^$' \
    "$src/lmcache-$ver/requirements/common.txt" > "$src/req.txt"
  echo 'torch==2.13.0' > "$src/cons.txt"
  "${pip[@]}" -c "$src/cons.txt" -r "$src/req.txt" >&2
  (cd / && "$venv/bin/python" -c "$probe") >&2
fi
if [ -n "$beside" ]; then beside_vllm; else echo "$venv/bin/python"; fi
