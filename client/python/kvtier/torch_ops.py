"""kvtier's kernels as torch custom ops (``torch.ops.kvtier.*``).

The ops run on torch's current CUDA stream, so they order with the surrounding torch work,
can be captured in a CUDA graph, and are opaque to ``torch.compile`` (each has a fake
implementation, so a compiled graph keeps them as calls instead of breaking). The pages
live in the daemon's HBM arena, which the ops take as a uint8 tensor (:func:`arena_tensor`):
``quantize_append`` declares it mutated and ``decode`` / ``dequantize_pages`` read it, so
the compiler sees the write-before-read order between them.

Geometry is one int list, ``[slot_bytes, num_slots, num_layers, num_kv_heads, head_dim,
block_tokens, format, slab_bytes, class_bytes]`` (:func:`geometry`), the fields of ``kvt_pool``
(kernels.h; the last two 0 for block-major pages, else the layer-major slabs' bytes and the
contract's slot class).

    torch.ops.kvtier.quantize_append(arena, k, v, slot_ids, positions, geom, layer, ks, vs, rule)
    torch.ops.kvtier.decode(arena, q, out, block_table, seq_lens, workspace, geom, layer,
                            ks, vs, softmax_scale, max_seq_len, num_splits)
    torch.ops.kvtier.dequantize_pages(arena, out, slot_ids, positions, geom, layer, side, scale)

``quantize_append`` writes the pages of every format with the CUDA kernel: NVFP4
bit-identical to the CPU codec, FP8 as ``x / scale`` rounded to E4M3 (round to nearest
even, saturating at +-448), BF16 as the values. The kernel addresses one block at a time
(slot ``s`` at ``base + s * slot_bytes``, its layers' pages side by side, formats/layout.h,
or layer-major in slabs),
so no view over the arena is ever built and nothing reaches past it, whatever the stride
(a block may span several granules of an arena of slot classes). Every launcher checks
its arguments first and raises :class:`kvtier.kernels.KernelError` without launching
anything.

``quantize_append_impl``, ``decode_impl`` and ``dequantize_pages_impl`` are the same
launchers without the dispatcher: eager callers (kvtier.transformers outside torch.compile)
use them to save the op dispatch on every layer; CUDA graph capture records them alike.
"""
import ctypes
from typing import List

import torch

from . import kernels as K

GEOMETRY_FIELDS = ("slot_bytes", "num_slots", "num_layers", "num_kv_heads", "head_dim", "block_tokens", "format",
                   "slab_bytes", "class_bytes")


class _CudaBytes:
    """A raw device allocation seen by torch (the IPC-mapped HBM arena)."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def arena_tensor(base: int, nbytes: int) -> torch.Tensor:
    """A uint8 CUDA tensor over device memory at `base` (not owned: the memory must outlive it)."""
    return torch.as_tensor(_CudaBytes(base, nbytes), device="cuda")


def geometry(pool: K.Pool) -> List[int]:
    return [int(pool.slot_bytes), int(pool.num_slots), int(pool.num_layers), int(pool.num_kv_heads),
            int(pool.head_dim), int(pool.block_tokens), int(pool.format), int(pool.slab_bytes),
            int(pool.class_bytes)]


_pools = {}


def _pool(arena: torch.Tensor, geom: List[int]) -> K.Pool:
    key = (arena.data_ptr(), *geom)
    p = _pools.get(key)
    if p is None:
        # The first seven fields alone: block-major pages.
        if len(geom) not in (len(GEOMETRY_FIELDS) - 2, len(GEOMETRY_FIELDS)):
            raise ValueError(f"geometry has {len(geom)} fields, expected {len(GEOMETRY_FIELDS)}: {GEOMETRY_FIELDS}")
        p = K.Pool(arena.data_ptr(), *geom)
        if geom[0] * geom[1] > arena.numel():
            raise ValueError(f"arena has {arena.numel()} bytes, geometry needs {geom[0] * geom[1]}")
        K.check_pool(p)
        _pools[key] = p
    return p


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def quantize_append_impl(arena: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_ids: torch.Tensor,
                    positions: torch.Tensor, geom: List[int], layer: int, k_scale: float, v_scale: float,
                    scale_rule: int) -> None:
    """K and V of one layer ([n, H, D] bf16/fp16, any strides) into the pages: token i goes
    to slot slot_ids[i] (int32), position positions[i] (int32) of the block.

    The kernel reads [n, H, D] row-major, so each of k and v is made contiguous here on its
    own: a model hands the cache views (K/V slices of a fused qkv projection, heads
    transposed out of [n, D, H]) whose strides are not those of [n, H, D], and a raw
    pointer to such a view reads other tokens' values."""
    if not (0 <= layer < geom[2]):
        raise K.KernelError(6, "quantize_append", f"layer {layer} is outside [0, {geom[2]})")
    if k.shape != v.shape or k.dim() != 3 or k.shape[1] != geom[3] or k.shape[2] != geom[4]:
        raise K.KernelError(6, "quantize_append", f"k/v are {tuple(k.shape)}/{tuple(v.shape)}, expected [n, {geom[3]}, {geom[4]}]")
    if k.dtype != v.dtype or k.dtype not in (torch.bfloat16, torch.float16):
        raise K.KernelError(6, "quantize_append", f"k/v must both be bf16 or fp16, got {k.dtype}/{v.dtype}")
    if slot_ids.dtype != torch.int32 or positions.dtype != torch.int32 or slot_ids.shape != (k.shape[0],) or \
            positions.shape != (k.shape[0],):
        raise K.KernelError(6, "quantize_append", f"slot_ids/positions must be int32 [{k.shape[0]}], got "
                            f"{slot_ids.dtype}{tuple(slot_ids.shape)}/{positions.dtype}{tuple(positions.shape)}")
    if k.shape[0] == 0:
        return
    k, v = k.contiguous(), v.contiguous()
    slot_ids, positions = slot_ids.contiguous(), positions.contiguous()
    p = K._QuantizeParams()
    p.k, p.v = k.data_ptr(), v.data_ptr()
    p.dtype = K.DTYPE_BF16 if k.dtype == torch.bfloat16 else K.DTYPE_FP16
    p.num_tokens = k.shape[0]
    p.slot_ids, p.positions = slot_ids.data_ptr(), positions.data_ptr()
    p.layer, p.k_scale, p.v_scale, p.scale_rule = layer, k_scale, v_scale, scale_rule
    K._check(K.library().kvt_quantize_append(ctypes.byref(_pool(arena, geom)), ctypes.byref(p), _stream()),
             "quantize_append")


