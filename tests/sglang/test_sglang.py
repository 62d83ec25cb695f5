"""kvtier.sglang: SGLang's HiCache storage backend on a real kvtierd, with the real sglang package.

    python3 tests/sglang/test_sglang.py            # every group
    python3 tests/sglang/test_sglang.py -k fp4     # the groups whose name holds "fp4"

The backend is made by sglang's own StorageBackendFactory from the dynamic-backend config the
README gives, on sglang's HiCacheStorageConfig. The host pools are CPU tensors shaped like
SGLang's MHATokenToKVPoolHost (kv_buffer [2, size, L, H, D] page_first, [2, L, size, H, D]
layer_first; host_indices are token indices of whole pages) and like its FP4 host pool
(uint8 packed E2M1 [2, size, L, H, D/2] plus E4M3 scales [2, size, L, H, D/16]); the real
classes cannot be built without a GPU. Expected block bytes are built one page, layer and side
at a time by slicing, independently of the backend's batched permutes.

Every daemon here is kvtierd on the shipped config/kvtier.toml with only its capacities (and
folder) set (kvtier.daemon.Daemon.shipped), as a user runs it.

Prints "N passed, N failed". Without the sglang package it fails, or prints "SKIPPED: reason"
when KVTIER_SGLANG_OPTIONAL=1.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, HiCacheStorageExtraInfo
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory
except ImportError as e:
    if os.environ.get("KVTIER_SGLANG_OPTIONAL") == "1":
        print(f"SKIPPED: sglang or torch is not importable ({e}); scripts/sglang-venv.sh makes the venv")
        sys.exit(0)
    print(f"FAILED: sglang or torch is not importable ({e}); scripts/sglang-venv.sh makes the venv "
          "(KVTIER_SGLANG_OPTIONAL=1 makes this a skip)")
    sys.exit(1)

import kvtier  # noqa: E402
import kvtier.daemon  # noqa: E402
from kvtier import sglang as KS  # noqa: E402

# Every folder a check makes (a daemon's socket, log and NVMe tier) lies in this one,
# removed when the run exits.
SCRATCH = tempfile.TemporaryDirectory(prefix="kvtier-sglang-test-")

L, H, D, T = 2, 2, 64, 16     # layers, KV heads, head_dim, page_size
SIZE = 16 * T                 # host pool tokens (16 pages)
MODEL = "test-org/tiny-llama"


class Pool:
    """A host pool shaped like SGLang's MHATokenToKVPoolHost (and its FP4 subclass)."""

    def __init__(self, layout, dtype, fill=True, seed=0, fp4=False):
        self.layout, self.page_size, self.size = layout, T, SIZE
        self.layer_num, self.head_num = L, H
        g = torch.Generator().manual_seed(seed)
        if fp4:
            self.head_dim = D // 2
            self.dtype = torch.uint8
            self.kv_buffer = torch.randint(0, 256, (2, SIZE, L, H, D // 2), dtype=torch.uint8, generator=g)
            sc = torch.randint(0, 256, (2, SIZE, L, H, D // 16), dtype=torch.uint8, generator=g)
            sc[(sc & 0x7F) == 0x7F] = 0x38  # no E4M3 NaN scale bytes
            self.scale_kv_buffer = sc
            if not fill:
                self.kv_buffer.zero_()
                self.scale_kv_buffer.zero_()
            return
        self.head_dim, self.dtype = D, dtype
        shape = (2, SIZE, L, H, D) if layout == "page_first" else (2, L, SIZE, H, D)
        if dtype in (torch.bfloat16, torch.float16):
            x = torch.randn(shape, generator=g).to(dtype)
        else:
            raw = torch.randint(0, 256, shape, dtype=torch.uint8, generator=g)
            raw[(raw & 0x7F) == 0x7F] = 0
            x = raw.view(dtype)
        self.kv_buffer = x if fill else torch.zeros_like(x)

    def indices(self, pages):
        return torch.cat([torch.arange(p * T, (p + 1) * T) for p in pages]) if pages else torch.zeros(0, dtype=torch.int64)

    def page_bytes(self, p):
        """Expected kvtier block of host page p, built by slicing (formats/layout.h)."""
        s = slice(p * T, (p + 1) * T)
        out = []
        for layer in range(L):
            sides = []
            for kv in range(2):
                if self.layout == "page_first":
                    x = self.kv_buffer[kv, s, layer]           # [T, H, row]
                else:
                    x = self.kv_buffer[kv, layer, s]           # [T, H, row]
                data = x.contiguous().view(torch.uint8).permute(1, 0, 2).contiguous().flatten()
                if hasattr(self, "scale_kv_buffer"):
                    sc = self.scale_kv_buffer[kv, s, layer].permute(1, 0, 2).contiguous().flatten()
                    data = torch.cat((data, sc))
                sides.append(data)
            out += sides
        return torch.cat(out)

    def page(self, p):
        s = slice(p * T, (p + 1) * T)
        parts = [self.kv_buffer[:, s] if self.layout == "page_first" else self.kv_buffer[:, :, s]]
        if hasattr(self, "scale_kv_buffer"):
            parts.append(self.scale_kv_buffer[:, s])
        return torch.cat([x.contiguous().view(torch.uint8).flatten() for x in parts])

    def snapshot(self):
        parts = [self.kv_buffer.view(torch.uint8).clone()]
        if hasattr(self, "scale_kv_buffer"):
            parts.append(self.scale_kv_buffer.clone())
        return parts


def block_bytes(fp4=False, dtype=torch.bfloat16):
    vals = L * 2 * H * T * D
    return vals // 2 + vals // 16 if fp4 else vals * (2 if dtype == torch.bfloat16 else 1)


def backend(sock, pool, model=MODEL, tp_rank=0, tp_size=1, layout=None, extra=None):
    cfg = {"backend_name": "kvtier", "module_path": "kvtier.sglang", "class_name": "KvtierHiCache",
           "interface_v1": 1, "socket": sock}
    cfg.update(extra or {})
    sc = HiCacheStorageConfig(tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
                              attn_cp_size=1, is_mla_model=False, enable_storage_metrics=False,
                              is_page_first_layout=(layout or pool.layout) == "page_first", model_name=model,
                              extra_config=cfg)
    b = StorageBackendFactory.create_backend("dynamic", sc, pool)
    b.register_mem_pool_host(pool)
    return b


def keys(tag, n):
    # SGLang's keys are hex strings of a SHA-256 chain; their content is opaque to the backend.
    import hashlib
    out, last = [], tag
    for i in range(n):
        last = hashlib.sha256(f"{last}:{i}".encode()).hexdigest()
        out.append(last)
    return out


def daemon(folder=None):
    """kvtierd on the shipped config; `folder` keeps its socket, log and NVMe tier for a restart."""
    return kvtier.daemon.Daemon.shipped({"tiers.host.capacity": "64MiB", "tiers.nvme.capacity": "256MiB"},
                                        folder=folder)


def stored_blocks(sock, b, ks):
    """The bytes kvtierd holds for keys ks, read through a separate client."""
    c = kvtier.Client(sock, name="oracle")
    try:
        cid = c.register_contract(b.contract)
        assert cid == b.cid
        lease = c.acquire(cid, [KS.page_key(cid, k) for k in ks], "host")
        try:
            bb = b.contract.block_bytes()
            return [torch.frombuffer(bytearray(c.host_slot(s, cid)[:bb]), dtype=torch.uint8) for s in lease.slots]
        finally:
            c.release(lease)
    finally:
        c.close()


def eq(a, b, what):
    assert torch.equal(a, b), f"{what}: {int((a != b).sum())} of {a.numel()} bytes differ"


# ---- groups ----

def roundtrip(layout, dtype, fp4=False):
    with daemon() as d:
        src = Pool(layout, dtype, seed=1, fp4=fp4)
        b = backend(d.socket, src)
        assert b.contract.kv_format == ("nvfp4" if fp4 else "bf16" if dtype == torch.bfloat16 else "fp8")
        assert b.contract.block_bytes() == block_bytes(fp4, dtype)
        ks = keys("rt", 6)
        pages = [3, 7, 0, 12, 5, 9]                  # scattered host pages, as HiCache hands them
        assert b.batch_exists(ks) == 0
        r = b.batch_set_v1(ks, src.indices(pages), HiCacheStorageExtraInfo(prefix_keys=None))
        assert r == [True] * 6, r
        assert b.batch_exists(ks) == 6
        for i, blk in enumerate(stored_blocks(d.socket, b, ks)):
            eq(blk, src.page_bytes(pages[i]), f"stored block {i} (host page {pages[i]})")
        dst = Pool(layout, dtype, fill=False, fp4=fp4)
        b2 = backend(d.socket, dst)
        before = dst.snapshot()
        to = [1, 2, 15, 4, 8, 10]
        r = b2.batch_get_v1(ks, dst.indices(to))
        assert r == [True] * 6, r
        for i in range(6):
            eq(dst.page(to[i]), src.page(pages[i]), f"loaded page {i}")
        untouched = sorted(set(range(SIZE // T)) - set(to))
        for p in untouched:
            q = Pool(layout, dtype, fill=False, fp4=fp4)
            q.kv_buffer = before[0].view(dst.kv_buffer.dtype)
            if fp4:
                q.scale_kv_buffer = before[1]
            eq(dst.page(p), q.page(p), f"page {p} not asked for")
        st = b.get_stats()
        assert st["pages_set"] == 6 and st["pages_hit"] == 6, st


def t_page_first_bf16():
    roundtrip("page_first", torch.bfloat16)


def t_layer_first_bf16():
    roundtrip("layer_first", torch.bfloat16)


def t_page_first_fp8():
    roundtrip("page_first", torch.float8_e4m3fn)


def t_layer_first_fp8():
    roundtrip("layer_first", torch.float8_e4m3fn)


def t_fp4_pages_with_scales():
    roundtrip("page_first", None, fp4=True)


def t_fp4_block_decodes_like_the_pages():
    """The FP4 pool's (data, scales) of every token row decode, through kvtier's codec, to
    the same values as the kvtier block stored from them: the block is NVFP4 in kvtier's
    sense, not only the same bytes."""
    with daemon() as d:
        pool = Pool("page_first", None, fp4=True)
        # SGLang's rows: encode random values per (token, layer, side, head) with kvtier's codec.
        g = torch.Generator().manual_seed(5)
        vals = torch.randn(2, SIZE, L, H, D, generator=g)
        for kv in range(2):
            for t in range(T):
                for layer in range(L):
                    for h in range(H):
                        x = vals[kv, t, layer, h].contiguous()
                        kvtier.nvfp4_encode(x.data_ptr(), D, 1.0, 0, pool.kv_buffer[kv, t, layer, h].data_ptr(),
                                            pool.scale_kv_buffer[kv, t, layer, h].data_ptr())
        b = backend(d.socket, pool)
        ks = keys("fp4dec", 1)
        assert b.batch_set_v1(ks, pool.indices([0])) == [True]
        blk = stored_blocks(d.socket, b, ks)[0]
        per = H * T
        page = blk.view(L, 2, per * (D // 2 + D // 16))
        for layer in range(L):
            for kv in range(2):
                data = page[layer, kv, :per * D // 2].contiguous()
                sc = page[layer, kv, per * D // 2:].contiguous()
                got = torch.empty(per * D, dtype=torch.float32)
                kvtier.nvfp4_decode(data.data_ptr(), sc.data_ptr(), per * D, 1.0, got.data_ptr())
                want = torch.empty(H, T, D, dtype=torch.float32)
                for h in range(H):
                    for t in range(T):
                        kvtier.nvfp4_decode(pool.kv_buffer[kv, t, layer, h].data_ptr(),
                                            pool.scale_kv_buffer[kv, t, layer, h].data_ptr(), D, 1.0,
                                            want[h, t].data_ptr())
                eq(got.view(torch.uint8), want.flatten().view(torch.uint8), f"decoded layer {layer} side {kv}")


def t_layouts_share_pages():
    """page_first and layer_first pools of one model store the same blocks."""
    with daemon() as d:
        a = Pool("page_first", torch.bfloat16, seed=2)
        ba = backend(d.socket, a)
        ks = keys("x", 3)
        assert ba.batch_set_v1(ks, a.indices([4, 5, 6])) == [True] * 3
        bl = Pool("layer_first", torch.bfloat16, fill=False)
        bb = backend(d.socket, bl)
        assert bb.cid == ba.cid
        assert bb.batch_get_v1(ks, bl.indices([0, 9, 3])) == [True] * 3
        for i, (p, q) in enumerate(zip([4, 5, 6], [0, 9, 3])):
            eq(bl.page_bytes(q), a.page_bytes(p), f"page {i}")


def t_leading_hits():
    with daemon() as d:
        pool = Pool("page_first", torch.bfloat16, seed=3)
        b = backend(d.socket, pool)
        ks = keys("lead", 6)
        assert b.batch_set_v1(ks[:3], pool.indices([0, 1, 2])) == [True] * 3
        assert b.batch_set_v1([ks[4]], pool.indices([4])) == [True]
        assert b.batch_exists(ks) == 3
        assert b.batch_exists(ks[3:]) == 0
        assert b.batch_exists(ks[4:5]) == 1
        assert b.batch_exists([]) == 0
        dst = Pool("page_first", torch.bfloat16, fill=False)
        b2 = backend(d.socket, dst)
        r = b2.batch_get_v1(ks, dst.indices([10, 11, 12, 13, 14, 15]))
        assert r == [True, True, True, False, False, False], r
        for p in (13, 14, 15):
            assert int(dst.page(p).count_nonzero()) == 0, f"page {p} after the first miss was written"
        eq(dst.page(12), pool.page(2), "third page")


def t_restart_hits_from_nvme():
    """kvtierd restarted on the same NVMe folder: a new backend (another process) hits."""
    folder = tempfile.mkdtemp(prefix="kvtier-sglang-", dir=SCRATCH.name)
    pool = Pool("layer_first", torch.bfloat16, seed=4)
    ks = keys("restart", 4)
    with daemon(folder) as d:
        b = backend(d.socket, pool)
        assert b.batch_set_v1(ks, pool.indices([2, 3, 4, 5])) == [True] * 4
        c = kvtier.Client(d.socket, name="flush")
        c.flush("nvme")
        c.close()
        b.close()
    with daemon(folder) as d:
        child = subprocess.run([sys.executable, __file__, "--child-get", d.socket, ",".join(ks)],
                               capture_output=True, text=True, timeout=300, env=os.environ)
        assert child.returncode == 0, child.stdout + child.stderr
        got = torch.tensor(list(bytes.fromhex(child.stdout.strip().splitlines()[-1])), dtype=torch.uint8)
        want = torch.cat([pool.page(p) for p in [2, 3, 4, 5]])
        eq(got, want, "pages loaded after the restart, in another process")


def child_get(sock, ks):
    pool = Pool("layer_first", torch.bfloat16, fill=False)
    b = backend(sock, pool)
    n = b.batch_exists(ks)
    assert n == len(ks), f"{n} of {len(ks)} hits after the restart"
    r = b.batch_get_v1(ks, pool.indices([0, 1, 2, 3]))
    assert all(r), r
    print(torch.cat([pool.page(p) for p in range(4)]).numpy().tobytes().hex())


def t_other_model_never_hits():
    with daemon() as d:
        pool = Pool("page_first", torch.bfloat16, seed=6)
        b = backend(d.socket, pool)
        ks = keys("m", 3)
        assert b.batch_set_v1(ks, pool.indices([0, 1, 2])) == [True] * 3
        for kw in ({"model": "test-org/other-model"}, {"tp_rank": 1, "tp_size": 2},
                   {"extra": {"model_revision": "v2"}}):
            dst = Pool("page_first", torch.bfloat16, fill=False)
            o = backend(d.socket, dst, **kw)
            assert o.cid != b.cid, kw
            assert o.batch_exists(ks) == 0, kw
            assert o.batch_get_v1(ks, dst.indices([0, 1, 2])) == [False] * 3, kw
            assert int(dst.kv_buffer.view(torch.uint8).count_nonzero()) == 0, kw
        # The same model in FP8 is another contract too, and FP8 pages of other scales another.
        f8 = Pool("page_first", torch.float8_e4m3fn, fill=False)
        o = backend(d.socket, f8)
        assert o.batch_exists(ks) == 0
        o2 = backend(d.socket, Pool("page_first", torch.float8_e4m3fn, fill=False), extra={"k_scales": 0.5})
        assert o2.cid != o.cid


def t_clear():
    with daemon() as d:
        pool = Pool("page_first", torch.bfloat16, seed=7)
        b = backend(d.socket, pool)
        ks = keys("clear", 2)
        b.batch_set_v1(ks, pool.indices([0, 1]))
        assert b.batch_exists(ks) == 2
        b.clear()
        assert b.batch_exists(ks) == 0


def raises(fn, what, exc=KS.KvtierHiCacheError):
    try:
        r = fn()
    except exc as e:
        return str(e)
    raise AssertionError(f"{what}: returned {r!r} instead of raising {exc.__name__}")


def t_bad_input_raises_and_changes_nothing():
    with daemon() as d:
        pool = Pool("page_first", torch.bfloat16, seed=8)
        b = backend(d.socket, pool)
        ks = keys("f", 2)
        before = pool.snapshot()
        # Bad host indices: not whole pages, out of range, wrong count. Nothing is written.
        bad = pool.indices([0, 1])
        bad[3] += 1
        raises(lambda: b.batch_set_v1(ks, bad), "unaligned indices")
        raises(lambda: b.batch_get_v1(ks, pool.indices([0, 1]) + 1), "indices off by one")
        raises(lambda: b.batch_get_v1(ks, pool.indices([0])), "too few indices")
        raises(lambda: b.batch_get_v1(ks, pool.indices([15, 16 - 1]) + T), "indices past the pool")
        assert b.batch_exists(ks) == 0
        eq(pool.snapshot()[0], before[0], "pool after refused calls")
        assert b.batch_set_v1(ks, pool.indices([0, 1])) == [True, True]
        # Start-up refusals, by name.
        msg = raises(lambda: backend(d.socket, Pool("page_first", torch.float16)), "fp16 pool")
        assert "float16" in msg, msg
        msg = raises(lambda: backend(d.socket, Pool("page_first", torch.bfloat16), extra={"interface_v1": 0}),
                     "without interface_v1", ValueError)
        assert "interface_v1" in msg, msg
        u8 = Pool("page_first", torch.float8_e4m3fn)
        u8.kv_buffer = u8.kv_buffer.view(torch.uint8)
        u8.dtype = torch.uint8
        msg = raises(lambda: backend(d.socket, u8), "uint8 pool of unknown format")
        assert "kv_cache_dtype" in msg, msg
        ok = backend(d.socket, u8, extra={"kv_cache_dtype": "fp8_e4m3"})
        assert ok.contract.kv_format == "fp8"
        p = Pool("page_first", torch.bfloat16)
        p.layout = "page_head"
        raises(lambda: backend(d.socket, p), "page_head layout")
        f4 = Pool("layer_first", None, fp4=True)
        raises(lambda: backend(d.socket, f4), "layer_first FP4 pool")
        raises(lambda: backend(d.socket, Pool("page_first", torch.float8_e4m3fn), extra={"k_scales": [1.0]}),
               "k_scales of the wrong length", ValueError)
        raises(lambda: backend(d.socket, Pool("page_first", torch.float8_e4m3fn), extra={"k_scales": float("nan")}),
               "a NaN scale", ValueError)
        raises(lambda: backend(d.socket, Pool("page_first", torch.bfloat16), extra={"k_scales": 0.5}),
               "scales for BF16 pages", ValueError)


def t_outage_kill9_misses_then_caches_again():
    """kvtierd killed -9 under the backend: no exception reaches SGLang (exists 0, get and
    set all False, the pool untouched), one log line for the outage; kvtierd started again on
    the same folder: the backend reattaches by itself and stores and loads again. A backend
    made while no daemon listens starts, misses, and attaches once one does."""
    import logging
    lines = []

    class H(logging.Handler):
        def emit(self, r):
            lines.append(r.getMessage())
    logging.getLogger("kvtier.sglang").addHandler(H())
    folder = tempfile.mkdtemp(prefix="kvtier-sglang-outage-", dir=SCRATCH.name)
    d = daemon(folder)
    try:
        pool = Pool("page_first", torch.bfloat16, seed=9)
        b = backend(d.socket, pool)
        ka, kb = keys("out-a", 3), keys("out-b", 3)
        assert b.batch_set_v1(ka, pool.indices([0, 1, 2])) == [True] * 3
        d.kill()
        before = pool.snapshot()
        assert b.batch_exists(ka) == 0
        assert b.batch_get_v1(ka, pool.indices([6, 7, 8])) == [False] * 3
        assert b.batch_set_v1(kb, pool.indices([3, 4, 5])) == [False] * 3
        for _ in range(5):
            assert b.batch_exists(kb) == 0
        eq(pool.snapshot()[0], before[0], "the pool after calls made while kvtierd is down")
        gone = [ln for ln in lines if "recomputes" in ln]
        assert len(gone) == 1, lines
        d.start()
        assert kvtier.daemon.wait_until(lambda: b.batch_set_v1(kb, pool.indices([3, 4, 5])) == [True] * 3), "no reattach"
        assert any("is back; caching again" in ln for ln in lines), lines
        assert b.batch_exists(kb) == 3
        assert b.batch_get_v1(kb, pool.indices([6, 7, 8])) == [True] * 3   # into other pages of the pool
        for i, (p, q) in enumerate(zip([3, 4, 5], [6, 7, 8])):
            eq(pool.page(q), pool.page(p), f"page {i} after the restart")
        assert b.get_stats()["outages"] == 1
    finally:
        d.stop()
    # No daemon at start: the backend is made, misses, and attaches once kvtierd listens.
    folder2 = tempfile.mkdtemp(prefix="kvtier-sglang-late-", dir=SCRATCH.name)
    pool = Pool("page_first", torch.bfloat16, seed=10)
    late = backend(os.path.join(folder2, "kvtierd.sock"), pool)
    ks = keys("late", 2)
    assert late.batch_exists(ks) == 0 and late.batch_set_v1(ks, pool.indices([0, 1])) == [False, False]
    with daemon(folder2):
        assert kvtier.daemon.wait_until(lambda: late.batch_set_v1(ks, pool.indices([0, 1])) == [True, True]), "no attach"
        assert late.batch_exists(ks) == 2


GROUPS = {k[2:]: v for k, v in globals().items() if k.startswith("t_")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-k", default="")
    ap.add_argument("--child-get", nargs=2)
    a = ap.parse_args()
    if a.child_get:
        child_get(a.child_get[0], a.child_get[1].split(","))
        return 0
    passed = failed = 0
    for name, fn in GROUPS.items():
        if a.k and a.k not in name:
            continue
        try:
            fn()
            passed += 1
            print(f"PASS {name}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {name}", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
