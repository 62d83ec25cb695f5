"""kvtier's CUDA kernels from Python (ctypes over libkvtier_kernels.so).

The C ABI is kernels/include/kvtier/kernels.h. Every launcher takes raw device pointers,
so this module works with torch tensors (``t.data_ptr()``), CuPy arrays or any other
CUDA memory, and with the HBM arena a :class:`kvtier.Client` mapped through CUDA IPC.

    from kvtier import kernels
    pool = kernels.Pool(base=client.hbm_device_ptr(), slot_bytes=client.hbm_granule,
                        num_slots=client.hbm_arena_bytes // client.hbm_granule,
                        num_layers=L, num_kv_heads=H, head_dim=D,
                        block_tokens=T, format=kernels.NVFP4)
    kernels.quantize_append(pool, k, v, slot_ids, positions, layer, k_scale, v_scale)
    kernels.decode(pool, q, out, block_table, seq_lens, layer, k_scale, v_scale, sm_scale)

Nothing here falls back to another format or to the CPU: a launcher that refuses its
arguments raises :class:`KernelError` with the library's one-line reason, and nothing was
launched.
"""
import ctypes
from typing import List, Optional

from . import _load_first, _locate

NVFP4, FP8, BF16 = 0, 1, 2
FORMAT_NAMES = {NVFP4: "nvfp4", FP8: "fp8", BF16: "bf16"}
FORMAT_BY_NAME = {v: k for k, v in FORMAT_NAMES.items()}
DTYPE_BF16, DTYPE_FP16 = 0, 1
MAX6, FOUR_OVER_SIX = 0, 1
E4M3_MAX, E2M1_MAX = 448.0, 6.0


class KernelError(RuntimeError):
    def __init__(self, code: int, what: str, message: str):
        super().__init__(f"{what}: {message} (kvt status {code})")
        self.code = code