quantize_append = torch.library.custom_op("kvtier::quantize_append", quantize_append_impl, mutates_args=("arena",),
                                          device_types="cuda")


@quantize_append.register_fake
def _(arena, k, v, slot_ids, positions, geom, layer, k_scale, v_scale, scale_rule):
    return None


def _decode_params(q, out, block_table, seq_lens, workspace, layer, k_scale, v_scale, softmax_scale,
                   max_seq_len, num_splits) -> K.DecodeParams:
    p = K.DecodeParams()
    p.q, p.out = q.data_ptr(), out.data_ptr()
    p.block_table, p.seq_lens = block_table.data_ptr(), seq_lens.data_ptr()
    p.batch, p.num_q_heads = q.shape[0], q.shape[1]
    p.max_blocks = block_table.shape[1]
    p.max_seq_len = max_seq_len
    p.layer, p.k_scale, p.v_scale, p.softmax_scale = layer, k_scale, v_scale, softmax_scale
    p.num_splits = num_splits
    if workspace is not None and workspace.numel() > 0:
        p.workspace, p.workspace_bytes = workspace.data_ptr(), workspace.numel()
    return p


def decode_workspace_bytes(arena: torch.Tensor, geom: List[int], q: torch.Tensor, out: torch.Tensor,
                           block_table: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                           num_splits: int = 0) -> int:
    """Bytes of scratch ``decode`` needs for this shape (0: no split)."""
    p = _decode_params(q, out, block_table, seq_lens, None, 0, 1.0, 1.0, 1.0, max_seq_len, num_splits)
    return int(K.library().kvt_decode_workspace_bytes(ctypes.byref(_pool(arena, geom)), ctypes.byref(p)))


def decode_impl(arena: torch.Tensor, q: torch.Tensor, out: torch.Tensor, block_table: torch.Tensor,
           seq_lens: torch.Tensor, workspace: torch.Tensor, geom: List[int], layer: int, k_scale: float,
           v_scale: float, softmax_scale: float, max_seq_len: int, num_splits: int) -> None:
    """Fused paged decode: q [B, Hq, D] bf16 over the pages named by block_table [B, max_blocks]
    (int32 slot ids) with seq_lens [B] (int32) tokens each -> out [B, Hq, D] bf16."""
    p = _decode_params(q, out, block_table, seq_lens, workspace, layer, k_scale, v_scale, softmax_scale,
                       max_seq_len, num_splits)
    K._check(K.library().kvt_decode(ctypes.byref(_pool(arena, geom)), ctypes.byref(p), _stream()), "decode")


decode = torch.library.custom_op("kvtier::decode", decode_impl, mutates_args=("out", "workspace"), device_types="cuda")


@decode.register_fake
def _(arena, q, out, block_table, seq_lens, workspace, geom, layer, k_scale, v_scale, softmax_scale,
      max_seq_len, num_splits):
    return None


def dequantize_pages_impl(arena: torch.Tensor, out: torch.Tensor, slot_ids: torch.Tensor, positions: torch.Tensor,
                     geom: List[int], layer: int, side: int, scale: float) -> None:
    """Pages -> bf16 out [n, H, D]: side 0 = K, 1 = V; scale is that side's global scale."""
    if out.shape[0] == 0:
        return
    p = K._DequantParams()
    p.out, p.num_tokens = out.data_ptr(), out.shape[0]
    p.slot_ids, p.positions = slot_ids.data_ptr(), positions.data_ptr()
    p.layer, p.side, p.scale = layer, side, scale
    K._check(K.library().kvt_dequantize_pages(ctypes.byref(_pool(arena, geom)), ctypes.byref(p), _stream()),
             "dequantize_pages")


dequantize_pages = torch.library.custom_op("kvtier::dequantize_pages", dequantize_pages_impl, mutates_args=("out",),
                                           device_types="cuda")


@dequantize_pages.register_fake
def _(arena, out, slot_ids, positions, geom, layer, side, scale):
    return None
