"""Write a KV-cache dump that `kvtierctl analyze` and `kvtierctl calibrate` read.

Format: safetensors (https://huggingface.co/docs/safetensors), one tensor per layer and
side, named ``layers.{i}.k`` and ``layers.{i}.v``, shape ``[tokens, kv_heads, head_dim]``
(keys after RoPE, as the engine caches them), dtype BF16, F16 or F32. Optionally
``layers.{i}.q`` with shape ``[queries, q_heads, head_dim]`` (q_heads a multiple of
kv_heads) holds real queries to score the attention error with. See docs/quality.md.

Works with torch tensors (any device; bf16/fp16/fp32) or numpy arrays (float16/float32),
and needs neither torch nor numpy to be importable unless you pass their objects.

Example (vLLM-style paged cache already gathered into contiguous tensors)::

    from kvtier.kvdump import write_kv_dump
    write_kv_dump("kv.safetensors", keys, values)   # lists, one [T, H, D] per layer
"""

from __future__ import annotations

import json
import os
import struct
from typing import Dict, Mapping, Optional, Sequence, Tuple

__all__ = ["write_kv_dump", "write_safetensors"]

_NUMPY_DTYPES = {"float32": "F32", "float16": "F16"}
_TORCH_DTYPES = {"torch.float32": "F32", "torch.float16": "F16", "torch.bfloat16": "BF16"}
_DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2}


def _to_bytes(t) -> Tuple[str, Tuple[int, ...], bytes]:
    """(dtype name, shape, little-endian bytes) of a torch tensor or numpy array."""
    mod = type(t).__module__
    if mod.startswith("torch"):
        dt = _TORCH_DTYPES.get(str(t.dtype))
        if dt is None:
            raise ValueError(f"unsupported torch dtype {t.dtype} (use bf16, fp16 or fp32)")
        import torch  # only when given a torch tensor

        c = t.detach().to("cpu").contiguous()
        shape = tuple(int(d) for d in c.shape)
        # Reinterpret as bytes without going through numpy (which may be absent and has
        # no bfloat16): a flat uint8 view of the contiguous tensor.
        raw = c.reshape(-1).view(torch.uint8)
        try:
            data = raw.numpy().tobytes()
        except (RuntimeError, ImportError):
            data = bytes(raw.tolist())
        return dt, shape, data
    if hasattr(t, "dtype") and hasattr(t, "tobytes"):
        dt = _NUMPY_DTYPES.get(str(t.dtype))
        if dt is None:
            raise ValueError(f"unsupported numpy dtype {t.dtype} (use float16 or float32; "
                             "for bfloat16 pass a torch tensor)")
        arr = t.astype(t.dtype.newbyteorder("<"), copy=False)
        return dt, tuple(int(d) for d in arr.shape), arr.tobytes(order="C")
    raise TypeError(f"expected a torch tensor or a numpy array, got {type(t).__name__}")


def write_safetensors(path: str, tensors: Mapping[str, object],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes tensors (name -> torch tensor / numpy array) as a safetensors file.

    The file is written to ``path + '.tmp'`` and renamed, so a failure leaves nothing.
    """
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name, t in tensors.items():
        dt, shape, data = _to_bytes(t)
        n = 1
        for d in shape:
            n *= d
        if len(data) != n * _DTYPE_SIZE[dt]:
            raise ValueError(f"{name}: {len(data)} bytes for shape {shape} {dt}")
        header[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - (8 + len(hjson)) % 8) % 8)
    tmp = path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(hjson)))
            f.write(hjson)
            for b in blobs:
                f.write(b)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_kv_dump(path: str, keys: Sequence[object], values: Sequence[object],
                  queries: Optional[Sequence[object]] = None,
                  metadata: Optional[Mapping[str, str]] = None) -> None:
    """Writes layers.{i}.k / layers.{i}.v (and layers.{i}.q) for i = 0..L-1.

    keys, values: one tensor per layer, each [tokens, kv_heads, head_dim], all the same
    shape. queries (optional): one [queries, q_heads, head_dim] tensor per layer.
    Shapes are checked here so that a bad dump fails before anything is written.
    """
    if len(keys) != len(values) or not keys:
        raise ValueError(f"need the same non-zero number of K and V layers, got {len(keys)} and {len(values)}")
    if queries is not None and len(queries) != len(keys):
        raise ValueError(f"need one query tensor per layer, got {len(queries)} for {len(keys)} layers")
    shape0 = tuple(int(d) for d in keys[0].shape)
    if len(shape0) != 3:
        raise ValueError(f"layers.0.k has shape {shape0}, expected [tokens, kv_heads, head_dim]")
    if shape0[2] % 32 != 0:
        raise ValueError(f"head_dim {shape0[2]} is not a multiple of 32")
    tensors: Dict[str, object] = {}
    for i, (k, v) in enumerate(zip(keys, values)):
        for side, t in (("k", k), ("v", v)):
            s = tuple(int(d) for d in t.shape)
            if s != shape0:
                raise ValueError(f"layers.{i}.{side} has shape {s}, expected {shape0}")
            tensors[f"layers.{i}.{side}"] = t
        if queries is not None:
            q = queries[i]
            qs = tuple(int(d) for d in q.shape)
            if len(qs) != 3 or qs[2] != shape0[2] or qs[1] % shape0[1] != 0:
                raise ValueError(f"layers.{i}.q has shape {qs}, expected [queries, q_heads, {shape0[2]}] "
                                 f"with q_heads a multiple of {shape0[1]}")
            tensors[f"layers.{i}.q"] = q
    write_safetensors(path, tensors, metadata)
