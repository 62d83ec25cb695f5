"""kvtier.pages: moves KV blocks between an engine's paged KV tensors and kvtier block bytes.

Takes plain torch tensors (no engine import), one per layer, in the layouts vLLM hands a
KV connector (docs/pages.md):

    kind          logical shape                         physical order inside a block
    "flash_attn"  (2, num_blocks, T, H, D)              NHD, or HND = permute (0,1,3,2,4)
    "flashinfer"  (num_blocks, 2, T, H, D)              NHD, or HND = permute (0,1,3,2,4)
    "cpu"         (num_blocks, H, T, 2*D)               per head T K rows then T V rows
                                                        (vLLM CPU, cpu_attn.py, LBHNC)
    "vllm_cuda"   (num_blocks, H, T, 2*D)               K = [..., :D], V = [..., D:] of each
                                                        token's row; B, H, T in any stride
                                                        order (vLLM 0.32 CUDA backends)

vLLM's CPU backend allocates (num_blocks, H, block_size, 2 * head_size) and its kernels view
it as (num_blocks, H, 2 * block_size, head_size) split in two at dim 2, so inside one head a
block holds its K rows (T x D) and then its V rows (T x D); it is not K|V per token.

vLLM 0.32's CUDA backends (FlashAttention, FlashInfer, Triton) hand the same logical shape
with the other meaning: each (block, head, token) row of 2*D holds that token's K then its V
(flash_attn.py: "(B, H, N, 2*D) -> ((B, N, H, D), (B, N, H, D))"), and the physical order
of B, H and N is the engine's KVCacheLayout (LBHNC, LBNHC, LHBNC, BLHNC, BLNHC, BHLNC;
vllm/v1/kv_cache_layout.py), so block and head strides may include other layers' pages.
The shape cannot tell "cpu" from "vllm_cuda": the caller names the kind from the platform.

and kvtier's block layout (formats/layout.h): per layer one page, K then V, HND inside a
page; a block is the pages of layers 0..L-1 one after the other. An NVFP4 page is
``K data | K scales | V data | V scales``.

Block formats (``mode``):
  * ``"as_is"``: BF16 pages as BF16 blocks, FP8 (E4M3) pages as FP8 blocks, both byte for
    byte; vLLM's own NVFP4 pages (uint8, last dim D/2 + D/16) as kvtier NVFP4 blocks by a
    byte permutation (bit-exact both ways, see :func:`vllm_nvfp4_permutation`). FP16 and
    FP32 pages are refused: kvtier has no FP16/FP32 block format.
  * ``"nvfp4"``: BF16/FP16 pages quantized to kvtier NVFP4 on save (per-layer FP32 K and V
    scales from the contract, max6 or 4over6) and dequantized on load. On the CPU through
    libkvtier's ``kvtier_nvfp4_encode``/``decode`` (the daemon's codec); on CUDA through
    libkvtier_kernels' ``quantize_append`` (bit-identical to it) and a device decode that
    computes ``(e2m1 * e4m3) * kv_scale`` in float32 like the CPU codec, so both paths
    load the same values bit for bit.
  * ``"fp8"``: BF16/FP16 pages as kvtier FP8 blocks (``x / scale`` rounded to E4M3 with
    saturation, as kvtier.torch_ops does); load multiplies back.

Block bytes (``dst`` of save, ``src`` of load) are either one uint8 tensor ``[n, >=
block_bytes]`` whose rows may be strided (a view of the pinned host arena, a device
buffer), or a list of n 1-D uint8 tensors (one per block, e.g. ``c.host_slot(s)`` views).
With a CUDA cache, save gathers every layer's pages on the device into one contiguous
staging buffer (quantizing in NVFP4 mode) and copies it to host with one async copy per
contiguous run of rows; load is the reverse. Everything is queued on ``stream`` (default:
the current stream); with ``wait=False`` the call returns before the copies end, and the
host bytes must not be read (save) or reused (load) until the stream passes that point.

:class:`HostPoolMover` moves whole pages of SGLang's HiCache host pools and
:class:`ChunkMover` LMCache's KV_2LTD chunks (each page or chunk one kvtier block).

Bad input raises :class:`PagesError` (a ValueError) before anything is written. An NVFP4
block with a bad scale byte (an E4M3 NaN or negative) is not decoded: its pages keep their
bytes, the other blocks load, and :class:`CorruptBlocksError` names it (on CUDA the check
runs on the device, and ``load(wait=False)``'s :class:`PendingLoad` raises it at ``wait()``).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import List, Optional, Sequence, Union

import torch

KINDS = ("flash_attn", "flashinfer", "cpu", "vllm_cuda")
MODES = ("as_is", "nvfp4", "fp8")
MAX6, FOUR_OVER_SIX = 0, 1
E4M3_MAX = 448.0

# E2M1 magnitudes by code (sign in bit 3), formats/nvfp4_math.h.
_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


class PagesError(ValueError):
    """A layout, shape, dtype or argument the mover refuses; nothing was written."""


class CorruptBlocksError(PagesError):
    """A load found blocks whose bytes cannot be decoded: an NVFP4 block scale byte that is an
    E4M3 NaN or negative (0x7F and above), or a global scale that is not a finite positive
    normal float. Those blocks' pages were not written (they keep their bytes); every other
    block of the call was loaded. block_ids: the engine block ids not loaded, in call order."""

    def __init__(self, msg: str, block_ids: Sequence[int]):
        super().__init__(msg)
        self.block_ids = list(block_ids)


@dataclass(frozen=True)
class EngineLayout:
    """How one layer's paged KV tensor is laid out.

    kind: "flash_attn" | "flashinfer" | "cpu" | "vllm_cuda" (shapes in the module docstring).
    order: "NHD" or "HND", the physical order of tokens and heads inside a block (for
        "vllm_cuda": which of the head and token strides is larger; the block stride may
        lie between them, or anywhere, in that kind).
    num_blocks, block_tokens (T), num_kv_heads (H), head_dim (D): D is the logical head
        size, also for NVFP4 pages whose last dim is D/2 + D/16 bytes.
    kv_dtype: what the elements are: "bf16", "fp16", "fp32", "fp8" (E4M3 bytes) or
        "nvfp4" (vLLM's packed pages).
    v_scale_swizzle: NVFP4 pages only: V block scales in the 4-token interleave vLLM
        writes for the SM100 trtllm-gen kernels (K scales are always linear).
    """
    kind: str
    order: str
    num_blocks: int
    block_tokens: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    v_scale_swizzle: bool = False


_AUTO_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32",
                torch.float8_e4m3fn: "fp8"}


def describe(cache: torch.Tensor, kind: str, kv_cache_dtype: str = "auto", num_kv_heads: Optional[int] = None,
             head_dim: Optional[int] = None, v_scale_swizzle: bool = False) -> EngineLayout:
    """Reads the layout of one layer's KV tensor and checks its shape and strides.

    kv_cache_dtype is vLLM's name ("auto", "bfloat16", "fp8", "fp8_e4m3", "nvfp4"); with
    "auto" the tensor's dtype decides. num_kv_heads / head_dim, when given, must match."""
    if kind not in KINDS:
        raise PagesError(f"layout kind {kind!r} is not one of {KINDS}")
    if not isinstance(cache, torch.Tensor):
        raise PagesError(f"a KV cache must be a torch.Tensor, got {type(cache).__name__}")
    if kind == "cpu":
        return _describe_cpu(cache, kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle)
    if kind == "vllm_cuda":
        return _describe_vllm_cuda(cache, kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle)
    if cache.dim() != 5:
        raise PagesError(f"a {kind} KV cache has 5 dims, got shape {tuple(cache.shape)}")
    kvd = _kv_dtype(cache, kv_cache_dtype)
    if v_scale_swizzle and kvd != "nvfp4":
        raise PagesError("v_scale_swizzle applies to NVFP4 pages only")
    sh, st = tuple(cache.shape), cache.stride()
    if kind == "flash_attn":
        kv_dim, nb, rest, rest_st = 0, sh[1], sh[2:], st[2:]
    elif kind == "flashinfer":
        kv_dim, nb, rest, rest_st = 1, sh[0], sh[2:], st[2:]
    if sh[kv_dim] != 2:
        raise PagesError(f"{kind} KV cache {tuple(sh)}: dim {kv_dim} must be 2 (K and V)")
    t, h, last = rest
    if kvd == "nvfp4":
        if last % 9 != 0:
            raise PagesError(f"NVFP4 page rows are D/2 + D/16 bytes; {last} is not that for any D")
        d = last // 9 * 16
    else:
        d = last
    if num_kv_heads is not None and h != num_kv_heads:
        raise PagesError(f"KV cache has {h} KV heads, expected {num_kv_heads} ({tuple(sh)} as {kind})")
    if head_dim is not None and d != head_dim:
        raise PagesError(f"KV cache has head_dim {d}, expected {head_dim} ({tuple(sh)} as {kind})")
    if min(nb, t, h, d) <= 0:
        raise PagesError(f"KV cache {tuple(sh)} has an empty dimension")
    if kvd == "nvfp4" and d % 16 != 0:
        raise PagesError(f"NVFP4 needs head_dim a multiple of 16, got {d}")
    # Inside a block: NHD dense (T stride H*last, H stride last) or HND dense (H stride
    # T*last, T stride last); the last dim always contiguous. Strides of size-1 dims do not
    # matter (torch may give them any value), and with T or H of 1 both orders agree.
    nhd = _dense(rest, rest_st, (h * last, last, 1))
    hnd = _dense(rest, rest_st, (last, t * last, 1))
    if not (nhd or hnd):
        raise PagesError(f"{kind} KV cache {tuple(sh)} strides {st}: a block must be dense in NHD or HND order "
                         f"(T, H, D strides {(h * last, last, 1)} or {(last, t * last, 1)}), got {rest_st}")
    order = "HND" if hnd and not nhd else "NHD"
    block_elems = t * h * last
    blk_dim = 1 - kv_dim if kind != "flashinfer" else 0
    for dim_, what in ((kv_dim, "K/V"), (blk_dim, "block")):
        if sh[dim_] > 1 and abs(st[dim_]) < block_elems:
            raise PagesError(f"KV cache strides {st}: the {what} stride {st[dim_]} overlaps a block of {block_elems}")
    if kvd == "nvfp4" and v_scale_swizzle and (t % 4 != 0 or (d // 16) % 4 != 0):
        raise PagesError(f"the V-scale swizzle needs block_tokens and head_dim/16 multiples of 4, got T={t}, D={d}")
    return EngineLayout(kind, order, nb, t, h, d, kvd, bool(v_scale_swizzle))


def _rows_of_2d(cache, kind, kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle, no_nvfp4, halves):
    """The checks the two (num_blocks, H, T, 2*D) kinds share: the shape, the dtype (NVFP4
    refused with `no_nvfp4`), the expected heads and head_dim. `halves` says what the two
    halves of the last dim hold. Returns (num_blocks, H, T, D, kv dtype)."""
    sh = tuple(cache.shape)
    if cache.dim() != 4:
        raise PagesError(f"a {kind} KV cache has 4 dims (num_blocks, num_kv_heads, block_size, 2 * head_dim), "
                         f"got shape {sh}")
    kvd = _kv_dtype(cache, kv_cache_dtype)
    if kvd == "nvfp4":
        raise PagesError(no_nvfp4)
    if v_scale_swizzle:
        raise PagesError("v_scale_swizzle applies to NVFP4 pages only")
    nb, h, t, d2 = sh
    if d2 % 2 != 0:
        raise PagesError(f"{kind} KV cache {sh}: the last dim is 2 * head_dim ({halves}), {d2} is odd")
    d = d2 // 2
    if min(nb, t, h, d) <= 0:
        raise PagesError(f"KV cache {sh} has an empty dimension")
    if num_kv_heads is not None and h != num_kv_heads:
        raise PagesError(f"KV cache has {h} KV heads, expected {num_kv_heads} ({sh} as {kind})")
    if head_dim is not None and d != head_dim:
        raise PagesError(f"KV cache has head_dim {d}, expected {head_dim} ({sh} as {kind})")
    return nb, h, t, d, kvd


def _describe_cpu(cache, kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle) -> EngineLayout:
    """vLLM CPU's (num_blocks, H, T, 2*D): each block dense (strides (T*2D, 2D, 1) inside)."""
    sh, st = tuple(cache.shape), cache.stride()
    nb, h, t, d, kvd = _rows_of_2d(cache, "cpu", kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle,
                                   "NVFP4 pages exist only for the CUDA backends (flash_attn, flashinfer)",
                                   "K rows then V rows")
    d2 = 2 * d
    if not _dense(sh[1:], st[1:], (t * d2, d2, 1)):
        raise PagesError(f"cpu KV cache {sh} strides {st}: a block must be dense (H, T, 2*D strides "
                         f"{(t * d2, d2, 1)}), got {st[1:]}")
    if nb > 1 and abs(st[0]) < h * t * d2:
        raise PagesError(f"KV cache strides {st}: the block stride {st[0]} overlaps a block of {h * t * d2}")
    return EngineLayout("cpu", "HND", nb, t, h, d, kvd, False)


def _describe_vllm_cuda(cache, kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle) -> EngineLayout:
    """vLLM 0.32 CUDA's (num_blocks, H, T, 2*D), K|V per token row, any order of B, H, T.

    The last dim must be contiguous; the other three may have any positive strides that
    nest without overlap (sorted by stride, each at least the span of the dims inside it),
    which covers every KVCacheLayout vLLM allocates, padded block strides included."""
    sh, st = tuple(cache.shape), cache.stride()
    nb, h, t, d, kvd = _rows_of_2d(cache, "vllm_cuda", kv_cache_dtype, num_kv_heads, head_dim, v_scale_swizzle,
                                   "vLLM 0.32's NVFP4 pages are (num_blocks, 2 * num_kv_heads, block_size, "
                                   "D/2 + D/16), K heads then V heads, not K|V per token row: kind vllm_cuda "
                                   "does not read them", "K then V per token")
    d2 = 2 * d
    if st[3] != 1:
        raise PagesError(f"vllm_cuda KV cache {sh} strides {st}: the last dim (K|V of a token) must be contiguous")
    # Nesting without overlap: sorted by stride, each dim starts past the span of those inside.
    span = d2
    for n, s_, what in sorted(((n, s_, w) for n, s_, w in zip(sh[:3], st[:3], ("block", "head", "token")) if n > 1),
                              key=lambda x: x[1]):
        if s_ < span:
            raise PagesError(f"vllm_cuda KV cache {sh} strides {st}: the {what} stride {s_} overlaps the {span} "
                             "elements inside it")
        span += (n - 1) * s_
    hnd = h == 1 or t == 1 or st[1] > st[2]
    nhd = h == 1 or t == 1 or st[2] > st[1]
    return EngineLayout("vllm_cuda", "HND" if hnd and not nhd else "NHD", nb, t, h, d, kvd, False)


def _dense(shape, strides, want) -> bool:
    return all(n == 1 or a == b for n, a, b in zip(shape, strides, want))


def _kv_dtype(cache: torch.Tensor, name: str) -> str:
    name = (name or "auto").lower()
    if name == "auto":
        kvd = _AUTO_DTYPES.get(cache.dtype)
        if kvd is None:
            raise PagesError(f"cannot tell what a {cache.dtype} KV cache holds: pass kv_cache_dtype "
                             "('fp8' for E4M3 bytes, 'nvfp4' for vLLM's packed NVFP4 pages)")
        return kvd
    named = {"bfloat16": "bf16", "bf16": "bf16", "half": "fp16", "float16": "fp16", "fp16": "fp16",
             "float32": "fp32", "fp8": "fp8", "fp8_e4m3": "fp8", "nvfp4": "nvfp4"}
    if name == "fp8_e5m2":
        raise PagesError("FP8 E5M2 pages are not supported: kvtier's FP8 blocks are E4M3")
    if name not in named:
        raise PagesError(f"kv_cache_dtype {name!r} is not supported (auto, bfloat16, float16, fp8, fp8_e4m3, nvfp4)")
    kvd = named[name]
    ok = {"bf16": (torch.bfloat16,), "fp16": (torch.float16,), "fp32": (torch.float32,),
          "fp8": (torch.uint8, torch.float8_e4m3fn), "nvfp4": (torch.uint8,)}[kvd]
    if cache.dtype not in ok:
        raise PagesError(f"kv_cache_dtype {name!r} needs a tensor of {[str(x) for x in ok]}, got {cache.dtype}")
    return kvd


def _check_layers(caches: Sequence[torch.Tensor], layout: EngineLayout):
    if len(caches) == 0:
        raise PagesError("no layers")
    dev, dt = caches[0].device, caches[0].dtype
    for i, c in enumerate(caches):
        if c.device != dev or c.dtype != dt:
            raise PagesError(f"layer {i} is {c.dtype} on {c.device}; layer 0 is {dt} on {dev}")
        got = describe(c, layout.kind, {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(
            layout.kv_dtype, layout.kv_dtype), v_scale_swizzle=layout.v_scale_swizzle)
        if got != layout:
            raise PagesError(f"layer {i} has layout {got}, layer 0 {layout}")


# ---- kvtier block geometry ------------------------------------------------------------

def block_format(layout: EngineLayout, mode: str) -> str:
    """The kvtier block format ("bf16", "fp8", "nvfp4") a mode stores this cache as, or
    PagesError when that combination is refused."""
    if mode not in MODES:
        raise PagesError(f"mode {mode!r} is not one of {MODES}")
    kvd = layout.kv_dtype
    if mode == "as_is":
        if kvd in ("bf16", "fp8", "nvfp4"):
            return kvd
        raise PagesError(f"kvtier has no {kvd} block format: store {kvd} pages with mode='nvfp4' or 'fp8', "
                         "or run the engine in bfloat16")
    if kvd not in ("bf16", "fp16"):
        raise PagesError(f"mode {mode!r} quantizes bf16/fp16 pages; these are {kvd}")
    if mode == "nvfp4" and layout.head_dim % 16 != 0:
        raise PagesError(f"NVFP4 needs head_dim a multiple of 16, got {layout.head_dim}")
    return mode


def page_bytes(fmt: str, num_kv_heads: int, head_dim: int, block_tokens: int) -> int:
    """Bytes of one layer's page (formats/layout.h)."""
    vals = num_kv_heads * block_tokens * head_dim
    return {"nvfp4": vals + vals // 8, "fp8": 2 * vals, "bf16": 4 * vals}[fmt]


# ---- vLLM NVFP4 pages -----------------------------------------------------------------
#
# vLLM's NVFP4 KV cache (vllm-project/vllm@0cd789b397efc1a8992489076db9fe28d41aed69,
# csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu, reshape_and_cache_nvfp4_dispatch) is a
# uint8 tensor whose last dim is D/2 + D/16; one block's K side (kv_cache[:, 0][b]) and V
# side are each H*T*(D/2 + D/16) bytes: the data region (H*T*D/2 bytes, low nibble = even
# element, from cvt.rn.satfinite.e2m1x2) and then the E4M3 scale region (H*T*D/16). Inside
# both regions rows are (h, t) for HND (head stride T*row, token stride row) and (t, h) for
# NHD. K scales are linear; V scales are linear on SM12x and, on SM100 (trtllm-gen), each
# head's [T, S] scale array (S = D/16) is stored with linear (t, s) at
#   t' = (t // 4) * 4 + s // (S / 4),  s' = (s % (S / 4)) * 4 + t % 4.
# The global scale is vLLM's k_scale / v_scale (a dequantization multiplier, the kernel
# quantizes with 1 / k_scale), which is kvtier's per-layer kv_scale.

def vllm_nvfp4_permutation(layout: EngineLayout) -> torch.Tensor:
    """int64 [page_bytes]: byte j of a kvtier NVFP4 page is byte perm[j] of vLLM's page
    (its K side then its V side, 2 * H*T*(D/2 + D/16) bytes)."""
    h, t, d = layout.num_kv_heads, layout.block_tokens, layout.head_dim
    half, s_dim = d // 2, d // 16
    side = h * t * (half + s_dim)
    data_bytes = h * t * half
    hh = torch.arange(h).view(h, 1, 1)
    tt = torch.arange(t).view(1, t, 1)
    nhd = layout.order == "NHD"

    def rows(inner):  # offset of row (h, t) in a region of `inner`-byte rows
        return (tt * h + hh) * inner if nhd else (hh * t + tt) * inner

    b = torch.arange(half).view(1, 1, half)
    data = (rows(half) + b).reshape(-1)
    s = torch.arange(s_dim).view(1, 1, s_dim)
    k_sf = (data_bytes + rows(s_dim) + s).reshape(-1)
    if layout.v_scale_swizzle:
        g = s_dim // 4
        t2 = (tt // 4) * 4 + s // g
        s2 = (s % g) * 4 + tt % 4
        row2 = (t2 * h + hh) * s_dim if nhd else (hh * t + t2) * s_dim
        v_sf = (data_bytes + row2 + s2).reshape(-1)
    else:
        v_sf = k_sf
    perm = torch.cat([data, k_sf, side + data, side + v_sf])
    assert perm.numel() == 2 * side
    return perm


# ---- NVFP4 decode in torch (the CPU codec's arithmetic, on any device) ----------------

def nvfp4_decode_torch(data: torch.Tensor, scales: torch.Tensor, kv_scale: torch.Tensor) -> torch.Tensor:
    """float32 values of NVFP4 bytes: data [..., n/2], scales [..., n/16] (uint8, any device),
    kv_scale broadcastable to [..., 1, 1] (float32). Value = (e2m1 * e4m3) * kv_scale, the
    order of kvtier's DecodeValue: e2m1 * e4m3 is exact, so only the last product rounds and
    the result equals kvtier_nvfp4_decode bit for bit."""
    lut = torch.tensor(_E2M1, dtype=torch.float32, device=data.device)
    lo = (data & 0xF).long()
    hi = (data >> 4).long()
    codes = torch.stack((lut[lo], lut[hi]), dim=-1)  # [..., n/2, 2]
    codes = codes.view(*data.shape[:-1], scales.shape[-1], 16)
    sf = scales.view(torch.float8_e4m3fn).float().unsqueeze(-1)
    return (codes * sf) * kv_scale


def _nvfp4_bad_rows(scales: torch.Tensor) -> torch.Tensor:
    """bool [n]: rows with a block scale byte that is an E4M3 NaN (0x7F, 0xFF) or negative
    (sign bit set; no encoder writes one), i.e. a byte >= 0x7F. scales: uint8 [n, ...]."""
    return (scales >= 0x7F).reshape(scales.shape[0], -1).any(1)


class PendingLoad:
    """What BlockMover.load returns. wait() blocks until the load's stream has passed it and
    raises CorruptBlocksError when blocks were refused (see there). With load(wait=True) it
    has already run; with wait=False the caller calls it before trusting the pages."""

    def __init__(self, event, flags_host: Optional[torch.Tensor], bad_rows: Sequence[int], ids: List[int]):
        self._event, self._flags, self._bad, self._ids = event, flags_host, list(bad_rows), ids

    def done(self) -> bool:
        """True when the load's work has finished (wait() will not block)."""
        return self._event is None or self._event.query()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()
            self._event = None
        if self._flags is not None:
            self._bad = sorted(set(self._bad) | set(self._flags.nonzero().flatten().tolist()))
            self._flags = None
        if self._bad:
            ids = [self._ids[i] for i in self._bad]
            raise CorruptBlocksError(
                f"{len(ids)} of {len(self._ids)} blocks have a bad scale (an E4M3 NaN or negative block scale "
                f"byte, or a global scale that is not a finite positive normal): engine blocks {ids[:16]}"
                f"{' ...' if len(ids) > 16 else ''} were not loaded and keep their pages; the other blocks were "
                "loaded", ids)


# ---- the mover -------------------------------------------------------------------------

Rows = Union[torch.Tensor, Sequence[torch.Tensor]]


class BlockMover:
    """Saves blocks of `caches` (one tensor per layer, all of `layout`) to kvtier block
    bytes and loads them back.

    mode: "as_is", "nvfp4" or "fp8" (module docstring). k_scales / v_scales: per-layer
    global scales (the contract's), required by "nvfp4" and "fp8", also for vLLM NVFP4
    pages only as documentation (the bytes carry no scale). scale_rule: MAX6 or
    FOUR_OVER_SIX (NVFP4 save)."""

    def __init__(self, caches: Sequence[torch.Tensor], layout: EngineLayout, mode: str = "as_is",
                 k_scales: Optional[Sequence[float]] = None, v_scales: Optional[Sequence[float]] = None,
                 scale_rule: int = MAX6, use_kernels: Optional[bool] = None):
        caches = list(caches)
        _check_layers(caches, layout)
        self.caches, self.layout, self.mode = caches, layout, mode
        self.format = block_format(layout, mode)
        self.num_layers = len(caches)
        self.device = caches[0].device
        L, H, T, D = self.num_layers, layout.num_kv_heads, layout.block_tokens, layout.head_dim
        self.page_bytes = page_bytes(self.format, H, D, T)
        self.block_bytes = self.page_bytes * L
        if scale_rule not in (MAX6, FOUR_OVER_SIX):
            raise PagesError(f"scale_rule {scale_rule} is not 0 (max6) or 1 (4over6)")
        self.scale_rule = scale_rule
        self.k_scales = self.v_scales = None
        if mode in ("nvfp4", "fp8"):
            if k_scales is None or v_scales is None:
                raise PagesError(f"mode {mode!r} needs k_scales and v_scales (one per layer, from the contract)")
            k_scales, v_scales = [float(x) for x in k_scales], [float(x) for x in v_scales]
            if len(k_scales) != L or len(v_scales) != L:
                raise PagesError(f"{len(k_scales)} k_scales and {len(v_scales)} v_scales for {L} layers")
            import math
            for x in k_scales + v_scales:
                if not (math.isfinite(x) and x > 0 and x >= 1.1754944e-38):
                    raise PagesError(f"global scale {x} is not a finite positive normal float")
            self.k_scales, self.v_scales = k_scales, v_scales
            self._scales_dev = torch.tensor([k_scales, v_scales], dtype=torch.float32).t().contiguous().to(self.device)
        self._perm = None
        if self.format == "nvfp4" and layout.kv_dtype == "nvfp4":
            perm = vllm_nvfp4_permutation(layout)
            if not torch.equal(perm, torch.arange(perm.numel())):
                self._perm = perm.to(self.device)
        # Per-layer [NB, H, T, D] views of K and V (elements), or for NVFP4 pages
        # [NB, side_bytes] byte views of each side.
        self._k, self._v = [], []
        for c in caches:
            k, v = self._sides(c)
            self._k.append(k)
            self._v.append(v)
        self._copy_stream = None
        self._eng = self._engine_table(use_kernels)
        # vLLM CPU pages as they are: each layer's blocks viewed [NB, H, 2, T, D] (a head's
        # K rows then its V rows), in the element type a block's bytes are read as.
        self._cpu_blocks = None
        if layout.kind == "cpu" and mode == "as_is" and self.format in ("bf16", "fp8"):
            et = torch.bfloat16 if self.format == "bf16" else torch.uint8
            self._cpu_blocks = [c.view(et).view(layout.num_blocks, H, 2, T, D) for c in caches]

    def _engine_table(self, use_kernels: Optional[bool]):
        """Device table of every layer's K/V addresses for kvt_engine_pages, or None where
        the torch path serves (CPU caches, vLLM NVFP4 pages, FP8 mode, FP16 NVFP4 decode,
        layers of different strides, no libkvtier_kernels, use_kernels=False)."""
        if self.device.type != "cuda" or use_kernels is False or self.layout.kv_dtype == "nvfp4":
            return None
        if self.mode == "fp8" or (self.mode == "nvfp4" and self.caches[0].dtype != torch.bfloat16):
            return None
        strides = {tuple(x.stride()) for x in self._k + self._v}
        if len(strides) != 1:
            return None
        try:
            from . import kernels as K
            K.library()
        except Exception:
            if use_kernels:
                raise
            return None
        es = self._k[0].element_size()
        st = self._k[0].stride()
        ptrs = []
        for k, v in zip(self._k, self._v):
            ptrs += [k.data_ptr(), v.data_ptr()]
        ptrs = torch.tensor(ptrs, dtype=torch.int64, device=self.device)
        # The per-call fields (block_ids, n, rows, row_stride, direction, row_errors) are
        # set on a copy of this template; the rest is fixed for the mover's life.
        lay = self.layout
        p = K.EnginePagesParams()
        p.engine, p.block_stride, p.head_stride, p.token_stride = ptrs.data_ptr(), st[0] * es, st[1] * es, st[2] * es
        p.elem_bytes, p.num_blocks = es, lay.num_blocks
        p.num_layers, p.num_kv_heads, p.head_dim, p.block_tokens = (self.num_layers, lay.num_kv_heads, lay.head_dim,
                                                                    lay.block_tokens)
        p.format = {"nvfp4": K.NVFP4, "fp8": K.FP8, "bf16": K.BF16}[self.format]
        p.scales = self._scales_dev.data_ptr() if self.format == "nvfp4" else None
        return {"ptrs": ptrs, "params": p, "fn": K.library().kvt_engine_pages, "check": K._check}

    def uses_kernels(self) -> bool:
        """True when the CUDA path copies (and decodes) with kvt_engine_pages."""
        return self._eng is not None

    def _kernel_copy(self, rows: torch.Tensor, ids: torch.Tensor, direction: int,
                     row_errors: Optional[torch.Tensor] = None) -> None:
        """One kvt_engine_pages launch on the current stream. NVFP4 rows need row_errors
        (int32 [n] on the device): the kernel's scale check writes it, and skips bad rows."""
        e = self._eng
        p = type(e["params"]).from_buffer_copy(e["params"])
        p.block_ids, p.n = ids.data_ptr(), ids.numel()
        p.rows, p.row_stride = rows.data_ptr(), rows.stride(0)
        p.direction = direction
        p.row_errors = row_errors.data_ptr() if row_errors is not None else None
        e["check"](e["fn"](ctypes.byref(p), ctypes.c_void_p(torch.cuda.current_stream(self.device).cuda_stream)),
                   "engine_pages")

    def _chunks(self, n: int, min_mib: int = 8):
        """Row ranges for the copy/compute pipeline: chunks of >= min_mib MiB, at most 8.
        Load uses 8 MiB: the last chunk's scatter is not overlapped, so small loads want
        several chunks. Save uses 16 MiB: NVFP4 save costs host time per chunk and layer
        (one quantize_append each), so more chunks make it slower."""
        k = max(1, min(8, n * self.block_bytes // (min_mib << 20), n))
        size = -(-n // k)
        return [(a, min(n, a + size)) for a in range(0, n, size)]

    def _side_stream(self):
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(self.device)
        return self._copy_stream

    # -- views ---------------------------------------------------------------------------
    def _sides(self, c: torch.Tensor):
        kind = self.layout.kind
        if kind == "cpu":
            # Per head T*D K elements then T*D V elements: [NB, H, T, D] views of each.
            lay = self.layout
            H, T, D = lay.num_kv_heads, lay.block_tokens, lay.head_dim
            size, st = (lay.num_blocks, H, T, D), (c.stride(0), 2 * T * D, D, 1)
            k = torch.as_strided(c, size, st, c.storage_offset())
            v = torch.as_strided(c, size, st, c.storage_offset() + T * D)
            if c.dtype == torch.float8_e4m3fn:
                k, v = k.view(torch.uint8), v.view(torch.uint8)
            return k, v
        if kind == "vllm_cuda":
            # K and V are the halves of each token's row: [NB, H, T, D] views with the
            # tensor's own strides (the kernel gets two base addresses, one set of strides).
            D = self.layout.head_dim
            k, v = c[..., :D], c[..., D:]
            if c.dtype == torch.float8_e4m3fn:
                k, v = k.view(torch.uint8), v.view(torch.uint8)
            return k, v
        k, v = (c[0], c[1]) if kind == "flash_attn" else (c[:, 0], c[:, 1])
        if c.dtype == torch.float8_e4m3fn:
            k, v = k.view(torch.uint8), v.view(torch.uint8)
        if self.layout.kv_dtype == "nvfp4":
            side = k[0].numel()
            return (torch.as_strided(k, (k.shape[0], side), (k.stride(0), 1)),
                    torch.as_strided(v, (v.shape[0], side), (v.stride(0), 1)))
        return k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [NB, T, H, D] -> [NB, H, T, D]

    def _ids(self, block_ids, unique: bool) -> List[int]:
        """The block ids as a list of ints, checked against [0, num_blocks) (and for
        repeats when unique); PagesError before anything is written."""
        if isinstance(block_ids, torch.Tensor):
            lst = block_ids.detach().reshape(-1).to("cpu", torch.int64).tolist()
        else:
            lst = [int(x) for x in block_ids]
        nb = self.layout.num_blocks
        if lst and (min(lst) < 0 or max(lst) >= nb):
            bad = next(x for x in lst if x < 0 or x >= nb)
            raise PagesError(f"block id {bad} is outside [0, {nb})")
        if unique and len(set(lst)) != len(lst):
            raise PagesError("a block id appears twice in one load")
        return lst

    def _ids_on_device(self, ids: List[int]) -> torch.Tensor:
        """ids as int64 on the cache's device: on CUDA an async copy from pinned memory on
        the current stream (a pageable copy would wait for the stream's earlier work)."""
        if self.device.type != "cuda":
            return torch.tensor(ids, dtype=torch.int64)
        return torch.tensor(ids, dtype=torch.int64, pin_memory=True).to(self.device, non_blocking=True)

    def _rows(self, rows: Rows, n: int, writable: bool) -> "_RowSet":
        """The n rows of block bytes, checked (PagesError before anything is written)."""
        bb = self.block_bytes
        if isinstance(rows, torch.Tensor):
            if rows.dtype != torch.uint8 or rows.dim() != 2:
                raise PagesError(f"block bytes must be a 2-D uint8 tensor [n, >= {bb}], got {rows.dtype} {tuple(rows.shape)}")
            if rows.shape[0] != n or rows.shape[1] < bb:
                raise PagesError(f"block bytes are {tuple(rows.shape)}, need [{n}, >= {bb}]")
            if rows.stride(1) != 1:
                raise PagesError("block byte rows must be contiguous")
            return _RowSet(rows[:, :bb], None, bb)
        rows = list(rows)
        if len(rows) != n:
            raise PagesError(f"{len(rows)} block buffers for {n} blocks")
        out = []
        for i, r in enumerate(rows):
            if not isinstance(r, torch.Tensor) or r.dtype != torch.uint8 or r.dim() != 1 or r.numel() < bb:
                raise PagesError(f"block buffer {i} must be a 1-D uint8 tensor of >= {bb} bytes")
            if r.stride(0) != 1:
                raise PagesError(f"block buffer {i} is not contiguous")
            out.append(r[:bb])
        if writable:
            for i, r in enumerate(out):
                if r.device != out[0].device:
                    raise PagesError(f"block buffer {i} is on {r.device}, buffer 0 on {out[0].device}")
        return _RowSet(None, out, bb)

    # -- public --------------------------------------------------------------------------
    def save(self, block_ids, dst: Rows, stream=None, wait: bool = True) -> None:
        """Writes block_ids' pages of every layer into dst (n rows of block_bytes)."""
        ids_l = self._ids(block_ids, unique=False)
        n = len(ids_l)
        rows = self._rows(dst, n, writable=True)
        if n == 0:
            return
        dst_dev = rows.device
        if self.device.type == "cuda":
            main = stream or torch.cuda.current_stream(self.device)
            bb = self.block_bytes
            with torch.cuda.stream(main):
                ids = self._ids_on_device(ids_l)
                st = torch.empty(n, self._staging_stride(), dtype=torch.uint8, device=self.device)
                if dst_dev == self.device:
                    self._gather(ids, st)
                    _copy_rows(st[:, :bb], rows, dst_dev)
                else:
                    # Gather chunk c on the compute stream while chunk c-1 goes to host.
                    copy = self._side_stream()
                    for a, b in self._chunks(n, 16):
                        self._gather(ids[a:b], st[a:b])
                        ev = torch.cuda.Event()
                        ev.record(main)
                        copy.wait_event(ev)
                        with torch.cuda.stream(copy):
                            _copy_rows(st[a:b, :bb], rows.part(a, b), dst_dev)
                    st.record_stream(copy)
                    main.wait_stream(copy)
                if wait:
                    main.synchronize()
            return
        if dst_dev.type != "cpu":
            raise PagesError(f"a CPU cache saves to host buffers, not {dst_dev}")
        ids = self._ids_on_device(ids_l)
        if rows.mat is not None:
            self._gather(ids, rows.mat)
        else:
            st = self._gather(ids, torch.empty(n, self.block_bytes, dtype=torch.uint8))
            for i, r in enumerate(rows.list):
                r.copy_(st[i])

    def load(self, src: Rows, block_ids, stream=None, wait: bool = True) -> PendingLoad:
        """Writes n blocks' bytes from src into block_ids' pages of every layer.

        PagesError (nothing written) for a refused argument. A block whose NVFP4 scales are
        bad (CorruptBlocksError) is not written and keeps its pages; the others are loaded.
        Returns a PendingLoad: with wait=True it has been waited on (and raised); with
        wait=False the caller calls its wait() before trusting the pages, and must not
        reuse src until then."""
        ids_l = self._ids(block_ids, unique=True)
        n = len(ids_l)
        rows = self._rows(src, n, writable=False)
        if n == 0:
            return PendingLoad(None, None, [], [])
        if self.device.type != "cuda":
            mat = rows.mat if rows.mat is not None else torch.stack(rows.list)
            if mat.device.type != "cpu":
                raise PagesError(f"a CPU cache loads from host buffers, not {mat.device}")
            res = PendingLoad(None, None, self._scatter(mat, self._ids_on_device(ids_l)), ids_l)
            if wait:
                res.wait()
            return res
        main = stream or torch.cuda.current_stream(self.device)
        bb = self.block_bytes
        # NVFP4 through the kernel: the device checks each row's scales right before its
        # decode (row_errors), so nothing here waits for the copies.
        check = self._eng is not None and self.format == "nvfp4"
        flags = None
        bad_rows: List[int] = []
        with torch.cuda.stream(main):
            if rows.device == self.device:
                ids = self._ids_on_device(ids_l)
                if check:
                    flags = torch.empty(n, dtype=torch.int32, device=self.device)
                mat = rows.mat
                if mat is not None and mat.stride(0) % 16 == 0 and mat.data_ptr() % 16 == 0:
                    st = mat
                else:
                    st = torch.empty(n, self._staging_stride(), dtype=torch.uint8, device=self.device)
                    _copy_rows_in(st[:, :bb], rows)
                bad_rows = self._scatter(st[:, :bb], ids, flags)
            else:
                # Copy chunk c to the device on a side stream while chunk c-1 is checked
                # and scattered. The copies are queued first (the stream idles until
                # then). The torch NVFP4 path checks every row on the host first.
                st = torch.empty(n, self._staging_stride(), dtype=torch.uint8, device=self.device)
                copy = self._side_stream()
                copy.wait_stream(main)
                events = []
                with torch.cuda.stream(copy):
                    for a, b in self._chunks(n):
                        _copy_rows_in(st[a:b, :bb], rows.part(a, b))
                        ev = torch.cuda.Event()
                        ev.record(copy)
                        events.append((a, b, ev))
                st.record_stream(copy)
                ids = self._ids_on_device(ids_l)
                if check:
                    flags = torch.empty(n, dtype=torch.int32, device=self.device)
                if self.format == "nvfp4" and flags is None:
                    main.wait_stream(copy)
                    bad_rows = self._scatter(st[:, :bb], ids)
                else:
                    for a, b, ev in events:
                        main.wait_event(ev)
                        self._scatter(st[a:b, :bb], ids[a:b], None if flags is None else flags[a:b])
            flags_host = None
            if flags is not None:
                flags_host = torch.empty(n, dtype=torch.int32, pin_memory=True)
                flags_host.copy_(flags, non_blocking=True)
            done = torch.cuda.Event()
            done.record(main)
        res = PendingLoad(done, flags_host, bad_rows, ids_l)
        if wait:
            res.wait()
        return res

    # -- internals -----------------------------------------------------------------------
    def _staging_stride(self) -> int:
        # kvt_pool wants 16-byte strides (NVFP4 quantize on the device).
        return (self.block_bytes + 15) // 16 * 16 if self.format == "nvfp4" else self.block_bytes

    def _layer(self, out: torch.Tensor, layer: int) -> torch.Tensor:
        p = self.page_bytes
        return out[:, layer * p:(layer + 1) * p]

    def _gather(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """Every layer's pages of blocks ids into out [n, >= block_bytes] (rows strided)."""
        lay, fmt = self.layout, self.format
        n, H, T, D = ids.numel(), lay.num_kv_heads, lay.block_tokens, lay.head_dim
        if fmt == "nvfp4" and lay.kv_dtype == "nvfp4":
            for l in range(self.num_layers):
                pages = torch.cat((self._k[l][ids], self._v[l][ids]), dim=1)
                self._layer(out, l).copy_(pages if self._perm is None else pages[:, self._perm])
            return out
        if fmt in ("bf16", "fp8") and self.mode == "as_is":
            if self._eng is not None:
                self._kernel_copy(out, ids, 0)
                return out
            et = torch.bfloat16 if fmt == "bf16" else torch.uint8
            for l in range(self.num_layers):
                pg = self._layer(out, l).view(et).view(n, 2, H, T, D)
                if self._cpu_blocks is not None:
                    # vLLM CPU: a block is [H, 2, T, D] in one piece; one gather, one copy.
                    pg.transpose(1, 2).copy_(self._cpu_blocks[l].index_select(0, ids))
                    continue
                pg[:, 0] = self._k[l][ids]
                pg[:, 1] = self._v[l][ids]
            return out
        if fmt == "fp8":
            for l in range(self.num_layers):
                pg = self._layer(out, l).view(n, 2, H, T, D)
                for s, side in enumerate((self._k[l], self._v[l])):
                    x = side[ids].float() / self._scales_dev[l, s]
                    pg[:, s] = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).view(torch.uint8)
            return out
        # NVFP4 quantize.
        if self.device.type == "cuda":
            return self._quantize_cuda(ids, out)
        from . import nvfp4_encode
        vals = H * T * D
        data = torch.empty(n, vals // 2, dtype=torch.uint8)
        scales = torch.empty(n, vals // 16, dtype=torch.uint8)
        for l in range(self.num_layers):
            pg = self._layer(out, l)
            off = 0
            for s, side in enumerate((self._k[l], self._v[l])):
                x = side[ids].float().contiguous()
                scale = (self.k_scales, self.v_scales)[s][l]
                nvfp4_encode(x.data_ptr(), x.numel(), scale, self.scale_rule, data.data_ptr(), scales.data_ptr())
                pg[:, off:off + vals // 2] = data
                pg[:, off + vals // 2:off + vals // 2 + vals // 16] = scales
                off += vals // 2 + vals // 16
        return out

    def _quantize_cuda(self, ids: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        from . import kernels as K
        lay = self.layout
        n, H, T, D = ids.numel(), lay.num_kv_heads, lay.block_tokens, lay.head_dim
        if out.stride(0) % 16 != 0 or out.data_ptr() % 16 != 0:
            raise PagesError("NVFP4 staging rows must be 16-byte aligned")
        pool = K.Pool(out.data_ptr(), out.stride(0), n, self.num_layers, H, D, T, K.NVFP4)
        slot_ids = torch.arange(n, dtype=torch.int32, device=self.device).repeat_interleave(T)
        positions = torch.arange(T, dtype=torch.int32, device=self.device).repeat(n)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        for l in range(self.num_layers):
            # [n, H, T, D] -> tokens [n*T, H, D], the kernel's input order.
            k = self._k[l][ids].permute(0, 2, 1, 3).reshape(n * T, H, D)
            v = self._v[l][ids].permute(0, 2, 1, 3).reshape(n * T, H, D)
            K.quantize_append(pool, k, v, slot_ids, positions, l, self.k_scales[l], self.v_scales[l],
                              self.scale_rule, stream=stream)
        return out

    def _scatter(self, src: torch.Tensor, ids: torch.Tensor, row_errors: Optional[torch.Tensor] = None) -> List[int]:
        """src [n, block_bytes] (on the cache's device, or host for a CPU cache) into the
        pages of blocks ids. Returns the rows refused for bad NVFP4 scales (not written),
        where that is known now; through the kernel the device writes them to row_errors
        (int32 [n], required there) instead and this returns []."""
        lay, fmt = self.layout, self.format
        n, H, T, D = ids.numel(), lay.num_kv_heads, lay.block_tokens, lay.head_dim
        L = self.num_layers
        if fmt == "nvfp4" and lay.kv_dtype == "nvfp4":
            side = self._k[0].shape[1]
            for l in range(L):
                pg = self._layer(src, l)
                if self._perm is not None:
                    pages = torch.empty(n, 2 * side, dtype=torch.uint8, device=self.device)
                    pages[:, self._perm] = pg
                else:
                    pages = pg
                self._k[l][ids] = pages[:, :side]
                self._v[l][ids] = pages[:, side:]
            return []
        if fmt in ("bf16", "fp8") and self.mode == "as_is":
            if self._eng is not None:
                self._kernel_copy(src, ids, 1)
                return []
            et = torch.bfloat16 if fmt == "bf16" else torch.uint8
            for l in range(L):
                pg = self._layer(src, l).view(et).view(n, 2, H, T, D)
                if self._cpu_blocks is not None:
                    # vLLM CPU: each block's [H, 2, T, D] written in one piece per layer
                    # (index_put through the K and V views is several times slower).
                    self._cpu_blocks[l].index_copy_(0, ids, pg.transpose(1, 2))
                    continue
                self._k[l][ids] = pg[:, 0]
                self._v[l][ids] = pg[:, 1]
            return []
        dt = self.caches[0].dtype
        if fmt == "fp8":
            for l in range(L):
                pg = self._layer(src, l).view(n, 2, H, T, D)
                for s, side in enumerate((self._k[l], self._v[l])):
                    side[ids] = (pg[:, s].view(torch.float8_e4m3fn).float() * self._scales_dev[l, s]).to(dt)
            return []
        # NVFP4 dequantize: all layers' sides are [data | scales] regions of one size.
        if self._eng is not None:
            # The kernel checks each row's scales and skips a bad row (row_errors).
            self._kernel_copy(src, ids, 1, row_errors)
            return []
        vals = H * T * D
        scales = src.view(n, L, 2, vals // 2 + vals // 16)[..., vals // 2:]
        bad = _nvfp4_bad_rows(scales)
        bad_rows = bad.nonzero().flatten().tolist()  # synchronizes a CUDA stream
        if bad_rows:
            good = (~bad).nonzero().flatten()
            n = good.numel()
            if n == 0:
                return bad_rows
            kept = torch.empty(n, self._staging_stride(), dtype=torch.uint8, device=src.device)
            kept[:, :self.block_bytes] = src[good]
            src, ids = kept[:, :self.block_bytes], ids[good.to(ids.device)]
        sides = src.view(n, L, 2, vals // 2 + vals // 16)
        data, scales = sides[..., :vals // 2], sides[..., vals // 2:]
        if self.device.type == "cuda" and dt == torch.bfloat16:
            self._dequantize_cuda(src, ids)
            return bad_rows
        if self.device.type == "cuda":
            x = nvfp4_decode_torch(data, scales, self._scales_dev.view(1, L, 2, 1, 1))
            x = x.to(dt).view(n, L, 2, H, T, D)
        else:
            from . import nvfp4_decode
            x = torch.empty(n, L, 2, vals, dtype=torch.float32)
            d_c, s_c = data.contiguous(), scales.contiguous()
            for l in range(L):
                for s in range(2):
                    buf = torch.empty(n, vals, dtype=torch.float32)
                    dd, ss = d_c[:, l, s].contiguous(), s_c[:, l, s].contiguous()
                    nvfp4_decode(dd.data_ptr(), ss.data_ptr(), n * vals, (self.k_scales, self.v_scales)[s][l],
                                 buf.data_ptr())
                    x[:, l, s] = buf
            x = x.to(dt).view(n, L, 2, H, T, D)
        for l in range(L):
            self._k[l][ids] = x[:, l, 0]
            self._v[l][ids] = x[:, l, 1]
        return bad_rows

    def _dequantize_cuda(self, src: torch.Tensor, ids: torch.Tensor) -> None:
        """NVFP4 pages in device memory src [n, block_bytes] (16-byte aligned rows) -> BF16
        pages of the cache, with libkvtier_kernels' dequantize_pages (one launch per layer
        and side, values equal to the CPU codec's) and one scatter per side."""
        from . import kernels as K
        lay = self.layout
        n, H, T, D = ids.numel(), lay.num_kv_heads, lay.block_tokens, lay.head_dim
        pool = K.Pool(src.data_ptr(), src.stride(0), n, self.num_layers, H, D, T, K.NVFP4)
        slot_ids = torch.arange(n, dtype=torch.int32, device=self.device).repeat_interleave(T)
        positions = torch.arange(T, dtype=torch.int32, device=self.device).repeat(n)
        stream = torch.cuda.current_stream(self.device).cuda_stream
        out = torch.empty(2, n * T, H, D, dtype=torch.bfloat16, device=self.device)
        for l in range(self.num_layers):
            for s, side in enumerate((self._k[l], self._v[l])):
                K.dequantize_pages(pool, out[s], slot_ids, positions, l, s, (self.k_scales, self.v_scales)[s][l],
                                   stream=stream)
                side[ids] = out[s].view(n, T, H, D).permute(0, 2, 1, 3)


class _RowSet:
    """n rows of bb block bytes: a 2-D uint8 view (mat, rows possibly strided) or a list of
    1-D views (slots anywhere)."""

    def __init__(self, mat: Optional[torch.Tensor], lst: Optional[List[torch.Tensor]], bb: int):
        self.mat, self.list, self.bb = mat, lst, bb
        self.device = mat.device if mat is not None else lst[0].device if lst else torch.device("cpu")

    def part(self, a: int, b: int) -> "_RowSet":
        return _RowSet(self.mat[a:b], None, self.bb) if self.mat is not None else _RowSet(None, self.list[a:b], self.bb)

    def runs(self):
        """[(first, count, flat uint8 view of count * bb bytes)] of rows that lie back to back."""
        bb = self.bb
        if self.mat is not None:
            m = self.mat
            if m.shape[0] == 1 or m.stride(0) == bb:
                return [(0, m.shape[0], _span(m, m.shape[0], bb))]
            return [(i, 1, m[i]) for i in range(m.shape[0])]
        out, rows, i = [], self.list, 0
        while i < len(rows):
            j = i + 1
            while j < len(rows) and rows[j].data_ptr() == rows[j - 1].data_ptr() + bb:
                j += 1
            out.append((i, j - i, _span(rows[i], j - i, bb)))
            i = j
        return out


def _span(r: torch.Tensor, count: int, bb: int) -> torch.Tensor:
    return torch.as_strided(r, (count * bb,), (1,))


def _copy_rows(st: torch.Tensor, rows: _RowSet, dst_dev) -> None:
    """Device staging [n, bb] -> destination rows: one async copy per contiguous run."""
    bb = st.shape[1]
    nb = dst_dev.type == "cpu"
    for first, count, span in rows.runs():
        part = st[first:first + count]
        if part.is_contiguous():
            span.copy_(part.reshape(-1), non_blocking=nb)
        else:  # staging rows padded past bb (NVFP4 16-byte rows)
            span.view(count, bb).copy_(part, non_blocking=nb)


def _copy_rows_in(st: torch.Tensor, rows: _RowSet) -> None:
    """Source rows -> device staging [n, bb]: one async copy per contiguous run."""
    bb = st.shape[1]
    for first, count, span in rows.runs():
        part = st[first:first + count]
        if part.is_contiguous():
            part.reshape(-1).copy_(span, non_blocking=True)
        else:
            part.copy_(span.view(count, bb), non_blocking=True)


def pin(t: torch.Tensor, read_only: bool = False) -> torch.Tensor:
    """Page-locks host memory that torch did not allocate (e.g. a view of kvtierd's host
    arena, which maps read-only) with cudaHostRegister, so copies from it are true async
    DMA. Returns t. The registration lasts until the process ends or unpin(t)."""
    flags = 0x08 if read_only else 0  # cudaHostRegisterReadOnly
    rc = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), t.numel() * t.element_size(), flags)
    if int(rc) != 0:
        raise PagesError(f"cudaHostRegister failed ({rc})")
    return t


def unpin(t: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(t.data_ptr())


# ---- Host pools of SGLang's HiCache ------------------------------------------------------
#
# SGLang's host pool (MHATokenToKVPoolHost) holds every page of every layer in one tensor,
# kv_buffer, indexed by token:
#   page_first:  [2, size, L, H, row]  -> one page is [2, T, L, H, row]
#   layer_first: [2, L, size, H, row]  -> one page is [2, L, T, H, row]
# Its FP4 subclass keeps the packed E2M1 data in kv_buffer (page_first, row = D/2 bytes)
# and the E4M3 block scales in scale_kv_buffer ([2, size, L, H, D/16]). One page (T tokens,
# every layer, K and V) is one kvtier block in kvtier's layout, whatever the pool's
# layout: both layouts store and load each other's pages; an FP4 page is one NVFP4 block
# with its data and scales together, bit for bit.

@dataclass(frozen=True)
class HostPoolGeometry:
    """What one page of a host pool is."""
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

    @property
    def engine_dtype(self) -> str:
        """The dtype name of kvtier.engine.EngineShape for these pages."""
        return {"bf16": "bfloat16", "fp8": "fp8_e4m3", "nvfp4": "nvfp4"}[self.kv_format]


def _pool_is_fp8(pool, kv_cache_dtype: Optional[str]) -> bool:
    dev = getattr(pool, "device_pool", None)
    for d in (getattr(pool, "dtype", None), getattr(dev, "dtype", None)):
        if d in (torch.float8_e4m3fn,) or (d is not None and "float8_e4m3" in str(d)):
            return True
    return str(kv_cache_dtype or "").lower() in ("fp8", "fp8_e4m3", "float8_e4m3fn")


def host_pool_geometry(pool, kv_cache_dtype: Optional[str] = None) -> HostPoolGeometry:
    """Reads and checks a host pool (MHATokenToKVPoolHost or its FP4 subclass); raises
    PagesError naming what cannot be stored. kv_cache_dtype "fp8_e4m3" says a uint8 pool
    holds FP8 E4M3 bytes when neither it nor its device pool says so."""
    name = type(pool).__name__
    if getattr(pool, "is_mla", False) or not hasattr(pool, "kv_buffer"):
        raise PagesError(f"{name}: only MHA host pools (kv_buffer of K and V) are supported; "
                         "MLA and hybrid pools are not")
    layout = getattr(pool, "layout", None)
    if layout not in ("page_first", "layer_first"):
        raise PagesError(f"{name}: --hicache-mem-layout {layout!r} is not supported; use page_first or layer_first")
    buf = pool.kv_buffer
    L, H, T = int(pool.layer_num), int(pool.head_num), int(pool.page_size)
    size = int(pool.size)
    scales = getattr(pool, "scale_kv_buffer", None)
    if scales is not None:
        if layout != "page_first" or buf.dtype != torch.uint8 or scales.dtype != torch.uint8:
            raise PagesError(f"{name}: an FP4 pool must be page_first with uint8 data and scales")
        packed = int(pool.head_dim)
        D = 2 * packed
        if D % 16 or tuple(buf.shape) != (2, size, L, H, packed) or scales.numel() != 2 * size * L * H * (D // 16):
            raise PagesError(f"{name}: FP4 kv_buffer {tuple(buf.shape)} and scale_kv_buffer {tuple(scales.shape)} "
                             f"are not (2, {size}, {L}, {H}, D/2) and one E4M3 scale per 16 values")
        fmt = "nvfp4"
    else:
        D = int(pool.head_dim)
        want = (2, size, L, H, D) if layout == "page_first" else (2, L, size, H, D)
        if tuple(buf.shape) != want:
            raise PagesError(f"{name}: kv_buffer {tuple(buf.shape)} is not the {layout} shape {want}")
        if buf.dtype == torch.bfloat16:
            fmt = "bf16"
        elif buf.dtype == torch.float8_e4m3fn or (buf.dtype == torch.uint8 and _pool_is_fp8(pool, kv_cache_dtype)):
            fmt = "fp8"
        elif buf.dtype == torch.uint8:
            raise PagesError(f"{name}: uint8 KV pages of unknown format; set kv_cache_dtype to fp8_e4m3 if they "
                             "are FP8 E4M3")
        else:
            raise PagesError(f"{name}: kvtier has no {buf.dtype} block format (bf16, fp8 E4M3 and NVFP4 are "
                             "stored); serve with --dtype bfloat16 or an fp8/fp4 KV cache")
    if not buf.is_contiguous() or buf.device.type != "cpu":
        raise PagesError(f"{name}: kv_buffer must be a contiguous CPU tensor")
    if size % T:
        raise PagesError(f"{name}: pool size {size} is not a multiple of page_size {T}")
    return HostPoolGeometry(layout, T, L, H, D, fmt)


def _pool_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype != torch.uint8 else t


def _pages_to_blocks(g: HostPoolGeometry, buf: torch.Tensor, idx: torch.Tensor, n: int) -> torch.Tensor:
    """Gathers n pages (token indices idx, n * T of them) of one byte buffer: [n, L, 2, H, T, row]."""
    T = g.page_size
    if g.layout == "page_first":
        x = buf[:, idx]                                    # [2, nT, L, H, row]
        x = x.view(2, n, T, *x.shape[2:])                  # [2, n, T, L, H, row]
        return x.permute(1, 3, 0, 4, 2, 5).contiguous()    # [n, L, 2, H, T, row]
    x = buf[:, :, idx]                                     # [2, L, nT, H, row]
    x = x.view(2, x.shape[1], n, T, *x.shape[3:])          # [2, L, n, T, H, row]
    return x.permute(2, 1, 0, 4, 3, 5).contiguous()


def _blocks_to_pages(g: HostPoolGeometry, buf: torch.Tensor, idx: torch.Tensor, blocks: torch.Tensor) -> None:
    """The inverse of _pages_to_blocks: blocks [n, L, 2, H, T, row] into buf at token indices idx."""
    n = blocks.shape[0]
    if g.layout == "page_first":
        buf[:, idx] = blocks.permute(2, 0, 4, 1, 3, 5).reshape(2, n * g.page_size, blocks.shape[1], blocks.shape[3],
                                                              blocks.shape[5])
    else:
        buf[:, :, idx] = blocks.permute(2, 1, 0, 4, 3, 5).reshape(2, blocks.shape[1], n * g.page_size,
                                                                 blocks.shape[3], blocks.shape[5])


class HostPoolMover:
    """Copies whole pages between an SGLang host pool and kvtier block bytes."""

    def __init__(self, pool, g: HostPoolGeometry):
        self.g = g
        self.data = _pool_bytes(pool.kv_buffer)
        self.scales = None
        if g.kv_format == "nvfp4":
            s = pool.scale_kv_buffer
            self.scales = s.reshape(2, s.shape[1], g.num_layers, g.num_kv_heads, g.head_dim // 16)
        self.size = int(pool.size)

    def page_starts(self, host_indices: torch.Tensor, n: int) -> torch.Tensor:
        """Checks host_indices (n whole, page-aligned pages of the pool) and returns them as
        int64 token indices on the CPU; PagesError otherwise."""
        T = self.g.page_size
        idx = host_indices.to(device="cpu", dtype=torch.int64).flatten()
        if idx.numel() != n * T:
            raise PagesError(f"{idx.numel()} host indices for {n} pages of {T} tokens")
        if n == 0:
            return idx
        pages = idx.view(n, T)
        first = pages[:, 0]
        if bool((first % T != 0).any()) or bool((pages != first[:, None] + torch.arange(T)).any()):
            raise PagesError("host indices are not whole pages (page-aligned runs of page_size tokens)")
        if int(idx.min()) < 0 or int(idx.max()) >= self.size:
            raise PagesError(f"host indices outside the pool's {self.size} tokens")
        return idx

    def save(self, idx: torch.Tensor, n: int, rows: Sequence[torch.Tensor]) -> None:
        """n pages at token indices idx -> rows (uint8 tensors of at least block_bytes)."""
        g = self.g
        data = _pages_to_blocks(g, self.data, idx, n)                  # [n, L, 2, H, T, row]
        if self.scales is not None:
            sc = _pages_to_blocks(g, self.scales, idx, n)               # [n, L, 2, H, T, D/16]
            per = g.num_kv_heads * g.page_size
            data = torch.cat((data.reshape(n, g.num_layers, 2, per * g.row_bytes),
                              sc.reshape(n, g.num_layers, 2, per * g.scale_bytes)), dim=3)
        flat = data.reshape(n, g.block_bytes)
        for i, r in enumerate(rows):
            r[:g.block_bytes].copy_(flat[i])

    def load(self, rows: Sequence[torch.Tensor], idx: torch.Tensor) -> None:
        """rows -> len(rows) pages at token indices idx."""
        g = self.g
        n = len(rows)
        flat = torch.stack([r[:g.block_bytes] for r in rows])
        L, H, T = g.num_layers, g.num_kv_heads, g.page_size
        if self.scales is None:
            _blocks_to_pages(g, self.data, idx, flat.view(n, L, 2, H, T, g.row_bytes))
            return
        per = H * T
        v = flat.view(n, L, 2, per * (g.row_bytes + g.scale_bytes))
        _blocks_to_pages(g, self.data, idx, v[..., :per * g.row_bytes].reshape(n, L, 2, H, T, g.row_bytes))
        _blocks_to_pages(g, self.scales, idx, v[..., per * g.row_bytes:].reshape(n, L, 2, H, T, g.scale_bytes))


# ---- LMCache chunks ----------------------------------------------------------------------
#
# LMCache hands a remote connector whole chunks as MemoryObjs in KV_2LTD order, [2, L, T,
# H*D] (K and V, layers, tokens, heads x head_dim). One full chunk is one kvtier block:
# per layer K then V, HND inside a page ([L, 2, H, T, D]).

class ChunkMover:
    """Converts LMCache KV_2LTD chunks to and from kvtier blocks (BF16 or FP8 E4M3)."""

    DTYPES = {torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8"}

    def __init__(self, num_layers: int, chunk_tokens: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype):
        if dtype not in self.DTYPES:
            raise PagesError(f"kvtier has no {dtype} block format (bf16 and fp8 e4m3 chunks are stored)")
        self.L, self.T, self.H, self.D, self.dtype = num_layers, chunk_tokens, num_kv_heads, head_dim, dtype
        self.shape = torch.Size([2, num_layers, chunk_tokens, num_kv_heads * head_dim])
        self.kv_format = self.DTYPES[dtype]
        self.block_bytes = 2 * num_layers * chunk_tokens * num_kv_heads * head_dim * dtype.itemsize

    def is_full(self, t: Optional[torch.Tensor]) -> bool:
        """A whole chunk of this shape (a prompt's last, shorter chunk is not a block)."""
        return t is not None and tuple(t.shape) == tuple(self.shape) and t.dtype == self.dtype

    def save(self, chunk: torch.Tensor, row: torch.Tensor) -> None:
        """One KV_2LTD chunk -> one block's bytes."""
        blk = chunk.view(2, self.L, self.T, self.H, self.D).permute(1, 0, 3, 2, 4).contiguous()
        row[:self.block_bytes].copy_(blk.view(-1).view(torch.uint8))

    def load(self, row: torch.Tensor, chunk: torch.Tensor) -> None:
        """One block's bytes -> a KV_2LTD chunk tensor."""
        src = row[:self.block_bytes].view(self.dtype).view(self.L, 2, self.H, self.T, self.D)
        chunk.view(2, self.L, self.T, self.H, self.D).copy_(src.permute(1, 0, 3, 2, 4))
