#!/usr/bin/env python3
"""Where one decode step of a transformers model on kvtier's pages spends its GPU time:
torch's profiler over one eager step of examples/transformers/bench_decode.py's Llama-3-8B
shape (random weights) with B sequences of C tokens of random pages, against a kvtierd
sized for them. Prints the kernels by total CUDA time.

  python3 tools/gpu/profile_step.py [--context 32768] [--batch 8] [--format nvfp4]
(PYTHONPATH=client/python, KVTIER_LIB / KVTIER_BIN_DIR as for kvtier.)"""
import argparse
import os
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
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--format", default="nvfp4", choices=("nvfp4", "fp8", "bf16"))
    ap.add_argument("--rows", type=int, default=16)
    a = ap.parse_args()
    t0 = time.time()
    with torch.no_grad():
        model = bd.models.build(bd.models.config("llama"), seed=0)
    contract = bd.kvtier_contract(model, a.format, 16)
    bb = contract.block_bytes()
    need = a.batch * (-(-(a.context + 40) // 16)) * ((bb + 4095) // 4096 * 4096)
    with Daemon(slot_bytes=bb, hbm=f"{need // bd.GiB + 2}GiB", host="1GiB", nvme="1GiB", timeout_s=300,
                client_share=1.0) as d:
        client = kvtier.Client(d.socket, name="profile-step", has_gpu=True)
        model.set_attn_implementation("kvtier")
        with torch.no_grad():
            step, cache = bd.kvtier_runner(model, client, contract, a.context, a.batch, 2, 4, False)
            print(f"model and pages ready in {time.time() - t0:.0f} s", flush=True)
            for _ in range(2):
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=a.rows, max_name_column_width=70))
            cache.release()
        client.close()


if __name__ == "__main__":
    main()
