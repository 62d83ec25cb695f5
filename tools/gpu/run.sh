#!/bin/bash
# Runs every gpu-labelled test and the decode benchmark on the GPU machine, from a build
# made elsewhere (tools/gpu/stage.sh) and carried in .devcarry/. Writes logs and JSON to
# the folder given (at most 8 files, so the device tool brings them all back).
# Usage (repo root on the GPU machine): tools/gpu/run.sh OUT_DIR [--quick] [--no-bench]
set -uo pipefail
OUT=${1:?usage: tools/gpu/run.sh OUT_DIR [--quick] [--no-bench]}
shift
QUICK=""; BENCH=1; PROFILE=0; TESTS=1; QBENCH=0
for a in "$@"; do
  case "$a" in
    --quick) QUICK="--quick" ;;
    --no-bench) BENCH=0 ;;
    --no-tests) TESTS=0 ;;
    --profile) PROFILE=1 ;;  # ncu of decode (nvfp4, fp8) and quantize + SASS into $OUT/profile.txt
    --qbench) QBENCH=1 ;;    # kvtier-bench decode: quantize_append (N=65536) + nvfp4 decode at 16x8192 only
  esac
done
REPO=$(pwd)
DC=$REPO/${DEVCARRY:-.devcarry}   # the folder tools/gpu/stage.sh filled (carried)
BUILD=$DC/build
mkdir -p "$OUT"
LOG=$OUT/run.log
exec > >(tee -a "$LOG") 2>&1
export LD_LIBRARY_PATH=$BUILD/lib:$DC/lib:${LD_LIBRARY_PATH:-}

# The CTest files hold the build machine's absolute paths (/work/main/build-kernels):
# make them resolve here.
SRC_BUILD=$(grep -m1 -o '/[^ "]*/build[^/ "]*' "$BUILD/CTestTestfile.cmake" | head -1)
SRC_ROOT=$(dirname "$SRC_BUILD")
if [ ! -e "$SRC_ROOT" ]; then mkdir -p "$(dirname "$SRC_ROOT")"; ln -s "$REPO" "$SRC_ROOT"; fi
if [ ! -e "$SRC_BUILD" ]; then ln -s "$BUILD" "$SRC_BUILD"; fi
# ... and load CMake's GoogleTestAddTests.cmake from the build machine's path.
if [ -f "$DC/cmake/path.txt" ]; then
  M=$(cat "$DC/cmake/path.txt")
  [ -e "$M" ] || { mkdir -p "$(dirname "$M")"; cp "$DC/cmake/GoogleTestAddTests.cmake" "$M"; }
  [ ! -d "$DC/cmake/GoogleTest" ] || [ -e "$(dirname "$M")/GoogleTest" ] || cp -r "$DC/cmake/GoogleTest" "$(dirname "$M")/"
fi
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

