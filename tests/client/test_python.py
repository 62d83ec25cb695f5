#!/usr/bin/env python3
"""The kvtier Python package (ctypes over libkvtier) against a real kvtierd.

Run by ctest with KVTIER_LIB, KVTIER_BIN_DIR and PYTHONPATH set (tests/client/CMakeLists.txt).
"""
import gc
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import kvtier
import kvtier.daemon


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="kvtier-py-")
        d = cls.tmp.name
        cls.sock = os.path.join(d, "kvtierd.sock")
        cfg = os.path.join(d, "kvtier.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nsocket = "{cls.sock}"\nmetrics_port = 0\n[tiers]\nslot_bytes = "4KiB"\n'
                    f'[tiers.host]\ncapacity = "256KiB"\n[tiers.nvme]\ncapacity = "1MiB"\ndir = "{d}/nvme"\n')
        cls.log = open(os.path.join(d, "kvtierd.log"), "w")
        cls.proc = kvtier.daemon.start_kvtierd(cfg, cls.sock, cls.log)

    @classmethod
    def tearDownClass(cls):
        cls.proc.send_signal(signal.SIGTERM)
        rc = cls.proc.wait(timeout=20)
        cls.log.close()
        cls.tmp.cleanup()
        assert rc == 0, f"kvtierd exited {rc}"

    def contract(self, model="py/model"):
        return kvtier.Contract(model_id=model, num_layers=2, num_kv_heads=1, head_dim=16, block_tokens=16,
                               model_revision="r1", tokenizer_revision="t1")

    def test_store_lookup_acquire_release(self):
        with kvtier.Client(self.sock, name="py") as c:
            self.assertEqual(c.slot_bytes, 4096)
            contract = self.contract()
            cid = c.register_contract(contract)
            self.assertEqual(cid, contract.id())
            self.assertEqual(contract.block_bytes(), 576)
            tokens = list(range(1000, 1000 + 16 * 6 + 3))
            keys = kvtier.key_chain(cid, tokens, 16)
            self.assertEqual(len(keys), 6)
            self.assertEqual(len({k.hex() for k in keys}), 6)
            lease = c.alloc(cid, 6, "host")
            self.assertNotEqual(lease.id, 0)
            self.assertEqual(list(lease.from_tier_names()), ["none"] * 6)  # alloc: nothing came from anywhere
            for i, s in enumerate(lease.slots):
                c.host_slot(s)[:576] = bytes([i + 1]) * 576
            items = [(s, k, keys[i - 1] if i else None) for i, (s, k) in enumerate(zip(lease.slots, keys))]
            self.assertEqual(c.commit(cid, lease, items), 6)
            c.release(lease)
            longer = kvtier.key_chain(cid, tokens + list(range(50)), 16)
            for transport in ("ring", "socket"):
                c.set_transport(transport)
                r = c.lookup(cid, longer)
                self.assertEqual(r.hit_blocks, 6, transport)
                self.assertEqual(r.tiers[:6], ["host"] * 6)
                self.assertEqual(r.tiers[6:], ["none"] * (len(longer) - 6))
                # TierNames: a lazy sequence of names that behaves like the list it replaced
                self.assertIsInstance(r.tiers, kvtier.TierNames)
                self.assertEqual(len(r.tiers), len(longer))
                self.assertEqual(list(r.tiers), ["host"] * 6 + ["none"] * (len(longer) - 6))
                self.assertEqual(r.tiers[0], "host")
                self.assertEqual(r.tiers[-1], "none")
                self.assertEqual(r.tiers.count("host"), 6)
                self.assertEqual(set(r.tiers), {"host", "none"})
                self.assertNotEqual(r.tiers[:6], ["host"] * 5 + ["nvme"])
                self.assertNotEqual(r.tiers[:6], ["host"] * 5)
                self.assertEqual(r.tiers.codes()[:6], bytes([kvtier.TIER_HOST]) * 6)
                self.assertEqual(r.tiers[:6], r.tiers[:6])
                got = c.acquire(cid, longer, "host")
                self.assertEqual(len(got.slots), 6)
                self.assertEqual(list(got.from_tier_names()), ["host"] * 6)  # found in host already
                for i, s in enumerate(got.slots):
                    self.assertEqual(bytes(c.host_slot(s)[:576]), bytes([i + 1]) * 576)
                c.release(got)
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.release(got)
                self.assertEqual(e.exception.status, "NOT_FOUND")
            stats = {s.tier: s for s in c.stats()}
            self.assertEqual(stats["host"].blocks, 6)
            self.assertEqual(stats["host"].slots_total, 64)
            # key_chain_array: the same keys without a per-key Python loop; its slices
            # go to lookup/acquire as they are.
            arr = kvtier.key_chain_array(cid, tokens + list(range(50)), 16)
            self.assertEqual(list(arr), longer)
            self.assertEqual(list(arr[2:5]), longer[2:5])
            self.assertEqual(c.lookup(cid, arr).hit_blocks, 6)
            self.assertEqual(c.lookup(cid, arr[:3]).hit_blocks, 3)
            # Operator flushes: to host is a no-op without HBM; to NVMe moves them all.
            c.flush("host")
            self.assertEqual(c.lookup(cid, keys).tiers, ["host"] * 6)
            c.flush("nvme")
            self.assertEqual(c.lookup(cid, keys).tiers, ["nvme"] * 6)
            with self.assertRaises(ValueError):
                c.flush("hbm")
            got = c.acquire(cid, keys, "host")  # back from NVMe, byte for byte
            self.assertEqual(list(got.from_tier_names()), ["nvme"] * 6)  # and it says so
            self.assertEqual([s.tier for s in got.slots], [kvtier.TIER_HOST] * 6)
            for i, s in enumerate(got.slots):
                self.assertEqual(bytes(c.host_slot(s)[:576]), bytes([i + 1]) * 576)
            c.release(got)
            self.assertEqual(c.evict_contract(cid), (6, 0))
            self.assertEqual(c.lookup(cid, keys).hit_blocks, 0)

    def test_acquire_async(self):
        """acquire_async from NVMe: fileno() turns readable, ready_blocks() only grows, and
        result() is what acquire() answers (slots and bytes); a second one may be in flight
        beside it."""
        import select
        with kvtier.Client(self.sock, name="py-async") as c:
            cid = c.register_contract(self.contract("py/async"))
            tokens = list(range(5000, 5000 + 16 * 12))
            keys = kvtier.key_chain(cid, tokens, 16)
            lease = c.alloc(cid, 12, "host")
            for i, s in enumerate(lease.slots):
                c.host_slot(s)[:576] = bytes([i + 40]) * 576
            c.commit(cid, lease, [(s, k, keys[i - 1] if i else None)
                                  for i, (s, k) in enumerate(zip(lease.slots, keys))])
            c.release(lease)
            c.flush("nvme")
            self.assertEqual(c.lookup(cid, keys).tiers, ["nvme"] * 12)
            op = c.acquire_async(cid, keys, "host", chunk_blocks=3)
            second = c.acquire_async(cid, keys[:4], "host")
            seen = [op.ready_blocks()]
            while not op.wait(0):
                r = op.ready_blocks()
                self.assertGreaterEqual(r, seen[-1])
                seen.append(r)
                time.sleep(0.0002)
            self.assertEqual(select.select([op.fileno()], [], [], 0)[0], [op.fileno()])
            self.assertEqual(op.ready_blocks(), 12)
            early = op.ready_slots()
            got = op.result()
            self.assertEqual(list(got.from_tier_names()), ["nvme"] * 12)
            self.assertEqual([(s.tier, s.slot) for s in got.slots], [(s.tier, s.slot) for s in early])
            for i, s in enumerate(got.slots):
                self.assertEqual(bytes(c.host_slot(s)[:576]), bytes([i + 40]) * 576)
            op.close()
            c.release(got)
            got2 = second.result()
            self.assertEqual([(s.tier, s.slot) for s in got2.slots], [(s.tier, s.slot) for s in got.slots[:4]])
            second.close()
            c.release(got2)
            again = c.acquire(cid, keys, "host")
            self.assertEqual([(s.tier, s.slot) for s in again.slots], [(s.tier, s.slot) for s in got.slots])
            c.release(again)
            # Closed without taking the result: its lease is released.
            op = c.acquire_async(cid, keys, "host")
            self.assertTrue(op.wait(10))
            op.close()
            with self.assertRaises(kvtier.KvtierError):
                op.ready_blocks()
            self.assertEqual(c.evict_contract(cid), (12, 0))  # nothing left pinned

    def test_errors(self):
        with kvtier.Client(self.sock) as c:
            with self.assertRaises(kvtier.KvtierError) as e:
                c.lookup(self.contract("py/unregistered").id(), [kvtier.Key(1, 2)])
            self.assertEqual(e.exception.status, "NOT_FOUND")
            big = kvtier.Contract(model_id="py/big", num_layers=80, num_kv_heads=8, head_dim=128, block_tokens=16)
            with self.assertRaises(kvtier.KvtierError) as e:
                c.register_contract(big)
            self.assertIn(e.exception.status, ("UNSUPPORTED", "REJECTED"))
            with self.assertRaises(kvtier.KvtierError) as e:
                c.acquire(c.register_contract(self.contract()), [kvtier.Key(1, 2)], "hbm")
            self.assertEqual(e.exception.status, "INVALID")
            with self.assertRaises(kvtier.KvtierError):
                kvtier.Contract(model_id="x", num_layers=2, num_kv_heads=1, head_dim=17, block_tokens=16).id()
            c.ping()
        with self.assertRaises(kvtier.KvtierError) as e:
            kvtier.Client("/nonexistent/kvtierd.sock")
        self.assertEqual(e.exception.status, "IO_ERROR")

    def test_sizes_are_checked_before_anything_is_allocated(self):
        """Counts past what a request can carry, or past the C integer they become, are
        INVALID before the package allocates for them or passes them on wrapped. Run in a
        child under an address-space limit of its size + 512 MiB: a package that
        allocated first fails there with MemoryError instead of answering."""
        import resource
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            out = []
            try:
                with kvtier.Client(self.sock, name="py-sizes") as c:
                    cid = c.register_contract(self.contract("py/sizes"))
                    with open("/proc/self/status") as f:
                        vm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:"))
                    resource.setrlimit(resource.RLIMIT_AS, (vm + (512 << 20), resource.RLIM_INFINITY))
                    moves = [
                        ("alloc 2**31", lambda: c.alloc(cid, 2**31)),
                        ("alloc 2**32+1", lambda: c.alloc(cid, 2**32 + 1)),
                        ("alloc 0", lambda: c.alloc(cid, 0)),
                        ("alloc -1", lambda: c.alloc(cid, -1)),
                        ("alloc wait 2**32", lambda: c.alloc(cid, 1, wait_ms=2**32)),
                        ("chunk 2**32+16", lambda: c.acquire_async(cid, [kvtier.Key(1, 2)], chunk_blocks=2**32 + 16)),
                        ("release 2**64+5", lambda: c.release(2**64 + 5)),
                        ("key_chain block 2**32+16", lambda: kvtier.key_chain(cid, list(range(64)), 2**32 + 16)),
                    ]
                    for name, call in moves:
                        try:
                            res = call()
                            if isinstance(res, kvtier.AsyncAcquire):
                                res.close()
                            out.append(f"{name}: no error")
                        except kvtier.KvtierError as e:
                            out.append(f"{name}: {e.status}")
                        except BaseException as e:  # noqa: BLE001
                            out.append(f"{name}: {type(e).__name__}")
                    c.ping()
                    out.append("ping: OK")
            except BaseException as e:  # noqa: BLE001
                out.append(f"child: {e!r}")
            os.write(w, "\n".join(out).encode())
            os._exit(0)
        os.close(w)
        got = b""
        while True:
            b = os.read(r, 4096)
            if not b:
                break
            got += b
        os.close(r)
        os.waitpid(pid, 0)
        lines = got.decode().split("\n")
        want = ["alloc 2**31: INVALID", "alloc 2**32+1: INVALID", "alloc 0: INVALID", "alloc -1: INVALID",
                "alloc wait 2**32: INVALID", "chunk 2**32+16: INVALID", "release 2**64+5: INVALID",
                "key_chain block 2**32+16: INVALID", "ping: OK"]
        self.assertEqual(lines, want)

    def test_struct_layouts_match_the_library(self):
        import ctypes
        table = kvtier._layout_table(kvtier._load())
        kvtier._check_layouts(table)  # what _load() ran
        self.assertEqual(set(kvtier._MIRRORS), {r for r in table})
        self.assertEqual(table["kvtier_tier_stats"][""], 8 + 20 * 8)
        self.assertIn("write_errors", table["kvtier_tier_stats"])
        with kvtier.Client(self.sock) as c:
            stats = c.stats()
            self.assertTrue(stats)
            self.assertEqual(stats[0].errors, 0)
            self.assertEqual(stats[0].write_errors, 0)

        # A binding that drifted from the C side is refused at load, naming the field.
        class ShortStats(ctypes.Structure):
            _fields_ = [f for f in kvtier._TierStats._fields_ if f[0] != "write_errors"]

        class WideKey(ctypes.Structure):
            _fields_ = [("hi", ctypes.c_uint64), ("lo", ctypes.c_uint32)]

        class MovedSlot(ctypes.Structure):
            _fields_ = [("from_tier", ctypes.c_uint8), ("tier", ctypes.c_uint8), ("reserved", ctypes.c_uint8 * 2),
                        ("slot", ctypes.c_uint32)]

        for rec, cls, what in (("kvtier_tier_stats", ShortStats, "write_errors"), ("kvtier_key", WideKey, "lo"),
                               ("kvtier_slot", MovedSlot, "kvtier_slot.")):
            with self.assertRaises(ImportError) as e:
                kvtier._check_layouts(table, {rec: cls})
            self.assertIn(what, str(e.exception))
        with self.assertRaises(ImportError):
            kvtier._check_layouts(table, {"kvtier_no_such_record": WideKey})

    def test_views_outlive_close_and_collection(self):
        # A view used after close() or after the Client is collected reads and writes
        # valid memory (no SIGSEGV); run in a child so that a crash fails this test
        # instead of killing the runner.
        code = f"""
import gc, kvtier
c = kvtier.Client({self.sock!r})
last = c.host_arena()[1] // c.slot_bytes - 1   # a staging slot: this client's, writable
v = c.host_slot(last)
v[:4] = b"abcd"
c.close()
assert bytes(v[:4]) == b"abcd"
v[:4] = b"wxyz"
w = kvtier.Client({self.sock!r}).host_slot(last)   # the Client is only referenced by its view
gc.collect()
w[:2] = b"ok"
assert bytes(w[:2]) == b"ok"
try:
    c.host_slot(0)
except kvtier.KvtierError as e:
    assert e.status == "DISCONNECTED", e
else:
    raise AssertionError("host_slot on a closed client")
print("views ok")
"""
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("views ok", r.stdout)

    def test_commit_report_of_cached_keys(self):
        # A commit of keys already cached says which bytes were equal and which were not
        # (the first bytes stay: tiers.on_conflict keep-first).
        with kvtier.Client(self.sock) as c:
            cid = c.register_contract(self.contract("py/commit-report"))
            keys = kvtier.key_chain(cid, list(range(7000, 7000 + 32)), 16)

            def store(fill):
                lease = c.alloc(cid, 2, "host")
                for i, s in enumerate(lease.slots):
                    c.host_slot(s)[:576] = bytes([fill + i]) * 576
                items = [(s, k, keys[i - 1] if i else None) for i, (s, k) in enumerate(zip(lease.slots, keys))]
                r = c.commit_report(cid, lease, items)
                c.release(lease)
                return r

            self.assertEqual(store(10), kvtier.CommitResult(2, 2, 0, 0, 0))
            self.assertEqual(store(10), kvtier.CommitResult(2, 0, 2, 0, 0))
            self.assertEqual(store(20), kvtier.CommitResult(2, 0, 0, 2, 0))
            lease = c.acquire(cid, keys, tier="host")
            self.assertEqual(bytes(c.host_slot(lease.slots[1])[:576]), bytes([11]) * 576)
            self.assertTrue(c.host_slot(lease.slots[1]).readonly)
            c.release(lease)
            self.assertEqual(c.evict_contract(cid), (2, 0))  # the other tests count the host tier's blocks

    def test_plain_commit_raises_conflict_under_each_on_conflict(self):
        # Keys a poisoner cached first with other bytes: commit and commit_chain raise
        # KvtierConflict and count only the keys holding the caller's bytes (keep-first,
        # drop-disputed); replace stores them and returns the count.
        for rule in ("keep-first", "drop-disputed", "replace"):
            with self.subTest(on_conflict=rule):
                d = tempfile.mkdtemp(prefix="kvtier-py-cf-", dir=self.tmp.name)
                sock = os.path.join(d, "kvtierd.sock")
                cfg = os.path.join(d, "kvtier.toml")
                with open(cfg, "w") as f:
                    f.write(f'[daemon]\nsocket = "{sock}"\nmetrics_port = 0\n[tiers]\nslot_bytes = "4KiB"\n'
                            f'on_conflict = "{rule}"\n[tiers.host]\ncapacity = "256KiB"\n[tiers.nvme]\n'
                            f'capacity = "0"\n')
                proc = kvtier.daemon.start_kvtierd(cfg, sock)
                try:
                    with kvtier.Client(sock, name="poisoner") as p, kvtier.Client(sock, name="honest") as h:
                        cid = p.register_contract(self.contract("py/conflict"))
                        self.assertEqual(h.register_contract(self.contract("py/conflict")), cid)
                        keys = kvtier.key_chain(cid, list(range(8000, 8000 + 64)), 16)

                        def stage(c, fill, ks):
                            lease = c.alloc(cid, len(ks), "host")
                            for s in lease.slots:
                                c.host_slot(s)[:576] = bytes([fill]) * 576
                            return lease, [(s, k, keys[keys.index(k) - 1] if keys.index(k) else None)
                                           for s, k in zip(lease.slots, ks)]

                        lease, items = stage(p, 0x66, keys[:2])
                        self.assertEqual(p.commit(cid, lease, items), 2)
                        p.release(lease)
                        lease, items = stage(h, 0x11, keys[:2])
                        if rule == "replace":
                            self.assertEqual(h.commit(cid, lease, items), 2)
                        else:
                            with self.assertRaises(kvtier.KvtierConflict) as e:
                                h.commit(cid, lease, items)
                            self.assertEqual(e.exception.status, "CONFLICT")
                            self.assertEqual(e.exception.committed, 0)
                            self.assertEqual(e.exception.conflicts, 2)
                            self.assertEqual(e.exception.result.different_bytes, 2)
                            self.assertIsInstance(e.exception, kvtier.KvtierError)
                        h.release(lease)
                        # commit_chain: keys[2] poisoned, keys[3] new.
                        lease, items = stage(p, 0x66, keys[2:3])
                        p.commit(cid, lease, [(items[0][0], keys[2], keys[1])])
                        p.release(lease)
                        lease = h.alloc(cid, 2, "host")
                        for s in lease.slots:
                            h.host_slot(s)[:576] = bytes([0x22]) * 576
                        if rule == "replace":
                            self.assertEqual(h.commit_chain(cid, lease, lease.slots, keys[2:4], keys[1]), 2)
                        else:
                            with self.assertRaises(kvtier.KvtierConflict) as e:
                                h.commit_chain(cid, lease, lease.slots, keys[2:4], keys[1])
                            self.assertEqual(e.exception.committed, 1)
                            self.assertEqual(e.exception.conflicts, 1)
                        h.release(lease)
                finally:
                    proc.send_signal(signal.SIGTERM)
                    proc.wait(timeout=20)

    def test_range_checks(self):
        with kvtier.Client(self.sock) as c:
            n = c.host_arena()[1] // c.slot_bytes
            self.assertEqual(n, 64 + 48)  # the arena, then this client's staging area (its 0.75 share)
            self.assertTrue(c.host_slot(63).readonly)  # the arena is read-only to clients
            self.assertFalse(c.host_slot(64).readonly)
            with self.assertRaises(TypeError):
                c.host_slot(0)[:1] = b"x"
            for bad in (-1, n, 1 << 40):
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.host_slot(bad)
                self.assertEqual(e.exception.status, "INVALID")
                with self.assertRaises(kvtier.KvtierError):
                    c.host_slot_address(bad)
            self.assertEqual(len(c.host_slot(n - 1)), c.slot_bytes)
            with self.assertRaises(kvtier.KvtierError) as e:
                c.host_slot(kvtier.Slot(kvtier.TIER_HBM, 0))
            self.assertIn("not host", str(e.exception))
            for tokens in ([1, 2, -1] + [0] * 13, [1 << 32] + [0] * 15):
                with self.assertRaises(kvtier.KvtierError) as e:
                    kvtier.key_chain(1, tokens, 16)
                self.assertEqual(e.exception.status, "INVALID")
                with self.assertRaises(kvtier.KvtierError):
                    kvtier.key_chain_array(1, tokens, 16)
            ok = [(1 << 32) - 1] + [0] * 15
            self.assertEqual(len(kvtier.key_chain(1, ok, 16)), 1)

    def test_empty_and_miss_cases(self):
        with kvtier.Client(self.sock) as c:
            cid = c.register_contract(self.contract("py/empty"))
            self.assertEqual(c.lookup(cid, []).hit_blocks, 0)
            lease = c.acquire(cid, [])
            self.assertEqual((lease.id, len(lease.slots)), (0, 0))
            miss = c.acquire(cid, [kvtier.Key(5, 5)])
            self.assertEqual(miss.id, 0)
            c.release(miss)  # lease 0: a no-op
            c.prefetch(cid, [])

    def test_commit_error_carries_committed_count(self):
        with kvtier.Client(self.sock) as c:
            cid = c.register_contract(self.contract("py/partial"))
            lease = c.alloc(cid, 2)
            k1, k2 = kvtier.Key(11, 1), kvtier.Key(11, 2)
            s0 = lease.slots[0]
            with self.assertRaises(kvtier.KvtierError) as e:
                c.commit(cid, lease, [(s0, k1, None), (s0, k2, k1)])  # the same slot twice
            self.assertEqual(e.exception.status, "INVALID")
            self.assertEqual(e.exception.committed, 1)
            self.assertEqual(c.lookup(cid, [k1]).hit_blocks, 1)
            c.release(lease)
            self.assertEqual(c.evict_contract(cid), (1, 0))  # leave the tiers as they were

    def test_token_level_store_load(self):
        with kvtier.Client(self.sock) as c:
            cid = c.register_contract(self.contract("py/tokens"))
            self.assertEqual(c.block_tokens(cid), 16)
            tokens = list(range(7000, 7000 + 16 * 3 + 2))
            self.assertEqual(c.key_chain(cid, tokens), kvtier.key_chain(cid, tokens, 16))
            self.assertEqual(c.lookup_tokens(cid, tokens), 0)
            blocks = [bytes([i + 40]) * 576 for i in range(3)]
            with self.assertRaises(kvtier.KvtierError):
                c.store(cid, tokens, [b"short"] * 3)  # wrong block size: refused, nothing stored
            self.assertEqual(c.lookup_tokens(cid, tokens), 0)
            self.assertEqual(c.store(cid, tokens, blocks), 3)
            self.assertEqual(c.store(cid, tokens, blocks), 0)
            self.assertEqual(c.lookup_tokens(cid, tokens), 48)
            self.assertEqual(c.lookup_tokens(cid, tokens[:48]), 32)  # the last token's block is recomputed
            cached, lease = c.load(cid, tokens)
            self.assertEqual((cached, len(lease.slots)), (48, 3))
            for i, s in enumerate(lease.slots):
                self.assertEqual(bytes(c.host_slot(s)[:576]), blocks[i])
            c.release(lease)
            cached, miss = c.load(cid, [1, 2, 3] * 20)
            self.assertEqual((cached, miss.id), (0, 0))
            c.release(miss)
            with self.assertRaises(kvtier.KvtierError) as e:
                c.lookup_tokens(self.contract("py/never").id(), tokens)
            self.assertEqual(e.exception.status, "NOT_FOUND")
            self.assertEqual(c.evict_contract(cid), (3, 0))

    def test_slot_classes(self):
        """Two contracts of different block sizes in one daemon of two host slot classes
        sharing 48 KiB slabs: each in its class, its fill reported, slot s at s * granule,
        its views as long as its class's slots."""
        from kvtier.daemon import Daemon
        with Daemon(slot_bytes=12288, hbm=None, host="240KiB", nvme="1MiB", slot_classes=[4096, 12288],
                    slab_bytes="48KiB") as d:
            with kvtier.Client(d.socket) as c:
                small = kvtier.Contract(model_id="py/small", num_layers=14, num_kv_heads=1, head_dim=16, block_tokens=16)
                large = kvtier.Contract(model_id="py/large", num_layers=40, num_kv_heads=1, head_dim=16, block_tokens=16)
                cs, cl = c.register_contract(small), c.register_contract(large)
                self.assertEqual(c.contract_slot(cs), (4096, 4032 / 4096))
                self.assertEqual(c.contract_slot(cl), (12288, 11520 / 12288))
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.contract_slot(cs + 1)
                self.assertEqual(e.exception.status, "NOT_FOUND")
                ts, tl = list(range(100, 100 + 16 * 3)), list(range(900, 900 + 16 * 2))
                bs = [bytes([i + 1]) * 4032 for i in range(3)]
                bl = [bytes([i + 9]) * 11520 for i in range(2)]
                self.assertEqual(c.store(cs, ts + [0], bs), 3)
                self.assertEqual(c.store(cl, tl + [0], bl), 2)
                base, _ = c.host_arena()
                for cid, toks, blocks, size in ((cs, ts, bs, 4096), (cl, tl, bl, 12288)):
                    cached, lease = c.load(cid, toks + [0])
                    self.assertEqual(len(lease.slots), len(blocks))
                    for i, s in enumerate(lease.slots):
                        v = c.host_slot(s, cid)
                        self.assertEqual(len(v), size)
                        self.assertEqual(c.host_slot_address(s, cid), base + s.slot * 4096)  # the granule
                        self.assertEqual(bytes(v[:len(blocks[i])]), blocks[i])
                        with self.assertRaises(kvtier.KvtierError):
                            c.host_slot(s)  # several classes: the view's size needs the contract
                    c.release(lease)
                with self.assertRaises(kvtier.KvtierError):
                    c.host_slot(10 ** 6, cs)  # past the window

    def test_slot_sizes_per_contract(self):
        """tiers.slot_classes = "per-contract": no class list at attach, each contract's
        slot (its block rounded up to the 4 KiB granule) from its registration, staging
        slots of two sizes held at once in one area, views as long as the contract's slot,
        and a view without the contract refused. 256 MiB: 4 slabs of 64 MiB (a slab holds
        the largest block), one for each size."""
        from kvtier.daemon import Daemon
        with Daemon(slot_bytes=64 << 20, hbm=None, host="256MiB", nvme="256MiB", slot_classes="per-contract") as d:
            with kvtier.Client(d.socket) as c:
                self.assertEqual(c.slot_bytes, 64 << 20)  # the largest block
                small = kvtier.Contract(model_id="py/pc-small", num_layers=14, num_kv_heads=1, head_dim=16,
                                        block_tokens=16)
                large = kvtier.Contract(model_id="py/pc-large", num_layers=40, num_kv_heads=8, head_dim=128,
                                        block_tokens=16)
                cs, cl = c.register_contract(small), c.register_contract(large)
                self.assertEqual(c.contract_slot(cs), (4096, 4032 / 4096))
                self.assertEqual(c.contract_slot(cl), (large.block_bytes(), 1.0))  # 720 KiB: whole pages
                self.assertEqual(c.contract_hbm_slot(cs), 0)  # no HBM tier
                ls, ll = c.alloc(cs, 3), c.alloc(cl, 2)
                views = []
                for cid, lease, size, fill in ((cs, ls, 4096, 7), (cl, ll, large.block_bytes(), 9)):
                    for i, s in enumerate(lease.slots):
                        v = c.host_slot(s, cid)
                        self.assertEqual(len(v), size)
                        v[:] = bytes([fill + i]) * size
                        views.append((c.host_slot_address(s, cid), size))
                        with self.assertRaises(kvtier.KvtierError):
                            c.host_slot(s)  # the size needs the contract
                views.sort()
                for (a, n), (b, _) in zip(views, views[1:]):
                    self.assertLessEqual(a + n, b)  # staging slots never overlap
                keys_s = [kvtier.Key(0x51, i + 1) for i in range(3)]
                keys_l = [kvtier.Key(0x52, i + 1) for i in range(2)]
                self.assertEqual(c.commit(cs, ls, [(s, k, None) for s, k in zip(ls.slots, keys_s)]), 3)
                self.assertEqual(c.commit(cl, ll, [(s, k, None) for s, k in zip(ll.slots, keys_l)]), 2)
                c.release(ls)
                c.release(ll)
                for cid, keys, size, fill in ((cs, keys_s, 4032, 7), (cl, keys_l, large.block_bytes(), 9)):
                    lease = c.acquire(cid, keys)
                    self.assertEqual(len(lease.slots), len(keys))
                    for i, s in enumerate(lease.slots):
                        self.assertEqual(bytes(c.host_slot(s, cid)[:size]), bytes([fill + i]) * size)
                    c.release(lease)

    def test_reconnect_keeps_contracts_and_arena(self):
        with kvtier.Client(self.sock) as c:
            cid = c.register_contract(self.contract("py/reconnect"))
            old = c.host_slot(c.host_arena()[1] // c.slot_bytes - 1)  # a staging slot: writable
            c.reconnect()
            self.assertEqual(c.block_tokens(cid), 16)
            self.assertEqual(c.lookup_tokens(cid, list(range(40))), 0)  # registered again
            self.assertEqual(c.store(cid, list(range(33)), [bytes([9]) * 576] * 2), 2)
            cached, lease = c.load(cid, list(range(33)))
            self.assertEqual(cached, 32)
            self.assertEqual(bytes(c.host_slot(lease.slots[1])[:576]), bytes([9]) * 576)
            old[:1] = b"x"  # a view of the old mapping is still valid memory
            c.release(lease)
            self.assertEqual(c.evict_contract(cid), (2, 0))

    def test_auto_reconnect_after_a_daemon_restart(self):
        # A daemon of its own, restarted under the client: with auto_reconnect the call
        # after the failed one attaches again, the contract is registered again, and the
        # package maps the new daemon's arena.
        d = tempfile.mkdtemp(prefix="kvtier-py-re-", dir=self.tmp.name)
        sock = os.path.join(d, "kvtierd.sock")
        cfg = os.path.join(d, "kvtier.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nsocket = "{sock}"\nmetrics_port = 0\n[tiers]\nslot_bytes = "4KiB"\n'
                    f'[tiers.host]\ncapacity = "256KiB"\n[tiers.nvme]\ncapacity = "0"\n')

        def start():
            return kvtier.daemon.start_kvtierd(cfg, sock)

        proc = start()
        try:
            with kvtier.Client(sock, auto_reconnect=True, timeout_ms=3000) as c:
                cid = c.register_contract(self.contract("py/auto"))
                self.assertEqual(c.store(cid, list(range(17)), [bytes([3]) * 576]), 1)
                proc.send_signal(signal.SIGTERM)
                self.assertEqual(proc.wait(timeout=20), 0)
                proc = start()
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.ping()
                self.assertEqual(e.exception.status, "DISCONNECTED")
                self.assertEqual(c.lookup_tokens(cid, list(range(40))), 0)  # reconnected, registered again
                self.assertEqual(c.store(cid, list(range(17)), [bytes([4]) * 576]), 1)
                cached, lease = c.load(cid, list(range(17)))
                self.assertEqual(cached, 16)
                self.assertEqual(bytes(c.host_slot(lease.slots[0])[:576]), bytes([4]) * 576)  # the new arena
                c.release(lease)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)

    def test_a_daemon_with_tenants_sends_no_arena(self):
        # With [[tenants]] the package maps no arena (the daemon sends no fd for it): an
        # acquired slot is a copy in this client's staging area, and an arena slot id is
        # refused rather than read.
        d = tempfile.mkdtemp(prefix="kvtier-py-tn-", dir=self.tmp.name)
        sock = os.path.join(d, "kvtierd.sock")
        cfg = os.path.join(d, "kvtier.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nsocket = "{sock}"\nmetrics_port = 0\n[tiers]\nslot_bytes = "4KiB"\n'
                    f'[tiers.host]\ncapacity = "256KiB"\n[tiers.nvme]\ncapacity = "0"\n'
                    f'[[tenants]]\nname = "t"\nuids = [{os.getuid()}]\n')
        proc = kvtier.daemon.start_kvtierd(cfg, sock)
        try:
            with kvtier.Client(sock, timeout_ms=3000) as c:
                cid = c.register_contract(self.contract("py/tenant"))
                self.assertEqual(c.store(cid, list(range(17)), [bytes([7]) * 576]), 1)
                cached, lease = c.load(cid, list(range(17)))
                self.assertEqual(cached, 16)
                arena_slots = 256 * 1024 // c.slot_bytes
                self.assertGreaterEqual(lease.slots[0].slot, arena_slots)  # a staging slot: the copy
                self.assertEqual(bytes(c.host_slot(lease.slots[0])[:576]), bytes([7]) * 576)
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.host_slot(0)
                self.assertEqual(e.exception.status, "INVALID")
                c.release(lease)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)

    def test_a_tenants_part_of_the_host_tier_is_read_in_place(self):
        # With a host_share the tenant owns a part of the host tier (tiers.host.tenant_parts):
        # the package maps it, an acquired block there is its arena slot, read in place;
        # the rest of the arena (the common pool) stays unmapped.
        d = tempfile.mkdtemp(prefix="kvtier-py-tp-", dir=self.tmp.name)
        sock = os.path.join(d, "kvtierd.sock")
        cfg = os.path.join(d, "kvtier.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nsocket = "{sock}"\nmetrics_port = 0\n[tiers]\nslot_bytes = "4KiB"\n'
                    f'[tiers.host]\ncapacity = "256KiB"\n[tiers.nvme]\ncapacity = "0"\n'
                    f'[[tenants]]\nname = "t"\nuids = [{os.getuid()}]\nhost_share = 0.5\n')
        proc = kvtier.daemon.start_kvtierd(cfg, sock)
        try:
            with kvtier.Client(sock, timeout_ms=3000) as c:
                cid = c.register_contract(self.contract("py/tenant-part"))
                self.assertEqual(c.store(cid, list(range(17)), [bytes([9]) * 576]), 1)
                cached, lease = c.load(cid, list(range(17)))
                self.assertEqual(cached, 16)
                part_slots = 256 * 1024 // c.slot_bytes // 2  # the tenant's part: slots 0..31
                self.assertLess(lease.slots[0].slot, part_slots)  # an arena slot: no copy
                self.assertEqual(bytes(c.host_slot(lease.slots[0])[:576]), bytes([9]) * 576)
                with self.assertRaises(kvtier.KvtierError) as e:
                    c.host_slot(part_slots)  # the common pool: not mapped
                self.assertEqual(e.exception.status, "INVALID")
                c.release(lease)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)

    def test_library_exports_only_its_c_abi(self):
        import shutil
        if not shutil.which("nm"):
            self.skipTest("nm (binutils) is not installed")
        out = subprocess.run(["nm", "-D", "--defined-only", kvtier.library_path()], capture_output=True, text=True,
                             check=True).stdout
        names = [line.split()[-1] for line in out.splitlines() if line.strip()]
        self.assertIn("kvtier_connect", names)
        self.assertEqual([n for n in names if not n.startswith("kvtier_")], [])

    def test_abi_version(self):
        lib = kvtier._load()
        self.assertEqual(lib.kvtier_abi_version(), kvtier._ABI_VERSION)

    def test_fork_child_is_refused_parent_unaffected(self):
        with kvtier.Client(self.sock) as c:
            c.ping()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:
                os.close(r)
                msg = b"no error"
                try:
                    c.ping()
                except kvtier.KvtierError as e:
                    msg = str(e).encode()
                try:  # the C library refuses too, for a caller that bypasses the package
                    rc = kvtier._load().kvtier_ping(c._h)
                    msg += b" | C:" + str(rc).encode() + b" " + kvtier._load().kvtier_last_error()
                except Exception as e:  # noqa: BLE001
                    msg += str(e).encode()
                os.write(w, msg)
                os._exit(0)
            os.close(w)
            out = b""
            while True:
                b = os.read(r, 4096)
                if not b:
                    break
                out += b
            os.close(r)
            os.waitpid(pid, 0)
            self.assertIn(b"used after fork: connect again in the child", out)
            self.assertIn(b"C:6 kvtier client used after fork", out)
            for _ in range(20):
                c.ping()  # the parent is unaffected


if __name__ == "__main__":
    unittest.main(verbosity=2)
