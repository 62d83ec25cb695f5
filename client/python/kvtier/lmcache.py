"""kvtier as an LMCache remote storage plugin (a RemoteConnector and its ConnectorAdapter).

LMCache configuration (lmcache.yaml, LMCache 0.5.6):

    chunk_size: 256
    remote_url: "kvtier://"                  # or kvtier:///run/kvtier/kvtierd.sock
    remote_serde: "naive"
    remote_storage_plugins: ["kvtier"]
    extra_config:
      remote_storage_plugin.kvtier.module_path: kvtier.lmcache
      remote_storage_plugin.kvtier.class_name: KvtierConnectorAdapter

``kvtier://`` with no path attaches to the engine core's socket ($KVTIER_SOCKET, else the
shipped config's; kvtier.engine.link); ``remote_storage_plugin.kvtier.socket`` names one
too. ``remote_storage_plugin.kvtier.model_revision`` names the weights; without it the
weights' identity is a SHA-256 of the model folder's files (kvtier.engine.weights_identity).

LMCache hands the connector whole chunks (``MemoryObj`` in ``KV_2LTD`` order, ``[2, L, T,
H*D]``). Each full chunk is one kvtier block of a contract made from LMCache's metadata
(engine ``lmcache``, model, weights, layers, KV heads, head_dim, chunk size, worker id and
world size, dtype), converted to kvtier's block layout (per layer K then V, HND) on put and
back on get (kvtier.pages.ChunkMover). A chunk shorter than ``chunk_size`` (a prompt's
last) is not stored: kvtier's blocks have one size per contract, and a miss only costs a
recompute. LMCache's chunk keys (``CacheEngineKey.to_string()``) are carried within the
contract as ``BLAKE2b-128(contract id LE8 || key)`` (kvtier.engine.hashed_key); they depend
on ``PYTHONHASHSEED`` unless LMCache's hash algorithm is set, so every worker needs the same
seed to hit across processes. BF16 and FP8 E4M3 KV caches are stored; MLA and other dtypes
are refused at start.

kvtierd down at start or killed mid-run is the daemon link's outage policy, the same as every
engine's: ``exists`` answers False, ``get`` None and ``put`` stores nothing, with one log line
per outage and a reconnect with back-off; no exception reaches LMCache.
"""
from __future__ import annotations

import asyncio
import logging
from typing import List, Optional


from . import engine as E
from . import pages as P

try:
    from lmcache.utils import CacheEngineKey
    from lmcache.v1.memory_management import MemoryFormat, MemoryObj
    from lmcache.v1.storage_backend.connector import ConnectorAdapter, ConnectorContext
    from lmcache.v1.storage_backend.connector.base_connector import RemoteConnector
except ImportError as e:  # the module is only useful inside LMCache
    raise ImportError(f"kvtier.lmcache needs the lmcache package: {e}") from e

log = logging.getLogger("kvtier.lmcache")

SCHEME = "kvtier://"


def chunk_key(contract_id: int, key: str):
    """kvtier key of one LMCache chunk key within a contract (kvtier.engine.hashed_key)."""
    return E.hashed_key(contract_id, key)


class KvtierConnector(RemoteConnector):
    """LMCache RemoteConnector on kvtierd (see the module doc)."""

    def __init__(self, loop, local_cpu_backend, config, socket: Optional[str] = None):
        extra = (config.extra_config if config is not None else None) or {}
        md = local_cpu_backend.metadata
        if md is None:
            raise ValueError("kvtier.lmcache needs LMCache's engine metadata (the KV shape)")
        if md.use_mla:
            raise ValueError("kvtier.lmcache: MLA KV caches are not supported")
        L, two, T, H, D = (int(x) for x in md.kv_shape)
        if two != 2:
            raise ValueError(f"kvtier.lmcache: KV shape {tuple(md.kv_shape)} is not (layers, 2, chunk, heads, head_dim)")
        try:
            self.mover = P.ChunkMover(L, T, H, D, md.kv_dtype)
        except P.PagesError as e:
            raise ValueError(f"kvtier.lmcache: {e}") from None
        self.loop = loop
        self.local_cpu_backend = local_cpu_backend
        self.dtype = md.kv_dtype
        weights = E.weights_identity(str(md.model_name), extra.get("remote_storage_plugin.kvtier.model_revision"))
        shape = E.EngineShape(L, H, D, {"bf16": "bfloat16", "fp8": "fp8_e4m3"}[self.mover.kv_format])
        try:
            self.contract = E.engine_contract("lmcache", str(md.model_name), weights, shape, T,
                                              tp_rank=int(md.worker_id), tp_size=int(md.world_size))
        except E.UnsupportedEngineModel as e:
            raise ValueError(f"kvtier.lmcache: {e}") from None
        self.cid = self.contract.id()
        self.link = E.DaemonLink(socket or extra.get("remote_storage_plugin.kvtier.socket"),
                                 f"lmcache-{md.worker_id}", logger=log)
        self.socket = self.link.socket_path
        self.io = E.BlockIO(self.link)
        self.link.attach(self.contract)  # attaches now when the daemon is up; a miss until it is
        self.partial_chunks_skipped = 0

    def _key(self, key: CacheEngineKey):
        return chunk_key(self.cid, key.to_string())

    def _put_sync(self, key: CacheEngineKey, obj: MemoryObj) -> None:
        t = obj.tensor
        if not self.mover.is_full(t):
            self.partial_chunks_skipped += 1
            return
        self.io.save(self.contract, [self._key(key)], lambda rows, i, m: self.mover.save(t, rows[0]))

    def _get_sync(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        out = []

        def read(rows, i, m):
            obj = self.local_cpu_backend.allocate(self.mover.shape, self.dtype, MemoryFormat.KV_2LTD)
            if obj is None:
                return 0
            self.mover.load(rows[0], obj.tensor)
            out.append(obj)
        self.io.load(self.contract, [self._key(key)], read)
        return out[0] if out else None

    def exists_sync(self, key: CacheEngineKey) -> bool:
        return self.io.lookup(self.contract, [self._key(key)]) == 1

    async def exists(self, key: CacheEngineKey) -> bool:
        return await asyncio.get_running_loop().run_in_executor(None, self.exists_sync, key)

    async def get(self, key: CacheEngineKey) -> Optional[MemoryObj]:
        return await asyncio.get_running_loop().run_in_executor(None, self._get_sync, key)

    async def put(self, key: CacheEngineKey, memory_obj: MemoryObj):
        await asyncio.get_running_loop().run_in_executor(None, self._put_sync, key, memory_obj)

    async def list(self) -> List[str]:
        raise NotImplementedError("kvtierd keeps hashes of LMCache's keys, not the keys: it cannot list them")

    async def close(self):
        self.link.close()


class KvtierConnectorAdapter(ConnectorAdapter):
    """Makes a KvtierConnector for ``kvtier://[<socket path>]`` (or ``plugin://kvtier``)."""

    def __init__(self):
        super().__init__(SCHEME)

    def can_parse(self, url: str) -> bool:
        return url.startswith(SCHEME) or url == "plugin://kvtier"

    def create_connector(self, context: ConnectorContext) -> RemoteConnector:
        sock = context.url[len(SCHEME):] if context.url.startswith(SCHEME) else None
        return KvtierConnector(context.loop, context.local_cpu_backend, context.config, socket=sock or None)
