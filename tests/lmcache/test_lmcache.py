"""kvtier.lmcache: LMCache's remote storage plugin on a real kvtierd, with the real lmcache package
(built for the CPU: NO_GPU_EXT=1 from the sdist, scripts/lmcache-venv.sh).

The connector is made by LMCache's own plugin loader (CreateConnector with
remote_storage_plugins and the module_path / class_name extra config the module doc gives);
memory objects come from LMCache's LocalCPUBackend. Prints "N passed, N failed".
"""
import asyncio
import os
import sys
import tempfile
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))

try:
    import torch
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.config import LMCacheEngineConfig
    from lmcache.v1.memory_allocators.ad_hoc_memory_allocator import AdHocMemoryAllocator
    from lmcache.v1.memory_management import MemoryFormat
    from lmcache.v1.metadata import LMCacheMetadata
    from lmcache.v1.storage_backend.connector import CreateConnector
    from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend
except ImportError as e:
    if os.environ.get("KVTIER_LMCACHE_OPTIONAL") == "1":
        print(f"SKIPPED: lmcache is not importable ({e}); scripts/lmcache-venv.sh makes the venv")
        sys.exit(0)
    print(f"FAILED: lmcache is not importable ({e}); scripts/lmcache-venv.sh makes the venv")
    sys.exit(1)

import kvtier  # noqa: E402
import kvtier.daemon  # noqa: E402

# Every folder a check makes (a daemon's socket, log and NVMe tier) lies in this one,
# removed when the run exits.
SCRATCH = tempfile.TemporaryDirectory(prefix="kvtier-lmcache-test-")

L, T, H, D = 2, 32, 2, 64


def daemon(folder=None):
    """kvtierd on the shipped config/kvtier.toml with only its capacities (and folder) set."""
    return kvtier.daemon.Daemon.shipped({"tiers.host.capacity": "64MiB", "tiers.nvme.capacity": "256MiB"},
                                        folder=folder)


def setup(sock, model="test-org/tiny", worker=0, world=1, dtype=torch.bfloat16):
    config = LMCacheEngineConfig(chunk_size=T, local_cpu=True, max_local_cpu_size=0.1, remote_url=f"kvtier://{sock}",
                                 remote_serde="naive", remote_storage_plugins=["kvtier"],
                                 extra_config={"remote_storage_plugin.kvtier.module_path": "kvtier.lmcache",
                                               "remote_storage_plugin.kvtier.class_name": "KvtierConnectorAdapter"})
    md = LMCacheMetadata(model_name=model, kv_dtype=dtype, kv_shape=(L, 2, T, H, D), use_mla=False, world_size=world,
                         local_world_size=world, worker_id=worker, local_worker_id=worker)
    cpu = LocalCPUBackend(config, md, memory_allocator=AdHocMemoryAllocator())
    loop = asyncio.new_event_loop()
    conn = CreateConnector(config.remote_url, loop, cpu, config, md)
    return loop, cpu, conn


def key(h, model="test-org/tiny", worker=0, world=1):
    return CacheEngineKey(model_name=model, world_size=world, worker_id=worker, chunk_hash=h, dtype=torch.bfloat16)


def obj(cpu, seed, tokens=T):
    o = cpu.allocate(torch.Size([2, L, tokens, H * D]), torch.bfloat16, MemoryFormat.KV_2LTD)
    o.tensor.copy_(torch.randn(2, L, tokens, H * D, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16))
    return o


