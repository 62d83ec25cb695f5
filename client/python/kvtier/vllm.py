"""kvtier as a vLLM KV connector: vLLM's KV blocks stored in and restored from kvtierd's
tiers (host memory, NVMe, remote), shared by every engine on the host.

Loaded by vLLM with no change to vLLM::

    vllm serve MODEL --dtype bfloat16 --kv-transfer-config '{"kv_connector": "KvtierConnector",
        "kv_connector_module_path": "kvtier.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/kvtier/kvtierd.sock"}}'

``kv_connector_extra_config`` keys (all optional):

- ``socket``: kvtierd's control socket. Default: $KVTIER_SOCKET, else
  ./kvtier-data/kvtierd.sock (the shipped config's; kvtier.engine.link).
- ``kv_format``: "as-is" (default: vLLM's BF16 pages as they are). "nvfp4": kvtier NVFP4
  blocks in the tiers (0.28x the bytes; quantized on save, dequantized to BF16 on load).
  "fp8": kvtier FP8 (E4M3) blocks (0.5x).
- ``kv_scale``: the static global scale of "nvfp4"/"fp8": a number (every layer, K and V),
  a list of one per layer, or ``{"k": [...], "v": [...]}``. Default: 2^-4 for NVFP4 (block
  amaxes up to 168 stored unclipped, docs/vllm.md says why), 1.0 for FP8. Recorded in the
  contract. With vLLM's FP8 KV cache (--kv-cache-dtype fp8), the model's k_scale / v_scale
  (default 1.0), checked against the model's at start.
- ``model_revision``: names the weights in the contract. Default: a SHA-256 of the model
  folder's config.json and weight files (read once per process at start;
  kvtier.engine.weights_identity, the rule of every engine).
- ``client_name``: the name kvtierd logs for this engine. Default: "vllm".
- ``load_if_cheaper``: load a prefix only where the engine's own measurements say loading
  it is faster than computing it (kvtier.engine.cost). Default: true; false loads every hit.

What happens (docs/vllm.md has the whole story):

- Scheduler side: :meth:`get_num_new_matched_tokens` hashes the prompt into kvtier's key
  chain (one key per vLLM block; the block size is vLLM's) and looks it up in kvtierd; it
  counts the leading blocks that are cached for every tensor-parallel rank (the block that
  holds the last prompt token too: the answer stops one token short, which vLLM computes for
  its logits), and nothing while the daemon is down.
  :meth:`build_connector_meta` says, per step, which blocks load (before the forward) and
  which prompt blocks became full and are saved (after it). A hit whose load the
  measurements say is slower than computing it is left to vLLM (load or compute below).
- Worker side: :meth:`start_load_kv` acquires the blocks in kvtierd's host tier (the daemon
  promotes from NVMe) and copies them from the shared read-only host arena straight into
  vLLM's paged KV tensors; blocks it could not get are reported by
  :meth:`get_block_ids_with_load_errors` so vLLM recomputes them, never decodes them.
  :meth:`wait_for_save` hands the step's new full blocks to a save thread, which copies
  them from vLLM's pages into kvtier's block format in this engine's staging slots and
  commits them while the next step runs; a finished request keeps its blocks until its
  saves have copied (:meth:`request_finished`, :meth:`get_finished`), a preempted one until
  then too (:meth:`handle_preemptions`).
- The contract (engine.py) holds the model name and weights identity, layers, KV heads per
  rank, head_dim, block tokens, dtype, the page layout, TP rank and size, and the request's
  ``cache_salt`` (as a digest): another model, dtype, layout, rank or salt never loads a
  block.
- Load or compute: each worker times its loads (per block) and its prefill-sized steps
  (per token, loads excluded; on CUDA with events, read once they completed) and reports
  them with its step output (:meth:`build_connector_worker_meta`); the scheduler keeps
  medians of both (:meth:`update_connector_output`, kvtier.engine.LoadCost) and declines a
  load predicted slower than its compute, probing every 16th declined one.
- kvtierd down at start or killed mid-run: vLLM serves by recomputing, with one log line per
  outage; the connector reattaches (backoff 0.5 s to 10 s) when the daemon is back (the
  daemon link's policy, shared by every engine: kvtier.engine.link).
- The contract, the keys, the daemon link and the chunked save and load are the engine
  core's (kvtier.engine); the page copies are kvtier.pages'. This module holds vLLM's hooks.

Refused at start, with the reason: hybrid models (more than one KV cache group: run with
--disable-hybrid-kv-cache-manager on a full-attention model), MLA, pipeline parallelism,
KV dtypes other than bf16 and fp8 (e4m3) (fp16, fp32, fp8_e5m2), FP8 scales that are not
the contract's, a bad kv_format or kv_scale, page layouts other than vLLM CPU's and the
CUDA backends' (vLLM 0.32's 4-D one, the earlier 5-D ones; docs/vllm.md), and kv_role
other than kv_both.
"""
from __future__ import annotations

