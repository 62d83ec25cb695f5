"""kvtier: Python client for kvtierd, over libkvtier's C ABI with ctypes.

Loads in any Python 3 (no compiled extension). The shared library is found through
$KVTIER_LIB (a path to libkvtier.so), then build/lib/libkvtier.so next to this source
tree, then the library folder it was installed with, then the system's library path
(kvtier/_locate.py). kvtier.__version__ is the package's version.

    import kvtier
    c = kvtier.Client("./kvtier-data/kvtierd.sock", name="my-engine")
    contract = kvtier.Contract(model_id="meta-llama/Llama-3.1-8B", num_layers=32,
                               num_kv_heads=8, head_dim=128, block_tokens=16)
    cid = c.register_contract(contract)
    keys = kvtier.key_chain(cid, token_ids, 16)
    hit = c.lookup(cid, keys)                  # LookupResult(hit_blocks, tiers, est_seconds_to_hbm)
    lease = c.acquire(cid, keys[:hit.hit_blocks], tier="hbm")  # Lease(id, slots)
    ...                                        # slot ids are the decode kernel's block table
    c.release(lease)

For torch: HBM slot s of the arena starts at c.hbm_device_ptr() + s * c.hbm_granule
(pass it to kernels via data_ptr()-style integers); host slot s is c.host_slot(s), a
memoryview, or c.host_slot_address(s) as an integer address. The host tier is read-only
to clients: the view of an acquired (arena) slot is read-only; the slots of a host alloc
lease are this client's own staging slots, writable, copied into the arena at commit.
Errors raise kvtier.KvtierError carrying the status name and the library's message.

Lifetimes: a host_slot() view keeps its Client and the arena mapping alive (the package
maps the arena itself), so a view used after close() or after the last other reference
to the Client is gone still reads and writes valid memory, never an unmapped page; the
Client's connection (and its leases) end when close() is called or when the Client and
all its views are collected. An integer from host_slot_address() is valid only while the
Client or one of its views is alive. A Client made before os.fork() belongs to the parent:
in the child every call raises "used after fork: connect again in the child".
"""

from __future__ import annotations

import collections.abc
import ctypes
import numbers
import mmap
import os
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

# ---- Version and library lookup (kvtier/_locate.py) --------------------------------------
from . import _locate

__version__ = _locate.package_version()

__all__ = [
    "KvtierError", "KvtierConflict", "Contract", "Key", "Slot", "LookupResult", "CommitResult", "TierNames", "Lease", "TierStats", "Client", "AsyncAcquire",
    "key_chain", "key_chain_array", "KeyArray", "contract_id", "nvfp4_encode", "nvfp4_decode", "library_path", "library_version", "TIER_HBM", "TIER_HOST", "TIER_NVME", "TIER_NONE",
]

TIER_HBM, TIER_HOST, TIER_NVME, TIER_REMOTE, TIER_NONE = 0, 1, 2, 3, 255
_TIER_NAMES = {TIER_HBM: "hbm", TIER_HOST: "host", TIER_NVME: "nvme", TIER_REMOTE: "remote", TIER_NONE: "none"}
_TIER_BY_CODE = [_TIER_NAMES.get(i, "none") for i in range(256)]
_TIER_BY_NAME = {v: k for k, v in _TIER_NAMES.items()}
_STATUS = ["OK", "NOT_FOUND", "REJECTED", "RETRY", "IO_ERROR", "CORRUPT", "INVALID", "UNSUPPORTED",
           "DISCONNECTED", "TIMEOUT", "CONFLICT"]
_CONFLICT = 10


class KvtierError(RuntimeError):
    """A libkvtier call failed. `status` is the C status name ("NOT_FOUND", ...).
    `committed` is set by Client.commit: how many items went through before the failure
    (they are visible and stay pinned until the lease is released); None elsewhere."""

    def __init__(self, code: int, message: str, committed: Optional[int] = None):
        self.code = code
        self.status = _STATUS[code] if 0 <= code < len(_STATUS) else str(code)
        self.committed = committed
        super().__init__(f"{self.status}: {message}")


class KvtierConflict(KvtierError):
    """A commit (Client.commit, commit_chain, store) went through, but some keys were
    already cached with other bytes (tiers.on_conflict keep-first or drop-disputed, or
    replace of a pinned block) or disputed (drop-disputed): those keys do not hold the
    caller's bytes, and an acquire of them serves the other bytes or nothing. `committed`
    counts the keys that do hold them; `conflicts` the others (None where the call does not
    say: store); `result` is the CommitResult of Client.commit (None elsewhere). Never
    treat a key of `conflicts` as holding the caller's bytes."""

    def __init__(self, message: str, committed: int, conflicts: Optional[int] = None,
                 result: Optional["CommitResult"] = None):
        super().__init__(_CONFLICT, message, committed=committed)
        self.conflicts = conflicts
        self.result = result


# ---- C structs (client/include/kvtier/kvtier.h) -------------------------------------------
# Each mirrors a public record; _load() checks every one, field by field, against the
# library's own layout table (kvtier_abi_layout), so a mismatch is an error at load, not
# wrong numbers later.

class _Key(ctypes.Structure):
    _fields_ = [("hi", ctypes.c_uint64), ("lo", ctypes.c_uint64)]


class _Slot(ctypes.Structure):
    _fields_ = [("tier", ctypes.c_uint8), ("from_tier", ctypes.c_uint8), ("reserved", ctypes.c_uint8 * 2),
                ("slot", ctypes.c_uint32)]


class _ConnectOptions(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("has_gpu", ctypes.c_int), ("timeout_ms", ctypes.c_uint32),
                ("spin_us", ctypes.c_uint32)]


class _ContractDesc(ctypes.Structure):
    _fields_ = [("model_id", ctypes.c_char_p), ("model_revision", ctypes.c_char_p),
                ("tokenizer_revision", ctypes.c_char_p), ("num_layers", ctypes.c_uint32),
                ("num_kv_heads", ctypes.c_uint32), ("head_dim", ctypes.c_uint32),
                ("block_tokens", ctypes.c_uint32), ("tp_rank", ctypes.c_uint32), ("tp_size", ctypes.c_uint32),
                ("kv_format", ctypes.c_uint8), ("scale_rule", ctypes.c_uint8),
                ("v_scale_swizzle", ctypes.c_uint8), ("reserved", ctypes.c_uint8),
                ("k_scales", ctypes.POINTER(ctypes.c_float)), ("v_scales", ctypes.POINTER(ctypes.c_float))]


class _LookupResult(ctypes.Structure):
    _fields_ = [("hit_blocks", ctypes.c_size_t), ("est_seconds_to_hbm", ctypes.c_double)]


class _CommitItem(ctypes.Structure):
    _fields_ = [("slot", _Slot), ("key", _Key), ("parent", _Key)]


class _CommitResult(ctypes.Structure):
    _fields_ = [("committed", ctypes.c_size_t), ("stored", ctypes.c_size_t), ("same_bytes", ctypes.c_size_t),
                ("different_bytes", ctypes.c_size_t), ("unchecked", ctypes.c_size_t),
                ("replaced", ctypes.c_size_t), ("disputed", ctypes.c_size_t)]


