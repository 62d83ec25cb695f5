"""kvtier as SGLang's HiCache storage backend (L3), loaded by SGLang's dynamic backend factory.

    python -m sglang.launch_server --model-path M --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCache", "interface_v1": 1,
            "socket": "/run/kvtier/kvtierd.sock"}'

SGLang builds the backend with ``KvtierHiCache(storage_config, kwargs)``
(sglang/srt/mem_cache/storage/backend_factory.py), hands it the host pool through
``register_mem_pool_host`` and then moves pages with the zero-copy v1 calls (SGLang uses them for a dynamic backend only with
``"interface_v1": 1`` in the extra config; without it the backend refuses to start):

- ``batch_exists(keys)``: how many leading pages kvtierd holds (one lookup).
- ``batch_set_v1(keys, host_indices)``: copies the pages out of the host pool into this
  client's staging slots in kvtier's block layout and commits them.
- ``batch_get_v1(keys, host_indices)``: acquires the leading run of cached pages in
  kvtierd's host tier (from NVMe when they are only there) and copies them into the pool.

Both v1 calls return one bool per key and never None; a failure of the daemon raises
:class:`KvtierHiCacheError` (SGLang's prefetch and backup threads would die on None).

**Blocks.** One SGLang page (``page_size`` tokens, every layer, K and V) is one kvtier block
in kvtier's layout (formats/layout.h: per layer K then V, HND inside), whatever the pool's
``page_first`` / ``layer_first`` layout: the two layouts store and load each other's pages.
BF16 and FP8 pages are byte copies; the FP4 host pool's pages (packed E2M1 data in
``kv_buffer``, E4M3 block scales in ``scale_kv_buffer``) are one kvtier NVFP4 block with
data and scales together, bit for bit (:func:`fp4_host_pool_storage`).

**Contract and keys.** The scale contract is (model, revision, layers, KV heads of this TP
rank, head_dim, page_size, format, TP rank and size, per-layer scales); pipeline and
context-parallel ranks go into the revision. SGLang's page keys (hex strings of a SHA-256
chain over token ids) are carried as kvtier keys within that contract:
``key = BLAKE2b-128(contract id LE8 || page key)``, so a restarted server or another process
with the same contract hits, and another model, dtype, page size or rank never does.
Each page's parent is the key before it (``extra_info.prefix_keys`` for the first page),
which feeds the daemon's prefix-aware eviction.

Settings (``extra_config`` of the flag, or the environment):

    socket          kvtierd's unix socket ($KVTIER_SOCKET; default /run/kvtier/kvtierd.sock)
    model_id        overrides storage_config.model_name
    model_revision  weights revision (part of the contract; default "")
    k_scales        per-layer K scales of FP8/NVFP4 pages, a list or one number (default 1.0)
    v_scales        the same for V
    kv_cache_dtype  "fp8_e4m3" when the pool is uint8 and its device pool does not say
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence

import torch

import kvtier

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
except ImportError as e:  # the module is only useful inside SGLang
    raise ImportError(f"kvtier.sglang needs the sglang package (pip install sglang): {e}") from e

log = logging.getLogger("kvtier.sglang")

DEFAULT_SOCKET = "/run/kvtier/kvtierd.sock"
_CHUNK = 32  # pages per staging alloc and per acquire (well under the daemon's per-client staging slots)


class KvtierHiCacheError(RuntimeError):
    """A batch could not be stored or loaded (daemon gone, tier full, bad pool); SGLang's
    caller logs it and recomputes. Bad settings raise it (or ValueError) at start."""


# ---- Page geometry ----------------------------------------------------------------------

@dataclass(frozen=True)
class PageGeometry:
    """What one SGLang page is, read from a host pool."""
    layout: str            # "page_first" | "layer_first"
    page_size: int         # tokens per page = the contract's block_tokens
    num_layers: int
    num_kv_heads: int      # heads held by this TP rank
    head_dim: int          # the model's head_dim (twice the packed row of FP4 pools)
    kv_format: str         # kvtier block format: "bf16" | "fp8" | "nvfp4"

    @property
    def row_bytes(self) -> int:
        """Bytes of one (token, head) row of kv_buffer (NVFP4: the packed data only)."""
        if self.kv_format == "nvfp4":
            return self.head_dim // 2
        return (2 if self.kv_format == "bf16" else 1) * self.head_dim

    @property
    def scale_bytes(self) -> int:
        """Bytes of one (token, head) row of E4M3 block scales (NVFP4 only)."""
        return self.head_dim // 16 if self.kv_format == "nvfp4" else 0

    @property
    def block_bytes(self) -> int:
        return self.num_layers * 2 * self.num_kv_heads * self.page_size * (self.row_bytes + self.scale_bytes)


def _fp8_name(pool, extra: dict) -> bool:
    dev = getattr(pool, "device_pool", None)
    for d in (getattr(pool, "dtype", None), getattr(dev, "dtype", None)):
        if d in (torch.float8_e4m3fn,) or (d is not None and "float8_e4m3" in str(d)):
            return True
    return str(extra.get("kv_cache_dtype", "")).lower() in ("fp8", "fp8_e4m3", "float8_e4m3fn")


def page_geometry(pool, extra: Optional[dict] = None) -> PageGeometry:
    """Reads and checks a host pool (MHATokenToKVPoolHost or its FP4 subclass); raises
    KvtierHiCacheError naming what cannot be stored."""
    extra = extra or {}
    name = type(pool).__name__
    if getattr(pool, "is_mla", False) or not hasattr(pool, "kv_buffer"):
        raise KvtierHiCacheError(f"{name}: only MHA host pools (kv_buffer of K and V) are supported; "
                                 "MLA and hybrid pools are not")
    layout = getattr(pool, "layout", None)
    if layout not in ("page_first", "layer_first"):
        raise KvtierHiCacheError(f"{name}: --hicache-mem-layout {layout!r} is not supported; use page_first "
                                 "or layer_first")
    buf = pool.kv_buffer
    L, H, T = int(pool.layer_num), int(pool.head_num), int(pool.page_size)
    size = int(pool.size)
    scales = getattr(pool, "scale_kv_buffer", None)
    if scales is not None:
        if layout != "page_first" or buf.dtype != torch.uint8 or scales.dtype != torch.uint8:
            raise KvtierHiCacheError(f"{name}: an FP4 pool must be page_first with uint8 data and scales")
        packed = int(pool.head_dim)
        D = 2 * packed
        if D % 16 or tuple(buf.shape) != (2, size, L, H, packed) or scales.numel() != 2 * size * L * H * (D // 16):
            raise KvtierHiCacheError(f"{name}: FP4 kv_buffer {tuple(buf.shape)} and scale_kv_buffer "
                                     f"{tuple(scales.shape)} are not (2, {size}, {L}, {H}, D/2) and one E4M3 "
                                     "scale per 16 values")
        fmt = "nvfp4"
    else:
        D = int(pool.head_dim)
        want = (2, size, L, H, D) if layout == "page_first" else (2, L, size, H, D)
        if tuple(buf.shape) != want:
            raise KvtierHiCacheError(f"{name}: kv_buffer {tuple(buf.shape)} is not the {layout} shape {want}")
        if buf.dtype == torch.bfloat16:
            fmt = "bf16"
        elif buf.dtype == torch.float8_e4m3fn or (buf.dtype == torch.uint8 and _fp8_name(pool, extra)):
            fmt = "fp8"
        elif buf.dtype == torch.uint8:
            raise KvtierHiCacheError(f"{name}: uint8 KV pages of unknown format; set extra_config kv_cache_dtype "
                                     "to fp8_e4m3 if they are FP8 E4M3")
        else:
            raise KvtierHiCacheError(f"{name}: kvtier has no {buf.dtype} block format (bf16, fp8 E4M3 and "
                                     "NVFP4 are stored); serve with --dtype bfloat16 or an fp8/fp4 KV cache")
    if not buf.is_contiguous() or buf.device.type != "cpu":
        raise KvtierHiCacheError(f"{name}: kv_buffer must be a contiguous CPU tensor")
    if size % T:
        raise KvtierHiCacheError(f"{name}: pool size {size} is not a multiple of page_size {T}")
    return PageGeometry(layout, T, L, H, D, fmt)


# ---- Moving pages -----------------------------------------------------------------------
#
# kvtier block (formats/layout.h), per layer l: K page, V page, each HND [H, T, row];
# an NVFP4 page is K data [H, T, D/2] | K scales [H, T, D/16] | V data | V scales.
# page_first kv_buffer:  [2, size, L, H, row]  -> a page is [2, T, L, H, row]
# layer_first kv_buffer: [2, L, size, H, row]  -> a page is [2, L, T, H, row]

def _bytes_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _to_blocks(g: PageGeometry, buf: torch.Tensor, idx: torch.Tensor, n: int) -> List[torch.Tensor]:
    """Gathers n pages (token indices idx, n * T of them) of one byte buffer and returns
    [n, L, 2, H, T, row] (contiguous)."""
    T = g.page_size
    if g.layout == "page_first":
        x = buf[:, idx]                                    # [2, nT, L, H, row]
        x = x.view(2, n, T, *x.shape[2:])                  # [2, n, T, L, H, row]
        return x.permute(1, 3, 0, 4, 2, 5).contiguous()    # [n, L, 2, H, T, row]
    x = buf[:, :, idx]                                     # [2, L, nT, H, row]
    x = x.view(2, x.shape[1], n, T, *x.shape[3:])          # [2, L, n, T, H, row]
    return x.permute(2, 1, 0, 4, 3, 5).contiguous()


def _from_blocks(g: PageGeometry, buf: torch.Tensor, idx: torch.Tensor, blocks: torch.Tensor) -> None:
    """The inverse of _to_blocks: blocks [n, L, 2, H, T, row] into buf at token indices idx."""
    n = blocks.shape[0]
    if g.layout == "page_first":
        x = blocks.permute(2, 0, 4, 1, 3, 5).reshape(2, n * g.page_size, *blocks.shape[1:2], blocks.shape[3],
                                                     blocks.shape[5])
        buf[:, idx] = x
    else:
        x = blocks.permute(2, 1, 0, 4, 3, 5).reshape(2, blocks.shape[1], n * g.page_size, blocks.shape[3],
                                                     blocks.shape[5])
        buf[:, :, idx] = x


class PageMover:
    """Copies whole pages between a host pool and rows of kvtier block bytes."""

    def __init__(self, pool, g: PageGeometry):
        self.g = g
        self.data = _bytes_view(pool.kv_buffer)
        self.scales = None
        if g.kv_format == "nvfp4":
            s = pool.scale_kv_buffer
            self.scales = s.reshape(2, s.shape[1], g.num_layers, g.num_kv_heads, g.head_dim // 16)
        self.size = int(pool.size)

    def page_starts(self, host_indices: torch.Tensor, n: int) -> torch.Tensor:
        """Checks host_indices (n whole, page-aligned pages of the pool) and returns them
        as int64 token indices on the CPU."""
        T = self.g.page_size
        idx = host_indices.to(device="cpu", dtype=torch.int64).flatten()
        if idx.numel() != n * T:
            raise KvtierHiCacheError(f"{idx.numel()} host indices for {n} pages of {T} tokens")
        if n == 0:
            return idx
        pages = idx.view(n, T)
        first = pages[:, 0]
        if bool((first % T != 0).any()) or bool((pages != first[:, None] + torch.arange(T)).any()):
            raise KvtierHiCacheError("host indices are not whole pages (page-aligned runs of page_size tokens)")
        if int(idx.min()) < 0 or int(idx.max()) >= self.size:
            raise KvtierHiCacheError(f"host indices outside the pool's {self.size} tokens")
        return idx

    def save(self, idx: torch.Tensor, n: int, rows: Sequence[torch.Tensor]) -> None:
        """Pages -> rows (each a uint8 tensor of at least block_bytes)."""
        g = self.g
        data = _to_blocks(g, self.data, idx, n)                        # [n, L, 2, H, T, row]
        if self.scales is not None:
            sc = _to_blocks(g, self.scales, idx, n)                     # [n, L, 2, H, T, D/16]
            per = g.num_kv_heads * g.page_size
            data = torch.cat((data.reshape(n, g.num_layers, 2, per * g.row_bytes),
                              sc.reshape(n, g.num_layers, 2, per * g.scale_bytes)), dim=3)
        flat = data.reshape(n, g.block_bytes)
        for i, r in enumerate(rows):
            r[:g.block_bytes].copy_(flat[i])

    def load(self, rows: Sequence[torch.Tensor], idx: torch.Tensor) -> None:
        """Rows -> pages at token indices idx (len(rows) pages)."""
        g = self.g
        n = len(rows)
        flat = torch.stack([r[:g.block_bytes] for r in rows])
        L, H, T = g.num_layers, g.num_kv_heads, g.page_size
        if self.scales is None:
            _from_blocks(g, self.data, idx, flat.view(n, L, 2, H, T, g.row_bytes))
            return
        per = H * T
        v = flat.view(n, L, 2, per * (g.row_bytes + g.scale_bytes))
        _from_blocks(g, self.data, idx, v[..., :per * g.row_bytes].reshape(n, L, 2, H, T, g.row_bytes))
        _from_blocks(g, self.scales, idx, v[..., per * g.row_bytes:].reshape(n, L, 2, H, T, g.scale_bytes))


def fp4_host_pool_storage(pool) -> None:
    """The hook SGLang's FP4 host pool (MHATokenToKVPoolFP4Host) needs for L3 storage.

    The pool keeps a page's block scales outside kv_buffer, in scale_kv_buffer, and its
    flat-page methods raise NotImplementedError so that no backend stores data without its
    scales (sglang#29913). KvtierHiCache does not use those methods: it reads kv_buffer and
    scale_kv_buffer together and stores both as one kvtier NVFP4 block. This function
    checks that a pool has what that needs (page_first, uint8 data [2, size, L, H, D/2],
    E4M3 scales, D/16 per row) and raises KvtierHiCacheError naming what is missing; the
    backend calls it from register_mem_pool_host."""
    if getattr(pool, "scale_kv_buffer", None) is None:
        raise KvtierHiCacheError(f"{type(pool).__name__} has no scale_kv_buffer: not an FP4 host pool")
    page_geometry(pool)


# ---- Contract and keys ------------------------------------------------------------------

def _scales(v, L: int, what: str):
    if v is None:
        return None
    vals = [float(v)] * L if isinstance(v, (int, float)) else [float(x) for x in v]
    if len(vals) != L or not all(x > 0 and x == x and x != float("inf") for x in vals):
        raise ValueError(f"{what} needs {L} finite positive numbers (or one), got {v!r}")
    return vals


def make_contract(cfg: HiCacheStorageConfig, g: PageGeometry, extra: dict) -> kvtier.Contract:
    """The scale contract of this rank's pages (see the module doc)."""
    model = extra.get("model_id") or cfg.model_name
    if not model:
        raise ValueError("kvtier.sglang needs the model's name: storage_config.model_name or extra_config model_id")
    if cfg.is_mla_model:
        raise KvtierHiCacheError("MLA models are not supported by kvtier.sglang")
    rev = str(extra.get("model_revision", ""))
    tags = []
    if cfg.pp_size > 1:
        tags.append(f"pp{cfg.pp_rank}/{cfg.pp_size}")
    if getattr(cfg, "attn_cp_size", 1) > 1:
        tags.append(f"cp{cfg.attn_cp_rank}/{cfg.attn_cp_size}")
    if getattr(cfg, "should_split_heads", False):
        tags.append(f"split-heads/{cfg.tp_lcm_size}")
    if tags:
        rev = rev + "+" + ",".join(tags)
    return kvtier.Contract(model_id=str(model), model_revision=rev, num_layers=g.num_layers,
                           num_kv_heads=g.num_kv_heads, head_dim=g.head_dim, block_tokens=g.page_size,
                           tp_rank=int(cfg.tp_rank), tp_size=int(cfg.tp_size), kv_format=g.kv_format,
                           k_scales=_scales(extra.get("k_scales"), g.num_layers, "k_scales"),
                           v_scales=_scales(extra.get("v_scales"), g.num_layers, "v_scales"))


def page_key(contract_id: int, key: str) -> kvtier.Key:
    """kvtier key of one SGLang page key within a contract: BLAKE2b-128(id LE8 || key)."""
    d = hashlib.blake2b(contract_id.to_bytes(8, "little") + key.encode("utf-8"), digest_size=16).digest()
    return kvtier.Key(int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big"))


# ---- The backend ------------------------------------------------------------------------

class KvtierHiCache(HiCacheStorage):
    """SGLang HiCache L3 storage on kvtierd (see the module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        self.extra = dict(storage_config.extra_config or {})
        self.socket = str(self.extra.get("socket") or os.environ.get("KVTIER_SOCKET") or DEFAULT_SOCKET)
        self.mem_pool_host = None
        self.client: Optional[kvtier.Client] = None
        self.contract: Optional[kvtier.Contract] = None
        self.cid = 0
        self.mover: Optional[PageMover] = None
        self._lock = threading.Lock()  # the prefetch and backup threads share the client
        self.stats = {"exists_calls": 0, "pages_hit": 0, "pages_missed": 0, "pages_set": 0,
                      "pages_got": 0, "errors": 0}
        if not self.extra.get("interface_v1"):
            raise ValueError('kvtier.sglang implements the zero-copy interface only: add "interface_v1": 1 to '
                             "--hicache-storage-backend-extra-config")
        if storage_config.model_name is None and not self.extra.get("model_id"):
            raise ValueError("kvtier.sglang needs the model's name: storage_config.model_name or extra_config model_id")

    # -- set-up --

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        if getattr(mem_pool_host, "scale_kv_buffer", None) is not None:
            fp4_host_pool_storage(mem_pool_host)
        g = page_geometry(mem_pool_host, self.extra)
        self.contract = make_contract(self.config, g, self.extra)
        self.mover = PageMover(mem_pool_host, g)
        with self._lock:
            self._connect()
        log.info("kvtier.sglang: %s pages of %d tokens, %d bytes, contract %016x on %s", g.kv_format,
                 g.page_size, g.block_bytes, self.cid, self.socket)

    def _connect(self):
        try:
            if self.client is None:
                self.client = kvtier.Client(self.socket, name=f"sglang-tp{self.config.tp_rank}")
            self.cid = self.client.register_contract(self.contract)
        except kvtier.KvtierError as e:
            self.client = None
            self.stats["errors"] += 1
            raise KvtierHiCacheError(f"kvtierd at {self.socket}: {e}") from e

    def _ready(self) -> kvtier.Client:
        if self.mover is None:
            raise KvtierHiCacheError("register_mem_pool_host was not called")
        if self.client is None:
            self._connect()
        return self.client

    def _failed(self, what: str, e: Exception):
        self.stats["errors"] += 1
        if isinstance(e, kvtier.KvtierError) and e.code in (8, 9):  # DISCONNECTED, TIMEOUT: connect again next call
            try:
                self.client.close()
            except Exception:
                pass
            self.client = None
        raise KvtierHiCacheError(f"kvtier {what} failed: {e}") from e

    def _keys(self, keys: Sequence[str]) -> List[kvtier.Key]:
        return [page_key(self.cid, k) for k in keys]

    # -- the v1 zero-copy interface --

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        if not keys:
            return 0
        with self._lock:
            client = self._ready()
            try:
                hit = client.lookup(self.cid, self._keys(keys)).hit_blocks
            except kvtier.KvtierError as e:
                self._failed("lookup", e)
        self.stats["exists_calls"] += 1
        self.stats["pages_hit"] += hit
        self.stats["pages_missed"] += len(keys) - hit
        return hit

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        n = len(keys)
        with self._lock:
            client = self._ready()
            idx = self.mover.page_starts(host_indices, n)
            kk = self._keys(keys)
            prefix = extra_info.prefix_keys if extra_info is not None and extra_info.prefix_keys else None
            parent = page_key(self.cid, prefix[-1]) if prefix else None
            T, bb = self.mover.g.page_size, self.mover.g.block_bytes
            done = 0
            try:
                while done < n:
                    m = min(_CHUNK, n - done)
                    lease = client.alloc(self.cid, m, "host", wait_ms=200)
                    try:
                        rows = [self._row(client, s, bb) for s in lease.slots]
                        self.mover.save(idx[done * T:(done + m) * T], m, rows)
                        p = kk[done - 1] if done else parent
                        client.commit_chain(self.cid, lease, lease.slots, kk[done:done + m], p)
                    finally:
                        client.release(lease)
                    done += m
            except kvtier.KvtierError as e:
                self._failed(f"set of {n} pages ({done} stored)", e)
        self.stats["pages_set"] += n
        return [True] * n

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        n = len(keys)
        with self._lock:
            client = self._ready()
            idx = self.mover.page_starts(host_indices, n)
            kk = self._keys(keys)
            T, bb = self.mover.g.page_size, self.mover.g.block_bytes
            done = 0
            try:
                while done < n:
                    chunk = kk[done:done + _CHUNK]
                    lease = client.acquire(self.cid, chunk, "host")
                    try:
                        got = len(lease.slots)
                        if got:
                            rows = [self._row(client, s, bb, self.cid) for s in lease.slots]
                            self.mover.load(rows, idx[done * T:(done + got) * T])
                    finally:
                        client.release(lease)
                    done += got
                    if got < len(chunk):
                        break
            except kvtier.KvtierError as e:
                self._failed(f"get of {n} pages ({done} loaded)", e)
        self.stats["pages_got"] += done
        return [True] * done + [False] * (n - done)

    @staticmethod
    def _row(client: kvtier.Client, slot, nbytes: int, cid: Optional[int] = None) -> torch.Tensor:
        addr = client.host_slot_address(slot, cid) if cid is not None else client.host_slot_address(slot)
        buf = (ctypes.c_uint8 * nbytes).from_address(addr)
        return torch.frombuffer(buf, dtype=torch.uint8)

    # -- the legacy interface: SGLang uses it only for backends outside its zero-copy list --

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key, target_location=None, target_sizes=None):
        raise NotImplementedError("kvtier.sglang implements the zero-copy v1 interface only (batch_get_v1)")

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        raise NotImplementedError("kvtier.sglang implements the zero-copy v1 interface only (batch_get_v1)")

    def set(self, key, value=None, target_location=None, target_sizes=None):
        raise NotImplementedError("kvtier.sglang implements the zero-copy v1 interface only (batch_set_v1)")

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        raise NotImplementedError("kvtier.sglang implements the zero-copy v1 interface only (batch_set_v1)")

    # -- housekeeping --

    def clear(self) -> None:
        """Drops every unpinned block of this contract from every tier of kvtierd."""
        with self._lock:
            client = self._ready()
            try:
                client.evict_contract(self.cid)
            except kvtier.KvtierError as e:
                self._failed("clear", e)

    def get_stats(self):
        out = dict(self.stats)
        out["contract_id"] = f"{self.cid:016x}"
        return out

    def close(self) -> None:
        with self._lock:
            if self.client is not None:
                self.client.close()
                self.client = None
