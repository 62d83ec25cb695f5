"""kvtier under Hugging Face transformers: a ``Cache`` whose K/V live in kvtierd's HBM slots
and an attention implementation ("kvtier") that decodes straight from those pages.

    import kvtier, kvtier.transformers as kt
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda")
    kt.use_kvtier(model)                        # attn_implementation = "kvtier"
    link = kt.attach()                          # $KVTIER_SOCKET, else the shipped config's socket
    cache = kt.prefix_cache(model, link, input_ids, attention_mask, max_new_tokens=64)
    out = model.generate(input_ids, attention_mask=attention_mask, past_key_values=cache,
                         max_new_tokens=64)    # computes only what was not cached
    cache.commit(out)                           # the full blocks of prompt + output
    cache.release()

What each piece does:

- :func:`prefix_cache` hashes every row's real tokens (left padding is skipped) into the
  contract's key chain, acquires the longest cached prefix of each row into HBM (one
  acquire per row; the daemon promotes from host or NVMe), allocates HBM slots for the
  rest of the prompt and the new tokens, and returns a :class:`KvtierCache` that already
  holds the prefix. ``generate`` then feeds only the columns after the common cached
  prefix. The last prompt token is always computed (its logits start the generation).
- :class:`KvtierCache` writes each layer's new K/V into the pages with
  ``torch.ops.kvtier.quantize_append`` (NVFP4, FP8 or BF16 pages, chosen per cache). It
  keeps no dense copy of the cache: decode steps run ``torch.ops.kvtier.decode`` (the fused
  paged decode) over the block table; prefill attends to the cached prefix (dequantized
  per layer, then dropped) plus the new tokens with torch's SDPA.
- The scale contract comes from the model (:func:`contract_for`): the engine core's model
  id rule (``transformers:<checkpoint>@<model class>``), layers, KV heads, head_dim, block
  tokens, format, per-layer global scales (:func:`calibrate`) and the model's identity
  (:func:`model_identity`: the engine core's hash of the checkpoint folder's files, or a
  fingerprint of the weights). The same model gives the same contract id in every
  process; blocks of another model are never used.
- kvtierd down (:func:`attach`'s link, the engine core's outage policy): :func:`prefix_cache`
  returns a :class:`RecomputeCache` (a transformers ``DynamicCache`` that loads and stores
  nothing) and selects SDPA attention on the model for that generate; one log line per
  outage; the next :func:`prefix_cache` that reaches the daemon selects kvtier's attention
  again. A daemon lost in the middle of a generate fails that generate (its K/V lived in
  the daemon's HBM); the next one recomputes.
- :class:`DecodeGraph` captures one decode step of the model over the cache in a CUDA
  graph and replays it (the kernels and the cache's bookkeeping are graph-safe).

What is refused, with the reason, by :func:`use_kvtier` (no page format serves the model)
or when the cache is made (the chosen format or block size is not served), before
anything is allocated: encoder-decoder models (cross-attention), sliding-window or other
non-full attention layers, attention logit soft-capping, multi-head latent attention, a
model whose attention modules do not call the attention interface once per layer (a probe
forward of 4 tokens records what the model really does, :func:`model_geometry`), dtypes
other than bf16, shapes outside the kernels' table (:func:`kvtier.kernels.decode_shapes`:
GQA group 1/2/4/8, head_dim 64/128, and 256 for NVFP4 pages, block tokens 16/32/64) and a
daemon without an HBM tier. Beam search and ``num_return_sequences > 1`` are refused when ``generate`` asks the
cache to reorder or repeat rows.
"""
from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
from typing import List, Optional, Sequence, Tuple

import numpy as np
import torch

import kvtier
from . import engine as E
from . import kernels as K
from . import torch_ops  # noqa: F401  (registers torch.ops.kvtier.*)

try:
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as e:  # pragma: no cover - reported to the caller
    raise ImportError(f"kvtier.transformers needs Hugging Face transformers >= 5: {e}") from e

ATTN_IMPLEMENTATION = "kvtier"
_log = logging.getLogger("kvtier.transformers")
FORMATS = ("nvfp4", "fp8", "bf16")
# 16-token blocks, vLLM's size: a prompt is reused in 16-token steps, and at (32K, batch 8)
# on an H200 the NVFP4 decode's long-context share is 1.29-1.31x its bytes (bench/README.md,
# "transformers"). 32 and 64 are served too (block_tokens=).
DEFAULT_BLOCK_TOKENS = 16


class UnsupportedModel(ValueError):
    """The model (or its configuration) cannot be served from kvtier's pages; the message
    names the reason. Raised before anything is allocated."""


# ---- model checks --------------------------------------------------------------------------

def _text_config(model):
    cfg = model.config
    get = getattr(cfg, "get_text_config", None)
    return get(decoder=True) if get is not None else cfg


_PROBE = "kvtier_probe"
# Arguments of the attention interface that change its result and that kvtier's decode
# does not take: attention sinks (GPT-OSS's s_aux), additive position biases.
_UNSERVED_KWARGS = ("s_aux", "sinks", "position_bias", "alibi", "attn_bias", "head_mask")


def _unserved_kwargs(module, kwargs) -> List[str]:
    """What an attention call asks for that kvtier's decode cannot honour."""
    out = [k for k in _UNSERVED_KWARGS if kwargs.get(k) is not None]
    if kwargs.get("is_causal", getattr(module, "is_causal", True)) is False:
        out.append("is_causal=False")
    return out