class _TierStats(ctypes.Structure):
    # kvtier_tier_stats (client/include/kvtier/tier_stats.h; its field list, KVTIER_TIER_STATS_FIELDS,
    # is formats/tier_stats_fields.h), in its order.
    _fields_ = [("tier", ctypes.c_uint8), ("present", ctypes.c_uint8), ("reserved", ctypes.c_uint8 * 2),
                ("slab_moves", ctypes.c_uint32)] + [
        (n, ctypes.c_uint64) for n in (
            "capacity_bytes", "used_bytes", "slots_total", "slots_used", "blocks", "pinned", "hits", "misses",
            "promotions_in", "demotions_out", "bytes_read", "bytes_written", "checksum_failures",
            "evictions_demoted", "evictions_dropped", "admission_rejects")
    ] + [("read_gbps", ctypes.c_double), ("write_gbps", ctypes.c_double)] + [
        ("errors", ctypes.c_uint64), ("write_errors", ctypes.c_uint64)]


class _AbiField(ctypes.Structure):
    _fields_ = [("record", ctypes.c_char_p), ("field", ctypes.c_char_p), ("offset", ctypes.c_uint32),
                ("size", ctypes.c_uint32)]


# C record name -> the ctypes struct that mirrors it.
_MIRRORS = {
    "kvtier_key": _Key,
    "kvtier_slot": _Slot,
    "kvtier_connect_options": _ConnectOptions,
    "kvtier_contract_desc": _ContractDesc,
    "kvtier_lookup_result": _LookupResult,
    "kvtier_commit_item": _CommitItem,
    "kvtier_commit_result": _CommitResult,
    "kvtier_tier_stats": _TierStats,
}


def _layout_table(lib) -> dict:
    """{record: {"": sizeof, field: (offset, size)}} from the library's kvtier_abi_layout."""
    f = lib.kvtier_abi_layout
    f.restype = ctypes.POINTER(_AbiField)
    f.argtypes = [ctypes.POINTER(ctypes.c_size_t)]
    n = ctypes.c_size_t()
    rows = f(ctypes.byref(n))
    table = {}
    for i in range(n.value):
        r = rows[i]
        rec = table.setdefault(r.record.decode(), {})
        name = r.field.decode()
        rec[name] = r.size if name == "" else (r.offset, r.size)
    return table


def _check_layouts(table: dict, mirrors: dict = None):
    """Raises ImportError naming the first ctypes struct that differs from the C record:
    a missing record, a field missing on either side, an offset, a size or the sizeof."""
    for rec, cls in (mirrors or _MIRRORS).items():
        c = table.get(rec)
        if c is None:
            raise ImportError(f"libkvtier has no record {rec} (an older or newer library?)")
        py = {name: (getattr(cls, name).offset, getattr(cls, name).size) for name, _ in cls._fields_}
        cf = {k: v for k, v in c.items() if k != ""}
        for name in sorted(set(py) | set(cf)):
            if name not in cf:
                raise ImportError(f"{rec}.{name}: in the Python binding, not in libkvtier")
            if name not in py:
                raise ImportError(f"{rec}.{name}: in libkvtier, not in the Python binding")
            if py[name] != cf[name]:
                raise ImportError(f"{rec}.{name}: Python has offset/size {py[name]}, libkvtier {cf[name]}")
        if ctypes.sizeof(cls) != c.get(""):
            raise ImportError(f"{rec}: Python sizeof {ctypes.sizeof(cls)}, libkvtier {c.get('')}")


# ---- Loading ------------------------------------------------------------------------------

def _candidates() -> List[str]:
    return _locate.library_candidates()


_lib = None
_lib_path = None


def library_path() -> str:
    """Path of the libkvtier.so in use (loads it)."""
    _load()
    return _lib_path


def library_version() -> str:
    """Version of the libkvtier.so in use (loads it); __version__ is the package's."""
    return _load().kvtier_version().decode()


def _load_first(candidates, what: str):
    """(library, path) of the first candidate that loads; else OSError naming `what`
    and why each candidate failed. (kvtier.kernels loads libkvtier_kernels.so with it.)"""
    errors = []
    for p in candidates:
        try:
            return ctypes.CDLL(p), p
        except OSError as e:
            errors.append(f"{p}: {e}")
    raise OSError(f"{what} not found: " + "; ".join(errors))


# The C ABI these ctypes declarations follow (kvtier.h's KVTIER_ABI_VERSION).
_ABI_VERSION = 3


def _check_abi_version(lib, path: str):
    """Refuses a library of another ABI version than these declarations."""
    if not hasattr(lib, "kvtier_abi_version"):
        raise OSError(f"{path} has no kvtier_abi_version: it predates this Python package")
    lib.kvtier_abi_version.restype, lib.kvtier_abi_version.argtypes = ctypes.c_uint32, []
    v = lib.kvtier_abi_version()
    if v != _ABI_VERSION:
        raise OSError(f"{path} has ABI version {v}; this Python package speaks {_ABI_VERSION}")


def _load():
    global _lib, _lib_path
    if _lib is None:
        lib, path = _load_first(_candidates(), "libkvtier.so (set KVTIER_LIB)")
        _check_layouts(_layout_table(lib))
        _check_abi_version(lib, path)
        _declare(lib)
        _lib, _lib_path = lib, path
    return _lib


# Forks seen by this process (os.register_at_fork): a Client remembers the count it was
# made under, so a call from a forked child fails at once instead of sharing the
# parent's ring (libkvtier checks the same in C).
_fork_generation = 0


