"""The part every serving-engine integration of kvtier shares (vLLM today; SGLang next).

- :class:`EngineShape` and :func:`shape_from_hf_config`: what a model's KV looks like to
  an engine (layers, KV heads per tensor-parallel rank, head_dim, dtype), read from its
  Hugging Face ``config.json`` and checked: models whose KV is not plain per-layer K and V
  (MLA, hybrid attention, sliding windows) are refused by name.
- :func:`folder_identity`: a name for the weights (SHA-256 of the checkpoint folder's
  config and weight files), so that another model's blocks are never loaded.
- :func:`engine_contract`: the scale contract of one engine's blocks, one per (model,
  weights, layers, KV heads, head_dim, block tokens, format, TP rank and size, salt).
  Everything that changes what a block's bytes mean is in it, so it is in the contract id
  and in every key: blocks of another model, dtype, layout, rank or salt never match.
- :func:`block_keys`: kvtier's key chain over a request's token ids.
- :class:`DaemonLink`: a connection to kvtierd made lazily and kept through outages: a
  call made while the daemon is down gets ``None`` (the engine recomputes), one log line
  says the daemon went away and one that it is back, and reconnects are tried with
  exponential backoff (0.5 s doubling to 10 s) so a dead daemon costs no time per step.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Sequence

import kvtier

log = logging.getLogger("kvtier.engine")

# Engine KV dtypes kvtier stores as they are, by the kvtier format that holds them.
# FP16 and FP32 have no kvtier format (a block of another dtype would need a conversion
# that is not lossless), so an engine serving them is refused at start.
AS_IS_FORMATS = {"bfloat16": "bf16", "fp8_e4m3": "fp8"}
TIER_FORMATS = ("as-is", "nvfp4", "fp8")
# Engine KV dtypes the quantizing tier formats take (BlockMover mode "nvfp4"/"fp8").
QUANTIZED_FROM = ("bfloat16", "float16")
# Default static global scale per quantizing tier format (docs/vllm.md, "NVFP4 in the
# tiers"). NVFP4: a block's E4M3 scale is amax / (6 * kv_scale), so 2^-4 stores block
# amaxes up to 6 * 448 / 16 = 168 unclipped and keeps block scales normal (full E4M3
# precision) down to an amax of 6 * 2^-6 / 16 ~= 0.006. FP8: an element is x / kv_scale in
# E4M3, and 1.0 is vLLM's own default k_scale / v_scale (|x| up to 448).
DEFAULT_KV_SCALE = {"nvfp4": 2.0 ** -4, "fp8": 1.0}


class UnsupportedEngineModel(ValueError):
    """The model, its dtype or the engine's settings cannot be stored in kvtier's blocks;
    the message names the reason. Raised at start, before anything is stored."""


@dataclass(frozen=True)
class EngineShape:
    """One tensor-parallel rank's view of a model's KV cache."""
    num_layers: int        # attention layers (each stores one K and one V page per block)
    num_kv_heads: int      # KV heads held by this rank (total / tp_size, at least 1)
    head_dim: int
    dtype: str             # the engine's KV dtype: "bfloat16", "float16", "fp8_e4m3", ...


def _text_config(cfg: dict) -> dict:
    for k in ("text_config", "llm_config", "language_config"):
        if isinstance(cfg.get(k), dict):
            return cfg[k]
    return cfg


def shape_from_hf_config(cfg: dict, tp_size: int = 1, dtype: Optional[str] = None) -> EngineShape:
    """The KV shape of a Hugging Face decoder config (config.json as a dict) for one rank
    of `tp_size`; raises UnsupportedEngineModel naming the first reason it cannot be
    stored."""
    c = _text_config(cfg)
    arch = ",".join(cfg.get("architectures") or []) or cfg.get("model_type", "model")
    if cfg.get("is_encoder_decoder"):
        raise UnsupportedEngineModel(f"{arch}: encoder-decoder models (cross-attention) are not supported")
    if c.get("kv_lora_rank") or c.get("q_lora_rank"):
        raise UnsupportedEngineModel(f"{arch}: multi-head latent attention (MLA) is not supported")
    layer_types = c.get("layer_types")
    if layer_types and any(t != "full_attention" for t in layer_types):
        kinds = sorted(set(layer_types) - {"full_attention"})
        raise UnsupportedEngineModel(f"{arch}: layers of type {kinds} (hybrid, sliding-window or linear attention) "
                                     "are not supported; every layer must be full attention")
    if c.get("sliding_window") is not None and c.get("use_sliding_window", True):
        raise UnsupportedEngineModel(f"{arch}: sliding-window attention (sliding_window={c['sliding_window']}) is "
                                     "not supported")
    heads = int(c["num_attention_heads"])
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or int(c["hidden_size"]) // heads)
    if tp_size < 1:
        raise UnsupportedEngineModel(f"tensor-parallel size {tp_size} < 1")
    per_rank = max(1, kv_heads // tp_size)
    dt = dtype or str(c.get("torch_dtype") or c.get("dtype") or "bfloat16")
    return EngineShape(int(c["num_hidden_layers"]), per_rank, head_dim, dt.replace("torch.", ""))


def folder_identity(path: str) -> str:
    """"sha256:<32 hex>" of a checkpoint folder's config.json and weight files (names and
    bytes, in name order): the same weights give the same identity in every process.
    Hashing reads every weight file once (about 1 s per GB). A path that is not a folder
    (a hub name) is named by its string: pass the weights' revision explicitly then."""
    if not os.path.isdir(path):
        return "name:" + path
    files = sorted(f for f in os.listdir(path)
                   if f == "config.json" or f.endswith(".safetensors") or f.endswith(".bin"))
    h = hashlib.sha256()
    for f in files:
        h.update(f.encode() + b"\0")
        with open(os.path.join(path, f), "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 24), b""):
                h.update(chunk)
    return "sha256:" + h.hexdigest()[:32]


def load_hf_config(path: str) -> dict:
    p = os.path.join(path, "config.json")
    with open(p) as f:
        return json.load(f)


def salt_tag(salt: Optional[str]) -> str:
    """The namespace of a cache salt inside a contract's model id ("" for no salt). Only a
    digest of the salt is kept, so the salt itself is not readable from the daemon."""
    if not salt:
        return ""
    return "#salt:" + hashlib.sha256(salt.encode("utf-8")).hexdigest()[:32]


def tier_scales(tier_format: str, kv_scale, num_layers: int):
    """Per-layer (k_scales, v_scales) of a tier format from an engine setting: None (the
    format's DEFAULT_KV_SCALE), one number (every layer, K and V), a list of num_layers
    numbers (K and V alike) or {"k": [...], "v": [...]}. As-is formats carry 1.0. Raises
    UnsupportedEngineModel on anything else or a scale that is not a finite positive
    normal float."""
    import math
    if tier_format not in DEFAULT_KV_SCALE:
        if kv_scale is not None:
            raise UnsupportedEngineModel(f"kv_scale applies to kv_format 'nvfp4' or 'fp8', not {tier_format!r}")
        return [1.0] * num_layers, [1.0] * num_layers
    if kv_scale is None:
        kv_scale = DEFAULT_KV_SCALE[tier_format]
    try:
        if isinstance(kv_scale, dict):
            if set(kv_scale) != {"k", "v"}:
                raise ValueError("a kv_scale object has exactly the keys 'k' and 'v'")
            ks, vs = [float(x) for x in kv_scale["k"]], [float(x) for x in kv_scale["v"]]
        elif isinstance(kv_scale, (list, tuple)):
            ks = vs = [float(x) for x in kv_scale]
        elif isinstance(kv_scale, (int, float, str)) and not isinstance(kv_scale, bool):
            ks = vs = [float(kv_scale)] * num_layers
        else:
            raise ValueError(f"{type(kv_scale).__name__} is not a number, a list or {{'k': [...], 'v': [...]}}")
    except (TypeError, ValueError) as e:
        raise UnsupportedEngineModel(f"kv_scale {kv_scale!r}: {e}") from None
    if len(ks) != num_layers or len(vs) != num_layers:
        raise UnsupportedEngineModel(f"kv_scale has {len(ks)} K and {len(vs)} V scales for {num_layers} layers")
    for x in ks + vs:
        if not (math.isfinite(x) and x >= 1.1754944e-38):
            raise UnsupportedEngineModel(f"kv_scale {x} is not a finite positive normal float")
    # As the contract holds them (float32), so every process quantizes with the same value.
    import ctypes
    return [ctypes.c_float(x).value for x in ks], [ctypes.c_float(x).value for x in vs]


def engine_contract(engine: str, model_name: str, weights: str, shape: EngineShape, block_tokens: int,
                    tp_rank: int = 0, tp_size: int = 1, tier_format: str = "as-is", salt: Optional[str] = None,
                    layout: str = "", kv_scale=None) -> kvtier.Contract:
    """The contract of one engine's blocks. `engine` and `layout` name how the engine's
    pages were laid out before they were put into kvtier's block format (part of the
    model id, so two layouts never share); `salt` puts the blocks in a namespace of their
    own (vLLM's cache_salt). tier_format "as-is" keeps the engine's dtype (BF16, FP8);
    "nvfp4" and "fp8" quantize BF16/FP16 pages into kvtier NVFP4 / FP8 blocks with the
    static per-layer global scales of `kv_scale` (see tier_scales), recorded in the
    contract: the format and the scales are in its id, so blocks of one format or scale
    never load as another."""
    if tier_format not in TIER_FORMATS:
        raise UnsupportedEngineModel(f"kv_format {tier_format!r} is not one of {TIER_FORMATS}")
    if tier_format == "as-is":
        fmt = AS_IS_FORMATS.get(shape.dtype)
        if fmt is None:
            raise UnsupportedEngineModel(f"KV dtype {shape.dtype} has no kvtier block format (kvtier stores bf16 and "
                                         f"fp8_e4m3 as they are); serve the model with --dtype bfloat16")
    else:
        if shape.dtype not in QUANTIZED_FROM:
            raise UnsupportedEngineModel(f"kv_format {tier_format!r} quantizes {' or '.join(QUANTIZED_FROM)} pages; "
                                         f"these are {shape.dtype}")
        fmt = tier_format
    k_scales, v_scales = tier_scales(tier_format, kv_scale, shape.num_layers)
    if not 0 <= tp_rank < tp_size:
        raise UnsupportedEngineModel(f"tensor-parallel rank {tp_rank} is not in [0, {tp_size})")
    if block_tokens < 1:
        raise UnsupportedEngineModel(f"block_tokens {block_tokens} < 1")
    name = f"{engine}:{os.path.basename(str(model_name).rstrip('/'))}"
    if layout:
        name += f"@{layout}"
    name += salt_tag(salt)
    return kvtier.Contract(model_id=name[:kvtier_max_string()], model_revision=weights[:kvtier_max_string()],
                           tokenizer_revision="", num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads,
                           head_dim=shape.head_dim, block_tokens=block_tokens, tp_rank=tp_rank, tp_size=tp_size,
                           kv_format=fmt, scale_rule="max6", k_scales=k_scales, v_scales=v_scales)


def kvtier_max_string() -> int:
    """Longest string a contract field holds (formats/contract.h kMaxContractString)."""
    return 256


def block_keys(contract_id: int, tokens: Sequence[int], block_tokens: int) -> kvtier.KeyArray:
    """kvtier's key chain over `tokens`: one key per full block, each naming the whole
    prefix up to its end (the same keys as every other kvtier client of the contract)."""
    return kvtier.key_chain_array(contract_id, tokens, block_tokens)


class DaemonLink:
    """A kvtierd connection that survives the daemon's outages.

    ``client()`` returns a connected :class:`kvtier.Client` (contracts registered) or None
    while the daemon is down; the first failure logs one warning, the return one info line.
    A caller that gets a KvtierError from a call on the client hands it to
    :meth:`failed`, which drops the connection when the error means the daemon is gone.
    Thread-safe."""

    GONE = {8, 9}  # DISCONNECTED, TIMEOUT: the connection is dead
    _CONNECT_ERRORS = (kvtier.KvtierError, OSError)

    def __init__(self, socket_path: str, name: str, contracts: Callable[[], Sequence[kvtier.Contract]] = lambda: (),
                 timeout_ms: int = 10000, backoff_s=(0.5, 10.0), logger: Optional[logging.Logger] = None,
                 clock=time.monotonic):
        self.socket_path, self.name, self.timeout_ms = socket_path, name, timeout_ms
        self._contracts = contracts
        self._lo, self._hi = backoff_s
        self._log = logger or log
        self._clock = clock
        self._lock = threading.Lock()
        self._client: Optional[kvtier.Client] = None
        self._ids: Dict[int, int] = {}
        self._down = False
        self._next_try = 0.0
        self._delay = self._lo
        self.outages = 0

    def client(self) -> Optional[kvtier.Client]:
        with self._lock:
            if self._client is not None:
                return self._client
            now = self._clock()
            if now < self._next_try:
                return None
            try:
                c = kvtier.Client(self.socket_path, name=self.name, timeout_ms=self.timeout_ms)
                for ct in self._contracts():
                    c.register_contract(ct)
            except self._CONNECT_ERRORS as e:
                self._went_down(f"cannot attach to kvtierd at {self.socket_path}: {e}")
                return None
            if self._down:
                self._log.warning("kvtier: kvtierd at %s is back; caching again", self.socket_path)
            self._down = False
            self._delay = self._lo
            self._client = c
            return c

    def register(self, contract: kvtier.Contract) -> Optional[int]:
        """Registers a contract on the current connection (None while the daemon is down)."""
        c = self.client()
        if c is None:
            return None
        try:
            return c.register_contract(contract)
        except kvtier.KvtierError as e:
            self.failed(e)
            return None

    def failed(self, err: Exception):
        """Reports an error from a call on the client: the connection is dropped (and the
        outage logged once) when the error says the daemon is gone."""
        if isinstance(err, kvtier.KvtierError) and err.code not in self.GONE:
            return
        with self._lock:
            c, self._client = self._client, None
            if c is not None:
                try:
                    c.close()
                except Exception:
                    pass
            self._went_down(f"lost kvtierd at {self.socket_path}: {err}")

    def _went_down(self, why: str):
        # Called with the lock held.
        if not self._down:
            self.outages += 1
            self._log.warning("kvtier: %s; the engine recomputes what it would have loaded until the daemon is "
                              "back (retrying every %.1f-%.0f s)", why, self._lo, self._hi)
            self._down = True
            self._delay = self._lo
        else:
            self._delay = min(self._delay * 2, self._hi)
        self._next_try = self._clock() + self._delay

    @property
    def down(self) -> bool:
        return self._down

    def close(self):
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            c.close()
