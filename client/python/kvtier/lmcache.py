"""kvtier as an LMCache remote storage plugin (a RemoteConnector and its ConnectorAdapter).

LMCache configuration (lmcache.yaml, LMCache 0.5.6):

    chunk_size: 256
    remote_url: "kvtier:///run/kvtier/kvtierd.sock"
    remote_serde: "naive"
    remote_storage_plugins: ["kvtier"]
    extra_config:
      remote_storage_plugin.kvtier.module_path: kvtier.lmcache
      remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter

LMCache hands the connector whole chunks (``MemoryObj`` in ``KV_2LTD`` order, ``[2, L, T,
H*D]``). Each full chunk is one kvtier block of a contract made from LMCache's metadata
(model, layers, KV heads, head_dim, chunk size, worker id and world size, dtype), converted to
kvtier's block layout (per layer K then V, HND) on put and back on get, so the contract
describes the bytes it holds. A chunk shorter than ``chunk_size`` (a prompt's last) is not
stored: kvtier's blocks have one size per contract, and a miss only costs a recompute.
LMCache's chunk keys (``CacheEngineKey.to_string()``) are carried within the contract as
``BLAKE2b-128(contract id LE8 || key)``; they depend on ``PYTHONHASHSEED`` unless LMCache's
hash algorithm is set, so every worker needs the same seed to hit across processes.
BF16 and FP8 E4M3 KV caches are stored; MLA and other dtypes are refused at start.
"""
from __future__ import annotations

import asyncio
import ctypes
import hashlib
import os
import threading
from typing import List, Optional

import torch

import kvtier

try:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj
    from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
except ImportError as e:  # the module is only useful inside LMCache
    raise ImportError(f"kvtier.lmcache needs the lmcache package: {e}") from e

SCHEME = "kvtier://"
DEFAULT_SOCKET = "/run/kvtier/kvtierd.sock"
_FORMATS = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}


def chunk_key(contract_id: int, key: str) -> kvtier.Key:
    d = hashlib.blake2b(contract_id.to_bytes(8, "little") + key.encode("utf-8"), digest_size=16).digest()
    return kvtier.Key(int.from_bytes(d[:8], "big"), int.from_bytes(d[8:], "big"))


class KvtierConnector(RemoteConnector):
    """LMCache RemoteConnector on kvtierd (see the module doc)."""

    def __init__(self, loop, local_cpu_backend, config, socket: Optional[str] = None):
        extra = (config.extra_config if config is not None else None) or {}
        md = local_cpu_backend.metadata
        if md is None:
            raise ValueError("kvtier.lmcache needs LMCache's engine metadata (the KV shape)")
        if md.use_mla:
            raise ValueError("kvtier.lmcache: MLA KV caches are not supported")
        if md.kv_dtype not in _FORMATS:
            raise ValueError(f"kvtier.lmcache: kvtier has no {md.kv_dtype} block format (bf16 and fp8 e4m3 are stored)")
        L, two, T, H, D = (int(x) for x in md.kv_shape)
        if two != 2:
            raise ValueError(f"kvtier.lmcache: KV shape {tuple(md.kv_shape)} is not (layers, 2, chunk, heads, head_dim)")
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.L, self.T, self.H, self.D, self.dtype = L, T, H, D, md.kv_dtype
        self.shape = torch.Size([2, L, T, H * D])
        self.socket = (socket or extra.get("remote_storage_plugin.kvtier.socket") or os.environ.get("KVTIER_SOCKET")
                       or DEFAULT_SOCKET)
        self.contract = kvtier.Contract(
            model_id=f"lmcache:{md.model_name}", model_revision=str(extra.get("remote_storage_plugin.kvtier.model_revision", "")),
            num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=T, tp_rank=int(md.worker_id),
            tp_size=int(md.world_size), kv_format=_FORMATS[md.kv_dtype])
        self.block_bytes = self.contract.block_bytes()
        self._lock = threading.Lock()
        self.client = kvtier.Client(self.socket, name=f"lmcache-{md.worker_id}")
        self.cid = self.client.register_contract(self.contract)
        self.partial_chunks_skipped = 0

    # -- conversion: KV_2LTD [2, L, T, H*D] <-> kvtier block [L, 2, H, T, D] --

    def _row(self, slot, cid=None) -> torch.Tensor:
        addr = self.client.host_slot_address(slot, cid) if cid is not None else self.client.host_slot_address(slot)
        return torch.frombuffer((ctypes.c_uint8 * self.block_bytes).from_address(addr), dtype=torch.uint8)

    def _put_sync(self, key: CacheEngineKey, obj: MemoryObj) -> None:
        t = obj.tensor
        if t is None or tuple(t.shape) != tuple(self.shape):
            self.partial_chunks_skipped += 1
            return
        blk = t.view(2, self.L, self.T, self.H, self.D).permute(1, 0, 3, 2, 4).contiguous()
        with self._lock:
            lease = self.client.alloc(self.cid, 1, "host", wait_ms=200)
            try:
                self._row(lease.slots[0]).copy_(blk.view(-1).view(torch.uint8))
                self.client.commit(self.cid, lease, [(lease.slots[0], chunk_key(self.cid, key.to_string()), None)])
            finally:
                self.client.release(lease)

    def _get_sync(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        with self._lock:
            lease = self.client.acquire(self.cid, [chunk_key(self.cid, key.to_string())], "host")
            try:
                if not lease.slots:
                    return None
                obj = self.local_cpu_backend.allocate(self.shape, self.dtype, MemoryFormat.KV_2LTD)
                if obj is None:
                    return None
                src = self._row(lease.slots[0], self.cid).view(self.dtype).view(self.L, 2, self.H, self.T, self.D)
                obj.tensor.view(2, self.L, self.T, self.H, self.D).copy_(src.permute(1, 0, 3, 2, 4))
                return obj
            finally:
                self.client.release(lease)

    def exists_sync(self, key: CacheEngineKey) -> bool:
        with self._lock:
            return self.client.lookup(self.cid, [chunk_key(self.cid, key.to_string())]).hit_blocks == 1

    async def exists(self, key: CacheEngineKey) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.exists_sync, key)

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return await asyncio.get_running_loop().run_in_executor(None, self._get_sync, key)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await asyncio.get_running_loop().run_in_executor(None, self._put_sync, key, memory_obj)

    async def list(self) -> List[str]:
        raise NotImplementedError("kvtierd keeps hashes of LMCache's keys, not the keys: it cannot list them")

    async def close(self):
        with self._lock:
            self.client.close()


class KvtierConnectorAdapter(ConnectorAdapter):
    """Makes a KvtierConnector for ``kvtier://<socket path>`` (or ``plugin://kvtier``)."""

    def __init__(self):
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        return url.startswith(SCHEME) or url == "plugin://kvtier"

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        sock = context.url[len(SCHEME):] if context.url.startswith(SCHEME) else None
        return KvtierConnector(context.loop, context.local_cpu_backend, context.config, socket=sock or None)
