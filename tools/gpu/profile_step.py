#!/usr/bin/env python3
"""Where one decode step of a transformers model on kvtier's pages spends its GPU time:
torch's profiler over one eager step of examples/transformers/bench_decode.py's Llama-3-8B
shape (random weights) with B sequences of C tokens of random pages, against a kvtierd
sized for them. Prints the kernels by total CUDA time.

  python3 tools/gpu/profile_step.py [--contexts 32768,131072] [--batch 8] [--formats nvfp4,fp8]
                                    [--trace-dir DIR]
Each (format, context) gets its own daemon; the model is built once. With --trace-dir each
profile is also written there as a Chrome trace (gzip).
(PYTHONPATH=client/python, KVTIER_LIB / KVTIER_BIN_DIR as for kvtier.)"""
import argparse
import gzip
import os
import shutil
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "transformers"))
import bench_decode as bd  # noqa: E402
import kvtier  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="32768")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--formats", default="nvfp4")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--trace-dir")
    a = ap.parse_args()
    t0 = time.time()
    with torch.no_grad():
        model = bd.models.build(bd.models.config("llama", small=False), seed=0)
    model.set_attn_implementation("kvtier")
    for fmt in a.formats.split(","):
        for ctx in (int(c) for c in a.contexts.split(",")):
            profile_one(model, fmt, ctx, a, t0)


def profile_one(model, fmt, ctx, a, t0):
    contract = bd.kvtier_contract(model, fmt, 16)
    bb = contract.block_bytes()
    need = a.batch * (-(-(ctx + 40) // 16)) * ((bb + 4095) // 4096 * 4096)
    print(f"=== {fmt} context {ctx} batch {a.batch}: block {bb} bytes, pages {need / 1e9:.1f} GB", flush=True)
    with Daemon(slot_bytes=bb, hbm=f"{need // bd.GiB + 2}GiB", host="1GiB", nvme="1GiB", timeout_s=300,
                client_share=1.0) as d:
        client = kvtier.Client(d.socket, name="profile-step", has_gpu=True)
        with torch.no_grad():
            step, cache = bd.kvtier_runner(model, client, contract, ctx, a.batch, 2, 4, False)
            print(f"model and pages ready in {time.time() - t0:.0f} s; geometry {cache.geom}", flush=True)
            print(f"eager step: {bd.median_step_ms(step, 2, 1):.2f} ms", flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=a.rows, max_name_column_width=70))
            if a.trace_dir:
                os.makedirs(a.trace_dir, exist_ok=True)
                path = os.path.join(a.trace_dir, f"step-{fmt}-{ctx}x{a.batch}.json")
                prof.export_chrome_trace(path)
                with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as z:
                    shutil.copyfileobj(f, z)
                os.remove(path)
            cache.release()
        client.close()


if __name__ == "__main__":
    main()
