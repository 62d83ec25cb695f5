"""Page writes and reads of torch.ops.kvtier (pytest; ctest runs it through run_tests.py,
label gpu), for every page format, every input layout a model hands the cache and every
pool geometry a daemon hands out.

- Layouts: contiguous [n, H, D]; K and V as slices of one fused qkv projection (Phi-3:
  [n, (Hq + 2H) * D], rows a qkv row apart); a per-head interleaved fused projection
  (GPT-NeoX: [n, H, 3D] chunked along D); heads transposed out of [H, n, D]; every other
  token of a longer tensor. The pages written from the view must be byte-identical to
  those written from a contiguous copy, and read back (dequantize_pages) exactly as the
  torch fake quantization of tests/transformers/reference.py says.
- Geometries: one slot size (stride >= the block), and an arena of slot classes whose
  granule (the stride) is a third of the block, with the last block ending exactly at the
  arena's end; the last layer of that block is written and read. Every byte outside the
  written rows must be unchanged (the arena is poisoned first).
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: kvtier's kernels need one", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from kvtier import kernels as K, torch_ops  # noqa: E402
import reference as R  # noqa: E402

L, H, D, T = 3, 2, 64, 16
HQ = 8
SCALES = {"nvfp4": (2.0 ** -8, 2.0 ** -7), "fp8": (2.0 ** -6, 2.0 ** -5), "bf16": (1.0, 1.0)}


def layouts(n, g):
    """name -> (k, v) views of shape [n, H, D] bf16, each non-contiguous but the first."""
    out = {"contiguous": (torch.randn(n, H, D, device="cuda", generator=g).bfloat16(),
                          torch.randn(n, H, D, device="cuda", generator=g).bfloat16())}
    qkv = torch.randn(n, (HQ + 2 * H) * D, device="cuda", generator=g).bfloat16()
    out["fused_qkv_slices"] = (qkv[:, HQ * D:(HQ + H) * D].view(n, H, D), qkv[:, (HQ + H) * D:].view(n, H, D))
    neox = torch.randn(n, H, 3 * D, device="cuda", generator=g).bfloat16()
    _, k, v = neox.chunk(3, dim=-1)
    out["interleaved_fused"] = (k, v)
    hnd = torch.randn(2, H, n, D, device="cuda", generator=g).bfloat16()
    out["heads_transposed"] = (hnd[0].transpose(0, 1), hnd[1].transpose(0, 1))
    wide = torch.randn(2, 2 * n, H, D, device="cuda", generator=g).bfloat16()
    out["every_other_token"] = (wide[0, ::2], wide[1, ::2])
    return out


def pool_geometry(fmt, kind):
    block = K.page_bytes(K.FORMAT_BY_NAME[fmt], H, D, T) * L
    if kind == "one_class":
        stride = (block + 4095) // 4096 * 4096
        return stride, 6
    # Slot classes: the stride is the granule, a third of the block (rounded to 16 bytes);
    # the arena holds a whole number of granules and its last block ends at its end.
    stride = (block // 3 + 15) // 16 * 16
    spans = -(-block // stride)
    return stride, 4 * spans


@pytest.mark.parametrize("kind", ["one_class", "granule_below_block"])
@pytest.mark.parametrize("fmt", ["bf16", "fp8", "nvfp4"])
def test_page_writes_from_every_layout(fmt, kind):
    g = torch.Generator(device="cuda").manual_seed(5)
    f = K.FORMAT_BY_NAME[fmt]
    stride, num_slots = pool_geometry(fmt, kind)
    block = K.page_bytes(f, H, D, T) * L
    usable = (num_slots * stride - block) // stride + 1
    n = 2 * T
    # Two blocks: the first slot and the last whose block ends inside the arena.
    pos = torch.arange(n, device="cuda")
    slots = torch.where(pos < T, 0, usable - 1).to(torch.int32)
    offs = (pos % T).to(torch.int32)
    ks, vs = SCALES[fmt]
    for name, (k, v) in layouts(n, g).items():
        assert k.shape == (n, H, D) and v.shape == (n, H, D), name
        if name != "contiguous":
            assert not (k.is_contiguous() and v.is_contiguous()), name
        arenas = []
        for kk, vv in ((k, v), (k.contiguous(), v.contiguous())):
            arena = torch.full((num_slots * stride,), 0xA5, dtype=torch.uint8, device="cuda")
            geom = [stride, num_slots, L, H, D, T, f]
            for layer in (0, L - 1):
                torch_ops.quantize_append_impl(arena, kk, vv, slots, offs, geom, layer, ks, vs, 0)
            arenas.append(arena)
        torch.cuda.synchronize()
        assert torch.equal(arenas[0], arenas[1]), \
            f"{fmt}/{kind}/{name}: pages written from the view differ from those of a contiguous copy " \
            f"({int((arenas[0] != arenas[1]).sum())} bytes)"
        arena = arenas[0]
        for layer in (0, L - 1):
            for side, x, sc in ((0, k, ks), (1, v, vs)):
                got = torch.empty(n, H, D, dtype=torch.bfloat16, device="cuda")
                torch_ops.dequantize_pages_impl(arena, got, slots, offs, geom, layer, side, sc)
                want = R.fake_quant(x.contiguous(), fmt, sc).bfloat16()
                bad = int((got.view(torch.int16) != want.view(torch.int16)).sum())
                assert bad == 0, f"{fmt}/{kind}/{name} layer {layer} side {side}: {bad} of {got.numel()} values " \
                                 f"differ from the fake quantization (max {(got.float() - want.float()).abs().max():.3e})"
        # Nothing outside the two blocks' written pages changed.
        touched = torch.zeros_like(arena, dtype=torch.bool)
        page = K.page_bytes(f, H, D, T)
        for s in (0, usable - 1):
            for layer in (0, L - 1):
                o = s * stride + layer * page
                touched[o:o + page] = True
        assert bool((arena[~touched] == 0xA5).all()), f"{fmt}/{kind}/{name}: bytes outside the written pages changed"


def test_out_of_range_slots_are_skipped():
    """A slot id whose block would pass the arena's end (with a stride below the block) is
    skipped: the arena is unchanged."""
    stride, num_slots = pool_geometry("bf16", "granule_below_block")
    block = K.page_bytes(K.BF16, H, D, T) * L
    usable = (num_slots * stride - block) // stride + 1
    arena = torch.full((num_slots * stride,), 0x5A, dtype=torch.uint8, device="cuda")
    geom = [stride, num_slots, L, H, D, T, K.BF16]
    k = torch.randn(3, H, D, device="cuda").bfloat16()
    for bad in (usable, num_slots - 1, -1):
        slots = torch.full((3,), bad, dtype=torch.int32, device="cuda")
        offs = torch.arange(3, dtype=torch.int32, device="cuda")
        torch_ops.quantize_append_impl(arena, k, k, slots, offs, geom, L - 1, 1.0, 1.0, 0)
    torch.cuda.synchronize()
    assert bool((arena == 0x5A).all())
