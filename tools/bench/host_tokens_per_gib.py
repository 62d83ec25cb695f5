#!/usr/bin/env python3
"""Tokens per GiB of host tier for a Llama-3-8B-shaped contract (32 layers x 8 KV heads x
128, 16-token NVFP4 blocks: 576 KiB) with an 80-layer contract (1440 KiB blocks)
registered and storing in the same daemon: one slot size (tiers.slot_bytes = 1440KiB,
tiers.slot_classes = [], the default configuration before slot classes) against the
default configuration (tiers.slot_classes = "auto", tiers.slab_bytes = "auto"), or given
classes sharing slabs by demand, in one run.

    python3 tools/bench/host_tokens_per_gib.py                       # the default ("auto")
    python3 tools/bench/host_tokens_per_gib.py 576KiB,1440KiB 64MiB  # classes, slab size

Each configuration starts kvtierd (KVTIER_BIN_DIR) with a 1 GiB host tier, no NVMe tier and
the host watermarks at 1 (the tier holds what its slots hold; eviction only on demand),
registers both contracts, stores 64 blocks of the 80-layer contract, then Llama blocks until
twice what the tier could hold, and prints the Llama blocks resident, their tokens per GiB
of host tier, the 80-layer blocks left, and the ratio of the two configurations. Then the
same with the 80-layer prompt read back (acquired and released) after every Llama prompt,
so that its blocks stay the most recently used: the 80-layer contract keeps its slabs.
Needs PYTHONPATH=client/python and KVTIER_LIB (or an installed libkvtier).
"""
import sys

import kvtier
from kvtier.daemon import Daemon

KiB, GiB = 1024, 1 << 30
HOST = GiB


def size(s):
    s = s.strip()
    for suffix, mul in (("KiB", KiB), ("MiB", KiB * KiB), ("GiB", GiB)):
        if s.endswith(suffix):
            return int(float(s[: -len(suffix)]) * mul)
    return int(s)


def resident(c, cid, prompts):
    n = 0
    for toks in prompts:
        r = c.lookup(cid, c.key_chain(cid, toks))
        n += sum(1 for t in r.tiers[: r.hit_blocks] if t == "host")
    return n


def run(classes, slab, keep_big=False):
    with Daemon(slot_bytes=1440 * KiB, hbm=None, host="1GiB", nvme="0", slot_classes=classes, slab_bytes=slab,
                host_watermarks=(1.0, 0.99)) as d, kvtier.Client(d.socket) as c:
        llama = kvtier.Contract(model_id="llama-3-8b-shaped", num_layers=32, num_kv_heads=8, head_dim=128,
                                block_tokens=16)
        big = kvtier.Contract(model_id="80-layer", num_layers=80, num_kv_heads=8, head_dim=128, block_tokens=16)
        cl, cb = c.register_contract(llama), c.register_contract(big)
        slot, fill = c.contract_slot(cl)
        bslot, bfill = c.contract_slot(cb)
        big_prompt = list(range(900000000, 900000000 + 16 * 64))
        c.store(cb, big_prompt + [1], [bytes([9]) * big.block_bytes()] * 64)
        most = HOST // llama.block_bytes()
        blk = [bytes([7]) * llama.block_bytes()] * 64
        prompts = [list(range(p * 100000, p * 100000 + 16 * 64)) for p in range(2 * most // 64 + 1)]
        for toks in prompts:
            c.store(cl, toks + [1], blk)
            if keep_big:
                _, lease = c.load(cb, big_prompt + [1])
                c.release(lease)
        n = resident(c, cl, prompts)
        nb = resident(c, cb, [big_prompt])
        name = ("default (slot_classes \"auto\", slab_bytes \"auto\")" if classes == "auto" else
                f"classes {','.join(str(x // KiB) + 'KiB' for x in classes)} in {slab} slabs" if classes else
                "one slot size (1440KiB, slot_classes = [])")
        if keep_big:
            name += ", 80-layer prompt read after every llama prompt"
        print(f"{name}: llama {llama.block_bytes()} B blocks in {slot} B slots (fill {fill:.3f}), "
              f"80-layer {big.block_bytes()} B in {bslot} B (fill {bfill:.3f}); "
              f"{n} llama blocks resident = {n * 16 * GiB // HOST} tokens per GiB of host tier; "
              f"80-layer blocks left {nb} of 64")
        return n


def main():
    classes = [size(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else "auto"
    slab = sys.argv[2] if len(sys.argv) > 2 else "auto"
    base = run([], "64MiB")
    new = run(classes, slab)
    print(f"ratio: {new / base:.3f}x the tokens per GiB of one slot size (the default before slot classes)")
    base = run([], "64MiB", keep_big=True)
    new = run(classes, slab, keep_big=True)
    print(f"ratio, 80-layer blocks kept hot: {new / base:.3f}x")


if __name__ == "__main__":
    main()
