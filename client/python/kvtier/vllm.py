"""kvtier as a vLLM KV connector: vLLM's KV blocks stored in and restored from kvtierd's
tiers (host memory, NVMe, remote), shared by every engine on the host.

Loaded by vLLM with no change to vLLM::

    vllm serve MODEL --dtype bfloat16 --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

``kv_connector_extra_config`` keys (all optional):

- ``socket``: kvtierd's control socket. Default: $KVTIER_SOCKET, else
  ./kvtier-data/kvtierd.sock (the daemon's default).
- ``kv_format``: "as-is" (default: vLLM's BF16 pages as they are). "nvfp4": kvtier NVFP4
  blocks in the tiers (0.28x the bytes; quantized on save, dequantized to BF16 on load).
  "fp8": kvtier FP8 (E4M3) blocks (0.5x).
- ``kv_scale``: the static global scale of "nvfp4"/"fp8": a number (every layer, K and V),
  a list of one per layer, or ``{"k": [...], "v": [...]}``. Default: 2^-4 for NVFP4 (block
  amaxes up to 168 stored unclipped, docs/vllm.md says why), 1.0 for FP8. Recorded in the
  contract.
- ``model_revision``: names the weights in the contract. Default: a SHA-256 of the model
  folder's config.json and weight files (read once per process at start).
- ``client_name``: the name kvtierd logs for this engine. Default: "vllm".

What happens (docs/vllm.md has the whole story):

- Scheduler side: :meth:`get_num_new_matched_tokens` hashes the prompt into kvtier's key
  chain (one key per vLLM block; the block size is vLLM's) and looks it up in kvtierd; it
  counts the leading blocks that are cached for every tensor-parallel rank, never the block
  that holds the last prompt token, and nothing while the daemon is down.
  :meth:`build_connector_meta` says, per step, which blocks load (before the forward) and
  which prompt blocks became full and are saved (after it).
- Worker side: :meth:`start_load_kv` acquires the blocks in kvtierd's host tier (the daemon
  promotes from NVMe) and copies them from the shared read-only host arena straight into
  vLLM's paged KV tensors; blocks it could not get are reported by
  :meth:`get_block_ids_with_load_errors` so vLLM recomputes them, never decodes them.
  :meth:`wait_for_save` copies each new full block from vLLM's pages into kvtier's block
  format in this engine's staging slots and commits it.
- The contract (engine.py) holds the model name and weights identity, layers, KV heads per
  rank, head_dim, block tokens, dtype, the page layout, TP rank and size, and the request's
  ``cache_salt`` (as a digest): another model, dtype, layout, rank or salt never loads a
  block.
- kvtierd down at start or killed mid-run: vLLM serves by recomputing, with one log line per
  outage; the connector reattaches (backoff 0.5 s to 10 s) when the daemon is back.

Refused at start, with the reason: hybrid models (more than one KV cache group: run with
--disable-hybrid-kv-cache-manager on a full-attention model), MLA, pipeline parallelism,
KV dtypes other than bf16 (fp16, fp32, fp8), a bad kv_format or kv_scale, a page layout other than vLLM CPU's
(num_blocks, H, block_size, 2 * head_dim), and kv_role other than kv_both.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

import kvtier
from . import engine as E
from . import pages as P

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole)

log = logging.getLogger("vllm.kvtier")

# The page layout vLLM CPU hands the connector (cpu_attn.py, kvtier.pages kind "cpu"):
# (num_blocks, num_kv_heads, block_size, 2 * head_dim), per head the block's K rows, then
# its V rows. Every copy between these pages and kvtier blocks is kvtier.pages.BlockMover's.
PAGE_LAYOUT = "cpu-bhnc"
PAGE_KIND = "cpu"
_LOAD_CHUNK = 256   # keys per acquire
_SAVE_CHUNK = 32    # staging slots per alloc (well under tiers.host.staging_slots_per_client)
# kv_connector_extra_config kv_format -> BlockMover mode.
MOVER_MODES = {"as-is": "as_is", "nvfp4": "nvfp4", "fp8": "fp8"}


def block_bytes_view(addr: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over nbytes of kvtierd's shared host arena at addr (a staging slot,
    or a read-only acquired slot that is only read)."""
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=torch.uint8)


