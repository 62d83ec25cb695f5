#!/usr/bin/env python3
"""Decode benchmark in one process on the GPU machine: torch SDPA (BF16, contiguous K/V,
enable_gqa) against kvtier's paged decode over BF16, FP8 and NVFP4 pages (through the C
ABI, kernels/include/kvtier/kernels.h, via ctypes), and a pure-read kernel as roofline.

Usage: decode_baseline.py --lib build/lib/libkvtier_kernels.so --out DIR [--results FILE]
Writes DIR/decode_baseline.json and DIR/decode_baseline.md; appends the markdown table to
--results (bench/history/results.md by default). Also cross-checks kvtier's BF16 decode against
SDPA on the same values (relative L2 printed; fails the run above 1e-2).
"""
import argparse
import ctypes as C
import json
import math
import os
import socket
import statistics
import sys
import threading
import time

import torch
import torch.nn.functional as F


# The C structs come from the Python package (client/python/kvtier/kernels.py), so the
# benchmark and the engines share one definition of kernels.h.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from kvtier.kernels import DecodeParams, Pool  # noqa: E402


NVFP4, FP8, BF16 = 0, 1, 2
NAMES = {NVFP4: "nvfp4", FP8: "fp8", BF16: "bf16"}
HQ, HKV, D = 32, 8, 128


def page_bytes(fmt, T):
    vals = HKV * T * D
    return {NVFP4: vals + vals // 8, FP8: 2 * vals, BF16: 4 * vals}[fmt]


def slot_bytes(fmt, T):
    return (page_bytes(fmt, T) + 4095) // 4096 * 4096


class Clock:
    """SM clock and board power cap while a timing runs, from NVML (libnvidia-ml.so.1,
    through ctypes; 'n/a' without it). A sustained NVFP4 decode reaches the H200's power
    limit and the driver lowers the SM clock (docs/kernels.md, "Power")."""
    SM, SW_POWER_CAP = 1, 0x4

    def __init__(self):
        self.dev, self.last = None, None
        try:
            self.nvml = C.CDLL("libnvidia-ml.so.1")
            if self.nvml.nvmlInit_v2() != 0:
                return
            pr = torch.cuda.get_device_properties(0)
            bus = None
            if all(hasattr(pr, a) for a in ("pci_domain_id", "pci_bus_id", "pci_device_id")):
                bus = f"{pr.pci_domain_id:08x}:{pr.pci_bus_id:02x}:{pr.pci_device_id:02x}.0"
            dev = C.c_void_p()
            if bus is not None and self.nvml.nvmlDeviceGetHandleByPciBusId_v2(bus.encode(), C.byref(dev)) == 0:
                self.dev = dev
            elif self.nvml.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev)) == 0:
                self.dev = dev
            fn = getattr(self.nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
            self.reasons = fn or self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons
        except (OSError, AttributeError):
            self.dev = None

    def start(self):
        self.samples, self.run = [], self.dev is not None
        if not self.run:
            return
        def loop():
            mhz, rs = C.c_uint(), C.c_ulonglong()
            while self.run:
                if self.nvml.nvmlDeviceGetClockInfo(self.dev, self.SM, C.byref(mhz)) == 0:
                    ok = self.reasons(self.dev, C.byref(rs)) == 0
                    self.samples.append((mhz.value, bool(ok and rs.value & self.SW_POWER_CAP)))
                time.sleep(0.002)
        self.th = threading.Thread(target=loop, daemon=True)
        self.th.start()

    def stop(self):
        if self.run:
            self.run = False
            self.th.join()
        self.last = self.samples
        return self.describe()

    def describe(self):
        if not self.last:
            return "n/a"
        mhz = sum(m for m, _ in self.last) / len(self.last)
        cap = sum(1 for _, c in self.last if c) / len(self.last)
        return f"{mhz:.0f} MHz" + (f", power cap {100 * cap:.0f}%" if cap > 0 else "")


CLOCK = None


def bench(fn, iters, reps=5):
    """Median over `reps` of the mean time of `iters` back-to-back launches (us): the GPU
    never waits on the host, so launch gaps stay out of the numbers. The SM clock over the
    timed launches is left in CLOCK (CLOCK.describe())."""
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    if CLOCK is not None:
        CLOCK.start()
    ts = []
    for r in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for i in range(iters):
            fn(i)
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b) * 1e3 / iters)
    if CLOCK is not None:
        CLOCK.stop()
    return statistics.median(ts)


