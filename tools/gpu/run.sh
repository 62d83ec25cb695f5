#!/bin/bash
# Runs every gpu-labelled test and the decode benchmark on the GPU machine, from a build
# made elsewhere (tools/gpu/stage.sh) and carried in .devcarry/. Writes logs and JSON to
# the folder given (at most 8 files, so the device tool brings them all back).
# Usage (repo root on the GPU machine): tools/gpu/run.sh OUT_DIR [--quick] [--no-bench]
set -uo pipefail
OUT=${1:?usage: tools/gpu/run.sh OUT_DIR [--quick] [--no-bench]}
shift
QUICK=""; BENCH=1
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    --no-bench) BENCH=0 ;;
  esac
done
REPO=$(pwd)
BUILD=$REPO/.devcarry/build
mkdir -p "$OUT"
LOG=$OUT/run.log
exec > >(tee -a "$LOG") 2>&1
export LD_LIBRARY_PATH=$BUILD/lib:$REPO/.devcarry/lib:${LD_LIBRARY_PATH:-}

# The CTest files hold the build machine's absolute paths (/work/main/build-kernels):
# make them resolve here.
SRC_BUILD=$(grep -m1 -o '/[^ "]*/build[^/ "]*' "$BUILD/CTestTestfile.cmake" | head -1)
SRC_ROOT=$(dirname "$SRC_BUILD")
if [ ! -e "$SRC_ROOT" ]; then mkdir -p "$(dirname "$SRC_ROOT")"; ln -s "$REPO" "$SRC_ROOT"; fi
if [ ! -e "$SRC_BUILD" ]; then ln -s "$BUILD" "$SRC_BUILD"; fi
echo "== $(date -u) on $(hostname): build tree $SRC_BUILD -> $BUILD"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv

# Machine code: tensor-core MMAs present, no local memory in the decode kernels.
{
  echo "== SASS summary of libkvtier_kernels.so (per kernel: instructions, HMMA, LDL/STL, LDS, LDG)"
  cuobjdump --dump-sass "$BUILD/lib/libkvtier_kernels.so" | awk '
    /Function :/ { if (name) printf "%-100s ins=%d HMMA=%d LDL=%d STL=%d LDS=%d LDGSTS=%d LDG=%d\n", name, n, h, ll, sl, lds, cpa, ldg;
                   name=$3; n=h=ll=sl=lds=cpa=ldg=0; next }
    /\/\*[0-9a-f]+\*\// { n++; if ($0 ~ /HMMA/) h++; if ($0 ~ /LDL/) ll++; if ($0 ~ /STL/) sl++;
                          if ($0 ~ / LDS/) lds++; if ($0 ~ /LDGSTS/) cpa++; else if ($0 ~ / LDG/) ldg++ }
    END { if (name) printf "%-100s ins=%d HMMA=%d LDL=%d STL=%d LDS=%d LDGSTS=%d LDG=%d\n", name, n, h, ll, sl, lds, cpa, ldg }'
  echo "== resource usage"
  cuobjdump --dump-resource-usage "$BUILD/lib/libkvtier_kernels.so" | grep -E "Function|REG" | paste - - | sed 's/  */ /g'
} > "$OUT/sass_summary.txt" 2>&1
cat "$OUT/sass_summary.txt" | cut -c1-220

echo "== gpu-labelled tests"
RC=0
ctest --test-dir "$SRC_BUILD" -L gpu -j 8 --output-on-failure --timeout 900 \
  --output-junit "$OUT/ctest_gpu.xml" > "$OUT/ctest_gpu.log" 2>&1 || RC=1
tail -n 40 "$OUT/ctest_gpu.log"

if [ "$BENCH" = 1 ]; then
  echo "== kvtier-bench decode"
  "$BUILD/bin/kvtier-bench" decode $QUICK --json "$OUT/bench_decode.json" --results "$OUT/RESULTS_gpu.md" || RC=1
  echo "== torch SDPA baseline + kvtier through the C ABI"
  PYTHONUNBUFFERED=1 python3 tools/gpu/decode_baseline.py --lib "$BUILD/lib/libkvtier_kernels.so" \
    --out "$OUT" --results "$OUT/RESULTS_gpu.md" $QUICK || RC=1
fi
echo "== done rc=$RC $(date -u)"
exit $RC
