#!/usr/bin/env python3
"""Why the decode is slower inside the model than in kvtier-bench: kvt_decode over all 32
layers of a kvtier.transformers cache (Llama-3-8B shape, B x C tokens of random pages
written by quantize_append), with the cache's own arena, tables and lengths, against the
same call on a local copy of the arena, on a zeroed local arena and on the zeroed daemon
arena, in one run. Median of --reps steps, CUDA events.

  python3 tools/gpu/decode_ab.py [--context 131072] [--batch 8] [--format nvfp4]"""
import argparse
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "examples", "transformers"))
import bench_decode as bd  # noqa: E402
import kvtier  # noqa: E402
from kvtier import torch_ops  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402


def read_gbs(arena, reps, limit=8 << 30):
    """GB/s of a sequential read (an int32 sum) of the first `limit` bytes of `arena`."""
    n = min(arena.numel(), limit) // 4 * 4
    return n / bd.median_step_ms(lambda: arena[:n].view(torch.int32).sum(dtype=torch.int64), 1, reps) / 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=131072)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--format", default="nvfp4")
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    with torch.no_grad():
        model = bd.models.build(bd.models.config("llama", small=False), seed=0)
    model.set_attn_implementation("kvtier")
    contract = bd.kvtier_contract(model, a.format, 16)
    bb = contract.block_bytes()
    need = a.batch * (-(-(a.context + 40) // 16)) * ((bb + 4095) // 4096 * 4096)
    with Daemon(slot_bytes=bb, hbm=f"{need // bd.GiB + 2}GiB", host="1GiB", nvme="1GiB", timeout_s=300,
                client_share=1.0) as d:
        client = kvtier.Client(d.socket, name="decode-ab", has_gpu=True)
        with torch.no_grad():
            step, c = bd.kvtier_runner(model, client, contract, a.context, a.batch, 2, 4, False)
            print(f"geometry {c.geom}, table {tuple(c.block_table.shape)}, lens {c.lens.tolist()}, "
                  f"max_seq_len {c.max_seq_len}, arena at {c.arena.data_ptr():#x} ({c.arena.numel()} bytes, base % 2 MiB = {c.arena.data_ptr() % (2 << 20)}), scales k {c.k_scales[0]} v {c.v_scales[0]}", flush=True)
            B, HQ, D = a.batch, 32, 128
            q = torch.randn(B, HQ, D, dtype=torch.bfloat16, device="cuda")
            out = torch.empty_like(q)
            seq = c.lens.clone()

            def run(arena, geom, table, msl):
                ws = torch.empty(max(16, torch_ops.decode_workspace_bytes(arena, geom, q, out, table, seq, msl)),
                                 dtype=torch.uint8, device="cuda")

                def one():
                    for layer in range(c.layers_count):
                        torch_ops.decode_impl(arena, q, out, table, seq, ws, geom, layer, c.k_scales[layer],
                                              c.v_scales[layer], D ** -0.5, msl, 0)
                return bd.median_step_ms(one, 1, a.reps)

            rows = []
            rows.append(("daemon arena, cache's table", run(c.arena, c.geom, c.block_table, c.max_seq_len)))
            rows.append(("daemon arena, max_seq_len = context", run(c.arena, c.geom, c.block_table, a.context)))
            print(f"sequential read of the daemon arena (mapped by libkvtier): {read_gbs(c.arena, a.reps):.0f} GB/s",
                  flush=True)
            used = int(c.block_table.max().item()) + 1
            nbytes = min(c.arena.numel(), (used + 64) * c.geom[0])
            local = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            geom_l = list(c.geom)
            geom_l[1] = nbytes // geom_l[0]
            local.copy_(c.arena[:nbytes])
            print(f"sequential read of the local arena: {read_gbs(local, a.reps):.0f} GB/s", flush=True)
            rows.append(("local copy of the arena", run(local, geom_l, c.block_table, c.max_seq_len)))
            local.zero_()
            rows.append(("local arena, zeros", run(local, geom_l, c.block_table, c.max_seq_len)))
            local.copy_(c.arena[:nbytes])
            local.random_(0, 256)
            rows.append(("local arena, random bytes", run(local, geom_l, c.block_table, c.max_seq_len)))
            del local
            c.arena[:nbytes].zero_()
            rows.append(("daemon arena, zeros", run(c.arena, c.geom, c.block_table, c.max_seq_len)))
            kvb = bd.kv_bytes_per_token(a.format) * a.context * a.batch
            print(f"| {a.format} {a.batch} x {a.context}: {c.layers_count} layers | ms | vs first |")
            print("|---|---|---|")
            for name, ms in rows:
                print(f"| {name} | {ms:.2f} | {ms / rows[0][1]:.2f} |")
            print(f"pages read per step {kvb / 1e9:.2f} GB: {kvb / 4.5e12 * 1e3:.2f} ms at 4.5 TB/s", flush=True)
            c.release()
        client.close()


if __name__ == "__main__":
    main()