def _after_fork_in_child():
    global _fork_generation
    _fork_generation += 1


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _declare(lib):
    S = ctypes.c_int
    P = ctypes.c_void_p
    u64, u32, sz = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_size_t
    sig = {
        "kvtier_status_name": (ctypes.c_char_p, [S]),
        "kvtier_last_error": (ctypes.c_char_p, []),
        "kvtier_protocol_version": (u32, []),
        "kvtier_version": (ctypes.c_char_p, []),
        "kvtier_connect": (S, [ctypes.c_char_p, ctypes.POINTER(_ConnectOptions), ctypes.POINTER(P)]),
        "kvtier_close": (None, [P]),
        "kvtier_reconnect": (S, [P]),
        "kvtier_set_auto_reconnect": (S, [P, S]),
        "kvtier_set_transport": (S, [P, S]),
        "kvtier_client_id": (u64, [P]),
        "kvtier_slot_bytes": (u64, [P]),
        "kvtier_host_arena": (P, [P, ctypes.POINTER(u64)]),
        "kvtier_host_arena_fd": (S, [P]),
        "kvtier_host_staging_fd": (S, [P]),
        "kvtier_host_parts": (u32, [P, u32, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(u64), ctypes.POINTER(u64)]),
        "kvtier_host_granule": (u64, [P]),
        "kvtier_hbm_granule": (u64, [P]),
        "kvtier_hbm_arena_bytes": (u64, [P]),
        "kvtier_host_slot_classes": (u32, [P, ctypes.POINTER(u64), u32]),
        "kvtier_contract_slot": (S, [P, u64, ctypes.POINTER(u64), ctypes.POINTER(ctypes.c_double)]),
        "kvtier_contract_hbm_slot": (S, [P, u64, ctypes.POINTER(u64)]),
        "kvtier_attach_generation": (u64, [P]),
        "kvtier_hbm_ipc_handle": (S, [P, ctypes.POINTER(ctypes.c_uint8)]),
        "kvtier_hbm_open": (S, [P, ctypes.POINTER(P)]),
        "kvtier_contract_id": (S, [ctypes.POINTER(_ContractDesc), ctypes.POINTER(u64)]),
        "kvtier_contract_block_bytes": (S, [ctypes.POINTER(_ContractDesc), ctypes.POINTER(u64)]),
        "kvtier_register_contract": (S, [P, ctypes.POINTER(_ContractDesc), ctypes.POINTER(u64)]),
        "kvtier_key_chain": (S, [u64, ctypes.POINTER(u32), sz, u32, ctypes.POINTER(_Key), sz, ctypes.POINTER(sz)]),
        "kvtier_lookup": (S, [P, u64, ctypes.POINTER(_Key), sz, ctypes.POINTER(_LookupResult),
                              ctypes.POINTER(ctypes.c_uint8)]),
        "kvtier_acquire": (S, [P, u64, ctypes.POINTER(_Key), sz, S, ctypes.POINTER(u64), ctypes.POINTER(_Slot),
                               ctypes.POINTER(sz)]),
        "kvtier_acquire_async": (S, [P, u64, ctypes.POINTER(_Key), sz, S, u32, ctypes.POINTER(P)]),
        "kvtier_acquire_async_fd": (S, [P]),
        "kvtier_acquire_async_ready": (S, [P, ctypes.POINTER(_Slot), sz, ctypes.POINTER(sz)]),
        "kvtier_acquire_async_wait": (S, [P, S]),
        "kvtier_acquire_async_result": (S, [P, ctypes.POINTER(u64), ctypes.POINTER(_Slot), ctypes.POINTER(sz)]),
        "kvtier_acquire_async_free": (None, [P]),
        "kvtier_alloc": (S, [P, u64, sz, S, ctypes.POINTER(u64), ctypes.POINTER(_Slot)]),
        "kvtier_alloc_wait": (S, [P, u64, sz, S, u32, ctypes.POINTER(u64), ctypes.POINTER(_Slot)]),
        "kvtier_commit": (S, [P, u64, u64, ctypes.POINTER(_CommitItem), sz, ctypes.POINTER(sz)]),
        "kvtier_commit_report": (S, [P, u64, u64, ctypes.POINTER(_CommitItem), sz, ctypes.POINTER(_CommitResult)]),
        "kvtier_release": (S, [P, u64]),
        "kvtier_prefetch": (S, [P, u64, ctypes.POINTER(_Key), sz, S]),
        "kvtier_stats": (S, [P, ctypes.POINTER(_TierStats), sz, ctypes.POINTER(sz)]),
        "kvtier_ping": (S, [P]),
        "kvtier_contract_block_tokens": (S, [P, u64, ctypes.POINTER(u32)]),
        "kvtier_lookup_tokens": (S, [P, u64, ctypes.POINTER(u32), sz, ctypes.POINTER(sz)]),
        "kvtier_commit_chain": (S, [P, u64, u64, ctypes.POINTER(_Slot), ctypes.POINTER(_Key), sz, _Key,
                                    ctypes.POINTER(sz)]),
        "kvtier_store_tokens": (S, [P, u64, ctypes.POINTER(u32), sz, ctypes.POINTER(P), ctypes.POINTER(sz)]),
        "kvtier_load_tokens": (S, [P, u64, ctypes.POINTER(u32), sz, S, ctypes.POINTER(u64), ctypes.POINTER(_Slot),
                                   sz, ctypes.POINTER(sz)]),
        "kvtier_flush_to": (S, [P, S]),
        "kvtier_evict_contract": (S, [P, u64, ctypes.POINTER(u64), ctypes.POINTER(u64)]),
        "kvtier_nvfp4_encode": (S, [P, sz, ctypes.c_float, u32, P, P]),
        "kvtier_nvfp4_decode": (S, [P, P, sz, ctypes.c_float, P]),
    }
    for name, (res, args) in sig.items():
        f = getattr(lib, name)
        f.restype = res
        f.argtypes = args


def _check(code: int):
    if code != 0:
        raise KvtierError(code, _load().kvtier_last_error().decode("utf-8", "replace"))


# ---- Public types -----------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    """A 128-bit block key ({hi, lo} words)."""
    hi: int
    lo: int

    def hex(self) -> str:
        return f"{self.hi:016x}{self.lo:016x}"


@dataclass(frozen=True)
class Slot:
    tier: int
    slot: int


@dataclass(frozen=True)
class CommitResult:
    """What a commit did with its items (Client.commit_report): committed = stored +
    same_bytes + different_bytes + unchecked + disputed. different_bytes: the keys were
    already cached with other bytes, and the daemon's tiers.on_conflict decided
    (keep-first: these bytes were dropped; replace: `replaced` of them took these bytes).
    disputed: drop-disputed had disputed the key and its block is still pinned: nothing
    stored, nothing served; commit again once it is gone. `conflicts` is what makes
    Client.commit raise KvtierConflict: the keys that do not hold these bytes."""
    committed: int
    stored: int
    same_bytes: int
    different_bytes: int
    unchecked: int
    replaced: int = 0
    disputed: int = 0

    @property
    def conflicts(self) -> int:
        return self.different_bytes - self.replaced + self.disputed


@dataclass
class LookupResult:
    hit_blocks: int
    tiers: "TierNames"          # "hbm" | "host" | "nvme" | "remote" | "none", one per key
    est_seconds_to_hbm: float


