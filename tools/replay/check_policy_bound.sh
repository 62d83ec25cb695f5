#!/usr/bin/env bash
# Checks the default eviction policy's bound (docs/replay.md): `reuse` is never more than
# 0.5 points of prefix hit rate below `lru`, at budgets from 1 GiB to 1 TiB, on every
# workload family the repository has and on adversarial ones sized from each budget's
# cache. Runs `kvtierctl bench policies --policies lru,reuse` (the simulator, the daemon's
# policy code) and prints one line per workload and budget, then the worst distance; exits
# 1 if any is below -0.5 points.
#
#   tools/replay/check_policy_bound.sh [build/bin/kvtierctl] [trace ...]
#
# Traces: the arguments after the binary (default: ../shared/traces/*.jsonl, the Mooncake
# sample, with 512-token blocks). Generated: the agentic generator and tool-agent loops
# (T = 16), and the adversarial scan, loop, shift and flood (T = 512, 4-block prompts,
# working set 1.1 x the budget's blocks / 4 prompts; docs/replay.md). NVFP4 and FP8
# ($FORMATS). The generated workloads of 16-token blocks take most of the time (about
# 10 CPU-minutes a format).
set -euo pipefail
CTL=${1:-build/bin/kvtierctl}
shift || true
TRACES=("$@")
if [ ${#TRACES[@]} -eq 0 ]; then
  for t in "$(dirname "$0")"/../../../shared/traces/*.jsonl; do [ -f "$t" ] && TRACES+=("$t"); done
fi
BUDGETS=(1GiB 4GiB 16GiB 64GiB 256GiB 1TiB)
FORMATS=${FORMATS:-nvfp4,fp8}  # FORMATS=nvfp4 halves the time
SWEEP=$(IFS=,; echo "${BUDGETS[*]}")
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

n=0
run() {  # name, then bench policies options
  local name=$1
  shift
  n=$((n + 1))
  "$CTL" bench policies --policies lru,reuse --formats "$FORMATS" --json "$@" > "$OUT/$(printf %03d $n)-$name.json"
}

for t in "${TRACES[@]}"; do run "trace:$(basename "$t")" --trace "$t" --block-tokens 512 --sweep "$SWEEP"; done
if [ -z "${SKIP_GENERATED:-}" ]; then  # SKIP_GENERATED=1: the traces and adversarial ones only
  run agentic --sweep "$SWEEP"
  run tool-loop --workload tool-loop --sweep "$SWEEP"
fi
# Adversarial: each sized from the cache of the budget it runs at (NVFP4's blocks; FP8's
# cache is 0.56x that, so the same workload is 2x its cache there).
blocks_per_gib=$("$CTL" bench policies --policies lru --formats nvfp4 --block-tokens 512 --workload loop \
  --working-set 2 --prompt-tokens 512 --sweep 1GiB --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["budgets"][0]["blocks"])')
for b in "${BUDGETS[@]}"; do
  gib=$(python3 -c "import sys; s='$b'; print(int(s[:-3]) * (1024 if s.endswith('TiB') else 1))")
  ws=$(python3 -c "print(max(2, int($blocks_per_gib * $gib * 1.1 / 4)))")
  for kind in scan loop shift flood; do
    run "$kind@$b" --workload "$kind" --working-set "$ws" --prompt-tokens 2048 --block-tokens 512 --sweep "$b"
  done
done

python3 - "$OUT" <<'EOF'
import json, os, sys
d = sys.argv[1]
worst = (1e9, "")
print(f"{'workload':<44} {'format':<6} {'budget':>10} {'lru':>7} {'reuse':>7} {'reuse - lru':>12}")
for f in sorted(os.listdir(d)):
    doc = json.load(open(os.path.join(d, f)))
    name = f[4:-5]
    for b in doc["budgets"]:
        diff = 100.0 * (b["reuse"] - b["lru"])
        gib = b["bytes"] / 2**30
        print(f"{name:<44} {b['format']:<6} {gib:>7.0f} GiB {b['lru']:>7.4f} {b['reuse']:>7.4f} {diff:>+11.2f}")
        if diff < worst[0]:
            worst = (diff, f"{name} {b['format']} {gib:.0f} GiB")
print(f"worst: {worst[0]:+.2f} points ({worst[1]})")
sys.exit(0 if worst[0] >= -0.5 else 1)
EOF