class Pool(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("slot_bytes", ctypes.c_uint64), ("num_slots", ctypes.c_uint64),
                ("num_layers", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("block_tokens", ctypes.c_uint32), ("format", ctypes.c_uint32),
                # Layer-major slabs (kernels.h): 0, 0 = block-major.
                ("slab_bytes", ctypes.c_uint64), ("class_bytes", ctypes.c_uint64)]


class _QuantizeParams(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("dtype", ctypes.c_uint32),
                ("num_tokens", ctypes.c_int32), ("slot_ids", ctypes.c_void_p), ("positions", ctypes.c_void_p),
                ("slot_ids_host", ctypes.c_void_p), ("positions_host", ctypes.c_void_p),
                ("layer", ctypes.c_uint32), ("k_scale", ctypes.c_float), ("v_scale", ctypes.c_float),
                ("scale_rule", ctypes.c_uint32), ("error_flag", ctypes.c_void_p)]


class DecodeParams(ctypes.Structure):
    _fields_ = [("q", ctypes.c_void_p), ("out", ctypes.c_void_p), ("lse", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("seq_lens", ctypes.c_void_p),
                ("block_table_host", ctypes.c_void_p), ("seq_lens_host", ctypes.c_void_p),
                ("batch", ctypes.c_int32), ("num_q_heads", ctypes.c_int32), ("max_blocks", ctypes.c_int32),
                ("max_seq_len", ctypes.c_int32), ("layer", ctypes.c_uint32), ("k_scale", ctypes.c_float),
                ("v_scale", ctypes.c_float), ("softmax_scale", ctypes.c_float), ("num_splits", ctypes.c_int32),
                ("workspace", ctypes.c_void_p), ("workspace_bytes", ctypes.c_uint64),
                ("error_flag", ctypes.c_void_p)]


class DecodeShape(ctypes.Structure):
    _fields_ = [("format", ctypes.c_uint32), ("head_dim", ctypes.c_uint32), ("group", ctypes.c_uint32),
                ("block_tokens", ctypes.c_uint32)]


class _DequantParams(ctypes.Structure):
    _fields_ = [("out", ctypes.c_void_p), ("num_tokens", ctypes.c_int32), ("slot_ids", ctypes.c_void_p),
                ("positions", ctypes.c_void_p), ("slot_ids_host", ctypes.c_void_p),
                ("positions_host", ctypes.c_void_p), ("layer", ctypes.c_uint32), ("side", ctypes.c_uint32),
                ("scale", ctypes.c_float), ("error_flag", ctypes.c_void_p)]


class EnginePagesParams(ctypes.Structure):
    _fields_ = [("engine", ctypes.c_void_p), ("block_stride", ctypes.c_int64), ("head_stride", ctypes.c_int64),
                ("token_stride", ctypes.c_int64), ("elem_bytes", ctypes.c_uint32), ("block_ids", ctypes.c_void_p),
                ("n", ctypes.c_int32), ("num_blocks", ctypes.c_int64), ("rows", ctypes.c_void_p),
                ("row_stride", ctypes.c_uint64), ("num_layers", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("head_dim", ctypes.c_uint32), ("block_tokens", ctypes.c_uint32), ("format", ctypes.c_uint32),
                ("scales", ctypes.c_void_p), ("direction", ctypes.c_uint32), ("error_flag", ctypes.c_void_p),
                ("row_errors", ctypes.c_void_p)]


_lib = None


def _candidates() -> List[str]:
    return _locate.kernels_candidates()


def library():
    """Loads libkvtier_kernels.so once (KVTIER_KERNELS_LIB, else next to KVTIER_LIB, else
    the repo's build folders, else the installed library folder, else the loader's
    search path)."""
    global _lib
    if _lib is None:
        lib, _ = _load_first(_candidates(), "libkvtier_kernels.so (set KVTIER_KERNELS_LIB; it is built only with CUDA)")
        lib.kvt_last_error.restype = ctypes.c_char_p
        lib.kvt_decode_workspace_bytes.restype = ctypes.c_uint64
        lib.kvt_decode_num_splits.restype = ctypes.c_int32
        for f in ("kvt_check_pool", "kvt_quantize_append", "kvt_decode", "kvt_dequantize_pages", "kvt_engine_pages"):
            getattr(lib, f).restype = ctypes.c_int
        lib.kvt_decode_shapes.restype = ctypes.c_uint32
        lib.kvt_decode_shapes.argtypes = [ctypes.POINTER(DecodeShape), ctypes.c_uint32]
        lib.kvt_decode_supports.restype = ctypes.c_int
        lib.kvt_decode_supports.argtypes = [ctypes.c_uint32] * 4
        _lib = lib
    return _lib


def built_with_cuda() -> bool:
    """Whether the loaded library has its GPU kernels (a build without CUDA answers every
    launcher with KVT_UNSUPPORTED; its decode-shape table still answers)."""
    return library().kvt_check_pool(None) != 7


_shapes = None


def decode_shapes() -> List[tuple]:
    """The shapes the kernels' decode serves, as (format, head_dim, group, block_tokens)
    tuples (format: NVFP4, FP8, BF16): the library's table (kvt_decode_shapes), the one
    source of what kvtier.transformers accepts."""
    global _shapes
    if _shapes is None:
        lib = library()
        n = lib.kvt_decode_shapes(None, 0)
        arr = (DecodeShape * n)()
        lib.kvt_decode_shapes(arr, n)
        _shapes = [(int(x.format), int(x.head_dim), int(x.group), int(x.block_tokens)) for x in arr]
    return list(_shapes)


def decode_unsupported(fmt: int, head_dim: int, group: int, block_tokens: int) -> Optional[str]:
    """None when the decode serves pages of `fmt` with this head_dim, GQA group and block
    tokens; otherwise the library's one-line reason (kvt_decode_supports)."""
    lib = library()
    if lib.kvt_decode_supports(fmt, head_dim, group, block_tokens) == 0:
        return None
    return lib.kvt_last_error().decode()


def _check(rc: int, what: str):
    if rc != 0:
        raise KernelError(rc, what, library().kvt_last_error().decode())


def _stream(stream) -> ctypes.c_void_p:
    if stream is None:
        import torch  # only when the caller passes no stream
        return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    return ctypes.c_void_p(int(stream))


def page_bytes(fmt: int, num_kv_heads: int, head_dim: int, block_tokens: int) -> int:
    """Bytes of one layer's page (formats/layout.h)."""
    vals = num_kv_heads * block_tokens * head_dim
    return {NVFP4: vals + vals // 8, FP8: 2 * vals, BF16: 4 * vals}[fmt]


def check_pool(pool: Pool):
    _check(library().kvt_check_pool(ctypes.byref(pool)), "pool")


def quantize_append(pool: Pool, k, v, slot_ids, positions, layer: int, k_scale: float, v_scale: float,
                    scale_rule: int = MAX6, stream=None, slot_ids_host=None, positions_host=None):
    """K and V of one layer ([n, H, D] bf16/fp16 torch tensors on the GPU) into the pool's
    pages (NVFP4, FP8 or BF16): token i goes to slot slot_ids[i] (int32 device tensor),
    position positions[i]. Views of any strides are copied to contiguous tensors first (the
    kernel reads [n, H, D] row-major)."""
    import torch
    n = k.shape[0]
    if k.dtype != v.dtype or k.dtype not in (torch.bfloat16, torch.float16):
        raise ValueError(f"k and v must both be bf16 or fp16, got {k.dtype} and {v.dtype}")
    k, v = k.contiguous(), v.contiguous()
    p = _QuantizeParams()
    p.k, p.v = k.data_ptr(), v.data_ptr()
    p.dtype = DTYPE_BF16 if k.dtype == torch.bfloat16 else DTYPE_FP16
    p.num_tokens = n
    p.slot_ids, p.positions = slot_ids.data_ptr(), positions.data_ptr()
    if slot_ids_host is not None:
        p.slot_ids_host = ctypes.cast(slot_ids_host, ctypes.c_void_p)
        p.positions_host = ctypes.cast(positions_host, ctypes.c_void_p)
    p.layer, p.k_scale, p.v_scale, p.scale_rule = layer, k_scale, v_scale, scale_rule
    _check(library().kvt_quantize_append(ctypes.byref(pool), ctypes.byref(p), _stream(stream)), "quantize_append")


class Decoder:
    """Reusable kvt_decode launches for a fixed (batch, heads, max_blocks) shape: the
    parameter block and the split workspace are made once."""

    def __init__(self, pool: Pool, batch: int, num_q_heads: int, max_blocks: int, softmax_scale: float,
                 num_splits: int = 0, with_lse: bool = False):
        import torch
        self.pool = pool
        self.p = DecodeParams()
        self.p.batch, self.p.num_q_heads, self.p.max_blocks = batch, num_q_heads, max_blocks
        self.p.max_seq_len = max_blocks * pool.block_tokens
        self.p.softmax_scale = softmax_scale
        self.p.num_splits = num_splits
        self.p.k_scale = self.p.v_scale = 1.0
        self.workspace = None  # sized at the first call (the size check needs the pointers)
        self._ws_len = -1
        self.lse = torch.empty(batch, num_q_heads, dtype=torch.float32, device="cuda") if with_lse else None
        self.p.lse = self.lse.data_ptr() if with_lse else None

    def __call__(self, q, out, block_table, seq_lens, layer: int, k_scale: float, v_scale: float,
                 max_seq_len: Optional[int] = None, stream=None):
        p = self.p
        p.q, p.out = q.data_ptr(), out.data_ptr()
        p.block_table, p.seq_lens = block_table.data_ptr(), seq_lens.data_ptr()
        if max_seq_len is not None:
            p.max_seq_len = max_seq_len
        p.layer, p.k_scale, p.v_scale = layer, k_scale, v_scale
        if self.workspace is None or p.max_seq_len != self._ws_len:
            import torch
            ws = int(library().kvt_decode_workspace_bytes(ctypes.byref(self.pool), ctypes.byref(p)))
            if self.workspace is None or ws > self.workspace.numel():
                self.workspace = torch.empty(max(ws, 16), dtype=torch.uint8, device="cuda")
            p.workspace, p.workspace_bytes = self.workspace.data_ptr(), self.workspace.numel()
            self._ws_len = p.max_seq_len
        _check(library().kvt_decode(ctypes.byref(self.pool), ctypes.byref(p), _stream(stream)), "decode")
        return out


def dequantize_pages(pool: Pool, out, slot_ids, positions, layer: int, side: int, scale: float, stream=None):
    """Pages -> bf16 [n, H, D] (out): side 0 = K, 1 = V; scale is that side's global scale
    (1.0 for BF16 pages)."""
    p = _DequantParams()
    p.out, p.num_tokens = out.data_ptr(), out.shape[0]
    p.slot_ids, p.positions = slot_ids.data_ptr(), positions.data_ptr()
    p.layer, p.side, p.scale = layer, side, scale
    _check(library().kvt_dequantize_pages(ctypes.byref(pool), ctypes.byref(p), _stream(stream)), "dequantize_pages")
    return out


def engine_pages(p: EnginePagesParams, stream=None):
    """kvt_engine_pages (kernels.h): gather engine pages into kvtier block rows or scatter
    rows (BF16/FP8 bytes, or NVFP4 decoded to BF16) into them, in one launch."""
    _check(library().kvt_engine_pages(ctypes.byref(p), _stream(stream)), "engine_pages")