class TierNames(collections.abc.Sequence):
    """The tier of each looked-up key, by name ("hbm", "host", "nvme", "remote", "none"):
    a read-only sequence over the reply's bytes. Names are made when read, so the lookup of
    a long prompt (2,048 keys at 32K tokens) costs no per-key Python work until someone
    reads them (a list of names cost ~70 us there, on the restore's critical path). Slices
    are TierNames too; it compares equal to a list of the same names."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes):
        self._raw = bytes(raw)

    def __len__(self):
        return len(self._raw)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return TierNames(self._raw[i])
        return _TIER_BY_CODE[self._raw[i]]

    def __iter__(self):
        return map(_TIER_BY_CODE.__getitem__, self._raw)

    def codes(self) -> bytes:
        """The raw tier codes (TIER_HBM, TIER_HOST, ...), one byte per key."""
        return self._raw

    def __eq__(self, other):
        if isinstance(other, TierNames):
            return self._raw == other._raw
        if isinstance(other, (list, tuple)):
            return len(other) == len(self._raw) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __repr__(self):
        return repr(list(self))


@dataclass
class Lease:
    id: int                     # 0: nothing was acquired
    slots: List[Slot] = field(default_factory=list)
    from_codes: bytes = b""     # acquire: where each block was (tier codes); see from_tiers

    def slot_ids(self):
        """Slot numbers as a numpy int32 array (the decode kernels' block table row)."""
        import numpy as np
        return np.fromiter((s.slot for s in self.slots), dtype=np.int32, count=len(self.slots))

    def tiers(self):
        """Tier of each slot as a numpy uint8 array (TIER_HBM, TIER_HOST)."""
        import numpy as np
        return np.fromiter((s.tier for s in self.slots), dtype=np.uint8, count=len(self.slots))

    def _from_bytes(self) -> bytes:
        return self.from_codes or bytes([TIER_NONE]) * len(self.slots)

    def from_tiers(self):
        """Acquire: where each block was when the acquire began (TIER_HBM: already there,
        TIER_HOST, TIER_NVME), so that one acquire is a whole restore and still says where
        it came from; TIER_NONE for alloc slots. A numpy uint8 array (a list of ints
        without numpy)."""
        try:
            import numpy as np
        except ImportError:
            return list(self._from_bytes())
        return np.frombuffer(self._from_bytes(), dtype=np.uint8).copy()

    def from_tier_names(self) -> "TierNames":
        """from_tiers by name ("hbm", "host", "nvme", "none"), without numpy."""
        return TierNames(self._from_bytes())


class AsyncAcquire:
    """An acquire in flight (Client.acquire_async); several may be in flight on one Client.
    fileno() is an eventfd written once per ready step and once when it finished (for
    select/poll/asyncio: read 8 bytes from it to rearm, then ask); ready_blocks() is how many leading
    blocks are usable now (only grows) and ready_slots() their slots; wait(timeout) is True
    once finished; result() waits and returns the Lease acquire() would have (then the
    caller's to release). close() (or collection) waits for it and releases a lease that
    result() did not hand out. It keeps its Client alive."""

    def __init__(self, client, op: int, n: int):
        self._client = client
        self._lib = client._lib
        self._op = op
        self._n = n

    def _h(self):
        if not self._op:
            raise KvtierError(6, "the asynchronous acquire is closed")
        return self._op

    def fileno(self) -> int:
        return self._lib.kvtier_acquire_async_fd(self._h())

    def ready_blocks(self) -> int:
        ready = ctypes.c_size_t()
        _check(self._lib.kvtier_acquire_async_ready(self._h(), None, 0, ctypes.byref(ready)))
        return ready.value

    def ready_slots(self) -> List[Slot]:
        arr = (_Slot * max(self._n, 1))()
        ready = ctypes.c_size_t()
        _check(self._lib.kvtier_acquire_async_ready(self._h(), arr, self._n, ctypes.byref(ready)))
        return [Slot(arr[i].tier, arr[i].slot) for i in range(ready.value)]

    def wait(self, timeout: Optional[float] = None) -> bool:
        ms = -1 if timeout is None else min(max(0, int(timeout * 1000)), 2**31 - 1)
        code = self._lib.kvtier_acquire_async_wait(self._h(), ms)
        if code == 3:  # RETRY: still in flight
            return False
        _check(code)
        return True

    def result(self) -> Lease:
        arr = (_Slot * max(self._n, 1))()
        lease = ctypes.c_uint64()
        n = ctypes.c_size_t()
        _check(self._lib.kvtier_acquire_async_result(self._h(), ctypes.byref(lease), arr, ctypes.byref(n)))
        return _lease_from_array(lease.value, arr, n.value)

    def close(self):
        op, self._op = getattr(self, "_op", None), None
        if op:
            self._lib.kvtier_acquire_async_free(op)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        self.close()


def _lease_from_array(lease_id: int, arr, n: int) -> Lease:
    try:
        import numpy as np
    except ImportError:
        return Lease(lease_id, [Slot(arr[i].tier, arr[i].slot) for i in range(n)],
                     bytes(arr[i].from_tier for i in range(n)))
    rec = np.frombuffer(arr, dtype=np.dtype([("tier", "u1"), ("from_tier", "u1"), ("r", "u1", 2), ("slot", "<u4")]),
                        count=n)
    lease = _ArrayLease(lease_id)
    lease._rec = rec
    return lease


class _ArrayLease(Lease):
    """A Lease whose slots live in a numpy record array (see _lease_from_array)."""

    def __init__(self, lease_id: int):
        self.id = lease_id
        self._rec = None
        self._slots = None

    @property
    def slots(self):
        if self._slots is None:
            self._slots = [Slot(int(t), int(s)) for t, s in zip(self._rec["tier"], self._rec["slot"])]
        return self._slots

    @slots.setter
    def slots(self, v):
        self._slots = v

    def slot_ids(self):
        return self._rec["slot"].astype("int32")

    def tiers(self):
        return self._rec["tier"]

    def _from_bytes(self) -> bytes:
        return self._rec["from_tier"].tobytes()

    def from_tiers(self):
        return self._rec["from_tier"]

    def __repr__(self):
        return f"Lease(id={self.id}, slots={len(self._rec)})"

    def __eq__(self, other):
        return isinstance(other, Lease) and self.id == other.id and list(self.slots) == list(other.slots)


@dataclass
class TierStats:
    tier: str
    present: bool
    capacity_bytes: int
    used_bytes: int
    slots_total: int
    slots_used: int
    blocks: int
    pinned: int
    hits: int
    misses: int
    promotions_in: int
    demotions_out: int
    bytes_read: int
    bytes_written: int
    checksum_failures: int
    evictions_demoted: int
    evictions_dropped: int
    admission_rejects: int
    read_gbps: float
    write_gbps: float
    errors: int  # remote tier: answers lost to a down or slow node
    write_errors: int  # remote tier: writes dropped or failed
    slab_moves: int = 0  # slabs moved between slot classes


@dataclass
class Contract:
    """The scale contract (DESIGN.md section 3): what a block's bytes mean."""
    model_id: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_tokens: int
    model_revision: str = ""
    tokenizer_revision: str = ""
    tp_rank: int = 0
    tp_size: int = 1
    kv_format: str = "nvfp4"     # nvfp4 | fp8 | bf16
    scale_rule: str = "max6"     # max6 | 4over6
    v_scale_swizzle: bool = False
    k_scales: Optional[Sequence[float]] = None  # per layer; None = all 1.0
    v_scales: Optional[Sequence[float]] = None

    def _desc(self):
        fmts = {"nvfp4": 0, "fp8": 1, "bf16": 2}
        rules = {"max6": 0, "4over6": 1}
        if self.kv_format not in fmts:
            raise KvtierError(6, f"kv_format {self.kv_format!r} is not nvfp4, fp8 or bf16")
        if self.scale_rule not in rules:
            raise KvtierError(6, f"scale_rule {self.scale_rule!r} is not max6 or 4over6")
        keep = []  # keeps the encoded strings and arrays alive with the struct

        def s(v):
            b = v.encode("utf-8")
            keep.append(b)
            return b

        def scales(v):
            if v is None:
                return None
            if len(v) != self.num_layers:
                raise KvtierError(6, f"scales need {self.num_layers} entries, got {len(v)}")
            arr = (ctypes.c_float * len(v))(*v)
            keep.append(arr)
            return ctypes.cast(arr, ctypes.POINTER(ctypes.c_float))

        d = _ContractDesc(s(self.model_id), s(self.model_revision), s(self.tokenizer_revision),
                          self.num_layers, self.num_kv_heads, self.head_dim, self.block_tokens, self.tp_rank,
                          self.tp_size, fmts[self.kv_format], rules[self.scale_rule],
                          1 if self.v_scale_swizzle else 0, 0, scales(self.k_scales), scales(self.v_scales))
        return d, keep

    def id(self) -> int:
        return contract_id(self)

    def block_bytes(self) -> int:
        d, _keep = self._desc()
        out = ctypes.c_uint64()
        _check(_load().kvtier_contract_block_bytes(ctypes.byref(d), ctypes.byref(out)))
        return out.value


def contract_id(contract: Contract) -> int:
    d, _keep = contract._desc()
    out = ctypes.c_uint64()
    _check(_load().kvtier_contract_id(ctypes.byref(d), ctypes.byref(out)))
    return out.value


def key_chain(contract_id: int, tokens: Sequence[int], block_tokens: int) -> List[Key]:
    """Keys of every full block of `tokens` (the same code the daemon and C++ use)."""
    lib = _load()
    contract_id = _count("contract_id", contract_id, 0, 2**64 - 1)
    block_tokens = _count("block_tokens", block_tokens, 1, 2**32 - 1)
    n_tok = len(tokens)
    _check_token_range(tokens)
    arr = (ctypes.c_uint32 * n_tok)(*tokens)
    cap = n_tok // block_tokens if block_tokens > 0 else 0
    out = (_Key * max(cap, 1))()
    n = ctypes.c_size_t()
    _check(lib.kvtier_key_chain(contract_id, arr, n_tok, block_tokens, out, cap, ctypes.byref(n)))
    return [Key(out[i].hi, out[i].lo) for i in range(n.value)]


def nvfp4_encode(x_addr: int, n: int, kv_scale: float, rule: int, data_addr: int, scales_addr: int) -> None:
    """kvtier_nvfp4_encode (kvtier.h): n float32 values at address x_addr (n a multiple of
    16) -> n/2 packed E2M1 bytes at data_addr and n/16 E4M3 scales at scales_addr, the bytes
    of kvtierd's NVFP4 pages and of the CUDA quantize kernel. rule 0 = max6, 1 = 4over6.
    Raises KvtierError (INVALID) on a bad count, a non-finite value or a bad kv_scale; then
    nothing was written. Addresses are integers (``tensor.data_ptr()``, ctypes addresses)."""
    _check(_load().kvtier_nvfp4_encode(x_addr, n, kv_scale, rule, data_addr, scales_addr))


def nvfp4_decode(data_addr: int, scales_addr: int, n: int, kv_scale: float, out_addr: int) -> None:
    """kvtier_nvfp4_decode: the inverse of nvfp4_encode, n float32 values to out_addr
    (e2m1(code) * e4m3(scale) * kv_scale). Raises KvtierError: INVALID on bad arguments,
    CORRUPT on a NaN scale byte; then nothing was written."""
    _check(_load().kvtier_nvfp4_decode(data_addr, scales_addr, n, kv_scale, out_addr))


# The most keys or slots one request may name: the largest daemon.max_keys_per_request
# (config/config.h); a daemon's own limit may be lower, and its library answers INVALID.
MAX_REQUEST_KEYS = 1 << 20


def _count(name: str, v, lo: int, hi: int) -> int:
    """An integer argument checked before anything is allocated for it or it reaches a
    C integer (which would wrap it silently): INVALID unless lo <= v <= hi."""
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise KvtierError(6, f"{name} must be an integer, not {type(v).__name__}")
    v = int(v)
    if not lo <= v <= hi:
        raise KvtierError(6, f"{name} = {v} is not in [{lo}, {hi}]")
    return v


def _check_token_range(tokens):
    """Token ids are uint32 in the key chain: anything else is refused, never wrapped."""
    if len(tokens) and (min(tokens) < 0 or max(tokens) > 0xFFFFFFFF):
        bad = next(t for t in tokens if not 0 <= t <= 0xFFFFFFFF)
        raise KvtierError(6, f"token id {bad} is not in [0, 2**32)")


class KeyArray:
    """Block keys in one C array (what key_chain_array returns): lookup, acquire and
    prefetch pass it to the library without a per-key Python loop, which matters for
    long prompts (8,192 keys at 128K tokens). Slicing with step 1 gives a view."""

    def __init__(self, arr, n: int, off: int = 0):
        self._arr, self._n, self._off = arr, n, off

    def __len__(self):
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step != 1:
                return [self[j] for j in range(start, stop, step)]
            return KeyArray(self._arr, max(0, stop - start), self._off + start)
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        k = self._arr[self._off + i]
        return Key(k.hi, k.lo)

    def __iter__(self):
        return (self[i] for i in range(self._n))

    def _ptr(self):
        return ctypes.cast(ctypes.byref(self._arr, self._off * ctypes.sizeof(_Key)), ctypes.POINTER(_Key))


def key_chain_array(contract_id: int, tokens, block_tokens: int) -> KeyArray:
    """key_chain for long prompts: `tokens` may be a numpy array (any integer dtype,
    converted to uint32) or a sequence; returns a KeyArray."""
    lib = _load()
    contract_id = _count("contract_id", contract_id, 0, 2**64 - 1)
    block_tokens = _count("block_tokens", block_tokens, 1, 2**32 - 1)
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        src = np.asarray(tokens)
        if src.size and src.dtype != np.uint32:
            if src.dtype.kind not in "iu":
                raise KvtierError(6, f"token ids must be integers, not {src.dtype}")
            if int(src.min()) < 0 or int(src.max()) > 0xFFFFFFFF:
                raise KvtierError(6, "token ids must be in [0, 2**32)")
        a = np.ascontiguousarray(src, dtype=np.uint32)
        ptr, n_tok = a.ctypes.data_as(ctypes.POINTER(ctypes.c_uint32)), a.size
    else:
        _check_token_range(tokens)
        a = (ctypes.c_uint32 * len(tokens))(*tokens)
        ptr, n_tok = a, len(tokens)
    cap = n_tok // block_tokens if block_tokens > 0 else 0
    out = (_Key * max(cap, 1))()
    n = ctypes.c_size_t()
    _check(lib.kvtier_key_chain(contract_id, ptr, n_tok, block_tokens, out, cap, ctypes.byref(n)))
    return KeyArray(out, n.value)


def _keys_array(keys: Sequence[Key]):
    if isinstance(keys, KeyArray):
        return keys._ptr()
    arr = (_Key * len(keys))()
    for i, k in enumerate(keys):
        arr[i].hi, arr[i].lo = k.hi, k.lo
    return arr


def _tier(t) -> int:
    if isinstance(t, str):
        if t not in _TIER_BY_NAME:
            raise KvtierError(6, f"tier {t!r} is not hbm, host or nvme")
        return _TIER_BY_NAME[t]
    return int(t)


class _Window:
    """The package's mapping of the host window: the arena (read-only: the daemon seals it
    against writes) and, right after it, the staging area (writable), in one reservation.
    Unmapped when the last reference (the Client or a view) is gone."""

    _libc = None

    def __init__(self, arena_fd: int, arena_bytes: int, staging_fd: int, staging_bytes: int, parts=()):
        if _Window._libc is None:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.mmap.restype = ctypes.c_void_p
            libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                  ctypes.c_long]
            libc.munmap.restype = ctypes.c_int
            libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
            _Window._libc = libc
        # Held by the instance too: at interpreter exit the module's globals (the class
        # among them) may be gone before the last window's __del__ runs.
        libc = self._libc = _Window._libc
        self.base, self.bytes, self.arena_bytes = 0, arena_bytes + staging_bytes, arena_bytes
        failed = ctypes.c_void_p(-1).value
        fixed = 0x10  # MAP_FIXED
        base = libc.mmap(None, self.bytes, 0, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)  # PROT_NONE: a reservation
        if base in (None, failed):
            raise KvtierError(4, "mmap of the host window: " + os.strerror(ctypes.get_errno()))
        self.base = base
        # arena_fd < 0 (a daemon with tenants sends none): the arena's part stays unmapped
        # but for `parts`, (fd, offset, bytes) of its tenant's parts, read-only.
        if any(libc.mmap(base + off, n, mmap.PROT_READ, mmap.MAP_SHARED | fixed, pfd, 0) in (None, failed)
               for pfd, off, n in parts) or \
                (arena_fd >= 0 and libc.mmap(base, arena_bytes, mmap.PROT_READ, mmap.MAP_SHARED | fixed, arena_fd, 0)
                 in (None, failed)) or \
                libc.mmap(base + arena_bytes, staging_bytes, mmap.PROT_READ | mmap.PROT_WRITE,
                          mmap.MAP_SHARED | fixed, staging_fd, 0) in (None, failed):
            err = ctypes.get_errno()
            self.close()
            raise KvtierError(4, "mmap of the host arena and staging area: " + os.strerror(err))

    def close(self):
        libc = self.__dict__.get("_libc")
        if self.base and libc is not None:
            libc.munmap(self.base, self.bytes)
            self.base = 0

    def __del__(self):
        self.close()


