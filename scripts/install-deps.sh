#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build and test. Idempotent: when all
# packages are already present it only runs dpkg queries (well under a second).
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git python3 systemd
  liburing-dev librocksdb-dev libxxhash-dev libboost-dev libzstd-dev
  libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libtomlplusplus-dev libhiredis-dev nlohmann-json3-dev libabsl-dev
  # TLS to the remote tier (libssl-dev); the test cluster's throwaway certificates (openssl)
  libssl-dev openssl
  redis-server redis-tools
  python3-numpy python3-setuptools python3-pip
  # tests/install: promtool (prometheus), dpkg-shlibdeps for cpack -G DEB (dpkg-dev),
  # systemd-analyze (systemd, above), the offline pip install (python3-pip, -setuptools)
  prometheus dpkg-dev
  clang libclang-rt-14-dev
  # vLLM's CPU build (scripts/install-vllm.sh, tests/vllm): NUMA and tcmalloc (LD_PRELOAD)
  libnuma1 libtcmalloc-minimal4
)
# Set KVTIER_DEPS_EXTRA="pkg ..." to add packages (e.g. a debugger).
read -r -a EXTRA <<<"${KVTIER_DEPS_EXTRA:-}"
PKGS+=("${EXTRA[@]}")

missing=()
for p in "${PKGS[@]}"; do
  [ -n "$p" ] || continue
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
# Only promtool is wanted from prometheus: a server the package just started is stopped.
if [[ " ${missing[*]} " == *" prometheus "* ]] && [ -d /run/systemd/system ]; then
  $SUDO systemctl disable --now prometheus.service >/dev/null 2>&1 || true
fi
