#!/usr/bin/env bash
# Builds the unit and integration tests with sanitizers and runs them.
#   scripts/sanitize.sh              both: ASan+UBSan in build-asan, TSan in build-tsan
#   scripts/sanitize.sh asan|tsan    one of them
#   scripts/sanitize.sh --long       also the longer variants (more crash cycles, the
#                                    soak under ASan); see docs/reliability.md
# Every binary of the subset, kvtierd included (integration tests start it from the
# same build folder), is built with the sanitizer; a report stops the process
# (halt_on_error) and fails the run.
#
# The subset (CI's time budget on 2 cores; docs/reliability.md says why):
#   ASan+UBSan: formats_test tiers_test daemon_unit_test bulk_runner_test daemon_integration_test
#               client_test export_file_test reliability_test (crash test at
#               KVTIER_CRASH_CYCLES=20)
#   TSan:       tiers_test daemon_unit_test bulk_runner_test daemon_integration_test client_test
#               reliability_test (crash test at 10 cycles), and of hostile_test the
#               close/reload race (1000 races, KVTIER_HOSTILE_RACES); without
#               NvmeStore.CrashBeforeIndexWriteLeavesNoBlock, which opens RocksDB (new
#               threads) in a child forked from a threaded process: TSan cannot follow
#               that ("dup thread with used id"); the ASan run has it
#   left out:   kernels_ref_test, quality_test (single-threaded float loops: slow under
#               sanitizers, covered by the normal build), replay_test, kvtierctl_cli_test,
#               reliability_soak_test (its RSS rule means nothing under a sanitizer; it
#               runs with --long), fuzz_replay_test (the libFuzzer binaries of
#               scripts/fuzz.sh are ASan+UBSan builds of the same targets), GPU tests.
#   KVTIER_JOBS  build jobs (default: number of cores)
set -euo pipefail
cd "$(dirname "$0")/.."
long=0
kinds=()
for a in "$@"; do
  case "$a" in
    --long) long=1 ;;
    asan|tsan) kinds+=("$a") ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "sanitize.sh: unknown argument $a" >&2; exit 2 ;;
  esac
done
[ ${#kinds[@]} -gt 0 ] || kinds=(asan tsan)
jobs="${KVTIER_JOBS:-$(nproc)}"
status=0

run_one() {  # kind build_dir flags tests...
  local kind=$1 dir=$2 flags=$3
  shift 3
  local t0 t1
  t0=$(date +%s)
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKVTIER_ENABLE_CUDA=OFF \
    -DKVTIER_WERROR=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" -DCMAKE_C_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="$flags" -DCMAKE_SHARED_LINKER_FLAGS="$flags" >/dev/null
  # A test may carry a gtest filter: name:filter.
  local names=()
  for t in "$@"; do names+=("${t%%:*}"); done
  ninja -C "$dir" -j"$jobs" kvtierd "${names[@]}"
  t1=$(date +%s)
  echo "sanitize $kind: built in $((t1 - t0)) s"
  for spec in "$@"; do
    local t=${spec%%:*} filter='*'
    [ "$spec" = "$t" ] || filter=${spec#*:}
    set +e
    # A hang must fail the run, not eat CI's 90 minutes: 15 min per test binary.
    timeout --kill-after=30 900 "$dir/bin/$t" --gtest_brief=1 --gtest_filter="$filter" >"$dir/$t.log" 2>&1
    local rc=$?
    [ $rc -eq 124 ] && echo "sanitize $kind: $t timed out after 900 s" >>"$dir/$t.log"
    set -e
    if [ $rc -ne 0 ] || grep -q "ERROR: AddressSanitizer\|runtime error:\|WARNING: ThreadSanitizer" "$dir/$t.log"; then
      echo "sanitize $kind: $t FAILED (rc $rc); see $dir/$t.log"
      grep -m5 -A20 "ERROR: AddressSanitizer\|runtime error:\|WARNING: ThreadSanitizer\|FAILED\|Failure" "$dir/$t.log" | head -60
      status=1
    else
      echo "sanitize $kind: $t ok ($(grep -m1 -o 'PASSED.*' "$dir/$t.log" | tr -d ']' | tr -s ' '))"
    fi
    # kvtierd's own sanitizer reports go to its log in the test's temp folder; a report
    # there kills the daemon (halt_on_error), which fails the test above.
  done
  echo "sanitize $kind: $(( $(date +%s) - t0 )) s in total"
}

export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for k in "${kinds[@]}"; do
  if [ "$k" = asan ]; then
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0"
    export KVTIER_CRASH_CYCLES=$([ $long = 1 ] && echo 100 || echo 20)
    tests=(formats_test tiers_test daemon_unit_test bulk_runner_test daemon_integration_test client_test export_file_test
      reliability_test)
    [ $long = 1 ] && tests+=(reliability_soak_test)
    run_one asan build-asan "-fsanitize=address,undefined -fno-sanitize-recover=undefined" "${tests[@]}" || status=1
    unset ASAN_OPTIONS
  else
    # die_after_fork=0: tests fork children (crash points, client processes) from a
    # multi-threaded gtest process; the children only exec or run single client loops.
    export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:die_after_fork=0:suppressions=$PWD/scripts/tsan-suppressions.txt"
    export KVTIER_CRASH_CYCLES=$([ $long = 1 ] && echo 50 || echo 10)
    run_one tsan build-tsan "-fsanitize=thread" \
      tiers_test:-NvmeStore.CrashBeforeIndexWriteLeavesNoBlock \
      daemon_unit_test bulk_runner_test daemon_integration_test client_test reliability_test \
      hostile_test:Hostile.CloseRacingARingReloadManyTimes:Hostile.CloseDuringARingReloadFreezesNothing || status=1
    unset TSAN_OPTIONS
  fi
done
exit $status