class Client:
    """One attachment to kvtierd. Leases are released by the daemon when it closes."""

    def __init__(self, socket_path: str, name: str = "python", has_gpu: bool = False,
                 timeout_ms: int = 60000, transport: str = "ring", auto_reconnect: bool = False):
        lib = _load()
        opts = _ConnectOptions(name.encode("utf-8"), 1 if has_gpu else 0, timeout_ms, 0)
        h = ctypes.c_void_p()
        self._h = None
        _check(lib.kvtier_connect(socket_path.encode("utf-8"), ctypes.byref(opts), ctypes.byref(h)))
        self._h = h
        self._lib = lib
        self._fork_generation = _fork_generation
        self._block_bytes = {}  # contract id -> block bytes, of the contracts registered here
        self._map_arena()
        if transport != "ring":
            self.set_transport(transport)
        if auto_reconnect:
            _check(lib.kvtier_set_auto_reconnect(h, 1))

    def _map_arena(self):
        # The package's own mapping of the host window (the same memfds, MAP_SHARED, laid
        # out as libkvtier's: the arena read-only, this client's staging area writable
        # after it): views hold the _Window, so it outlives kvtier_close's munmap of the C
        # mapping.
        lib, h = self._lib, self._h
        self._attach_generation = lib.kvtier_attach_generation(h)
        self._slot_bytes = lib.kvtier_slot_bytes(h)
        self._mm, self._arena_base, self._arena_bytes = None, 0, 0
        self._arena_private = False
        self._parts = []
        self._granule = lib.kvtier_host_granule(h)
        self._classes = lib.kvtier_host_slot_classes(h, None, 0)
        n = ctypes.c_uint64()
        if lib.kvtier_host_arena(h, ctypes.byref(n)) and n.value:
            fd, sfd = lib.kvtier_host_arena_fd(h), lib.kvtier_host_staging_fd(h)
            if sfd >= 0:
                # No arena fd: the daemon has tenants, and the arena's part stays unmapped.
                staging_bytes = os.fstat(sfd).st_size
                parts = []
                pfd, off, nb = ctypes.c_int(), ctypes.c_uint64(), ctypes.c_uint64()
                for i in range(lib.kvtier_host_parts(h, 0, None, None, None)):
                    lib.kvtier_host_parts(h, i, ctypes.byref(pfd), ctypes.byref(off), ctypes.byref(nb))
                    parts.append((pfd.value, off.value, nb.value))
                self._mm = _Window(fd, n.value - staging_bytes, sfd, staging_bytes, parts)
                self._arena_base = self._mm.base
                self._arena_bytes = n.value
                self._arena_private = fd < 0
                self._parts = [(off, nb) for _, off, nb in parts]

    def reconnect(self):
        """Attaches again (after DISCONNECTED, TIMEOUT or a daemon restart) and registers
        the contracts registered here again. The old leases are gone; the host arena is
        mapped anew (views taken before stay valid memory, of the old arena)."""
        _check(self._lib.kvtier_reconnect(self._handle()))
        self._map_arena()

    def close(self):
        """Ends the connection (the daemon releases its leases). Views of host slots stay
        valid memory; calls on a closed client raise."""
        h, self._h = getattr(self, "_h", None), None
        if h:
            self._lib.kvtier_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _handle(self):
        if self._fork_generation != _fork_generation:
            raise KvtierError(6, "kvtier client used after fork: connect again in the child")
        if not self._h:
            raise KvtierError(8, "client is closed")
        return self._h

    def set_transport(self, transport: str):
        t = {"ring": 0, "socket": 1}.get(transport)
        if t is None:
            raise KvtierError(6, f"transport {transport!r} is not ring or socket")
        _check(self._lib.kvtier_set_transport(self._handle(), t))

    @property
    def client_id(self) -> int:
        return self._lib.kvtier_client_id(self._handle())

    @property
    def slot_bytes(self) -> int:
        self._current_arena()
        return self._slot_bytes

    def _current_arena(self):
        h = self._handle()
        if self._lib.kvtier_attach_generation(h) != self._attach_generation:  # reconnected
            self._map_arena()

    def host_arena(self) -> Tuple[int, int]:
        """(address, bytes) of this package's mapping of the host window (the arena,
        read-only, then this client's staging area, writable); (0, 0) without a host tier."""
        self._current_arena()
        return (self._arena_base, self._arena_bytes)

    @staticmethod
    def _slot_number(slot) -> int:
        """The number of a host slot (a Slot of the host tier, or its number)."""
        if isinstance(slot, Slot):
            if slot.tier != TIER_HOST:
                raise KvtierError(6, f"slot {slot.slot} is in {_TIER_NAMES.get(slot.tier, slot.tier)}, not host")
            return slot.slot
        return int(slot)

    def _slot_offset(self, slot, n: int) -> int:
        """Offset in the window of host slot `slot` (a Slot or its number) of n bytes,
        checked: a host slot, inside the window, in a part this client maps. The arena is
        mapped by the caller's _current_arena()."""
        s = self._slot_number(slot)
        if not self._mm or not 0 <= s < 2**32:
            raise KvtierError(6, f"host slot {s} is outside the host window")
        off = s * self._granule
        if self._arena_private and off < self._mm.arena_bytes and \
                not any(p <= off < p + m for p, m in self._parts):
            raise KvtierError(6, f"host slot {s} is in the arena, which this client does not map (the daemon has "
                                 f"tenants: acquired blocks are in its tenant's part or copies in slots "
                                 f"{self._mm.arena_bytes // self._granule} and up)")
        if off + n > self._arena_bytes:
            raise KvtierError(6, f"host slot {s} is outside the host window")
        return off

    def _host_slot_place(self, slot, contract=None):
        """(offset in the window, bytes, writable) of one host slot: slot s is at
        s * granule (kvtier_host_slot); its size is its contract's slot class (a staging
        slot: slot_bytes)."""
        s = self._slot_number(slot)
        self._current_arena()
        if not self._mm or not 0 <= s < 2**32:
            raise KvtierError(6, f"host slot {s} is outside the host window")
        staging = s * self._granule >= self._mm.arena_bytes
        if contract is not None:
            n = self.contract_slot(contract)[0]
        elif self._classes == 0:
            # Slot sizes made per contract (tiers.slot_classes = "per-contract"): a slot,
            # staging or arena, is as long as its contract's.
            raise KvtierError(6, f"host slot {s}: the daemon makes a slot size per contract; "
                                 "name the contract (host_slot(slot, contract)) for its size")
        elif staging or self._classes == 1:
            n = self._slot_bytes
        else:
            raise KvtierError(6, f"host slot {s}: the host tier has {self._classes} slot classes; "
                                 "name the contract (host_slot(slot, contract)) for its size")
        return self._slot_offset(slot, n), n, staging

    def host_slot_offsets(self, slots, contract) -> Tuple[List[int], int]:
        """(offsets in host_arena()'s window, slot bytes) of host slots of one contract: each
        checked as host_slot_address checks it, with one contract lookup for all of them."""
        self._current_arena()
        if not self._mm:
            raise KvtierError(6, "this client maps no host window (the daemon has no host tier)")
        n = self.contract_slot(contract)[0]
        return [self._slot_offset(slot, n) for slot in slots], n

    def host_window(self):
        """A ctypes byte array over this package's mapping of the whole host window (the
        arena read-only, then the staging area), which keeps the mapping alive; None
        without a host tier. Offsets are host_slot_offsets'."""
        self._current_arena()
        if not self._mm:
            return None
        arr = (ctypes.c_uint8 * self._arena_bytes).from_address(self._arena_base)
        arr._kvtier_client = self
        arr._kvtier_window = self._mm
        return arr

    def host_slot_address(self, slot, contract=None) -> int:
        """Address of one host slot; valid while this Client or one of its views lives."""
        return self._arena_base + self._host_slot_place(slot, contract)[0]

    def host_slot(self, slot, contract=None) -> memoryview:
        """View of one host slot: writable for a slot of a host alloc lease (this client's
        staging slot, slot_bytes long), read-only for an acquired or committed block (the
        arena; as long as the slots of its contract's class: name the contract when the
        host tier has several slot classes). The view keeps this Client and the mapping
        alive."""
        off, n, staging = self._host_slot_place(slot, contract)
        arr = (ctypes.c_uint8 * n).from_address(self._arena_base + off)
        arr._kvtier_client = self
        arr._kvtier_window = self._mm
        view = memoryview(arr).cast("B")
        return view if staging else view.toreadonly()

    @property
    def hbm_granule(self) -> int:
        """HBM slot s is at hbm_device_ptr() + s * hbm_granule whatever its size (the
        decode kernels' pool stride); slot_bytes with one slot class, 0 without HBM."""
        return self._lib.kvtier_hbm_granule(self._handle())

    @property
    def hbm_arena_bytes(self) -> int:
        """Bytes of the HBM arena (0 without HBM, or from a daemon of protocol 5)."""
        return self._lib.kvtier_hbm_arena_bytes(self._handle())

    def hbm_device_ptr(self) -> int:
        """Device address of HBM slot 0 in this process (cudaIpcOpenMemHandle, once)."""
        p = ctypes.c_void_p()
        _check(self._lib.kvtier_hbm_open(self._handle(), ctypes.byref(p)))
        return p.value or 0

    def register_contract(self, contract: Contract) -> int:
        d, _keep = contract._desc()
        out = ctypes.c_uint64()
        _check(self._lib.kvtier_register_contract(self._handle(), ctypes.byref(d), ctypes.byref(out)))
        self._block_bytes[out.value] = contract.block_bytes()
        return out.value

    def contract_slot(self, contract_id: int):
        """(host slot bytes, fill) of a contract this client registered: the smallest of the
        daemon's slot classes that holds its block, and block bytes / slot bytes."""
        n, fill = ctypes.c_uint64(), ctypes.c_double()
        _check(self._lib.kvtier_contract_slot(self._handle(), contract_id, ctypes.byref(n), ctypes.byref(fill)))
        return n.value, fill.value

    def contract_hbm_slot(self, contract_id: int) -> int:
        """HBM slot bytes of a contract this client registered (the HBM tier's class of its
        block; 0 without an HBM tier)."""
        n = ctypes.c_uint64()
        _check(self._lib.kvtier_contract_hbm_slot(self._handle(), contract_id, ctypes.byref(n)))
        return n.value

    def lookup(self, contract_id: int, keys: Sequence[Key]) -> LookupResult:
        arr = _keys_array(keys)
        res = _LookupResult()
        tiers = (ctypes.c_uint8 * max(len(keys), 1))()
        _check(self._lib.kvtier_lookup(self._handle(), contract_id, arr, len(keys), ctypes.byref(res), tiers))
        return LookupResult(res.hit_blocks, TierNames(bytes(tiers)[:len(keys)]), res.est_seconds_to_hbm)

    def acquire(self, contract_id: int, keys: Sequence[Key], tier="host") -> Lease:
        arr = _keys_array(keys)
        slots = (_Slot * max(len(keys), 1))()
        lease = ctypes.c_uint64()
        n = ctypes.c_size_t()
        _check(self._lib.kvtier_acquire(self._handle(), contract_id, arr, len(keys), _tier(tier),
                                        ctypes.byref(lease), slots, ctypes.byref(n)))
        return _lease_from_array(lease.value, slots, n.value)

    def acquire_async(self, contract_id: int, keys: Sequence[Key], tier="host", chunk_blocks: int = 0) -> "AsyncAcquire":
        """acquire() without blocking: returns an AsyncAcquire at once. The daemon makes the
        leading blocks ready in steps of chunk_blocks (0: 16); one per client at a time."""
        contract_id = _count("contract_id", contract_id, 0, 2**64 - 1)
        chunk_blocks = _count("chunk_blocks", chunk_blocks, 0, 2**32 - 1)
        arr = _keys_array(keys)
        op = ctypes.c_void_p()
        _check(self._lib.kvtier_acquire_async(self._handle(), contract_id, arr, len(keys), _tier(tier),
                                              chunk_blocks, ctypes.byref(op)))
        return AsyncAcquire(self, op.value, len(keys))

    def alloc(self, contract_id: int, n: int, tier="host", wait_ms: int = 0) -> Lease:
        """n free slots under a new lease. wait_ms > 0 waits out RETRY (a tier full for
        now) up to that long; REJECTED (this client's own leases fill the tier) at once."""
        contract_id = _count("contract_id", contract_id, 0, 2**64 - 1)
        n = _count("n", n, 1, MAX_REQUEST_KEYS)
        wait_ms = _count("wait_ms", wait_ms, 0, 2**32 - 1)
        slots = (_Slot * n)()
        lease = ctypes.c_uint64()
        if wait_ms:
            _check(self._lib.kvtier_alloc_wait(self._handle(), contract_id, n, _tier(tier), wait_ms,
                                               ctypes.byref(lease), slots))
            return _lease_from_array(lease.value, slots, n)
        _check(self._lib.kvtier_alloc(self._handle(), contract_id, n, _tier(tier), ctypes.byref(lease), slots))
        return _lease_from_array(lease.value, slots, n)

    def commit(self, contract_id: int, lease: Lease, items: Sequence[Tuple[Slot, Key, Optional[Key]]]) -> int:
        """items: (slot, key, parent or None). Returns how many were committed (now hold
        these bytes). Raises KvtierConflict when some keys were already cached with other
        bytes or disputed (kvtier_commit's KVTIER_CONFLICT): every item went through, and
        those keys are not counted."""
        r = self.commit_report(contract_id, lease, items)
        if r.conflicts > 0:
            raise KvtierConflict(
                f"{r.conflicts} of {r.committed} keys do not hold these bytes: {r.different_bytes - r.replaced} "
                f"already cached with different bytes (tiers.on_conflict), {r.disputed} disputed and still pinned",
                committed=r.committed - r.conflicts, conflicts=r.conflicts, result=r)
        return r.committed

    def commit_report(self, contract_id: int, lease: Lease,
                      items: Sequence[Tuple[Slot, Key, Optional[Key]]]) -> CommitResult:
        """commit that says how many items were stored and how many keys were already
        cached with equal or different bytes (CommitResult)."""
        arr = (_CommitItem * len(items))()
        for i, (slot, key, parent) in enumerate(items):
            arr[i].slot.tier, arr[i].slot.slot = slot.tier, slot.slot
            arr[i].key.hi, arr[i].key.lo = key.hi, key.lo
            if parent is not None:
                arr[i].parent.hi, arr[i].parent.lo = parent.hi, parent.lo
        r = _CommitResult()
        code = self._lib.kvtier_commit_report(self._handle(), contract_id, lease.id, arr, len(items), ctypes.byref(r))
        if code != 0:
            raise KvtierError(code, self._lib.kvtier_last_error().decode("utf-8", "replace"), committed=r.committed)
        return CommitResult(r.committed, r.stored, r.same_bytes, r.different_bytes, r.unchecked, r.replaced,
                            r.disputed)

    # ---- token level: prompts as token ids (the block size comes from the contract) ----

    def block_tokens(self, contract_id: int) -> int:
        """block_tokens of a contract this client registered (NOT_FOUND otherwise)."""
        out = ctypes.c_uint32()
        _check(self._lib.kvtier_contract_block_tokens(self._handle(), contract_id, ctypes.byref(out)))
        return out.value

    def key_chain(self, contract_id: int, tokens: Sequence[int]) -> List[Key]:
        """kvtier.key_chain with the registered contract's block size."""
        return key_chain(contract_id, tokens, self.block_tokens(contract_id))

    @staticmethod
    def _tokens(tokens):
        _check_token_range(tokens)
        return (ctypes.c_uint32 * len(tokens))(*tokens)

    def lookup_tokens(self, contract_id: int, tokens: Sequence[int]) -> int:
        """How many leading tokens can come from the cache: whole cached blocks, never the
        block that holds the last prompt token (the engine recomputes it)."""
        out = ctypes.c_size_t()
        _check(self._lib.kvtier_lookup_tokens(self._handle(), contract_id, self._tokens(tokens), len(tokens),
                                              ctypes.byref(out)))
        return out.value

    def commit_chain(self, contract_id: int, lease: Lease, slots: Sequence[Slot], keys: Sequence[Key],
                     parent: Optional[Key] = None) -> int:
        """commit with the parents filled in (keys[i - 1]; `parent` or none for keys[0])."""
        if len(slots) != len(keys):
            raise KvtierError(6, f"{len(slots)} slots for {len(keys)} keys")
        sa = (_Slot * max(len(slots), 1))()
        for i, s in enumerate(slots):
            sa[i].tier, sa[i].slot = s.tier, s.slot
        p = _Key(parent.hi, parent.lo) if parent is not None else _Key(0, 0)
        done = ctypes.c_size_t()
        code = self._lib.kvtier_commit_chain(self._handle(), contract_id, lease.id, sa, _keys_array(keys),
                                             len(keys), p, ctypes.byref(done))
        if code == _CONFLICT:
            raise KvtierConflict(self._lib.kvtier_last_error().decode("utf-8", "replace"), committed=done.value,
                                 conflicts=len(keys) - done.value)
        if code != 0:
            raise KvtierError(code, self._lib.kvtier_last_error().decode("utf-8", "replace"), committed=done.value)
        return done.value

    def store(self, contract_id: int, tokens: Sequence[int], blocks) -> int:
        """After prefill: stores the prompt's full blocks that are not cached yet in the
        host tier. blocks[i] (bytes-like, the contract's block_bytes) is block i's KV;
        entries of the cached prefix are not read. Returns how many blocks were stored."""
        n = len(tokens) // self.block_tokens(contract_id)
        block_bytes = self._block_bytes[contract_id]
        if len(blocks) < n:
            raise KvtierError(6, f"{len(blocks)} blocks for a prompt of {n} full blocks")
        keep, ptrs = [], (ctypes.c_void_p * max(n, 1))()
        for i in range(n):
            b = blocks[i]
            if b is None:
                continue
            data = bytes(memoryview(b).cast("B"))
            if len(data) != block_bytes:
                raise KvtierError(6, f"block {i} has {len(data)} bytes; the contract's blocks have {block_bytes}")
            buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
            keep.append(buf)
            ptrs[i] = ctypes.addressof(buf)
        done = ctypes.c_size_t()
        code = self._lib.kvtier_store_tokens(self._handle(), contract_id, self._tokens(tokens), len(tokens), ptrs,
                                             ctypes.byref(done))
        if code == _CONFLICT:
            raise KvtierConflict(self._lib.kvtier_last_error().decode("utf-8", "replace"), committed=done.value)
        if code != 0:
            raise KvtierError(code, self._lib.kvtier_last_error().decode("utf-8", "replace"), committed=done.value)
        return done.value

    def load(self, contract_id: int, tokens: Sequence[int], tier="host") -> Tuple[int, Lease]:
        """On the next request: pins the reusable cached prefix (lookup_tokens' rule).
        Returns (cached_tokens, lease); the lease's slots hold the blocks in order, and a
        miss is (0, a lease with id 0), which release() accepts."""
        bt = self.block_tokens(contract_id)
        cap = max((len(tokens) - 1) // bt, 0) if tokens else 0
        slots = (_Slot * max(cap, 1))()
        lease, cached = ctypes.c_uint64(), ctypes.c_size_t()
        _check(self._lib.kvtier_load_tokens(self._handle(), contract_id, self._tokens(tokens), len(tokens), _tier(tier),
                                            ctypes.byref(lease), slots, cap, ctypes.byref(cached)))
        return cached.value, _lease_from_array(lease.value, slots, cached.value // bt)

    def release(self, lease):
        lease_id = lease.id if isinstance(lease, Lease) else _count("lease", lease, 0, 2**64 - 1)
        _check(self._lib.kvtier_release(self._handle(), lease_id))

    def prefetch(self, contract_id: int, keys: Sequence[Key], tier="host"):
        arr = _keys_array(keys)
        _check(self._lib.kvtier_prefetch(self._handle(), contract_id, arr, len(keys), _tier(tier)))

    def stats(self) -> List[TierStats]:
        out = (_TierStats * 8)()
        n = ctypes.c_size_t()
        _check(self._lib.kvtier_stats(self._handle(), out, 8, ctypes.byref(n)))
        res = []
        for i in range(n.value):
            s = out[i]
            vals = {f: getattr(s, f) for f, _ in _TierStats._fields_ if f != "reserved"}
            vals["tier"] = _TIER_NAMES.get(s.tier, str(s.tier))
            vals["present"] = bool(s.present)
            res.append(TierStats(**vals))
        return res

    def ping(self):
        _check(self._lib.kvtier_ping(self._handle()))

    def flush(self, to="nvme"):
        """Operator action: demotes every unpinned block down to `to` ("host": HBM is
        emptied into host memory; "nvme": HBM and host go to NVMe). Returns when done."""
        if to not in ("host", "nvme"):
            raise ValueError(f"flush target must be 'host' or 'nvme', not {to!r}")
        _check(self._lib.kvtier_flush_to(self._handle(), _tier(to)))

    def evict_contract(self, contract_id: int) -> Tuple[int, int]:
        """Operator action: drops every unpinned block of a contract from every tier.
        Returns (evicted, skipped because pinned)."""
        ev, sk = ctypes.c_uint64(), ctypes.c_uint64()
        _check(self._lib.kvtier_evict_contract(self._handle(), contract_id, ctypes.byref(ev), ctypes.byref(sk)))
        return ev.value, sk.value
