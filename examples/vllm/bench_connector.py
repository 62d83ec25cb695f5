"""The vLLM connector's own cost on the CPU: a prefix's blocks loaded from kvtierd's host tier
into vLLM CPU's pages by the worker-side KvtierConnector, against copying the same bytes at
memcpy speed, in the same run; and the scheduler-side lookup.

    eval "$(scripts/install-vllm.sh --env)"
    PYTHONPATH=$PWD/client/python KVTIER_LIB=$PWD/build/lib/libkvtier.so KVTIER_BIN_DIR=$PWD/build/bin \\
      python examples/vllm/bench_connector.py [--tokens 8000] [--layers 6] [--reps 9]

The connector is the real one (its register_kv_caches, _save, _load and lookup; vLLM's config
objects are not needed to drive them), kvtierd runs the shipped config with only capacities
set. Rows (medians of --reps after a warm-up):
  memcpy            one torch copy of the prefix's block bytes (host to host)
  memcpy x2         two such copies (the load's floor: out of the arena, into the pages)
  load (as-is)      KvtierConnector._load of the prefix: acquire, views, copy into the pages,
                    release
  lookup            the scheduler's lookup of the prefix's keys
  save (as-is)      KvtierConnector._save of the prefix (alloc, copy out, commit, release)
and the load's cost over memcpy (the target: at most 10 ms more at 8,000 tokens).
Every timed load is checked: the pages equal the source pages.
"""
import argparse
import os
import statistics
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

import kvtier.daemon  # noqa: E402
from kvtier import engine as E  # noqa: E402


def worker(link, shape, T, layers, tier_format="as-is"):
    """A worker-side KvtierConnector over `layers` (vLLM CPU pages), without vLLM's config."""
    from kvtier.vllm import KvtierConnector
    c = KvtierConnector.__new__(KvtierConnector)
    c.page_layout, c.shape, c.block_tokens, c.tp_rank, c.tp_size, c._ranks = "cpu-bhnc", shape, T, 0, 1, [0]
    c.model_name, c.weights, c.tier_format, c._contracts, c.kv_scale = "bench", "sha256:bench", tier_format, {}, None
    c.link, c._load_errors = link, set()
    c.io = E.BlockIO(link)
    c._init_saver()
    names = [f"model.layers.{i}.self_attn.attn" for i in range(len(layers))]
    c.register_kv_caches(dict(zip(names, layers)))
    return c


def med(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block-tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=9)
    a = ap.parse_args()
    from kvtier.vllm import _Transfer
    L, H, D, T = a.layers, a.heads, a.head_dim, a.block_tokens
    nb = a.tokens // T
    shape = E.EngineShape(L, H, D, "bfloat16")
    g = torch.Generator().manual_seed(1)
    src = [torch.randn(nb + 4, H, T, 2 * D, generator=g).to(torch.bfloat16) for _ in range(L)]
    dst = [torch.zeros_like(p) for p in src]
    tokens = list(range(3, 3 + nb * T))
    bb = E.engine_contract("vllm", "bench", "sha256:bench", shape, T, layout="cpu-bhnc").block_bytes()
    host = f"{max(64, (4 * nb * bb) >> 20)}MiB"
    print(f"{a.tokens} tokens = {nb} blocks of {bb} bytes ({nb * bb / 2**20:.1f} MiB), {L} layers, "
          f"{torch.get_num_threads()} torch threads", flush=True)
    with kvtier.daemon.Daemon.shipped({"tiers.host.capacity": host, "tiers.nvme.capacity": "1GiB",
                                       "daemon.max_tier_share_per_client": 1.0}) as d:
        w = worker(E.DaemonLink(d.socket, "bench-w"), shape, T, src)
        r = worker(E.DaemonLink(d.socket, "bench-r"), shape, T, dst)
        ids = list(range(nb))
        save_ms = med(lambda: w._save(_Transfer("s", None, tokens, 0, ids)), 1)
        assert w.saved_blocks >= nb, w.saved_blocks
        flat = torch.empty(nb * bb, dtype=torch.uint8)
        flat2 = torch.empty_like(flat)
        memcpy = med(lambda: flat2.copy_(flat), a.reps)
        memcpy2 = med(lambda: (flat2.copy_(flat), flat.copy_(flat2)), a.reps)
        load = med(lambda: r._load(_Transfer("l", None, tokens, 0, ids)), a.reps)
        ok = all(torch.equal(dst[l][:nb].view(torch.int16), src[l][:nb].view(torch.int16)) for l in range(L))
        errs = r.get_block_ids_with_load_errors()
        contract = r._contract(None, 0)
        keys = E.block_keys(contract.id(), tokens, T)
        lookup = med(lambda: r.io.lookup(contract, keys), a.reps)
    print(f"{'row':<16}{'ms':>10}")
    for name, v in (("memcpy", memcpy), ("memcpy x2", memcpy2), ("load (as-is)", load), ("lookup", lookup),
                    ("save (as-is)", save_ms)):
        print(f"{name:<16}{v:>10.2f}")
    print(f"load - memcpy: {load - memcpy:.2f} ms (target <= 10 ms); load / memcpy {load / memcpy:.1f}x; "
          f"pages equal the source: {ok and not errs}")
    return 0 if ok and not errs else 1


if __name__ == "__main__":
    sys.exit(main())
