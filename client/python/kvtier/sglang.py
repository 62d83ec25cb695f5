"""kvtier as SGLang's HiCache storage backend (L3), loaded by SGLang's dynamic backend factory.

    python -m sglang.launch_server --model-path M --enable-hierarchical-cache \\
        --hicache-mem-layout page_first --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
            "module_path": "kvtier.sglang", "class_name": "KvtierHiCache", "interface_v1": 1}'

SGLang builds the backend with ``KvtierHiCache(storage_config, kwargs)``
(sglang/srt/mem_cache/storage/backend_factory.py), hands it the host pool through
``register_mem_pool_host`` and then moves pages with the zero-copy v1 calls (SGLang uses them
for a dynamic backend only with ``"interface_v1": 1`` in the extra config; without it the
backend refuses to start):

- ``batch_exists(keys)``: how many leading pages kvtierd holds (one lookup).
- ``batch_set_v1(keys, host_indices)``: copies the pages out of the host pool into staging
  slots in kvtier's block layout and commits them (the engine core's chunked save).
- ``batch_get_v1(keys, host_indices)``: acquires the leading run of cached pages in
  kvtierd's host tier (from NVMe when they are only there) and copies them into the pool.

Both v1 calls return one bool per key and never None. kvtierd down or killed mid-run is
the daemon link's outage policy, the same as every engine's (kvtier.engine.link): lookups
find nothing, gets load nothing and sets store nothing (False), SGLang recomputes, one log
line per outage, and the backend reattaches with back-off when the daemon is back. Host
indices that are not whole pages of the pool raise :class:`KvtierHiCacheError`, before
anything is written.

**Blocks.** One SGLang page (``page_size`` tokens, every layer, K and V) is one kvtier block
in kvtier's layout, whatever the pool's ``page_first`` / ``layer_first`` layout
(kvtier.pages.HostPoolMover): the two layouts store and load each other's pages. BF16 and
FP8 pages are byte copies; the FP4 host pool's pages (packed E2M1 data in ``kv_buffer``,
E4M3 block scales in ``scale_kv_buffer``) are one kvtier NVFP4 block with data and scales
together, bit for bit.

**Contract and keys** (kvtier.engine): engine ``sglang``, the model's name, the weights'
identity (the ``model_revision`` setting, else a SHA-256 of the model folder's files), layers,
KV heads of this TP rank, head_dim, page_size, format, TP rank and size, per-layer scales;
pipeline and context-parallel ranks go into the layout tag. SGLang's page keys (hex strings of
a SHA-256 chain over token ids) are carried within the contract as
``BLAKE2b-128(contract id LE8 || page key)`` (kvtier.engine.hashed_key), so a restarted server
or another process with the same contract hits, and another model, weights, dtype, page size
or rank never does. Each page's parent is the key before it (``extra_info.prefix_keys`` for
the first page), which feeds the daemon's prefix-aware eviction.

Settings (``extra_config`` of the flag):

    socket          kvtierd's unix socket (default: $KVTIER_SOCKET, else the shipped config's)
    model_id        the model's name in the contract (default: storage_config.model_name)
    model_path      the checkpoint folder whose files name the weights (default: model_name
                    when it is a folder)
    model_revision  names the weights instead of hashing the folder
    k_scales        per-layer K scales of FP8/NVFP4 pages, a list or one number (default 1.0)
    v_scales        the same for V
    kv_cache_dtype  "fp8_e4m3" when the pool is uint8 and its device pool does not say
"""
from __future__ import annotations

import logging
import os
from typing import List, Optional

import torch

import kvtier

from . import engine as E
from . import pages as P

try:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig, HiCacheStorageExtraInfo
except ImportError as e:  # the module is only useful inside SGLang
    raise ImportError(f"kvtier.sglang needs the sglang package (pip install sglang): {e}") from e

log = logging.getLogger("kvtier.sglang")


class KvtierHiCacheError(RuntimeError):
    """Bad settings, a pool kvtier cannot store, or host indices that are not whole pages."""


def page_key(contract_id: int, key: str):
    """kvtier key of one SGLang page key within a contract (kvtier.engine.hashed_key)."""
    return E.hashed_key(contract_id, key)


def _model_folder(name: str, extra: dict) -> str:
    """The checkpoint folder that names the weights: extra model_path, else model_name (which
    SGLang tags "<path>-<format>" for pools with a page format of their own)."""
    if extra.get("model_path"):
        return str(extra["model_path"])
    if not os.path.isdir(name) and "-" in name and os.path.isdir(name.rsplit("-", 1)[0]):
        return name.rsplit("-", 1)[0]
    return name