import ctypes
import logging
import re
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import torch

import kvtier
from . import engine as E
from . import pages as P

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole, KVConnectorWorkerMetadata)

log = logging.getLogger("vllm.kvtier")

# The page layouts vLLM hands a connector, by platform (kvtier.pages kinds, docs/pages.md).
# Every copy between these pages and kvtier blocks is kvtier.pages.BlockMover's.
#  - vLLM CPU (cpu_attn.py, kind "cpu"): (num_blocks, num_kv_heads, block_size,
#    2 * head_dim), per head the block's K rows, then its V rows.
#  - vLLM CUDA before the 5-D logical KV layout (vLLM RFC #42082): FlashAttention and most
#    backends (get_kv_cache_shape) hand (2, num_blocks, block_size, H, D) (kind
#    "flash_attn"), FlashInfer (num_blocks, 2, block_size, H, D) (kind "flashinfer");
#    either NHD, or HND through the stride order (get_kv_cache_stride_order), which the
#    mover reads from the strides.
#  - vLLM 0.32's CUDA backends (kind "vllm_cuda"): (num_blocks, H, block_size, 2 * D) in
#    any stride order (vllm/v1/kv_cache_layout.py), K and V the halves of each row. The
#    same shape as vLLM CPU's with another meaning: the platform picks the kind, never
#    the shape.
# The tag names the platform in the contract's model id: kvtier's block bytes are the same
# for every layout, but a CPU and a GPU engine do not compute bit-equal KV, so they do not
# share blocks. The scheduler knows the platform, not the tensors, so the tag is the
# platform's, and every CUDA backend of a platform shares one tag.
PAGE_LAYOUTS = {"cpu": "cpu-bhnc", "cuda": "cuda"}
PAGE_LAYOUT = PAGE_LAYOUTS["cpu"]
PAGE_KIND = "cpu"
# vLLM's FP8 KV cache dtypes kvtier stores as they are (E4M3; vLLM's "fp8" is E4M3). E5M2
# has no kvtier block format.
FP8_CACHE_DTYPES = ("fp8", "fp8_e4m3")
# Suffix of the layout tag for an FP8 engine's pages: its blocks never meet those a BF16
# engine quantizes to FP8 (kv_format "fp8"), whose K and V were computed from BF16 pages.
FP8_PAGES_TAG = "-fp8e4m3"
# kv_connector_extra_config kv_format -> BlockMover mode.
MOVER_MODES = {"as-is": "as_is", "nvfp4": "nvfp4", "fp8": "fp8"}


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
    # Requests vLLM preempted in this step: their blocks went back to vLLM's pool, so a
    # save still copying out of them must end before this step's forward or loads.
    preempted: Set[str] = field(default_factory=set)
    # Tokens the step computes (all requests): the worker's per-token compute time.
    step_tokens: int = 0


@dataclass
class KvtierWorkerMetadata(KVConnectorWorkerMetadata):
    """A worker's measurements since its last step output, for the scheduler's LoadCost:
    (seconds, blocks) of each complete load, (seconds, tokens) of each measured step."""
    loads: List[Tuple[float, int]] = field(default_factory=list)
    steps: List[Tuple[float, int]] = field(default_factory=list)

    def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
        if not isinstance(other, KvtierWorkerMetadata):
            return self
        return KvtierWorkerMetadata(self.loads + other.loads, self.steps + other.steps)


