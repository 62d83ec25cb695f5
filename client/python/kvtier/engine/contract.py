"""Contract and identity: what an engine's blocks mean, named so that no other blocks match.

- :class:`EngineShape` and :func:`shape_from_hf_config`: what a model's KV looks like to
  an engine (layers, KV heads per tensor-parallel rank, head_dim, dtype), read from its
  Hugging Face ``config.json`` and checked: models whose KV is not plain per-layer K and V
  (MLA, hybrid attention, sliding windows) are refused by name.
- :func:`model_id`: the one rule for a contract's model id, ``<engine>:<model>[@<layout>]
  [#salt:<digest>]``, for every engine.
- :func:`weights_identity`: the contract's model revision, the weights' identity, on by
  default for every engine: the ``model_revision`` setting when given, else a SHA-256 of
  the checkpoint folder's config and weight files (:func:`folder_identity`), so two
  checkpoints with one name and shape never share blocks.
- :func:`tier_scales` / :func:`layer_scales`: the one validation of per-layer global scales.
- :func:`engine_contract`: the scale contract of one engine's blocks, one per (engine,
  model, weights, layers, KV heads, head_dim, block tokens, format, layout, TP rank and
  size, salt). Everything that changes what a block's bytes mean is in it, so it is in the
  contract id and in every key: blocks of another engine, model, dtype, layout, rank or
  salt never match.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import kvtier

log = logging.getLogger("kvtier.engine")

# Engine KV dtypes kvtier stores as they are, by the kvtier format that holds them.
# FP16 and FP32 have no kvtier format (a block of another dtype would need a conversion
# that is not lossless), so an engine serving them is refused at start.
AS_IS_FORMATS = {"bfloat16": "bf16", "fp8_e4m3": "fp8", "nvfp4": "nvfp4"}
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


_IDENTITIES: Dict[Tuple, str] = {}
_IDENTITY_LOCK = threading.Lock()
_WARNED: set = set()  # models warned about once per process (weights not hashed)


def _weight_files(path: str):
    return sorted(f for f in os.listdir(path)
                  if f == "config.json" or f.endswith(".safetensors") or f.endswith(".bin"))


def folder_identity(path: str) -> str:
    """"sha256:<32 hex>" of a checkpoint folder's config.json and weight files (names and
    bytes, in name order): the same weights give the same identity in every process.
    Hashing reads every weight file once (about 1 s per GB); the result is kept for the
    process, keyed by the files' names, sizes and modification times, so an engine's
    scheduler and worker read them once. A path that is not a folder (a hub name) is
    named by its string: pass the weights' revision explicitly then."""
    if not os.path.isdir(path):
        return "name:" + path
    files = _weight_files(path)
    stats = []
    for f in files:
        st = os.stat(os.path.join(path, f))
        stats.append((f, st.st_size, st.st_mtime_ns, st.st_ino))
    memo = (os.path.realpath(path), tuple(stats))
    with _IDENTITY_LOCK:
        if memo in _IDENTITIES:
            return _IDENTITIES[memo]
        h = hashlib.sha256()
        for f in files:
            h.update(f.encode() + b"\0")
            with open(os.path.join(path, f), "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 24), b""):
                    h.update(chunk)
        ident = "sha256:" + h.hexdigest()[:32]
        _IDENTITIES[memo] = ident
        return ident


def weights_identity(model_path: str, model_revision: Optional[str] = None) -> str:
    """The contract's model revision: `model_revision` when the operator names the weights
    (a hub revision, a release tag), else :func:`folder_identity` of the checkpoint folder.
    A model given by a hub name that is not a local folder and no model_revision gets
    "name:<path>", and a warning: two checkpoints served under that name would share
    blocks."""
    if model_revision:
        return str(model_revision)
    ident = folder_identity(str(model_path))
    if ident.startswith("name:") and ident not in _WARNED:
        _WARNED.add(ident)
        log.warning("kvtier: model %r is not a local checkpoint folder, so its weights are not hashed into the "
                    "contract; set model_revision to name them (two checkpoints served under one name would "
                    "otherwise share blocks)", model_path)
    return ident


def model_id(engine: str, model_name: str, layout: str = "", salt: Optional[str] = None) -> str:
    """The one model-id rule of every engine: ``<engine>:<basename of the model name or
    path>``, then ``@<layout>`` (how the engine's pages were laid out before they became
    kvtier blocks, when that changes the bytes) and the salt's tag. The engine is in it
    because two engines do not compute bit-equal K and V for one prompt."""
    name = f"{engine}:{os.path.basename(str(model_name).rstrip('/')) or str(model_name)}"
    if layout:
        name += f"@{layout}"
    return (name + salt_tag(salt))[:kvtier_max_string()]


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


def layer_scales(value, num_layers: int, what: str = "kv_scale") -> Tuple[list, list]:
    """Per-layer (k_scales, v_scales) from an engine setting: one number (every layer, K
    and V), a list of num_layers numbers (K and V alike) or {"k": [...], "v": [...]}.
    Each is a finite positive normal float32, returned as float32 holds it (so every
    process quantizes with the same value). Raises UnsupportedEngineModel naming the
    setting on anything else."""
    try:
        if isinstance(value, dict):
            if set(value) != {"k", "v"}:
                raise ValueError("a scale object has exactly the keys 'k' and 'v'")
            ks, vs = [float(x) for x in value["k"]], [float(x) for x in value["v"]]
        elif isinstance(value, (list, tuple)):
            ks = vs = [float(x) for x in value]
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            ks = vs = [float(value)] * num_layers
        else:
            raise ValueError(f"{type(value).__name__} is not a number, a list or {{'k': [...], 'v': [...]}}")
    except (TypeError, ValueError) as e:
        raise UnsupportedEngineModel(f"{what} {value!r}: {e}") from None
    if len(ks) != num_layers or len(vs) != num_layers:
        raise UnsupportedEngineModel(f"{what} has {len(ks)} K and {len(vs)} V scales for {num_layers} layers")
    for x in ks + vs:
        if not (math.isfinite(x) and x >= 1.1754944e-38 and x <= 3.4028234e38):
            raise UnsupportedEngineModel(f"{what} {x} is not a finite positive normal float")
    return [ctypes.c_float(x).value for x in ks], [ctypes.c_float(x).value for x in vs]


def tier_scales(tier_format: str, kv_scale, num_layers: int):
    """Per-layer (k_scales, v_scales) of a quantizing tier format ("nvfp4", "fp8") from the
    kv_scale setting (None: the format's DEFAULT_KV_SCALE; see layer_scales). Other
    formats carry 1.0 and take no kv_scale."""
    if tier_format not in DEFAULT_KV_SCALE:
        if kv_scale is not None:
            raise UnsupportedEngineModel(f"kv_scale applies to kv_format 'nvfp4' or 'fp8', not {tier_format!r}")
        return [1.0] * num_layers, [1.0] * num_layers
    return layer_scales(DEFAULT_KV_SCALE[tier_format] if kv_scale is None else kv_scale, num_layers)


def engine_contract(engine: str, model_name: str, weights: str, shape: EngineShape, block_tokens: int,
                    tp_rank: int = 0, tp_size: int = 1, tier_format: str = "as-is", salt: Optional[str] = None,
                    layout: str = "", kv_scale=None, page_scales=None) -> kvtier.Contract:
    """The contract of one engine's blocks. `engine` and `layout` name how the engine's
    pages were laid out before they were put into kvtier's block format (part of the
    model id, :func:`model_id`, so two layouts never share); `salt` puts the blocks in a
    namespace of their own (vLLM's cache_salt). `weights` is :func:`weights_identity`'s.

    tier_format "as-is" keeps the engine's dtype: BF16, FP8 E4M3 (whose per-layer scales,
    `page_scales` in layer_scales' forms, default 1.0, give the bytes their values) or the
    engine's own NVFP4 pages (shape.dtype "nvfp4", page_scales the global scales).
    "nvfp4" and "fp8" quantize BF16/FP16 pages into kvtier NVFP4 / FP8 blocks with the
    static per-layer global scales of `kv_scale` (see tier_scales). The format and the
    scales are in the contract id, so blocks of one format or scale never load as
    another."""
    if tier_format not in TIER_FORMATS:
        raise UnsupportedEngineModel(f"kv_format {tier_format!r} is not one of {TIER_FORMATS}")
    if tier_format == "as-is":
        fmt = AS_IS_FORMATS.get(shape.dtype)
        if fmt is None:
            raise UnsupportedEngineModel(f"KV dtype {shape.dtype} has no kvtier block format (kvtier stores bf16, "
                                         f"fp8_e4m3 and NVFP4 pages as they are); serve the model with --dtype "
                                         "bfloat16")
        if kv_scale is not None:
            raise UnsupportedEngineModel("kv_scale applies to kv_format 'nvfp4' or 'fp8', not 'as-is'")
        if fmt == "bf16":
            if page_scales is not None:
                raise UnsupportedEngineModel("BF16 pages take no scales")
            k_scales, v_scales = [1.0] * shape.num_layers, [1.0] * shape.num_layers
        else:
            k_scales, v_scales = layer_scales(1.0 if page_scales is None else page_scales, shape.num_layers,
                                              "the pages' scales")
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
    if fmt == "nvfp4" and shape.head_dim % 16:
        raise UnsupportedEngineModel(f"NVFP4 needs head_dim a multiple of 16, got {shape.head_dim}")
    return kvtier.Contract(model_id=model_id(engine, model_name, layout, salt),
                           model_revision=str(weights)[:kvtier_max_string()], tokenizer_revision="",
                           num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_dim,
                           block_tokens=block_tokens, tp_rank=tp_rank, tp_size=tp_size, kv_format=fmt,
                           scale_rule="max6", k_scales=k_scales, v_scales=v_scales)


def kvtier_max_string() -> int:
    """Longest string a contract field holds (formats/contract.h kMaxContractString)."""
    return 256