def make_contract(cfg: HiCacheStorageConfig, g: P.HostPoolGeometry, extra: dict):
    """The scale contract of this rank's pages (see the module doc)."""
    model = extra.get("model_id") or cfg.model_name
    if not model:
        raise ValueError("kvtier.sglang needs the model's name: storage_config.model_name or extra_config model_id")
    if cfg.is_mla_model:
        raise KvtierHiCacheError("MLA models are not supported by kvtier.sglang")
    # The pool's layout is not a tag: page_first and layer_first pages are the same blocks.
    tags = []
    if cfg.pp_size > 1:
        tags.append(f"pp{cfg.pp_rank}of{cfg.pp_size}")
    if getattr(cfg, "attn_cp_size", 1) > 1:
        tags.append(f"cp{cfg.attn_cp_rank}of{cfg.attn_cp_size}")
    if getattr(cfg, "should_split_heads", False):
        tags.append(f"split-heads{cfg.tp_lcm_size}")
    weights = E.weights_identity(_model_folder(str(cfg.model_name or model), extra), extra.get("model_revision"))
    ks, vs = extra.get("k_scales"), extra.get("v_scales")
    scales = None
    if ks is not None or vs is not None:
        if g.kv_format == "bf16":
            raise ValueError("k_scales / v_scales apply to FP8 and NVFP4 pages, not BF16")
        scales = {"k": ks if isinstance(ks, (list, tuple)) else [1.0 if ks is None else ks] * g.num_layers,
                  "v": vs if isinstance(vs, (list, tuple)) else [1.0 if vs is None else vs] * g.num_layers}
    shape = E.EngineShape(g.num_layers, g.num_kv_heads, g.head_dim, g.engine_dtype)
    try:
        return E.engine_contract("sglang", str(model), weights, shape, g.page_size, tp_rank=int(cfg.tp_rank),
                                 tp_size=int(cfg.tp_size), layout=",".join(tags), page_scales=scales)
    except E.UnsupportedEngineModel as e:
        raise ValueError(f"kvtier.sglang: {e}") from None


class KvtierHiCache(HiCacheStorage):
    """SGLang HiCache L3 storage on kvtierd (see the module doc)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        self.config = storage_config
        self.extra = dict(storage_config.extra_config or {})
        if not self.extra.get("interface_v1"):
            raise ValueError('kvtier.sglang implements the zero-copy interface only: add "interface_v1": 1 to '
                             "--hicache-storage-backend-extra-config")
        if storage_config.model_name is None and not self.extra.get("model_id"):
            raise ValueError("kvtier.sglang needs the model's name: storage_config.model_name or extra_config model_id")
        self.link = E.DaemonLink(self.extra.get("socket"), f"sglang-tp{storage_config.tp_rank}", logger=log)
        self.socket = self.link.socket_path
        self.io = E.BlockIO(self.link)
        self.mem_pool_host = None
        self.contract = None
        self.cid = 0
        self.mover: Optional[P.HostPoolMover] = None
        self.stats = {"exists_calls": 0, "pages_hit": 0, "pages_missed": 0, "pages_set": 0, "pages_got": 0}

    # -- set-up --

    def register_mem_pool_host(self, mem_pool_host) -> None:
        super().register_mem_pool_host(mem_pool_host)
        try:
            g = P.host_pool_geometry(mem_pool_host, self.extra.get("kv_cache_dtype"))
        except P.PagesError as e:
            raise KvtierHiCacheError(str(e)) from None
        self.contract = make_contract(self.config, g, self.extra)
        self.cid = self.contract.id()
        self.mover = P.HostPoolMover(mem_pool_host, g)
        self.link.attach(self.contract)  # attaches now when the daemon is up; a miss until it is
        log.info("kvtier.sglang: %s pages of %d tokens, %d bytes, contract %016x on %s", g.kv_format,
                 g.page_size, g.block_bytes, self.cid, self.socket)

    def _ready(self):
        if self.mover is None:
            raise KvtierHiCacheError("register_mem_pool_host was not called")

    def _pages(self, host_indices: torch.Tensor, n: int) -> torch.Tensor:
        try:
            return self.mover.page_starts(host_indices, n)
        except P.PagesError as e:
            raise KvtierHiCacheError(str(e)) from None

    # -- the v1 zero-copy interface --

    def batch_exists(self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None) -> int:
        self._ready()
        if not keys:
            return 0
        hit = self.io.lookup(self.contract, E.hashed_keys(self.cid, keys))
        self.stats["exists_calls"] += 1
        self.stats["pages_hit"] += hit
        self.stats["pages_missed"] += len(keys) - hit
        return hit

    def batch_set_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        self._ready()
        n = len(keys)
        idx = self._pages(host_indices, n)
        prefix = extra_info.prefix_keys if extra_info is not None and extra_info.prefix_keys else None
        parent = page_key(self.cid, prefix[-1]) if prefix else None
        T = self.mover.g.page_size

        def write(rows, i, m):
            self.mover.save(idx[i * T:(i + m) * T], m, rows)
        stored = self.io.save(self.contract, E.hashed_keys(self.cid, keys), write, parent) if n else 0
        self.stats["pages_set"] += stored
        return [True] * stored + [False] * (n - stored)

    def batch_get_v1(self, keys: List[str], host_indices: torch.Tensor,
                     extra_info: Optional[HiCacheStorageExtraInfo] = None) -> List[bool]:
        self._ready()
        n = len(keys)
        idx = self._pages(host_indices, n)
        T = self.mover.g.page_size

        def read(rows, i, m):
            self.mover.load(rows, idx[i * T:(i + m) * T])
        done = self.io.load(self.contract, E.hashed_keys(self.cid, keys), read) if n else 0
        self.stats["pages_got"] += done
        return [True] * done + [False] * (n - done)

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
        """Drops every unpinned block of this contract from every tier of kvtierd (nothing
        while the daemon is down)."""
        self._ready()
        with self.link.lock:
            client, cid = self.link.attach(self.contract)
            if client is None:
                return
            try:
                client.evict_contract(cid)
            except kvtier.KvtierError as e:
                self.link.report("clear", e)

    def get_stats(self):
        out = dict(self.stats)
        out["contract_id"] = f"{self.cid:016x}"
        out["outages"] = self.link.outages
        return out

    def close(self) -> None:
        self.link.close()
