#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/) with clang in build-fuzz and runs each one.
#   scripts/fuzz.sh            short run: KVTIER_FUZZ_SECONDS (default 30) per target (CI)
#   scripts/fuzz.sh --long     long run: 3600 s per target (see docs/reliability.md)
#   scripts/fuzz.sh TARGET...  only these targets (wire record contract contract_file
#                              config safetensors trace export)
# Each target starts from its committed seeds (tests/fuzz/corpus/<target>, read-only) and
# a working corpus in build-fuzz/corpus/<target> (kept between runs). A crash, leak, UBSan
# report, timeout or out-of-memory stops the run with the input saved under
# build-fuzz/artifacts/; the script then exits non-zero. A new seed worth keeping can be
# copied from build-fuzz/corpus/ into tests/fuzz/corpus/.
#   KVTIER_FUZZ_BUILD_DIR  build folder (default build-fuzz)
#   KVTIER_JOBS            build jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${KVTIER_FUZZ_SECONDS:-30}"
targets=()
for a in "$@"; do
  case "$a" in
    --long) seconds=3600 ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) targets+=("$a") ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=(wire record contract contract_file config safetensors trace export)
build="${KVTIER_FUZZ_BUILD_DIR:-build-fuzz}"
jobs="${KVTIER_JOBS:-$(nproc)}"
CC_BIN="$(command -v clang-14 || command -v clang)"
CXX_BIN="$(command -v clang++-14 || command -v clang++)"
t0=$(date +%s)
# Libraries get coverage instrumentation and ASan/UBSan too (fuzzer-no-link), so that
# the fuzzer sees inside the parsers; the fuzz_* binaries link libFuzzer.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$CC_BIN" -DCMAKE_CXX_COMPILER="$CXX_BIN" \
  -DKVTIER_ENABLE_CUDA=OFF -DKVTIER_WERROR=OFF \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >/dev/null
# Targets this compiler can build (fuzz_safetensors needs clang >= 15 for _Float16).
built=()
for t in "${targets[@]}"; do
  if ninja -C "$build" -t query "fuzz_$t" >/dev/null 2>&1; then built+=("$t")
  else echo "fuzz: no fuzz_$t target with this compiler (see tests/fuzz/CMakeLists.txt); its seeds run in fuzz_replay_test"; fi
done
targets=("${built[@]}")
ninja -C "$build" -j"$jobs" $(printf 'fuzz_%s ' "${targets[@]}")
t1=$(date +%s)
echo "fuzz: built ${#targets[@]} targets in $((t1 - t0)) s; running each for ${seconds} s"
mkdir -p "$build/artifacts"
total=0
status=0
for t in "${targets[@]}"; do
  mkdir -p "$build/corpus/$t"
  log="$build/fuzz_$t.log"
  set +e
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=1 \
    "$build/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
      -print_final_stats=1 -artifact_prefix="$build/artifacts/$t-" \
      "$build/corpus/$t" "tests/fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  set -e
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
  total=$((total + ${runs:-0}))
  if [ $rc -ne 0 ]; then
    echo "fuzz: $t FAILED (rc $rc) after ${runs:-?} inputs; see $log and $build/artifacts/"
    tail -30 "$log"
    status=1
  else
    echo "fuzz: $t ok: ${runs} inputs, ${cov}, corpus $(ls "$build/corpus/$t" | wc -l) files"
  fi
done
echo "fuzz: ${total} inputs in total over ${#targets[@]} targets; $(( $(date +%s) - t0 )) s including the build"
exit $status