def _probe_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function of the probe forward: records what the model hands the attention
    interface, then computes transformers' own sdpa attention."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    calls = getattr(_tls, "probe", None)
    if calls is not None:
        calls.append({"layer": getattr(module, "layer_idx", None), "q": tuple(query.shape), "k": tuple(key.shape),
                      "v": tuple(value.shape), "sliding_window": kwargs.get("sliding_window"),
                      "softcap": kwargs.get("softcap"), "module": type(module).__name__,
                      "unserved": _unserved_kwargs(module, kwargs)})
    return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                  **kwargs)


@torch.no_grad()
def _probe_calls(model) -> list:
    """What the attention interface sees in one forward of 4 tokens with the attention
    implementation switched to a recording one (cached on the model). Empty when the
    model's attention does not go through the interface (transformers then leaves the
    implementation as it was, and the recorder is never called)."""
    cached = getattr(model, "_kvtier_probe", None)
    if cached is not None:
        return cached
    impl = model.config._attn_implementation
    vocab = int(getattr(_text_config(model), "vocab_size", 0) or 0)
    ids = (torch.arange(4, device=model.device) % max(vocab, 1)).unsqueeze(0)
    calls = []
    _tls.probe = calls
    try:
        model.set_attn_implementation(_PROBE)
        if model.config._attn_implementation == _PROBE:
            try:
                model(input_ids=ids, use_cache=False)
            except Exception as e:
                raise UnsupportedModel(f"{type(model).__name__}: a probe forward of 4 tokens failed, so what its "
                                       f"attention does is unknown: {type(e).__name__}: {e}") from e
    finally:
        _tls.probe = None
        if model.config._attn_implementation != impl:
            model.set_attn_implementation(impl)
    model._kvtier_probe = calls
    return calls


def _probed_geometry(model, name: str, layers: int) -> Tuple[int, int, int]:
    """(query heads, KV heads, head_dim) as the model's attention modules hand them to the
    attention interface in a probe forward; raises UnsupportedModel when what they do
    cannot be served from kvtier's pages."""
    calls = _probe_calls(model)
    if not calls:
        raise UnsupportedModel(f"{name}: its attention does not go through transformers' attention interface (a "
                               "probe forward never called the registered attention function)")
    seen = [c["layer"] for c in calls]
    if any(x is None for x in seen):
        mods = sorted({c["module"] for c in calls if c["layer"] is None})
        raise UnsupportedModel(f"{name}: attention modules {mods} have no layer_idx, so their K/V cannot be "
                               "placed in a layer's pages")
    if sorted(seen) != list(range(layers)):
        raise UnsupportedModel(f"{name}: a probe forward called the attention interface for layers {sorted(seen)}, "
                               f"not once for each of its {layers} layers (cross-attention, shared or skipped "
                               "layers are not supported)")
    for c in calls:
        if c["unserved"]:
            raise UnsupportedModel(f"{name}: layer {c['layer']}'s attention takes {c['unserved']}, which kvtier's "
                                   "decode does not apply")
        if c["softcap"] is not None:
            raise UnsupportedModel(f"{name}: attention logit soft-capping ({c['softcap']}) is not supported by "
                                   "kvtier's decode")
        if c["sliding_window"] is not None:
            raise UnsupportedModel(f"{name}: layer {c['layer']} uses sliding-window attention (window "
                                   f"{c['sliding_window']}); every layer must be full attention")
    shapes = {(c["q"][1], c["k"][1], c["q"][3], c["k"][3], c["v"][1], c["v"][3]) for c in calls}
    if len(shapes) != 1:
        raise UnsupportedModel(f"{name}: its layers differ in heads or head_dim ({sorted(shapes)}); kvtier's pages "
                               "have one geometry for every layer")
    hq, hk, dq, dk, hv, dv = shapes.pop()
    if not (dq == dk == dv) or hk != hv:
        raise UnsupportedModel(f"{name}: queries, keys and values differ in head_dim or heads (q {hq}x{dq}, "
                               f"k {hk}x{dk}, v {hv}x{dv}); kvtier's decode takes one head_dim for all three")
    if hq % hk:
        raise UnsupportedModel(f"{name}: {hq} query heads are not a multiple of its {hk} KV heads")
    return hq, hk, dq


def _decode_reasons(head_dim: int, group: int, block_tokens: Sequence[int] = (), fmt: Optional[str] = None) -> str:
    """'' when the kernels' decode serves (head_dim, group) for some block size (or for
    `fmt` and each of `block_tokens`, when given); else the kernels' reasons."""
    if fmt is not None:
        reasons = [K.decode_unsupported(K.FORMAT_BY_NAME[fmt], head_dim, group, t) for t in block_tokens]
        return "; ".join(r for r in reasons if r)
    if any(d == head_dim and g == group for _, d, g, _ in K.decode_shapes()):
        return ""
    reasons = {K.decode_unsupported(f, head_dim, group, DEFAULT_BLOCK_TOKENS) for f in K.FORMAT_NAMES}
    return "; ".join(sorted(r for r in reasons if r))


