#!/usr/bin/env python3
"""Summarizes an ncu source page (per-SASS-instruction counters with PC sampling) of one
kernel: the share of each warp-stall reason, the hot loop's instruction mix (the
instructions executed most often), and the instructions that collect the most samples.

Usage: stall_summary.py SOURCE.csv
SOURCE.csv comes from
  ncu --section SourceCounters --section WarpStateStats -k regex:KERNEL --launch-count 1 -o REP PROGRAM
  ncu -i REP.ncu-rep --page source --csv --print-source sass > SOURCE.csv
(tools/gpu/run.sh --profile does both for the NVFP4 decode at 16 x 64K.)
"""
import collections
import csv
import re
import sys


def main():
    if len(sys.argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = list(csv.reader(open(sys.argv[1], newline="")))
    hdr_i = next((i for i, r in enumerate(rows) if "Address" in r and "Source" in r), None)
    if hdr_i is None:
        print(f"{sys.argv[1]}: no 'Address, Source' header: not an ncu source page", file=sys.stderr)
        return 1
    hdr, data = rows[hdr_i], [r for r in rows[hdr_i + 1:] if len(r) == len(rows[hdr_i])]
    col = {h: i for i, h in enumerate(hdr)}
    need = ["Warp Stall Sampling (All Samples)", "Instructions Executed"]
    if any(n not in col for n in need):
        print(f"{sys.argv[1]}: missing columns {[n for n in need if n not in col]}", file=sys.stderr)
        return 1
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def num(r, h):
        try:
            return int(r[col[h]])
        except ValueError:
            return 0

    def op(r):
        return re.sub(r"^@!?U?P\w+\s+", "", r[col["Source"]].strip()).split()[0]

    total = sum(num(r, need[0]) for r in data)
    print(f"{len(data)} SASS instructions, {total} samples")
    print("stall reasons (share of all samples):")
    for h, v in sorted(((h, sum(num(r, h) for r in data)) for h in reasons), key=lambda x: -x[1]):
        if v:
            print(f"  {h[6:]:20s} {100 * v / max(total, 1):5.1f}%")
    top = max(num(r, need[1]) for r in data)
    loop = [r for r in data if num(r, need[1]) == top]
    loop_samples = sum(num(r, need[0]) for r in loop)
    print(f"hot loop: {len(loop)} instructions executed {top} times each, "
          f"{100 * loop_samples / max(total, 1):.1f}% of the samples; by opcode:")
    for o, n in collections.Counter(op(r) for r in loop).most_common():
        print(f"  {o:28s} {n}")
    print("most-sampled instructions:")
    for r in sorted(data, key=lambda r: -num(r, need[0]))[:15]:
        worst = max(reasons, key=lambda h: num(r, h))
        print(f"  {num(r, need[0]):6d}  {r[col['Address']][-5:]}  {r[col['Source']].strip()[:70]:70s} "
              f"({worst[6:]} {num(r, worst)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