RC=0
if [ "$PROFILE" = 1 ]; then
  {
    # The NVFP4 and FP8 decodes, with the per-instruction-issue stall reasons (warps
    # stalled per issued instruction).
    for F in nvfp4 fp8; do
      echo "== ncu: decode $F, batch 16 x 8192, T=16"
      ncu --clock-control none -k regex:DecodeKernel --launch-skip 3 --launch-count 1 \
        --section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats \
        --section WarpStateStats --section InstructionStats --section Occupancy --section MemoryWorkloadAnalysis \
        --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio,smsp__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,smsp__inst_executed_pipe_fp16.avg.pct_of_peak_sustained_active \
        python3 tools/gpu/decode_baseline.py --lib "$BUILD/lib/libkvtier_kernels.so" --out /tmp/prof --results "" \
          --formats $F --shapes 16x8192 --block-tokens 16 --iters 2 --no-sdpa 2>&1 \
        | grep -v "^==PROF==" | sed -n '/DecodeKernel/,$p'
    done
    # Per SASS instruction: PC-sampled stall reasons of the default NVFP4 decode at 16 x 64K
    # (one launch), summarized by tools/gpu/stall_summary.py (reason shares, the hot loop's
    # instruction mix, the most-sampled instructions).
    echo "== ncu source counters: decode nvfp4, 16 x 64K, T=16"
    ncu --clock-control none -k regex:DecodeKernel --launch-skip 3 --launch-count 1 \
      --section SourceCounters --section WarpStateStats --import-source no -o /tmp/kvt_src -f \
      "$BUILD/bin/kvtier-bench" decode --formats nvfp4 --shapes 16x65536 --block-tokens 16 --iters 2 \
        --results /tmp/prof_results.md > /dev/null 2>&1 \
      && ncu -i /tmp/kvt_src.ncu-rep --page source --csv --print-source sass > /tmp/kvt_src.csv 2>/dev/null \
      && python3 tools/gpu/stall_summary.py /tmp/kvt_src.csv
    echo "== ncu: quantize_append max6 (kvtier-bench decode --quick: N=8192, H=8, D=128)"
    ncu --clock-control none -k regex:Quantize --launch-count 1 \
      --section SpeedOfLight --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$BUILD/bin/kvtier-bench" decode --quick --formats nvfp4 --shapes 16x8192 --block-tokens 16 \
        --results /tmp/prof_results.md 2>&1 | grep -v "^==PROF==" | sed -n "/Quantize/,\$p"
    echo "== SASS of DecodeKernel<nvfp4, 128> and QuantizeMax6Kernel"
    cuobjdump --dump-sass "$BUILD/lib/libkvtier_kernels.so" | \
      awk -v re="DecodeKernelILi0ELi128ELb0E|QuantizeMax6Kernel" '/Function :/ {p = ($0 ~ re)} p'
  } > "$OUT/profile.txt" 2>&1
  grep -E "==|Duration|Throughput|Issue Slots|Issued Ipc|No Eligible|Stall|Warp Cycles|Achieved Occupancy|Registers|Eligible Warps|issue_stalled|pipe_" "$OUT/profile.txt" \
    | cut -c1-150 | head -150
fi

[ "$TESTS" = 1 ] && echo "== gpu-labelled tests"
[ "$TESTS" = 1 ] && { ctest --test-dir "$SRC_BUILD" -L gpu -j 8 --output-on-failure --timeout 900 \
  --output-junit "$OUT/ctest_gpu.xml" > "$OUT/ctest_gpu.log" 2>&1 || RC=1
  grep -E "tests passed|\(Failed\)|Not Run|SKIP" "$OUT/ctest_gpu.log" | tail -n 40; }
if [ "$QBENCH" = 1 ]; then
  echo "== kvtier-bench decode --formats nvfp4 --shapes 16x8192 --block-tokens 16 (quantize_append N=65536)"
  "$BUILD/bin/kvtier-bench" decode --formats nvfp4 --shapes 16x8192 --block-tokens 16 --results "$OUT/qbench.md" 2>&1 | tail -n 12
fi

if [ "$BENCH" = 1 ]; then
  echo "== kvtier-bench decode"
  "$BUILD/bin/kvtier-bench" decode $QUICK --json "$OUT/bench_decode.json" --results "$OUT/RESULTS_gpu.md" || RC=1
  echo "== torch SDPA baseline + kvtier through the C ABI"
  PYTHONUNBUFFERED=1 python3 tools/gpu/decode_baseline.py --lib "$BUILD/lib/libkvtier_kernels.so" \
    --out "$OUT" --results "$OUT/RESULTS_gpu.md" $QUICK || RC=1
  # The same kernels held at their load ($SUSTAIN_MS ms each before timing; 0 skips): what a
  # busy server gets once the board's power cap lowers the clock (docs/kernels.md).
  if [ "${SUSTAIN_MS:-3000}" != 0 ] && [ -z "$QUICK" ]; then
    echo "== kvtier-bench decode --sustain-ms ${SUSTAIN_MS:-3000} (16 x 64K and 64 x 8K, T=16)"
    "$BUILD/bin/kvtier-bench" decode --shapes 16x65536,64x8192 --block-tokens 16 --sustain-ms "${SUSTAIN_MS:-3000}" \
      --results "$OUT/RESULTS_gpu.md" || RC=1
  fi
fi
echo "== done rc=$RC $(date -u)"
exit $RC