def model_geometry(model) -> Tuple[int, int, int, int]:
    """(layers, query heads, KV heads, head_dim) of a decoder the kernels can serve in some
    page format; raises UnsupportedModel naming the first reason it cannot.

    What the model does decides: a probe forward (4 tokens, cached on the model) records
    each call of the attention interface, and every layer must call it once, with full
    attention (no window, no soft-capping) and one geometry that the kernels' table
    (:func:`kvtier.kernels.decode_shapes`) serves."""
    cfg = _text_config(model)
    name = type(model).__name__
    if getattr(model.config, "is_encoder_decoder", False):
        raise UnsupportedModel(f"{name}: encoder-decoder models (cross-attention) are not supported")
    if getattr(cfg, "kv_lora_rank", None) or getattr(cfg, "q_lora_rank", None):
        raise UnsupportedModel(f"{name}: multi-head latent attention (MLA) is not supported")
    if getattr(cfg, "attn_logit_softcapping", None):
        raise UnsupportedModel(f"{name}: attention logit soft-capping "
                               f"({cfg.attn_logit_softcapping}) is not supported by kvtier's decode")
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types and any(t != "full_attention" for t in layer_types):
        kinds = sorted(set(layer_types) - {"full_attention"})
        raise UnsupportedModel(f"{name}: layers of type {kinds} (sliding-window or other non-full attention) are "
                               "not supported; every layer must be full attention")
    layers = int(cfg.num_hidden_layers)
    heads, kv_heads, head_dim = _probed_geometry(model, name, layers)
    why = _decode_reasons(head_dim, heads // kv_heads)
    if why:
        raise UnsupportedModel(f"{name}: {heads} query heads over {kv_heads} KV heads of head_dim {head_dim} are not "
                               f"served by kvtier's decode in any page format ({why})")
    return layers, heads, kv_heads, head_dim


def check_format(model, kv_format: str, block_tokens: int = DEFAULT_BLOCK_TOKENS) -> None:
    """Raises UnsupportedModel, with the kernels' reason, unless their decode serves
    `model` with `kv_format` pages of `block_tokens`-token blocks."""
    _, heads, kv_heads, head_dim = model_geometry(model)
    if kv_format not in FORMATS:
        raise ValueError(f"kv_format {kv_format!r} is not one of {FORMATS}")
    why = _decode_reasons(head_dim, heads // kv_heads, (block_tokens,), kv_format)
    if why:
        raise UnsupportedModel(f"{type(model).__name__} with {kv_format} pages of {block_tokens}-token blocks: {why}")


def use_kvtier(model):
    """Selects kvtier's attention for `model` (checks it first); returns the model."""
    model_geometry(model)
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


# ---- identity, scales, contract --------------------------------------------------------------

def model_identity(model) -> str:
    """A string that names the weights: for a model loaded from a checkpoint folder, a SHA-256
    of its config and weight files; otherwise a fingerprint of the parameters (name, shape,
    dtype and float64 sums of a fixed sample of each). Cached on the model."""
    cached = getattr(model, "_kvtier_identity", None)
    if cached:
        return cached
    path = getattr(model.config, "_name_or_path", "") or getattr(model, "name_or_path", "")
    files = []
    if path and os.path.isdir(path):
        files = sorted(f for f in os.listdir(path)
                       if f == "config.json" or f.endswith(".safetensors") or f.endswith(".bin"))
    if any(f != "config.json" for f in files):
        ident = E.folder_identity(path)  # the rule of every engine (kvtier.engine)
    else:
        h = hashlib.sha256()
        with torch.no_grad():
            for name, p in sorted(model.named_parameters(), key=lambda x: x[0]):
                flat = p.detach().reshape(-1)
                step = max(1, flat.numel() // 4096)
                sample = flat[::step].double()
                h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:".encode())
                h.update(np.float64(sample.sum().item()).tobytes() + np.float64((sample * sample).sum().item()).tobytes())
        ident = "weights:" + h.hexdigest()[:32]
    model._kvtier_identity = ident
    return ident


def _pow2_scale(amax: float, top: float) -> float:
    """The smallest power of two >= amax / top: a global scale that keeps every block scale
    in E4M3's normal range and is the same in every process for the same weights (small
    run-to-run differences in amax do not move it)."""
    if not math.isfinite(amax) or amax <= 0:
        return 1.0
    return float(2.0 ** math.ceil(math.log2(amax / top)))


@torch.no_grad()
def calibrate(model, kv_format: str, input_ids: Optional[torch.Tensor] = None, tokens: int = 1024,
              seed: int = 7) -> Tuple[List[float], List[float]]:
    """Per-layer K and V global scales for an NVFP4 or FP8 cache (1.0 for BF16): the K/V
    amax of one forward over `input_ids` (or a deterministic pseudo-random prompt of
    `tokens` ids), rounded up to a power of two (see _pow2_scale)."""
    layers, _, _, _ = model_geometry(model)
    if kv_format == "bf16":
        return [1.0] * layers, [1.0] * layers
    if kv_format not in FORMATS:
        raise ValueError(f"kv_format {kv_format!r} is not one of {FORMATS}")
    from transformers import DynamicCache
    if input_ids is None:
        vocab = _text_config(model).vocab_size
        g = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(0, vocab, (1, tokens), generator=g)
    input_ids = input_ids.to(model.device)
    dc = DynamicCache(config=model.config)
    impl = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        model(input_ids=input_ids, past_key_values=dc, use_cache=True, logits_to_keep=1)
    finally:
        model.set_attn_implementation(impl)
    top = K.E4M3_MAX * (K.E2M1_MAX if kv_format == "nvfp4" else 1.0)
    ks = [_pow2_scale(float(layer.keys.float().abs().max()), top) for layer in dc.layers]
    vs = [_pow2_scale(float(layer.values.float().abs().max()), top) for layer in dc.layers]
    return ks, vs


def contract_for(model, kv_format: str = "nvfp4", block_tokens: int = DEFAULT_BLOCK_TOKENS, scale_rule: str = "max6",
                 k_scales: Optional[Sequence[float]] = None, v_scales: Optional[Sequence[float]] = None,
                 model_id: Optional[str] = None) -> kvtier.Contract:
    """The scale contract of `model`'s KV blocks in `kv_format`. Scales default to
    :func:`calibrate`'s. model_id defaults to the checkpoint name."""
    layers, _, kv_heads, head_dim = model_geometry(model)
    check_format(model, kv_format, block_tokens)
    if kv_format == "bf16":
        k_scales = v_scales = [1.0] * layers
    elif k_scales is None or v_scales is None:
        k_scales, v_scales = calibrate(model, kv_format)
    name = model_id or getattr(model.config, "_name_or_path", "") or type(model).__name__
    return kvtier.Contract(model_id=E.model_id("transformers", name, layout=type(model).__name__),
                           model_revision=model_identity(model), tokenizer_revision="",
                           num_layers=layers, num_kv_heads=kv_heads, head_dim=head_dim, block_tokens=block_tokens,
                           kv_format=kv_format, scale_rule=scale_rule,
                           k_scales=[float(x) for x in k_scales], v_scales=[float(x) for x in v_scales])


# ---- the cache -----------------------------------------------------------------------------

def _ops():
    """The kernels through torch's dispatcher while torch.compile traces (so it sees them as
    ops), and called directly otherwise (the dispatch costs ~30 us a call, x3 per layer)."""
    if torch.compiler.is_compiling():
        return torch.ops.kvtier.quantize_append, torch.ops.kvtier.decode, torch.ops.kvtier.dequantize_pages
    return torch_ops.quantize_append_impl, torch_ops.decode_impl, torch_ops.dequantize_pages_impl


_CHUNK = 16384  # keys or slots per request (well under the daemon's max_keys_per_request)
_tls = threading.local()  # the cache whose layer ran `update` last (read by the attention)


class _Plan:
    """What one forward writes and reads, made at layer 0's update and used by every layer."""
    __slots__ = ("decode", "slots", "offs", "seq", "src_b", "src_j", "rows", "prefix")


class KvtierLayer(CacheLayerMixin):
    """One layer of a KvtierCache: holds no tensors (the pages are in the daemon's arena)."""

    is_compileable = False
    is_sliding = False
    is_croppable = False

    def __init__(self, cache: "KvtierCache", layer_idx: int):
        super().__init__()
        self.cache, self.layer_idx = cache, layer_idx
        self.is_initialized = True

    def lazy_initialization(self, key_states, value_states):
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return self.cache._update(self.layer_idx, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> Tuple[int, int]:
        return self.cache._columns + query_length, 0

    def get_seq_length(self) -> int:
        return self.cache._columns

    def get_max_length(self) -> int:
        return -1

    def reset(self):
        raise NotImplementedError("a KvtierCache cannot be reset: make a new one (prefix_cache)")

    def reorder_cache(self, beam_idx):
        raise NotImplementedError("kvtier's cache does not support beam search (num_beams > 1): its rows are "
                                  "block tables of daemon-owned slots; use greedy or sampled generation")

    def crop(self, tokens_to_remove: int):
        if tokens_to_remove != 0:
            raise NotImplementedError("kvtier's cache cannot crop (assisted generation is not supported)")

    def batch_repeat_interleave(self, repeats: int):
        if repeats != 1:
            raise NotImplementedError("kvtier's cache does not support num_return_sequences > 1 or beam search")

    def batch_select_indices(self, indices):
        raise NotImplementedError("kvtier's cache does not support selecting batch rows")

    def offload(self):
        pass

    def prefetch(self):
        pass


class KvtierCache(Cache):
    """A transformers Cache over kvtierd's HBM slots (see the module docstring).

    Made by :func:`prefix_cache`. Rows are the batch rows of `input_ids`; each row has a
    block table (acquired prefix blocks, then allocated blocks) and a length (tokens whose
    K/V are in the pages). Left padding is never stored. Holds two kinds of leases: the
    acquire of each row's cached prefix (read-only blocks) and one alloc for the rest;
    :meth:`commit` publishes the full new blocks and :meth:`release` gives everything back
    (also on close of the context manager)."""

    def __init__(self, model, client: kvtier.Client, contract: kvtier.Contract, scale_rule: str = "max6"):
        self.layers_count, self.q_heads, self.kv_heads, self.head_dim = model_geometry(model)
        dtype = next(model.parameters()).dtype
        if dtype != torch.bfloat16:
            raise UnsupportedModel(f"model dtype {dtype}: kvtier's decode takes bf16 queries; load the model with "
                                   "dtype=torch.bfloat16")
        if contract.num_layers != self.layers_count or contract.num_kv_heads != self.kv_heads or \
                contract.head_dim != self.head_dim:
            raise UnsupportedModel(f"contract {contract.model_id} ({contract.num_layers} layers x "
                                   f"{contract.num_kv_heads} KV heads x {contract.head_dim}) does not describe this "
                                   f"model ({self.layers_count} x {self.kv_heads} x {self.head_dim})")
        if contract.model_revision != model_identity(model):
            raise UnsupportedModel(f"contract {contract.model_id} names weights {contract.model_revision}, but this "
                                   f"model's weights are {model_identity(model)}: another model's blocks are never "
                                   "used")
        if contract.kv_format not in FORMATS:
            raise UnsupportedModel(f"contract {contract.model_id}: kv_format {contract.kv_format!r} is not one of "
                                   f"{FORMATS}")
        check_format(model, contract.kv_format, int(contract.block_tokens))
        super().__init__(layers=[KvtierLayer(self, i) for i in range(self.layers_count)])
        self.client, self.contract = client, contract
        self.cid = client.register_contract(contract)
        self.T = contract.block_tokens
        self.fmt = K.FORMAT_BY_NAME[contract.kv_format]
        self.rule = {"max6": K.MAX6, "4over6": K.FOUR_OVER_SIX}[scale_rule]
        self.k_scales = [float(x) for x in (contract.k_scales or [1.0] * self.layers_count)]
        self.v_scales = [float(x) for x in (contract.v_scales or [1.0] * self.layers_count)]
        hbm = [s for s in client.stats() if s.tier == "hbm"]
        if not hbm or not hbm[0].present or hbm[0].slots_total == 0:
            raise UnsupportedModel("kvtierd has no HBM tier: kvtier's decode reads HBM slots; configure "
                                   "[tiers.hbm] and connect with has_gpu=True")
        # HBM slot s at base + s * granule (slots of several sizes share the arena; with one
        # the granule is slot_bytes): the kernels' pool stride and its ids.
        self.slot_bytes = client.hbm_granule or client.slot_bytes
        self.num_slots = client.hbm_arena_bytes // self.slot_bytes or hbm[0].slots_total
        base = client.hbm_device_ptr()
        self.arena = torch_ops.arena_tensor(base, self.slot_bytes * self.num_slots)
        pool = K.Pool(base, self.slot_bytes, self.num_slots, self.layers_count, self.kv_heads, self.head_dim,
                      self.T, self.fmt)
        K.check_pool(pool)
        self.geom = torch_ops.geometry(pool)
        self.device = torch.device("cuda", torch.cuda.current_device())
        self._leases: List[kvtier.Lease] = []   # acquires of cached prefixes
        self._allocs: List[kvtier.Lease] = []   # slots for the new tokens
        self._closed = False
        self._columns = 0           # columns transformers has fed (left padding included)
        self._plan: Optional[_Plan] = None

    # ---- setup (prefix_cache) ----------------------------------------------------------
    def _start(self, rows_tokens: List[np.ndarray], pads: List[int], max_new_tokens: int):
        B, T = len(rows_tokens), self.T
        self.batch = B
        self.pads = np.asarray(pads, dtype=np.int64)
        self.hit_blocks = [0] * B
        self.hit_tiers: List[List[str]] = [[] for _ in range(B)]
        tables: List[List[int]] = [[] for _ in range(B)]
        for b, toks in enumerate(rows_tokens):
            usable = (len(toks) - 1) // T  # the last prompt token is always computed
            if usable <= 0:
                continue
            keys = kvtier.key_chain_array(self.cid, toks[:usable * T], T)
            # One acquire per row; a prompt of more keys than one request may carry continues
            # while the previous chunk hit in full.
            for start in range(0, usable, _CHUNK):
                lease = self.client.acquire(self.cid, keys[start:min(usable, start + _CHUNK)], tier="hbm")
                ids = lease.slot_ids()
                if len(ids) == 0:
                    break
                self._leases.append(lease)
                if int((lease.tiers() != kvtier.TIER_HBM).sum()):
                    raise kvtier.KvtierError(6, "acquire returned slots outside HBM: the decode needs HBM slots")
                tables[b].extend(int(x) for x in ids)
                self.hit_tiers[b].extend(lease.from_tier_names())
                if len(ids) < min(_CHUNK, usable - start):
                    break
            self.hit_blocks[b] = len(tables[b])
        self.capacity = np.array([len(t) + max_new_tokens for t in rows_tokens], dtype=np.int64)
        need = [-(-self.capacity[b] // T) - self.hit_blocks[b] for b in range(B)]
        self._alloc_index = {}   # (row, block) -> (lease, index in that lease)
        todo = [(b, self.hit_blocks[b] + i) for b in range(B) for i in range(need[b])]
        for start in range(0, len(todo), _CHUNK):
            part = todo[start:start + _CHUNK]
            lease = self.client.alloc(self.cid, len(part), tier="hbm")
            self._allocs.append(lease)
            for i, ((b, blk), sid) in enumerate(zip(part, lease.slot_ids())):
                self._alloc_index[(b, blk)] = (lease, i)
                tables[b].append(int(sid))
        self.max_blocks = max(1, max(len(t) for t in tables))
        table = np.full((B, self.max_blocks), -1, dtype=np.int32)
        for b, t in enumerate(tables):
            table[b, :len(t)] = t
        self.tables = tables
        self.block_table = torch.from_numpy(table).to(self.device)
        self.lens_host = np.array([h * T for h in self.hit_blocks], dtype=np.int64)
        self.lens = torch.from_numpy(self.lens_host.astype(np.int32)).to(self.device)
        # transformers' view: every column before `_columns` is cached for every row.
        self._columns = int(min(p + h for p, h in zip(self.pads, self.lens_host)))
        self.max_seq_len = self.max_blocks * T
        self._decode_out = None
        self._workspace = None

    @property
    def cached_tokens(self) -> List[int]:
        """Per row: prompt tokens restored from the daemon (whole blocks)."""
        return [h * self.T for h in self.hit_blocks]

    # ---- per forward -------------------------------------------------------------------
    def _check_open(self):
        if self._closed:
            raise kvtier.KvtierError(6, "this KvtierCache was released; make a new one with prefix_cache()")

    def _make_plan(self, S: int) -> _Plan:
        self._check_open()
        B, T = self.batch, self.T
        plan = _Plan()
        c0 = self._columns
        if S == 1:
            # Decode: one real token per row, at position lens[b] (left padding puts the last
            # column of every row on a real token). Slots and offsets are computed on the
            # device so that a captured graph replays them.
            if not np.array_equal(self.lens_host, c0 - self.pads):
                raise kvtier.KvtierError(6, "a one-token forward must follow every row's last cached token")
            if np.any(self.lens_host + 1 > self.capacity):
                raise kvtier.KvtierError(2, f"a row outgrew the cache ({self.capacity.tolist()} tokens per row were "
                                         "allocated): pass a larger max_new_tokens to prefix_cache")
            plan.decode = True
            wpos = self.lens
            plan.slots = self.block_table.gather(1, (wpos // T).long().unsqueeze(1)).squeeze(1).contiguous()
            plan.offs = (wpos % T).contiguous()
            plan.seq = wpos + 1
            self.lens.copy_(plan.seq)
            self.lens_host += 1
            self._columns += 1
            return plan
        plan.decode = False
        plan.prefix = {}  # per row: the cached prefix's (slots, offsets), made by the first layer
        src_b, src_j, slots, offs, rows = [], [], [], [], []
        for b in range(B):
            pad = int(self.pads[b])
            j0 = max(0, pad - c0)                 # first real column of this forward
            p0 = c0 + j0 - pad                    # its position in the row
            n_q = S - j0
            if n_q <= 0:
                rows.append((0, 0, 0))
                continue
            p_end = p0 + n_q
            if p_end > self.capacity[b]:
                raise kvtier.KvtierError(2, f"row {b} needs {p_end} tokens, {self.capacity[b]} were allocated")
            if p0 > self.lens_host[b]:
                raise kvtier.KvtierError(6, f"row {b}: tokens [{self.lens_host[b]}, {p0}) were never written")
            j = np.arange(j0, S, dtype=np.int64)
            p = c0 + j - pad
            new = p >= self.lens_host[b]          # cached positions are not written again
            j, p = j[new], p[new]
            src_b.append(np.full(len(j), b, dtype=np.int64))
            src_j.append(j)
            slots.append(np.asarray(self.tables[b], dtype=np.int32)[p // T])
            offs.append((p % T).astype(np.int32))
            rows.append((j0, p0, n_q))
            self.lens_host[b] = max(self.lens_host[b], p_end)
        dev = self.device

        def cat(parts, dtype):
            return torch.from_numpy(np.concatenate(parts) if parts else np.zeros(0, dtype)).to(dev)
        plan.src_b, plan.src_j = cat(src_b, np.int64), cat(src_j, np.int64)
        plan.slots, plan.offs = cat(slots, np.int32), cat(offs, np.int32)
        plan.rows = rows
        plan.seq = None
        self.lens.copy_(torch.from_numpy(self.lens_host.astype(np.int32)))
        self._columns += S
        return plan

    def _update(self, layer: int, key_states: torch.Tensor, value_states: torch.Tensor):
        B, _, S, _ = key_states.shape
        if B != self.batch:
            raise NotImplementedError(f"the cache holds {self.batch} rows but the forward has {B}: kvtier's cache "
                                      "does not support beam search or num_return_sequences > 1")
        if layer == 0:
            self._plan = self._make_plan(S)
        plan = self._plan
        # Views as the model made them (quantize_append makes each contiguous on its own).
        if plan.decode:
            k = key_states.reshape(B, self.kv_heads, self.head_dim)
            v = value_states.reshape(B, self.kv_heads, self.head_dim)
        else:
            k = key_states.transpose(1, 2)[plan.src_b, plan.src_j]
            v = value_states.transpose(1, 2)[plan.src_b, plan.src_j]
        _ops()[0](self.arena, k, v, plan.slots, plan.offs, self.geom, layer, self.k_scales[layer],
                  self.v_scales[layer], self.rule)
        _tls.cache = self
        return key_states, value_states

    # ---- attention ---------------------------------------------------------------------
    def _decode_buffers(self, q):
        if self._decode_out is None or self._decode_out.shape != q.shape:
            self._decode_out = torch.empty_like(q)
            ws = torch_ops.decode_workspace_bytes(self.arena, self.geom, q, self._decode_out, self.block_table,
                                                  self.lens, self.max_seq_len)
            self._workspace = torch.empty(max(ws, 16), dtype=torch.uint8, device=self.device)
        return self._decode_out, self._workspace

    def _attend(self, module, query, key, value, scaling: float):
        layer = module.layer_idx
        plan = self._plan
        B, Hq, S, D = query.shape
        if plan.decode:
            q = query.reshape(B, Hq, D)
            if not q.is_contiguous():
                q = q.contiguous()
            out, ws = self._decode_buffers(q)
            _ops()[1](self.arena, q, out, self.block_table, plan.seq, ws, self.geom, layer, self.k_scales[layer],
                      self.v_scales[layer], float(scaling), self.max_seq_len, 0)
            return out.view(B, 1, Hq, D)
        from torch.nn.attention.bias import causal_lower_right
        out = torch.zeros(B, S, Hq, D, dtype=query.dtype, device=query.device)
        for b, (j0, p0, n_q) in enumerate(plan.rows):
            if n_q == 0:
                continue
            kn = key[b, :, j0:, :]
            vn = value[b, :, j0:, :]
            if p0 > 0:
                # The cached prefix, dequantized into the head of one [p0 + n_q, H, D] buffer per
                # side and the new tokens' exact K/V after it: SDPA reads it as a strided
                # [1, H, L, D] view, and GQA (enable_gqa) reads each KV head for its whole group,
                # so nothing is concatenated or repeated per query head.
                if b not in plan.prefix:
                    pos = torch.arange(p0, device=self.device)
                    plan.prefix[b] = (self.block_table[b][pos // self.T].contiguous(), (pos % self.T).to(torch.int32))
                slots, offs = plan.prefix[b]
                deq = _ops()[2]
                sides = []
                for side, new, scales in ((0, kn, self.k_scales), (1, vn, self.v_scales)):
                    buf = torch.empty(p0 + n_q, self.kv_heads, D, dtype=torch.bfloat16, device=self.device)
                    deq(self.arena, buf[:p0], slots, offs, self.geom, layer, side, scales[layer])
                    if new.dtype != torch.bfloat16:
                        buf = buf.to(new.dtype)
                    buf[p0:] = new.transpose(0, 1)
                    sides.append(buf.transpose(0, 1)[None])
                q = query[b:b + 1, :, j0:, :]
                o = torch.nn.functional.scaled_dot_product_attention(
                    q, sides[0], sides[1], attn_mask=causal_lower_right(n_q, p0 + n_q), scale=scaling,
                    enable_gqa=True)
            else:
                q = query[b:b + 1, :, j0:, :]
                o = torch.nn.functional.scaled_dot_product_attention(q, kn[None], vn[None], is_causal=True,
                                                                     scale=scaling, enable_gqa=True)
            out[b, j0:] = o[0].transpose(0, 1)
        return out

    # ---- publishing and lifetime -------------------------------------------------------
    def commit(self, sequences) -> int:
        """Commits every full block whose K/V this cache wrote (prompt and output), keyed by
        the tokens of `sequences` (generate's output: [B, columns], left padding included).
        Blocks two rows share are committed once. Returns how many blocks were committed."""
        self._check_open()
        if not self._allocs:
            return 0
        seqs = sequences.detach().cpu().numpy() if isinstance(sequences, torch.Tensor) else np.asarray(sequences)
        if seqs.ndim != 2 or seqs.shape[0] != self.batch:
            raise ValueError(f"sequences must be [batch={self.batch}, columns], got {seqs.shape}")
        per_lease, seen = {}, set()
        for b in range(self.batch):
            toks = seqs[b, self.pads[b]:].astype(np.int64)
            if np.any(toks < 0) or np.any(toks >= 2 ** 32):
                raise ValueError(f"row {b}: token ids must be in [0, 2^32)")
            written = int(min(self.lens_host[b], len(toks)))
            nb = written // self.T
            if nb <= self.hit_blocks[b]:
                continue
            keys = kvtier.key_chain_array(self.cid, toks[:nb * self.T].astype(np.uint32), self.T)
            for i in range(self.hit_blocks[b], nb):
                key = keys[i]
                if key in seen:
                    continue
                seen.add(key)
                lease, j = self._alloc_index[(b, i)]
                per_lease.setdefault(lease.id, (lease, []))[1].append((lease.slots[j], key,
                                                                      keys[i - 1] if i > 0 else None))
        # kvtier_commit splits a long commit under the daemon's max_keys_per_request itself. A
        # key cached with other bytes (another engine's) holds none of ours: not counted, and
        # logged once per process (KvtierConflict).
        done = 0
        for lease, items in per_lease.values():
            try:
                done += self.client.commit(self.cid, lease, items)
            except kvtier.KvtierConflict as e:
                done += e.committed
                if not getattr(KvtierCache, "_conflict_logged", False):
                    KvtierCache._conflict_logged = True
                    import logging
                    logging.getLogger("kvtier.transformers").warning("commit: %s", e)
        return done

    def release(self):
        """Gives the leases back (uncommitted slots are freed). The cache is unusable after."""
        if self._closed:
            return
        self._closed = True
        leases = self._leases + self._allocs
        self._leases, self._allocs = [], []
        for lease in leases:
            try:
                self.client.release(lease)
            except kvtier.KvtierError:
                pass  # the connection is gone: the daemon dropped the leases with it

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()

    def __del__(self):
        try:
            self.release()
        except Exception:
            pass


def attach(socket: Optional[str] = None, name: str = "transformers") -> "E.DaemonLink":
    """A link to kvtierd for :func:`prefix_cache` (the engine core's: `socket`, else
    $KVTIER_SOCKET, else the shipped config's socket; attached with the GPU's HBM arena;
    kept through outages)."""
    return E.DaemonLink(socket, name, has_gpu=True, logger=_log)


class RecomputeCache:
    """What :func:`prefix_cache` gives while kvtierd is down: a transformers DynamicCache
    (made by :func:`_recompute_cache`) that loads nothing and whose commit stores nothing."""

    @staticmethod
    def commit(sequences) -> int:
        return 0

    @staticmethod
    def release():
        return None

    @property
    def cached_tokens(self) -> List[int]:
        return [0] * getattr(self, "_kvtier_rows", 0)

    @property
    def hit_tiers(self) -> List[List[str]]:
        return [[] for _ in range(getattr(self, "_kvtier_rows", 0))]

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


def _recompute_cache(model, rows: int):
    from transformers import DynamicCache

    class _Recompute(RecomputeCache, DynamicCache):
        pass
    cache = _Recompute(config=model.config)
    cache._kvtier_rows = rows
    # kvtier's attention reads only a KvtierCache: SDPA computes this generate.
    if model.config._attn_implementation == ATTN_IMPLEMENTATION:
        model.set_attn_implementation("sdpa")
        model._kvtier_recomputing = True
    return cache


def prefix_cache(model, client, input_ids: torch.Tensor, attention_mask: Optional[torch.Tensor] = None,
                 max_new_tokens: int = 256, kv_format: str = "nvfp4", block_tokens: int = DEFAULT_BLOCK_TOKENS,
                 scale_rule: str = "max6", contract: Optional[kvtier.Contract] = None):
    """A KvtierCache for `input_ids` ([B, S], left padded where `attention_mask` is 0) that
    already holds each row's longest cached prefix (restored into HBM by one acquire per
    row), with HBM slots allocated for the rest of the prompt and `max_new_tokens` more.
    Pass it to ``model.generate(input_ids, attention_mask=..., past_key_values=cache)``.

    `client` is a kvtier.Client (errors raise) or the link of :func:`attach` (the engine
    core's outage policy: while kvtierd is down the result is a :class:`RecomputeCache`,
    SDPA computes the generate, and the model's attention goes back to kvtier's once a
    prefix_cache reaches the daemon again)."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be [batch, tokens], got {tuple(input_ids.shape)}")
    B, S = input_ids.shape
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if attention_mask.shape != input_ids.shape:
        raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not match input_ids {(B, S)}")
    mask = attention_mask.detach().cpu().numpy().astype(bool)
    ids = input_ids.detach().cpu().numpy().astype(np.int64)
    if np.any(ids < 0) or np.any(ids >= 2 ** 32):
        raise ValueError("token ids must be in [0, 2^32)")
    rows, pads = [], []
    for b in range(B):
        pad = int(np.argmax(mask[b])) if mask[b].any() else S
        if not mask[b, pad:].all():
            raise ValueError(f"row {b}: kvtier's cache takes left padding only (the attention mask has a 0 after "
                             "the first 1)")
        if pad == S:
            raise ValueError(f"row {b} has no tokens")
        pads.append(pad)
        rows.append(ids[b, pad:].astype(np.uint32))
    if max_new_tokens < 0:
        raise ValueError("max_new_tokens must be >= 0")
    if contract is None:
        contract = contract_for(model, kv_format, block_tokens, scale_rule)
    if not isinstance(client, E.DaemonLink):
        cache = KvtierCache(model, client, contract, scale_rule=contract.scale_rule)
        try:
            cache._start(rows, pads, max_new_tokens)
        except BaseException:
            cache.release()
            raise
        return cache
    link = client
    with link.lock:
        c, _ = link.attach(contract)
        if c is None:
            return _recompute_cache(model, B)
        try:
            cache = KvtierCache(model, c, contract, scale_rule=contract.scale_rule)
        except kvtier.KvtierError as e:
            link.report("attach", e, "this generate recomputes")
            return _recompute_cache(model, B)
        try:
            cache._start(rows, pads, max_new_tokens)
        except kvtier.KvtierError as e:
            cache.release()
            if e.code not in E.DaemonLink.GONE:
                raise
            link.report("prefix_cache", e, "this generate recomputes")
            return _recompute_cache(model, B)
        except BaseException:
            cache.release()
            raise
    if getattr(model, "_kvtier_recomputing", False):
        model.set_attn_implementation(ATTN_IMPLEMENTATION)
        model._kvtier_recomputing = False
    return cache


# ---- the attention implementation ------------------------------------------------------------

def kvtier_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers attention function "kvtier": attention over the KvtierCache that ran this
    layer's update (decode steps: the fused paged decode; prefill: cached prefix + new)."""
    cache = getattr(_tls, "cache", None)
    if cache is None or cache._plan is None:
        raise RuntimeError("attn_implementation='kvtier' needs a KvtierCache as past_key_values "
                           "(kvtier.transformers.prefix_cache)")
    _tls.cache = None
    if kwargs.get("sliding_window") is not None:
        raise UnsupportedModel("sliding-window attention is not supported by kvtier's cache")
    if kwargs.get("softcap") is not None:
        raise UnsupportedModel("attention logit soft-capping is not supported by kvtier's cache")
    unserved = _unserved_kwargs(module, kwargs)
    if unserved:
        raise UnsupportedModel(f"kvtier's cache does not apply the attention arguments {unserved}")
    if dropout:
        raise UnsupportedModel("kvtier's attention is for inference: dropout must be 0 (call model.eval())")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return cache._attend(module, query, key, value, float(scaling)), None


def kvtier_mask(*args, **kwargs):
    """Mask function for "kvtier": none is needed (the cache knows each row's padding and
    length), and returning None keeps mask creation off the decode step."""
    return None


AttentionInterface.register(ATTN_IMPLEMENTATION, kvtier_attention)
AttentionMaskInterface.register(ATTN_IMPLEMENTATION, kvtier_mask)


def _register_probe():
    from transformers.masking_utils import sdpa_mask
    AttentionInterface.register(_PROBE, _probe_attention)
    AttentionMaskInterface.register(_PROBE, sdpa_mask)


_register_probe()


# ---- CUDA graphs -----------------------------------------------------------------------------

class DecodeGraph:
    """One decode step of `model` over `cache`, captured in a CUDA graph and replayed.

        g = DecodeGraph(model, cache)        # after the prefill
        logits = g.step(next_tokens)         # [B] token ids -> [B, vocab] logits

    The step's inputs (token ids) and the cache's device-side lengths live in fixed
    buffers; the cache's block table and workspace are fixed at capture."""

    def __init__(self, model, cache: KvtierCache, warmup: int = 2):
        self.model, self.cache = model, cache
        B = cache.batch
        self.ids = torch.zeros(B, 1, dtype=torch.long, device=cache.device)
        saved_lens, saved_host, saved_cols = cache.lens.clone(), cache.lens_host.copy(), cache._columns
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(warmup):
                self._forward()
                cache.lens.copy_(saved_lens)
                cache.lens_host[:] = saved_host
                cache._columns = saved_cols
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.logits = self._forward()
        cache.lens.copy_(saved_lens)
        cache.lens_host[:] = saved_host
        cache._columns = saved_cols
        torch.cuda.synchronize()

    def _forward(self):
        pos = self.cache.lens.long().unsqueeze(1)
        out = self.model(input_ids=self.ids, position_ids=pos, past_key_values=self.cache, use_cache=True,
                         logits_to_keep=1)
        return out.logits[:, -1, :]

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        c = self.cache
        c._check_open()
        if np.any(c.lens_host + 1 > c.capacity):
            raise kvtier.KvtierError(2, "a row outgrew the cache: pass a larger max_new_tokens to prefix_cache")
        self.ids.copy_(tokens.reshape(-1, 1))
        self.graph.replay()
        c.lens_host += 1
        c._columns += 1
        return self.logits