class _StepClock:
    """The worker's times for load or compute. On the CPU, wall clock. On CUDA, events on
    the current stream (a step's forward and its loads are queued work; the host's clock
    would see only the queueing), read once the step's last event completed."""

    def __init__(self, cuda: bool, min_tokens: int):
        self.cuda, self.min_tokens = cuda, min_tokens  # smaller steps: their loads only
        self.step = None      # the open step: [start mark or None, tokens, [(mark, mark, blocks)]]
        self.pending = deque()  # closed steps not yet read: (start or None, end, tokens, loads)

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a

    def ready(self, mark) -> bool:
        return mark.query() if self.cuda else True

    def begin(self, tokens: int) -> None:
        # A step too small to time (a decode step) takes no mark: only its loads are timed.
        self.step = [self.mark() if tokens >= self.min_tokens else None, tokens, []]

    def load(self, start, blocks: int) -> None:
        if self.step is not None:
            self.step[2].append((start, self.mark(), blocks))

    def end(self) -> None:
        if self.step is not None:
            start, tokens, loads = self.step
            if start is not None or loads:
                self.pending.append((start, self.mark(), tokens, loads))
            self.step = None

    def harvest(self) -> Optional[KvtierWorkerMetadata]:
        """The measurements of the closed steps whose work has completed, in order."""
        out = KvtierWorkerMetadata()
        while self.pending and self.ready(self.pending[0][1]):
            start, end, tokens, loads = self.pending.popleft()
            spent = 0.0
            for a, b, blocks in loads:
                s = self.seconds(a, b)
                spent += s
                out.loads.append((s, blocks))
            if start is not None:
                out.steps.append((max(self.seconds(start, end) - spent, 0.0), tokens))
        return out if (out.loads or out.steps) else None


@dataclass
class _ReqState:
    tokens: List[int]                 # prompt token ids
    salt: Optional[str]
    block_ids: List[int] = field(default_factory=list)
    saved_upto: int = 0               # prompt blocks below this are in kvtier or being saved
    local_tokens: int = 0             # vLLM's own prefix-cache hit (block aligned)
    hit_blocks: int = 0               # blocks kvtier had at lookup
    load_tokens: int = 0              # tokens granted to load (0: none)


def _layer_index(name: str) -> int:
    nums = re.findall(r"\.(\d+)\.", "." + name + ".")
    if not nums:
        raise E.UnsupportedEngineModel(f"cannot tell the layer index of KV cache {name!r}")
    return int(nums[0])


