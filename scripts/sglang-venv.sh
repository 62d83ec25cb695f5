#!/usr/bin/env bash
# Makes (once per machine) the virtual environment the SGLang backend's tests run in: the
# CPU build of torch, the sglang package without its GPU dependencies (--no-deps), and the
# pure-Python packages that sglang's HiCache storage modules import (the storage backend
# factory pulls them in through sglang.srt.utils). Prints the environment's python on
# stdout. Idempotent: a venv where the factory imports is kept.
#   KVTIER_SGLANG_VENV  where the venv lives (default: ~/.cache/kvtier/sglang-venv)
#   KVTIER_SGLANG_SPEC  the sglang requirement (default: sglang==0.5.23)
#   KVTIER_TORCH_SPEC   the torch requirement (default: torch==2.13.0)
#   KVTIER_PYTHON       the interpreter the venv is made from (default: python3 on PATH)
set -euo pipefail
venv="${KVTIER_SGLANG_VENV:-$HOME/.cache/kvtier/sglang-venv}"
spec="${KVTIER_SGLANG_SPEC:-sglang==0.5.23}"
torch_spec="${KVTIER_TORCH_SPEC:-torch==2.13.0}"
py="${KVTIER_PYTHON:-python3}"
probe='from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory'
ok() { [ -x "$venv/bin/python" ] && (cd / && "$venv/bin/python" -c "$probe") >/dev/null 2>&1; }
if ok; then echo "$venv/bin/python"; exit 0; fi
mkdir -p "$(dirname "$venv")"
# One maker at a time: parallel ctest entries share it.
exec 9>"$venv.lock"
flock 9
if ! ok; then
  rm -rf "$venv"
  "$py" -m venv "$venv" >&2
  pip=("$venv/bin/python" -m pip install --quiet --disable-pip-version-check)
  "${pip[@]}" "$torch_spec" numpy >&2
  "${pip[@]}" --no-deps "$spec" >&2
  # What `import sglang.srt.mem_cache.storage.backend_factory` needs, and no more: torch is
  # kept at the CPU build (sglang pins a CUDA one, hence --no-deps above).
  "${pip[@]}" orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic pyzmq tqdm \
    ipython aiohttp triton >&2
  (cd / && "$venv/bin/python" -c "$probe; import torch; print('sglang venv: torch', torch.__version__)") >&2
fi
echo "$venv/bin/python"