# ---- metadata ---------------------------------------------------------------------------

@dataclass
class _Transfer:
    """Blocks of one request to load or save this step. `tokens` covers the request's
    tokens up to the end of the last block named (the worker hashes them with its own
    rank's contract); block_ids[i] is vLLM's block for block index first + i."""
    req_id: str
    salt: Optional[str]
    tokens: List[int]
    first: int
    block_ids: List[int]


@dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    loads: List[_Transfer] = field(default_factory=list)
    saves: List[_Transfer] = field(default_factory=list)


@dataclass
class _ReqState:
    tokens: List[int]                 # prompt token ids
    salt: Optional[str]
    block_ids: List[int] = field(default_factory=list)
    saved_upto: int = 0               # prompt blocks below this are in kvtier or being saved
    local_tokens: int = 0             # vLLM's own prefix-cache hit (block aligned)
    hit_blocks: int = 0               # blocks kvtier had at lookup
    load_tokens: int = 0              # tokens granted to load (0: none)


class _Once:
    """Logs a message once per key (per outage kind) so a failing path is not a log flood."""

    def __init__(self):
        self._seen = set()

    def warn(self, key, msg, *args):
        if key not in self._seen:
            self._seen.add(key)
            log.warning(msg, *args)

    def clear(self, key):
        self._seen.discard(key)