class KvtierConnector(KVConnectorBase_V1):
    """vLLM's KV blocks in kvtierd's tiers (see the module docstring)."""

    cost: Optional[E.LoadCost] = None    # scheduler: load or compute (None: load every hit)
    _clock: Optional[_StepClock] = None  # worker: the measurements for it (None: none)
    _measured = False                    # scheduler: the first measurements were logged

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
        if cache_dtype == "fp8_e5m2":
            raise E.UnsupportedEngineModel(
                "KvtierConnector: KV cache dtype fp8_e5m2 is not supported: kvtier's FP8 blocks are E4M3; serve "
                "with --kv-cache-dtype fp8_e4m3 (or fp8), or the default (bfloat16 pages)")
        if cache_dtype in FP8_CACHE_DTYPES:
            dtype = "fp8_e4m3"
            if getattr(cc, "calculate_kv_scales", False):
                raise E.UnsupportedEngineModel(
                    "KvtierConnector: an FP8 KV cache with scales calculated at run time (calculate_kv_scales) is "
                    "not supported: a stored block's scales must be known when the engine starts")
        else:
            dtype = str(mc.dtype).replace("torch.", "") if cache_dtype == "auto" else cache_dtype
        if dtype not in ("bfloat16", "fp8_e4m3"):
            raise E.UnsupportedEngineModel(
                f"KvtierConnector: KV cache dtype {dtype} is not supported: kvtier stores vLLM's pages as they are "
                "in BF16 or FP8 E4M3 (FP16 and FP32 have no kvtier block format); serve with --dtype bfloat16 "
                "and the default --kv-cache-dtype, or --kv-cache-dtype fp8")
        from vllm.platforms import current_platform
        platform = "cpu" if current_platform.is_cpu() else "cuda" if current_platform.is_cuda() else None
        if platform is None:
            raise E.UnsupportedEngineModel(f"KvtierConnector: platform {current_platform.device_type!r} is not "
                                           "supported (vLLM CPU and CUDA are)")
        self.page_layout = PAGE_LAYOUTS[platform] + (FP8_PAGES_TAG if dtype == "fp8_e4m3" else "")
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
        self.weights = E.weights_identity(str(mc.model), extra.get("model_revision"))
        self.tier_format = tier_format
        self._mover: Optional[P.BlockMover] = None
        cheaper = str(extra.get("load_if_cheaper", True)).lower()
        if cheaper not in ("true", "1", "false", "0"):
            raise E.UnsupportedEngineModel(f"KvtierConnector: load_if_cheaper {extra['load_if_cheaper']!r} is not "
                                           "true or false")
        if cheaper in ("true", "1"):
            if role == KVConnectorRole.WORKER:
                self._clock = _StepClock(platform == "cuda", 2 * self.block_tokens)
            else:
                self.cost = E.LoadCost(min_step_tokens=2 * self.block_tokens)
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank
            self.tp_rank = int(get_tensor_model_parallel_rank())
            ranks = [self.tp_rank]
        else:
            self.tp_rank = 0
            ranks = list(range(self.tp_size))
        self._ranks = ranks
        self._contracts: Dict[Tuple[Optional[str], int], kvtier.Contract] = {}
        name = f"{extra.get('client_name', 'vllm')}-{'scheduler' if role == KVConnectorRole.SCHEDULER else 'worker'}" \
               f"-tp{self.tp_rank}"
        self.link = E.DaemonLink(extra.get("socket"), name, logger=log)
        self.io = E.BlockIO(self.link)
        self._contract(None, ranks[0])  # refuses a bad kv_format or shape now, at start
        # scheduler side
        self._reqs: Dict[str, _ReqState] = {}
        self._loads: List[_Transfer] = []
        self._saving: Set[str] = set()   # requests with a save in some step's metadata
        # worker side
        self._kv_layers: List[torch.Tensor] = []
        self._load_errors: set = set()
        self._init_saver()
        c0 = self._contracts[(None, ranks[0])]
        log.info("KvtierConnector (%s): model %s weights %s, %d layers x %d KV heads x %d, %d-token blocks, "
                 "rank %d/%d, tier format %s (%d bytes a block, K scale %g), kvtierd at %s", role.name.lower(),
                 self.model_name, self.weights, self.shape.num_layers, self.shape.num_kv_heads, self.shape.head_dim,
                 self.block_tokens, self.tp_rank, self.tp_size, tier_format, c0.block_bytes(), c0.k_scales[0],
                 self.link.socket_path)

    # ---- contracts --------------------------------------------------------------------

    def _contract(self, salt: Optional[str], rank: int) -> kvtier.Contract:
        key = (salt, rank)
        c = self._contracts.get(key)
        if c is None:
            fp8_pages = self.shape.dtype == "fp8_e4m3"
            # FP8 pages as they are: the values are the E4M3 bytes times vLLM's per-layer
            # k_scale / v_scale, so those scales are the contract's (kv_scale, default 1.0,
            # vLLM's own default; register_kv_caches checks them against the model's).
            c = E.engine_contract("vllm", self.model_name, self.weights, self.shape, self.block_tokens,
                                  tp_rank=rank, tp_size=self.tp_size, tier_format=self.tier_format, salt=salt,
                                  layout=self.page_layout, kv_scale=None if fp8_pages else self.kv_scale,
                                  page_scales=self.kv_scale if fp8_pages else None)
            self._contracts[key] = c
        return c

    # ==== scheduler side =================================================================

    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> Tuple[Optional[int], bool]:
        tokens = list(request.prompt_token_ids or [])
        salt = getattr(request, "cache_salt", None)
        st = _ReqState(tokens=tokens, salt=salt, local_tokens=num_computed_tokens)
        self._reqs[request.request_id] = st
        bt = self.block_tokens
        # Every full block counts, the one holding the last prompt token too; vLLM computes
        # that token again for its logits, so the tokens answered stop one short of the prompt.
        hit = len(tokens) // bt
        if hit == 0:
            return 0, False
        for rank in self._ranks:
            contract = self._contract(salt, rank)
            hit = min(hit, self.io.lookup(contract, E.block_keys(contract.id(), tokens[:hit * bt], bt)))
            if hit == 0:
                break
        st.hit_blocks = hit
        st.saved_upto = hit
        ext = min(hit * bt, len(tokens) - 1) - num_computed_tokens
        if ext <= 0:
            return 0, False
        if self.cost is not None and not self.cost.worth_loading(-(-ext // bt), ext):
            if self.cost.declined == 1:
                load_s, compute_s = self.cost.estimate(-(-ext // bt), ext)
                log.info("kvtier: a %d-token prefix is predicted to load in %.1f ms and compute in %.1f ms; vLLM "
                         "computes it (and every hit predicted slower to load than to compute, loading every %dth "
                         "to measure again)", ext, load_s * 1e3, compute_s * 1e3, self.cost.probe_every)
            return 0, False
        return ext, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int):
        st = self._reqs.get(request.request_id)
        if st is None:
            return
        st.block_ids = list(blocks.get_block_ids()[0])
        st.load_tokens = num_external_tokens
        if num_external_tokens > 0:
            bt = self.block_tokens
            first = st.local_tokens // bt
            # up to the block holding the last token answered: whole where the prompt ends
            # on a block's edge (vLLM overwrites its last slot when it computes that token)
            last = min(-(-(st.local_tokens + num_external_tokens) // bt), st.hit_blocks)
            self._loads.append(_Transfer(request.request_id, st.salt, st.tokens[:last * bt], first,
                                         st.block_ids[first:last]))

    def build_connector_meta(self, scheduler_output) -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata(loads=self._loads,
                                       preempted=set(getattr(scheduler_output, "preempted_req_ids", None) or ()),
                                       step_tokens=int(getattr(scheduler_output, "total_num_scheduled_tokens", 0)))
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
                self._saving.add(rid)
        return meta

    def update_connector_output(self, connector_output) -> None:
        m = getattr(connector_output, "kv_connector_worker_meta", None)
        if self.cost is None or not isinstance(m, KvtierWorkerMetadata):
            return
        for seconds, blocks in m.loads:
            self.cost.add_load(seconds, blocks)
        for seconds, tokens in m.steps:
            self.cost.add_step(seconds, tokens)
        if not self._measured and self.cost.loads_seen and self.cost.steps_seen:
            # One line when both sides are first measured: the rule is live, at these rates.
            self._measured = True
            b, t = self.cost.latest()
            log.info("kvtier: load or compute: the workers' first measurements: a block loaded in %.3f ms, a token "
                     "computed in %.3f ms; a hit predicted slower to load than to compute is left to vLLM once each "
                     "side has %d", b * 1e3, t * 1e3, self.cost.min_samples)

    def request_finished(self, request, block_ids: List[int]) -> Tuple[bool, Optional[Dict[str, Any]]]:
        # A request that had a save in any step keeps its blocks until every worker says
        # (get_finished, finished_sending) that its saves have copied out of them. The rule
        # is the metadata's, so the scheduler and every worker agree on it without asking:
        # a worker reports exactly the finished requests it was handed saves for.
        self._reqs.pop(request.request_id, None)
        if request.request_id in self._saving:
            self._saving.discard(request.request_id)
            return True, None
        return False, None

    # ==== worker side ====================================================================

    def register_kv_caches(self, kv_caches: Dict[str, torch.Tensor]):
        names = sorted(kv_caches, key=_layer_index)
        layers = [kv_caches[n] for n in names]
        s = self.shape
        if len(layers) != s.num_layers:
            raise E.UnsupportedEngineModel(f"KvtierConnector: vLLM hands {len(layers)} KV caches for a model of "
                                           f"{s.num_layers} layers")
        if s.dtype == "fp8_e4m3":
            self._check_scales(names, self._layer_scales(names))
        self._mover = self._make_mover(names, layers, self._backend_kind(names))
        self._kv_layers = layers
        log.info("KvtierConnector: %d KV caches of %s blocks registered (%s, %s)", len(layers), self._mover.layout.num_blocks,
                 self._mover.layout.kind, self._mover.layout.order)

    def _attention_layers(self) -> Dict[str, Any]:
        """vLLM's attention layers by KV cache name (its static forward context), or {}."""
        return getattr(getattr(getattr(self, "_vllm_config", None), "compilation_config", None),
                       "static_forward_context", None) or {}

    def _layer_scales(self, names: Sequence[str]) -> Optional[List[Tuple[float, float]]]:
        """vLLM's (k_scale, v_scale) of each attention layer (the model's, loaded with its
        weights), or None where vLLM does not show them."""
        ctx = self._attention_layers()
        out = []
        for n in names:
            layer = ctx.get(n)
            if layer is None or not hasattr(layer, "_k_scale_float"):
                return None
            out.append((float(layer._k_scale_float), float(layer._v_scale_float)))
        return out

    def _check_scales(self, names: Sequence[str], scales: Optional[Sequence[Tuple[float, float]]]):
        """Refuses FP8 pages whose vLLM scales are not the contract's (kv_scale)."""
        if scales is None:
            raise E.UnsupportedEngineModel("KvtierConnector: cannot read vLLM's k_scale / v_scale of the FP8 KV "
                                           "cache's layers, so its blocks' meaning is unknown")
        c = self._contract(None, self.tp_rank)
        for l, (n, (k, v)) in enumerate(zip(names, scales)):
            want = (c.k_scales[l], c.v_scales[l])
            if (ctypes.c_float(k).value, ctypes.c_float(v).value) != want:
                raise E.UnsupportedEngineModel(
                    f"KvtierConnector: FP8 KV cache {n} has vLLM k_scale {k} / v_scale {v}, the contract says "
                    f"{want[0]} / {want[1]}: set kv_connector_extra_config kv_scale to the model's scales "
                    "(a number, one per layer, or {\"k\": [...], \"v\": [...]})")

    def _backend_kind(self, names: Sequence[str]) -> Optional[str]:
        """The kvtier.pages kind vLLM's attention backend names (None: tell it by the shape)."""
        ctx = self._attention_layers()
        layer = ctx.get(names[0]) if names else None
        backend = getattr(layer, "attn_backend", None)
        name = str(backend.get_name()) if backend is not None and hasattr(backend, "get_name") else ""
        if name.startswith("FLASHINFER"):
            return "flashinfer"
        return None

    def _page_kind(self, kv: torch.Tensor, hint: Optional[str]) -> str:
        """Which layout a layer's KV tensor is in: vLLM CPU's (4 dims) on the CPU platform;
        on CUDA vLLM 0.32's (4 dims, kind vllm_cuda), or the earlier flash_attn (2, NB, ...)
        or flashinfer (NB, 2, ...)."""
        if not self.page_layout.startswith("cuda"):
            return PAGE_KIND
        if kv.dim() == 4:
            # vLLM 0.32's CUDA backends (flash_attn.py forward: "(B, H, N, 2*D) -> ((B, N, H,
            # D), (B, N, H, D))") split each (block, head, token) row into its K half and its
            # V half, in any stride order (vllm/v1/kv_cache_layout.py): not the CPU backend's
            # reading of the same shape, so the platform decides, not the shape.
            return "vllm_cuda"
        if kv.dim() != 5:
            raise P.PagesError(f"a CUDA backend's KV cache has 4 or 5 dims, got {tuple(kv.shape)}")
        if hint is not None:
            return hint
        first, second = kv.shape[0] == 2, kv.shape[1] == 2
        if first and not second:
            return "flash_attn"
        if second and not first:
            return "flashinfer"
        raise P.PagesError(f"cannot tell (2, num_blocks, ...) from (num_blocks, 2, ...) in {tuple(kv.shape)}")

    def _make_mover(self, names: Sequence[str], layers: Sequence[torch.Tensor], hint: Optional[str] = None
                    ) -> P.BlockMover:
        """The BlockMover between vLLM's pages and this rank's kvtier blocks; refuses pages
        of another shape, dtype or layout, and a block size that is not the contract's."""
        s = self.shape
        fp8 = s.dtype == "fp8_e4m3"
        kv_name = "fp8" if fp8 else "bfloat16"
        ok_dtypes = (torch.uint8, torch.float8_e4m3fn) if fp8 else (torch.bfloat16,)
        if self.page_layout.startswith("cuda"):
            want = (f"vLLM CUDA's {kv_name} pages (num_blocks, {s.num_kv_heads}, {self.block_tokens}, "
                    f"{2 * s.head_dim}) in any stride order (vLLM 0.32), or (2, num_blocks, {self.block_tokens}, "
                    f"{s.num_kv_heads}, {s.head_dim}) or (num_blocks, 2, ...), NHD or HND")
        else:
            want = (f"vLLM CPU's {kv_name} pages (num_blocks, {s.num_kv_heads}, {self.block_tokens}, "
                    f"{2 * s.head_dim})")
        for n, kv in zip(names, layers):
            if kv.dtype not in ok_dtypes:
                raise E.UnsupportedEngineModel(f"KvtierConnector: KV cache {n} is {tuple(kv.shape)} {kv.dtype} on "
                                               f"{kv.device}; this engine's contract takes {want}")
        try:
            kind = self._page_kind(layers[0], hint)
            lay = P.describe(layers[0], kind, kv_name, s.num_kv_heads, s.head_dim)
            if lay.block_tokens != self.block_tokens:
                raise P.PagesError(f"{lay.block_tokens}-token blocks, the contract's are {self.block_tokens}")
            c = self._contract(None, self.tp_rank)
            mover = P.BlockMover(layers, lay, MOVER_MODES[self.tier_format], c.k_scales, c.v_scales, P.MAX6)
        except P.PagesError as e:
            raise E.UnsupportedEngineModel(f"KvtierConnector: KV cache {names[0]} {tuple(layers[0].shape)}: {e}; "
                                           f"this engine's contract takes {want}") from None
        if mover.block_bytes != c.block_bytes():
            raise E.UnsupportedEngineModel(f"KvtierConnector: a block is {mover.block_bytes} bytes from the pages, "
                                           f"{c.block_bytes()} in the contract")
        return mover

    # ---- background saves --------------------------------------------------------------
    #
    # wait_for_save hands each request's new full blocks to one save thread and returns, so
    # the next step's forward runs while they are copied out of vLLM's pages and committed.
    # What makes that safe: a block a save reads is a full block of a live request, which
    # vLLM never writes again, and its pages go back to vLLM's pool only
    #  - when the request finishes: request_finished delays the free (True) for a request
    #    with any save, and get_finished reports it in finished_sending only once every
    #    save of it has copied its blocks out (the commit to kvtierd may still be running;
    #    it reads the staging slot, not vLLM's pages);
    #  - when vLLM preempts it: the blocks are freed at once, so handle_preemptions (before
    #    the step's forward and loads) waits until that request's saves have copied.
    # One thread keeps a request's saves (and their chain's parents) in order.

    def _init_saver(self):
        self._state = threading.Condition()  # guards the three below
        self._copying: Dict[str, int] = {}   # request -> saves not yet copied out of the pages
        self._saving_reqs: Set[str] = set()  # requests handed a save, not yet finished
        self._finishing: Set[str] = set()    # finished requests whose saves are still copying
        self._pool: Optional[ThreadPoolExecutor] = None

    def _submit_save(self, tr: _Transfer):
        with self._state:
            self._copying[tr.req_id] = self._copying.get(tr.req_id, 0) + 1
            self._saving_reqs.add(tr.req_id)
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-save")
        self._pool.submit(self._save_job, tr)

    def _save_job(self, tr: _Transfer):
        copied = []

        def done_copying():
            if not copied:
                copied.append(True)
                with self._state:
                    left = self._copying.get(tr.req_id, 0) - 1
                    if left > 0:
                        self._copying[tr.req_id] = left
                    else:
                        self._copying.pop(tr.req_id, None)
                    self._state.notify_all()
        try:
            self._save(tr, done_copying)
        except Exception as e:  # never let a save take the engine down
            self.link.warn_once(("save", type(e).__name__), "kvtier: save failed (%s: %s); those blocks are not "
                                "cached", type(e).__name__, e)
        finally:
            done_copying()

    def _wait_copied(self, req_ids) -> None:
        with self._state:
            self._state.wait_for(lambda: not any(r in self._copying for r in req_ids))

    def drain_saves(self, timeout_s: Optional[float] = None) -> bool:
        """Waits until every save handed to the save thread so far has ended (copied and
        committed, or failed); False when timeout_s passed first."""
        if self._pool is None:
            return True
        fut = self._pool.submit(lambda: None)
        try:
            fut.result(timeout_s)
            return True
        except Exception:
            return False

    # ---- worker hooks --------------------------------------------------------------------

    def handle_preemptions(self, kv_connector_metadata) -> None:
        if isinstance(kv_connector_metadata, KvtierConnectorMetadata) and kv_connector_metadata.preempted:
            self._wait_copied(kv_connector_metadata.preempted)

    def bind_connector_metadata(self, connector_metadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        # The step starts here (vLLM binds before the forward and calls wait_for_save after
        # it); the scheduler's LoadCost leaves out steps too small to say what a token costs.
        if self._clock is not None and isinstance(connector_metadata, KvtierConnectorMetadata):
            self._clock.begin(connector_metadata.step_tokens)

    def build_connector_worker_meta(self):
        return self._clock.harvest() if self._clock is not None else None

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
        t0 = self._clock.mark() if self._clock is not None else None
        done = 0
        if self._mover is not None:
            contract = self._contract(tr.salt, self.tp_rank)
            keys = E.block_keys(contract.id(), tr.tokens, self.block_tokens)[tr.first:tr.first + n]

            def read(rows, i, m):
                # The mover checks every NVFP4 block's scales before decoding it; on a refused
                # block (CorruptBlocksError) the whole chunk and what follows count as load
                # errors, so vLLM recomputes them all.
                try:
                    self._mover.load(rows, tr.block_ids[i:i + m])
                except P.PagesError as e:
                    self.link.warn_once(("load", "corrupt"), "kvtier: a loaded block is refused (%s); vLLM "
                                        "recomputes the blocks", e)
                    return 0
                return m
            done = self.io.load(contract, keys, read)
        if done < n:
            # Every block after the first one missing is recomputed (vLLM recomputes from the
            # first invalid block of a request).
            self._load_errors.update(tr.block_ids[done:])
        elif t0 is not None:
            self._clock.load(t0, n)  # a complete load: its time per block is the tier's

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # start_load_kv loads every layer before the forward

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata, **kwargs) -> None:
        return  # saved whole after the step, on the save thread (wait_for_save)

    def wait_for_save(self):
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvtierConnectorMetadata):
            return
        if self._clock is not None:
            self._clock.end()
        for tr in meta.saves:
            self._submit_save(tr)

    def get_finished(self, finished_req_ids: Set[str]) -> Tuple[Optional[Set[str]], Optional[Set[str]]]:
        with self._state:
            for rid in finished_req_ids:
                if rid in self._saving_reqs:
                    self._saving_reqs.discard(rid)
                    self._finishing.add(rid)
            done = {rid for rid in self._finishing if rid not in self._copying}
            self._finishing -= done
        return (done or None), None

    def _save(self, tr: _Transfer, copied=lambda: None):
        """Copies tr's blocks out of vLLM's pages into staging slots and commits them (the
        engine core's chunked save); calls copied() once the last page was read (before the
        last commit)."""
        n = len(tr.block_ids)
        if n == 0 or self._mover is None:
            return
        contract = self._contract(tr.salt, self.tp_rank)
        chain = E.block_keys(contract.id(), tr.tokens, self.block_tokens)
        keys = chain[tr.first:tr.first + n]
        parent = chain[tr.first - 1] if tr.first > 0 else None

        def write(rows, i, m):
            self._mover.save(tr.block_ids[i:i + m], rows)
        try:
            self.io.save(contract, keys, write, parent, copied)
        except P.PagesError as e:
            self.link.warn_once(("save", "pages"), "kvtier: save refused (%s); those blocks are not cached", e)

    @property
    def saved_blocks(self) -> int:
        return self.io.saved_blocks

    @property
    def loaded_blocks(self) -> int:
        return self.io.loaded_blocks

    def get_block_ids_with_load_errors(self) -> set:
        errs, self._load_errors = self._load_errors, set()
        return errs

    def shutdown(self):
        if self.cost is not None:
            b, t = self.cost.seconds_per_block(), self.cost.seconds_per_token()
            log.info("kvtier: load or compute: %d loads and %d steps measured; %d hits left to vLLM to compute (%d "
                     "of them loaded anyway to measure again); a block loads in %s, a token computes in %s (medians)",
                     self.cost.loads_seen, self.cost.steps_seen, self.cost.declined, self.cost.probes,
                     "-" if b is None else f"{b * 1e3:.3f} ms", "-" if t is None else f"{t * 1e3:.3f} ms")
        if self._pool is not None:
            self.drain_saves(10.0)
            self._pool.shutdown(wait=False)
        self.link.close()
