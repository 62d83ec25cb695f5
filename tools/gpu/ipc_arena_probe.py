#!/usr/bin/env python3
"""The paged decode over one arena of NVFP4 pages, allocated in this process and imported
over CUDA IPC by another one (as an engine imports kvtierd's HBM arena), in the same run.

Each measurement is one decode step's attention: kvt_decode for every layer of a
32-layer, 8-KV-head, head_dim 128, 16-token-block arena (Llama-3-8B's shape), batch B at
context C, block tables in slot order or shuffled. Median of --reps steps, CUDA events.

  python3 tools/gpu/ipc_arena_probe.py [--batch 8] [--context 131072] [--reps 5]
(PYTHONPATH=client/python, KVTIER_LIB / KVTIER_KERNELS_LIB as for kvtier.)"""
import argparse
import os
import statistics
import sys

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))
from kvtier import kernels as K  # noqa: E402
from kvtier import torch_ops  # noqa: E402

L, H, D, T, HQ = 32, 8, 128, 16, 32
PAGE = T * H * D + T * H * D // 8  # NVFP4: data + E4M3 scales, K and V
SLOT = L * PAGE


def step_ms(arena, B, ctx, order, reps):
    num_slots = arena.numel() // SLOT
    geom = [SLOT, num_slots, L, H, D, T, K.NVFP4, 0, 0]
    nblk = -(-ctx // T)
    if order == "shuffled":
        g = torch.Generator(device="cuda").manual_seed(0)
        ids = torch.randperm(num_slots, device="cuda", generator=g)[:B * nblk]
    else:
        ids = torch.arange(B * nblk, device="cuda")
    table = ids.view(B, nblk).to(torch.int32).contiguous()
    seq = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    q = torch.randn(B, HQ, D, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    ws = torch.empty(max(16, torch_ops.decode_workspace_bytes(arena, geom, q, out, table, seq, nblk * T)),
                     dtype=torch.uint8, device="cuda")

    def one():
        for layer in range(L):
            torch_ops.decode_impl(arena, q, out, table, seq, ws, geom, layer, 1.0, 1.0, D ** -0.5, nblk * T, 0)

    one()
    ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        one()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def child(q_in, q_out, B, ctx, reps):
    arena = q_in.get()  # imported with cudaIpcOpenMemHandle by torch
    q_out.put({o: step_ms(arena, B, ctx, o, reps) for o in ("slot order", "shuffled")})
    del arena
    q_in.get()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    B, ctx = a.batch, a.context
    nbytes = (B * (-(-ctx // T)) + 64) * SLOT
    arena = torch.zeros(nbytes, dtype=torch.uint8, device="cuda")
    kv_bytes = B * ctx * L * H * D * 9 // 8
    print(f"arena {nbytes / 2**30:.1f} GiB, batch {B} x {ctx}, NVFP4 pages read per step {kv_bytes / 1e9:.2f} GB")
    local = {o: step_ms(arena, B, ctx, o, a.reps) for o in ("slot order", "shuffled")}
    ctxm = mp.get_context("spawn")
    q_in, q_out = ctxm.Queue(), ctxm.Queue()
    p = ctxm.Process(target=child, args=(q_in, q_out, B, ctx, a.reps))
    p.start()
    q_in.put(arena)
    imported = q_out.get()
    q_in.put(None)
    p.join()
    again = {o: step_ms(arena, B, ctx, o, a.reps) for o in ("slot order", "shuffled")}
    print("| block table | local cudaMalloc ms | imported over CUDA IPC ms | local again ms | imported / local |")
    print("|---|---|---|---|---|")
    for o in ("slot order", "shuffled"):
        base = min(local[o], again[o])
        print(f"| {o} | {local[o]:.2f} | {imported[o]:.2f} | {again[o]:.2f} | {imported[o] / base:.2f}x |")
    print(f"read floor of the pages: {kv_bytes / 4.5e12 * 1e3:.2f} ms at 4.5 TB/s")


if __name__ == "__main__":
    main()