def _layer_index(name: str) -> int:
    nums = re.findall(r"\.(\d+)\.", "." + name + ".")
    if not nums:
        raise E.UnsupportedEngineModel(f"cannot tell the layer index of KV cache {name!r}")
    return int(nums[0])


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV blocks in kvtierd's tiers (see the module docstring)."""

    def __init__(self, vllm_config, role: KVConnectorRole, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        kt = vllm_config.kv_transfer_config
        extra = dict(kt.kv_connector_extra_config or {})
        if kt.kv_role != "kv_both":
            raise E.UnsupportedEngineModel(f"KvtierConnector: kv_role {kt.kv_role!r} is not supported (prefill/decode "
                                           "disaggregation is not supported); use kv_role 'kv_both'")
        mc, pc, cc = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
        if getattr(mc, "use_mla", False):
            raise E.UnsupportedEngineModel("KvtierConnector: multi-head latent attention (MLA) models are not supported")
        if pc.pipeline_parallel_size != 1:
            raise E.UnsupportedEngineModel(f"KvtierConnector: pipeline parallelism (size {pc.pipeline_parallel_size}) "
                                           "is not supported")
        if kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) != 1:
            raise E.UnsupportedEngineModel(
                f"KvtierConnector: {len(kv_cache_config.kv_cache_groups)} KV cache groups (a hybrid model or the "
                "hybrid KV cache manager) are not supported; serve a full-attention model with "
                "--disable-hybrid-kv-cache-manager")
        cache_dtype = str(cc.cache_dtype)
        dtype = str(mc.dtype).replace("torch.", "") if cache_dtype == "auto" else cache_dtype
        if dtype != "bfloat16":
            raise E.UnsupportedEngineModel(
                f"KvtierConnector: KV cache dtype {dtype} is not supported: kvtier stores vLLM's pages as they are "
                "in BF16 only (FP16 and FP32 have no kvtier block format, and vLLM's FP8 pages carry vLLM's own "
                "scales); serve with --dtype bfloat16 and the default --kv-cache-dtype")
        tier_format = str(extra.get("kv_format", "as-is"))
        if tier_format not in MOVER_MODES:
            raise E.UnsupportedEngineModel(f"KvtierConnector: kv_format {tier_format!r} is not one of "
                                           f"{tuple(MOVER_MODES)}")
        self.kv_scale = extra.get("kv_scale")
        self.tp_size = int(pc.tensor_parallel_size)
        hf = mc.hf_config.to_dict() if hasattr(mc.hf_config, "to_dict") else dict(mc.hf_config)
        self.shape = E.shape_from_hf_config(hf, self.tp_size, dtype)
        heads, hd = int(mc.get_num_kv_heads(pc)), int(mc.get_head_size())
        if (heads, hd) != (self.shape.num_kv_heads, self.shape.head_dim):
            raise E.UnsupportedEngineModel(f"KvtierConnector: vLLM serves {heads} KV heads x {hd} per rank, the "
                                           f"model's config says {self.shape.num_kv_heads} x {self.shape.head_dim}")
        self.block_tokens = int(cc.block_size)
        self.model_name = str(mc.served_model_name if isinstance(mc.served_model_name, str) else mc.model)
        self.weights = str(extra.get("model_revision") or E.folder_identity(str(mc.model)))
        self.tier_format = tier_format
        self._mover: Optional[P.BlockMover] = None
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self.tp_rank = int(get_tensor_model_parallel_rank())
            ranks = [self.tp_rank]
        else:
            self.tp_rank = 0
            ranks = list(range(self.tp_size))
        self._ranks = ranks
        self._contracts: Dict[Tuple[Optional[str], int], kvtier.Contract] = {}
        socket = str(extra.get("socket") or os.environ.get("KVTIER_SOCKET") or "./kvtier-data/kvtierd.sock")
        name = f"{extra.get('client_name', 'vllm')}-{'scheduler' if role == KVConnectorRole.SCHEDULER else 'worker'}" \
               f"-tp{self.tp_rank}"
        self.link = E.DaemonLink(socket, name, contracts=lambda: list(self._contracts.values()), logger=log)
        self._contract(None, ranks[0])  # refuses a bad kv_format or shape now, at start
        self._once = _Once()
        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        self._loads: List[_Transfer] = []
        # worker side
        self._kv_layers: List[torch.Tensor] = []
        self._load_errors: set = set()
        self.loaded_blocks = self.saved_blocks = 0
        c0 = self._contracts[(None, ranks[0])]
        log.info("KvtierConnector (%s): model %s weights %s, %d layers x %d KV heads x %d, %d-token blocks, "
                 "rank %d/%d, tier format %s (%d bytes a block, K scale %g), kvtierd at %s", role.name.lower(),
                 self.model_name, self.weights, self.shape.num_layers, self.shape.num_kv_heads, self.shape.head_dim,
                 self.block_tokens, self.tp_rank, self.tp_size, tier_format, c0.block_bytes(), c0.k_scales[0],
                 socket)

    # ---- contracts --------------------------------------------------------------------

    def _contract(self, salt: Optional[str], rank: int) -> kvtier.Contract:
        key = (salt, rank)
        c = self._contracts.get(key)
        if c is None:
            c = E.engine_contract("vllm", self.model_name, self.weights, self.shape, self.block_tokens,
                                  tp_rank=rank, tp_size=self.tp_size, tier_format=self.tier_format, salt=salt,
                                  layout=PAGE_LAYOUT, kv_scale=self.kv_scale)
            self._contracts[key] = c
        return c

    def _client_and_id(self, salt: Optional[str], rank: int):
        """(client, contract id) with the contract registered, or (None, 0) while the daemon
        is down."""
        contract = self._contract(salt, rank)
        client = self.link.client()
        if client is None:
            return None, 0
        cid = contract.id()
        if cid not in client._block_bytes:
            if self.link.register(contract) is None:
                return None, 0
            client = self.link.client()
            if client is None:
                return None, 0
        return client, cid

    def _failed(self, what: str, err: kvtier.KvtierError, msg: str):
        """A call failed: a lost daemon is DaemonLink's one line per outage; any other error
        is logged once per operation and status (the request goes on without kvtier)."""
        if err.code in E.DaemonLink.GONE:
            self.link.failed(err)
        else:
            self._once.warn((what, err.code), msg, err)

    # ==== scheduler side =================================================================

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        tokens = list(request.prompt_token_ids or [])
        salt = getattr(request, "cache_salt", None)
        st = _ReqState(tokens=tokens, salt=salt, local_tokens=num_computed_tokens)
        self._reqs[request.request_id] = st
        bt = self.block_tokens
        # Never the block holding the last prompt token: vLLM computes it for its logits.
        usable = max(len(tokens) - 1, 0) // bt
        if usable == 0:
            return 0, False
        hit = usable
        for rank in self._ranks:
            client, cid = self._client_and_id(salt, rank)
            if client is None:
                return 0, False
            try:
                keys = E.block_keys(cid, tokens[:usable * bt], bt)
                hit = min(hit, client.lookup(cid, keys).hit_blocks)
            except kvtier.KvtierError as e:
                self._failed("lookup", e, "kvtier: lookup failed (%s); computing instead")
                return 0, False
            if hit == 0:
                break
        st.hit_blocks = hit
        st.saved_upto = hit
        ext = hit * bt - num_computed_tokens
        return (ext if ext > 0 else 0), False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        st.block_ids = list(blocks.get_block_ids()[0])
        st.load_tokens = num_external_tokens
        if num_external_tokens > 0:
            bt = self.block_tokens
            first = st.local_tokens // bt
            last = (st.local_tokens + num_external_tokens) // bt
            self._loads.append(_Transfer(request.request_id, st.salt, st.tokens[:last * bt], first,
                                         st.block_ids[first:last]))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._loads)
        self._loads = []
        bt = self.block_tokens
        steps = [(r.req_id, r.block_ids[0], r.num_computed_tokens, True) for r in scheduler_output.scheduled_new_reqs]
        cached = scheduler_output.scheduled_cached_reqs
        resumed = getattr(cached, "resumed_req_ids", set()) or set()
        for i, rid in enumerate(cached.req_ids):
            nb = cached.new_block_ids[i]
            steps.append((rid, nb[0] if nb is not None else None, cached.num_computed_tokens[i], rid in resumed))
        for rid, block_ids, computed, replace in steps:
            st = self._reqs.get(rid)
            if st is None:
                continue
            if block_ids is not None:
                st.block_ids = list(block_ids) if replace else st.block_ids + list(block_ids)
            end = computed + scheduler_output.num_scheduled_tokens.get(rid, 0)
            full = min(end, len(st.tokens)) // bt
            full = min(full, len(st.block_ids))
            if full > st.saved_upto:
                meta.saves.append(_Transfer(rid, st.salt, st.tokens[:full * bt], st.saved_upto,
                                            st.block_ids[st.saved_upto:full]))
                st.saved_upto = full
        return meta

    def request_finished(self, request, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # Saves run inside the step that computed the blocks (wait_for_save), so the blocks
        # are free to go when vLLM finishes the request.
        self._reqs.pop(request.request_id, None)
        return False, None

    # ==== worker side ====================================================================

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        names = sorted(kv_caches, key=_layer_index)
        layers = [kv_caches[n] for n in names]
        s = self.shape
        if len(layers) != s.num_layers:
            raise E.UnsupportedEngineModel(f"KvtierConnector: vLLM hands {len(layers)} KV caches for a model of "
                                           f"{s.num_layers} layers")
        self._mover = self._make_mover(names, layers)
        self._kv_layers = layers
        log.info("KvtierConnector: %d KV caches of %s blocks registered", len(layers), layers[0].shape[0])

    def _make_mover(self, names: Sequence[str], layers: Sequence[torch.Tensor]) -> P.BlockMover:
        """The BlockMover between vLLM CPU's pages and this rank's kvtier blocks; refuses
        pages of another shape, dtype, device or layout, and a block size that is not the
        contract's."""
        s = self.shape
        want = f"vLLM CPU's bf16 pages (num_blocks, {s.num_kv_heads}, {self.block_tokens}, {2 * s.head_dim})"
        for n, kv in zip(names, layers):
            if kv.dtype != torch.bfloat16 or kv.device.type != "cpu":
                raise E.UnsupportedEngineModel(f"KvtierConnector: KV cache {n} is {tuple(kv.shape)} {kv.dtype} on "
                                               f"{kv.device}; this release copies {want} only")
        try:
            lay = P.describe(layers[0], PAGE_KIND, "bfloat16", s.num_kv_heads, s.head_dim)
            if lay.block_tokens != self.block_tokens:
                raise P.PagesError(f"{lay.block_tokens}-token blocks, the contract's are {self.block_tokens}")
            c = self._contract(None, self.tp_rank)
            mover = P.BlockMover(layers, lay, MOVER_MODES[self.tier_format], c.k_scales, c.v_scales, P.MAX6)
        except P.PagesError as e:
            raise E.UnsupportedEngineModel(f"KvtierConnector: KV cache {names[0]} {tuple(layers[0].shape)}: {e}; "
                                           f"this release copies {want} only") from None
        if mover.block_bytes != c.block_bytes():
            raise E.UnsupportedEngineModel(f"KvtierConnector: a block is {mover.block_bytes} bytes from the pages, "
                                           f"{c.block_bytes()} in the contract")
        return mover

    def start_load_kv(self, forward_context, **kwargs) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvtierConnectorMetadata):
            return
        for tr in meta.loads:
            self._load(tr)

    def _load(self, tr: _Transfer):
        n = len(tr.block_ids)
        if n == 0:
            return
        done = 0
        client, cid = self._client_and_id(tr.salt, self.tp_rank)
        if client is not None and self._mover is not None:
            try:
                keys = E.block_keys(cid, tr.tokens, self.block_tokens)[tr.first:tr.first + n]
                block_bytes = client._block_bytes[cid]
                while done < n:
                    chunk = keys[done:min(n, done + _LOAD_CHUNK)]
                    lease = client.acquire(cid, chunk, "host")
                    try:
                        got = len(lease.slots)
                        rows = [block_bytes_view(client.host_slot_address(slot, cid), block_bytes)
                                for slot in lease.slots]
                        # All of the chunk's pages or none: the mover checks every block
                        # (NVFP4: every scale byte) before the first write.
                        self._mover.load(rows, tr.block_ids[done:done + got])
                    finally:
                        client.release(lease)
                    done += got
                    if got < len(chunk):
                        break
            except kvtier.KvtierError as e:
                self._failed("load", e, "kvtier: load failed (%s); vLLM recomputes the blocks")
            except P.PagesError as e:
                self._once.warn(("load", "corrupt"), "kvtier: a loaded block is refused (%s); vLLM recomputes "
                                "the blocks", e)
        self.loaded_blocks += done
        if done < n:
            # Every block after the first one missing is recomputed (vLLM recomputes from the
            # first invalid block of a request).
            self._load_errors.update(tr.block_ids[done:])

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loads every layer before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        return  # saved whole in wait_for_save, after every layer ran

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvtierConnectorMetadata):
            return
        for tr in meta.saves:
            self._save(tr)

    def _save(self, tr: _Transfer):
        n = len(tr.block_ids)
        if n == 0 or self._mover is None:
            return
        client, cid = self._client_and_id(tr.salt, self.tp_rank)
        if client is None:
            return
        try:
            keys = E.block_keys(cid, tr.tokens, self.block_tokens)
            block_bytes = client._block_bytes[cid]
            at = tr.first
            while at < tr.first + n:
                m = min(_SAVE_CHUNK, tr.first + n - at)
                lease = client.alloc(cid, m, "host", wait_ms=200)
                try:
                    rows = [block_bytes_view(client.host_slot_address(slot), block_bytes) for slot in lease.slots]
                    first = at - tr.first
                    self._mover.save(tr.block_ids[first:first + len(rows)], rows)
                    parent = keys[at - 1] if at > 0 else None
                    stored = client.commit_chain(cid, lease, lease.slots, keys[at:at + m], parent)
                finally:
                    client.release(lease)
                self.saved_blocks += stored
                at += m
        except kvtier.KvtierError as e:
            # Anything but success (a full tier, a conflict, a dead daemon) means "not stored".
            self._failed("save", e, "kvtier: save failed (%s); those blocks are not cached")
        except P.PagesError as e:
            self._once.warn(("save", "pages"), "kvtier: save refused (%s); those blocks are not cached", e)

    def get_block_ids_with_load_errors(self) -> set:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self):
        self.link.close()