class Kvtier:
    def __init__(self, path):
        self.lib = C.CDLL(path)
        self.lib.kvt_last_error.restype = C.c_char_p
        self.lib.kvt_decode_workspace_bytes.restype = C.c_uint64
        self.lib.kvt_decode_num_splits.restype = C.c_int32

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what}: {rc}: {self.lib.kvt_last_error().decode()}")

    def make_pool(self, fmt, T, slots, gen):
        sb = slot_bytes(fmt, T)
        pb = page_bytes(fmt, T)
        buf = torch.empty(slots * sb, dtype=torch.uint8, device="cuda")
        view = buf.view(slots, sb)[:, :pb]
        if fmt == BF16:
            view.view(torch.bfloat16).copy_(torch.randn(slots, pb // 2, device="cuda", generator=gen))
        elif fmt == FP8:
            x = torch.randint(0, 0x50, (slots, pb), device="cuda", dtype=torch.int32, generator=gen)
            s = torch.randint(0, 2, (slots, pb), device="cuda", dtype=torch.int32, generator=gen) * 0x80
            view.copy_((x | s).to(torch.uint8))
        else:
            view.copy_(torch.randint(0, 256, (slots, pb), device="cuda", dtype=torch.int32, generator=gen).to(torch.uint8))
            vals = HKV * T * D
            for off in (vals // 2, vals + vals // 16):  # K and V scale regions
                n = vals // 16
                view[:, off:off + n] = torch.randint(0x30, 0x48, (slots, n), device="cuda", dtype=torch.int32,
                                                     generator=gen).to(torch.uint8)
        pool = Pool(buf.data_ptr(), sb, slots, 1, HKV, D, T, fmt)
        return buf, pool

    def decode_params(self, pool, q, out, bt, lens, B, L, T, fmt, splits=0):
        p = DecodeParams()
        p.q, p.out, p.lse = q.data_ptr(), out.data_ptr(), None
        p.block_table, p.seq_lens = bt.data_ptr(), lens.data_ptr()
        p.batch, p.num_q_heads, p.max_blocks, p.max_seq_len = B, HQ, L // T, L
        p.layer = 0
        p.k_scale = p.v_scale = 1.0 if fmt == BF16 else 0.02
        p.softmax_scale = 1.0 / math.sqrt(D)
        p.num_splits = splits
        ws = self.lib.kvt_decode_workspace_bytes(C.byref(pool), C.byref(p))
        wsb = torch.empty(max(ws, 16), dtype=torch.uint8, device="cuda")
        p.workspace, p.workspace_bytes = wsb.data_ptr(), ws
        return p, wsb


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--results", default=os.path.join(os.path.dirname(__file__), "..", "..", "bench", "history", "results.md"))
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--formats", default="bf16,fp8,nvfp4", help="kvtier formats to time")
    ap.add_argument("--shapes", default="", help="e.g. 16x65536,1x131072 (default: the four target shapes)")
    ap.add_argument("--block-tokens", default="16,64")
    ap.add_argument("--no-sdpa", action="store_true", help="skip torch SDPA (e.g. under a profiler)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kv = Kvtier(args.lib)
    global CLOCK
    CLOCK = Clock()
    dev = torch.cuda.get_device_properties(0)
    l2 = dev.L2_cache_size
    gen = torch.Generator(device="cuda")
    gen.manual_seed(int(time.time_ns() & 0xFFFFFFFF))
    stream = torch.cuda.current_stream().cuda_stream
    rows = []

    # Roofline: kvtier's streaming-read probe over 2 GiB, and torch's D2D copy for context.
    probe = torch.randint(0, 255, (2 << 30,), dtype=torch.uint8, device="cuda", generator=gen)
    sink = torch.zeros(1, dtype=torch.int32, device="cuda")
    us = bench(lambda i: kv.check(kv.lib.kvt_read_bandwidth_probe(C.c_void_p(probe.data_ptr()), C.c_uint64(probe.numel()),
                                                                   C.c_void_p(sink.data_ptr()), C.c_void_p(stream)), "probe"),
               args.iters)
    roof = probe.numel() / us / 1e3
    dst = torch.empty_like(probe)
    us_copy = bench(lambda i: dst.copy_(probe), args.iters)
    del dst, probe
    read_clock = CLOCK.describe()
    rows.append(dict(kernel="pure read (roofline)", us=us, gbps=roof, clock=read_clock))
    rows.append(dict(kernel="torch D2D copy (read+write)", us=us_copy, gbps=2 * (2 << 30) / us_copy / 1e3,
                     clock=CLOCK.describe()))

    # Cross-check: kvtier bf16 pages built from the very K/V that SDPA reads.
    B, L, T = 2, 4096, 16
    q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    ref = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, enable_gqa=True).squeeze(2).float()
    nb = L // T
    kp = k.view(B, HKV, nb, T, D).permute(0, 2, 1, 3, 4)
    vp = v.view(B, HKV, nb, T, D).permute(0, 2, 1, 3, 4)
    slots_t = torch.stack([kp, vp], dim=2).contiguous()  # [B, nb, 2, H, T, D] = slot-major pages
    pool = Pool(slots_t.data_ptr(), page_bytes(BF16, T), B * nb, 1, HKV, D, T, BF16)
    bt = torch.arange(B * nb, dtype=torch.int32, device="cuda").view(B, nb)
    lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
    out = torch.full((B, HQ, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    p, wsb = kv.decode_params(pool, q, out, bt, lens, B, L, T, BF16)
    kv.check(kv.lib.kvt_decode(C.byref(pool), C.byref(p), C.c_void_p(stream)), "decode")
    torch.cuda.synchronize()
    rel = ((out.float() - ref).norm() / ref.norm()).item()
    print(f"cross-check kvtier bf16 decode vs torch SDPA: rel L2 = {rel:.2e}", flush=True)
    if not rel < 1e-2:
        print("FAIL: kvtier bf16 decode disagrees with SDPA", file=sys.stderr)
        return 1
    del slots_t, k, v

    shapes = [(1, 32768), (1, 131072), (16, 65536), (64, 8192)]
    if args.quick:
        shapes = [(1, 32768), (16, 65536)]
    if args.shapes:
        shapes = [tuple(int(v) for v in it.split("x")) for it in args.shapes.split(",")]
    fmts = [f for f in (BF16, FP8, NVFP4) if NAMES[f] in args.formats.split(",")]
    tlist = [int(t) for t in args.block_tokens.split(",")]
    sdpa_us = {}
    for (B, L) in ([] if args.no_sdpa else shapes):
        kvbytes = B * HKV * L * D * 2 * 2
        nsets = max(1, math.ceil(4 * l2 / kvbytes))
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
        ks = [torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(nsets)]
        vs = [torch.randn(B, HKV, L, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(nsets)]
        us = bench(lambda i: F.scaled_dot_product_attention(q, ks[i % nsets], vs[i % nsets], enable_gqa=True), args.iters)
        sdpa_us[(B, L)] = us
        rows.append(dict(kernel="torch SDPA bf16 (contiguous)", B=B, L=L, us=us, gbps=kvbytes / us / 1e3,
                         clock=CLOCK.describe()))
        del ks, vs, q
        torch.cuda.empty_cache()
    for T in tlist:
        for (B, L) in shapes:
            t = {}
            for fmt in fmts:
                blocks = B * (L // T)
                it_bytes = blocks * page_bytes(fmt, T)
                nsets = max(1, math.ceil(4 * l2 / it_bytes))
                buf, pool = kv.make_pool(fmt, T, blocks * nsets, gen)
                bts = [(torch.randperm(blocks, device="cuda", generator=gen) + s * blocks).to(torch.int32).view(B, L // T)
                       for s in range(nsets)]
                lens = torch.full((B,), L, dtype=torch.int32, device="cuda")
                q = torch.randn(B, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                out = torch.empty_like(q)
                ps = []
                for s in range(nsets):
                    p, wsb = kv.decode_params(pool, q, out, bts[s], lens, B, L, T, fmt)
                    ps.append((p, wsb))
                splits = kv.lib.kvt_decode_num_splits(C.byref(pool), C.byref(ps[0][0]))

                def run(i):
                    kv.check(kv.lib.kvt_decode(C.byref(pool), C.byref(ps[i % nsets][0]), C.c_void_p(stream)), "decode")
                us = bench(run, args.iters)
                torch.cuda.synchronize()
                assert torch.isfinite(out).all(), "decode produced non-finite values"
                t[fmt] = us
                rows.append(dict(kernel=f"kvtier decode {NAMES[fmt]}", B=B, L=L, T=T, us=us,
                                 gbps=it_bytes / us / 1e3, splits=splits, clock=CLOCK.describe()))
                del buf, bts, ps, q, out
                torch.cuda.empty_cache()
            if len(t) < 3 or (B, L) not in sdpa_us:
                continue
            rows.append(dict(kernel="ratios", B=B, L=L, T=T,
                             nvfp4_over_sdpa=t[NVFP4] / sdpa_us[(B, L)], nvfp4_over_fp8=t[NVFP4] / t[FP8],
                             nvfp4_over_bf16=t[NVFP4] / t[BF16]))

    host = socket.gethostname()
    md = [f"\n## decode baseline: torch SDPA vs kvtier paged decode (tools/gpu/decode_baseline.py)\n",
          f"- machine: {host}, {dev.name}, torch {torch.__version__}",
          f"- date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
          f"- command: `python3 tools/gpu/decode_baseline.py --lib <build>/lib/libkvtier_kernels.so --iters {args.iters}`\n",
          "| kernel | batch | context | T | splits | time us | GB/s (bytes it must read) | of pure read | nvfp4/SDPA time | nvfp4/fp8 time | nvfp4/bf16 time | SM clock |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["kernel"] == "ratios":
            md.append(f"| ratios | {r['B']} | {r['L']} | {r['T']} | | | | | {r['nvfp4_over_sdpa']:.3f} | "
                      f"{r['nvfp4_over_fp8']:.3f} | {r['nvfp4_over_bf16']:.3f} | |")
        else:
            md.append(f"| {r['kernel']} | {r.get('B', '')} | {r.get('L', '')} | {r.get('T', '')} | {r.get('splits', '')} | "
                      f"{r['us']:.1f} | {r['gbps']:.0f} | {100 * r['gbps'] / roof:.1f}% | | | | {r.get('clock', '')} |")
    md.append(f"\n32 query heads, 8 KV heads, D=128, one layer. SDPA reads 512 B per token and KV head, kvtier bf16 512, "
              f"fp8 256, nvfp4 144. Cross-check kvtier bf16 vs SDPA on identical values: rel L2 {rel:.2e}. "
              f"Median of {args.iters}; data rotates over >= 4x L2. SM clock: mean over the timed launches (NVML), "
              f"with the share of samples throttled by the board's power cap.\n")
    text = "\n".join(md) + "\n"
    print(text, flush=True)
    with open(os.path.join(args.out, "decode_baseline.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "decode_baseline.json"), "w") as f:
        json.dump(dict(device=dev.name, host=host, roofline_gbps=roof, cross_check_rel_l2=rel, rows=rows), f, indent=1)
    if args.results:
        with open(args.results, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