def t_roundtrip_restart_other_model():
    folder = tempfile.mkdtemp(prefix="kvtier-lmcache-", dir=SCRATCH.name)
    bb = L * 2 * H * T * D * 2
    with daemon(folder) as d:
        loop, cpu, conn = setup(d.socket)
        run = loop.run_until_complete
        a = obj(cpu, 1)
        want = a.tensor.clone()
        assert not run(conn.exists(key(11)))
        run(conn.put(key(11), a))
        assert run(conn.exists(key(11))) and conn.exists_sync(key(11))
        # The stored block is kvtier's layout: per layer K then V, HND.
        c = kvtier.Client(d.socket)
        inner = conn.connection if hasattr(conn, "connection") else conn
        real = getattr(inner, "_connector", None) or getattr(conn, "_connector", None) or conn
        cid = c.register_contract(real.contract)
        lease = c.acquire(cid, [kvtier.lmcache.chunk_key(cid, key(11).to_string())], "host")
        blk = torch.frombuffer(bytearray(c.host_slot(lease.slots[0], cid)[:bb]), dtype=torch.bfloat16)
        c.release(lease)
        ref = want.view(2, L, T, H, D).permute(1, 0, 3, 2, 4).contiguous().flatten()
        assert torch.equal(blk.view(torch.int16), ref.view(torch.int16)), "stored block is not kvtier's layout"
        got = run(conn.get(key(11)))
        assert got is not None and torch.equal(got.tensor.view(torch.int16), want.view(torch.int16))
        assert run(conn.get(key(12))) is None
        # A partial chunk is not stored (a miss later, never wrong bytes).
        run(conn.put(key(13), obj(cpu, 2, tokens=T // 2)))
        assert not run(conn.exists(key(13)))
        # Another model and another worker never hit.
        _, _, other = setup(d.socket, model="test-org/other")
        assert not loop.run_until_complete(other.exists(key(11, model="test-org/other")))
        c.flush("nvme")
        c.close()
        run(conn.close())
    with daemon(folder) as d:
        loop, cpu, conn = setup(d.socket)
        got = loop.run_until_complete(conn.get(key(11)))
        assert got is not None and torch.equal(got.tensor.view(torch.int16), want.view(torch.int16)), "after restart"


def t_outage_kill9_misses_then_caches_again():
    """kvtierd killed -9 under the connector: exists is False, get None, put stores nothing,
    and no exception reaches LMCache; one log line for the outage. kvtierd started again on
    the same folder: the connector reattaches by itself and puts and gets again. A connector
    made while no daemon listens is made, misses, and attaches once one does."""
    import logging
    lines = []

    class Lines(logging.Handler):
        def emit(self, r):
            lines.append(r.getMessage())
    logging.getLogger("kvtier.lmcache").addHandler(Lines())
    folder = tempfile.mkdtemp(prefix="kvtier-lmcache-outage-", dir=SCRATCH.name)
    d = daemon(folder)
    try:
        loop, cpu, conn = setup(d.socket)
        run = loop.run_until_complete
        a, b = obj(cpu, 3), obj(cpu, 4)
        run(conn.put(key(21), a))
        assert run(conn.exists(key(21)))
        d.kill()
        assert not run(conn.exists(key(21)))
        assert run(conn.get(key(21))) is None
        run(conn.put(key(22), b))
        for _ in range(5):
            assert not run(conn.exists(key(22)))
        assert len([ln for ln in lines if "recomputes" in ln]) == 1, lines
        d.start()

        def put_and_find():
            run(conn.put(key(22), b))
            return run(conn.exists(key(22)))
        assert kvtier.daemon.wait_until(put_and_find), "the connector did not reattach"
        assert any("is back; caching again" in ln for ln in lines), lines
        got = run(conn.get(key(22)))
        assert got is not None and torch.equal(got.tensor.view(torch.int16), b.tensor.view(torch.int16))
        run(conn.close())
    finally:
        d.stop()
    folder2 = tempfile.mkdtemp(prefix="kvtier-lmcache-late-", dir=SCRATCH.name)
    loop, cpu, conn = setup(os.path.join(folder2, "kvtierd.sock"))
    run = loop.run_until_complete
    c = obj(cpu, 5)
    run(conn.put(key(23), c))
    assert not run(conn.exists(key(23)))
    with daemon(folder2):
        def put_and_find2():
            run(conn.put(key(23), c))
            return run(conn.exists(key(23)))
        assert kvtier.daemon.wait_until(put_and_find2), "the connector did not attach"


def main():
    passed = failed = 0
    for name, fn in [(k, v) for k, v in globals().items() if k.startswith("t_")]:
        try:
            fn()
            passed += 1
            print(f"PASS {name[2:]}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {name[2:]}", flush=True)
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
