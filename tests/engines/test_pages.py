"""kvtier.pages: the block mover between engine KV tensors and kvtier block bytes.

    python3 tests/engines/test_pages.py cpu   # CPU tests (torch's CPU build is enough)
    python3 tests/engines/test_pages.py gpu   # the same checks on CUDA tensors, and CUDA == CPU

Every reference here is built independently of kvtier.pages: as-is block bytes by slicing the
logical tensors one block at a time; NVFP4 bytes with libkvtier's codec (kvtier_nvfp4_encode)
one block at a time; vLLM's NVFP4 pages by a per-token writer that follows vLLM's
reshape_and_cache_nvfp4 kernel addressing (the strides and swizzle formula in its source).
Prints "N passed, N failed"; "SKIPPED: reason" (exit 0) where torch or a GPU is missing,
unless KVTIER_REQUIRE_TORCH=1, which makes a missing torch a failure.
"""
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))


def skip(reason):
    print(f"SKIPPED: {reason}")
    sys.exit(0)


try:
    import torch
except ImportError:
    if os.environ.get("KVTIER_REQUIRE_TORCH") == "1":
        print("FAILED: torch is not importable and KVTIER_REQUIRE_TORCH=1 (scripts/torch-venv.sh makes its venv)")
        sys.exit(1)
    skip("torch is not installed (scripts/torch-venv.sh makes a venv with it)")

import kvtier  # noqa: E402
from kvtier import pages as P  # noqa: E402

LAYOUTS = [("flash_attn", "NHD"), ("flash_attn", "HND"), ("flashinfer", "NHD"), ("flashinfer", "HND"),
           ("cpu", "HND")]
DEV = "cpu"


def make_cache(kind, order, nb, t, h, d, dtype, device=None, fill=True, gen=None):
    """One layer's KV tensor, allocated in physical order and viewed in vLLM's logical shape."""
    device = device or DEV
    if kind == "flash_attn":
        phys = (2, nb, t, h, d) if order == "NHD" else (2, nb, h, t, d)
    elif kind == "flashinfer":
        phys = (nb, 2, t, h, d) if order == "NHD" else (nb, 2, h, t, d)
    else:
        phys = (nb, h, t, 2 * d)  # vLLM CPU (cpu_attn.py): (num_blocks, H, block_size, 2 * head_size)
    if dtype in (torch.uint8, torch.float8_e4m3fn):
        raw = torch.randint(0, 256, phys, dtype=torch.uint8, generator=gen)
        raw[(raw & 0x7F) == 0x7F] = 0  # no E4M3 NaN bytes
        x = raw.view(dtype) if dtype != torch.uint8 else raw
    else:
        x = (torch.randn(phys, generator=gen) * 0.5).to(dtype) if fill else torch.zeros(phys, dtype=dtype)
    x = x.to(device)
    if kind != "cpu" and order == "HND":
        x = x.permute(0, 1, 3, 2, 4)
    return x


# vLLM 0.32's KVCacheLayout (vllm/v1/kv_cache_layout.py): the physical order of the logical
# axes [L, B, H, N, C] of one KV cache group's buffer; each layer is the [B, H, N, C] view
# of one L index (vllm/v1/worker/utils.py, create_kv_cache_views). "BLHNC+pad": BLHNC with
# a block stride past the block's pages, as vLLM pads pages in block-outer layouts. For
# the six orders the views' shapes, strides and offsets equal those of vLLM 0.32.0's
# create_kv_cache_views for a FullAttentionSpec of the same geometry.
VLLM_CUDA_ORDERS = {"LBHNC": (0, 1, 2, 3, 4), "LBNHC": (0, 1, 3, 2, 4), "LHBNC": (0, 2, 1, 3, 4),
                    "BLHNC": (1, 0, 2, 3, 4), "BLNHC": (1, 0, 3, 2, 4), "BHLNC": (1, 2, 0, 3, 4),
                    "BLHNC+pad": (1, 0, 2, 3, 4)}


def vllm_cuda_caches(order, L, nb, t, h, d, dtype, device=None, fill=True, gen=None):
    """L layers of a vLLM 0.32 CUDA KV cache group: one buffer allocated in the physical order
    `order` of [L, B, H, N, C=2*D], each layer the logical (B, H, N, 2*D) view of it."""
    device = device or DEV
    perm = VLLM_CUDA_ORDERS[order]
    logical = (L, nb, h, t, 2 * d)
    phys = tuple(logical[i] for i in perm)
    pad = 24 if order.endswith("+pad") else 0
    per_block = L * h * t * 2 * d + pad  # BLHNC: a block holds every layer's page, then pad
    n_el = nb * per_block if pad else L * nb * h * t * 2 * d
    if dtype in (torch.uint8, torch.float8_e4m3fn):
        raw = torch.randint(0, 256, (n_el,), dtype=torch.uint8, generator=gen)
        raw[(raw & 0x7F) == 0x7F] = 0  # no E4M3 NaN bytes
        raw = raw.view(dtype) if dtype != torch.uint8 else raw
    else:
        raw = (torch.randn(n_el, generator=gen) * 0.5).to(dtype) if fill else torch.zeros(n_el, dtype=dtype)
    raw = raw.to(device)
    if pad:
        st = (h * t * 2 * d, per_block, t * 2 * d, 2 * d, 1)
        view = torch.as_strided(raw, logical, st)
    else:
        inv = [perm.index(i) for i in range(5)]
        view = raw.view(phys).permute(*inv)
    assert tuple(view.shape) == logical
    return [view[l] for l in range(L)], raw


def cpu_sides(cache):
    """(K, V) of a vLLM CPU cache, each [NB, H, T, D], the way vLLM's CPU attention reads
    it (cpu_attn.py forward): view (num_blocks, H, 2 * block_size, head_size), chunk(2, dim=2)."""
    nb, h, t, d2 = cache.shape
    return cache.view(nb, h, 2 * t, d2 // 2).chunk(2, dim=2)


def block_hnd(cache, kind, b, side):
    """[H, T, D] of block b, side 0 (K) / 1 (V), from the logical tensor."""
    if kind == "flash_attn":
        return cache[side, b].permute(1, 0, 2)
    if kind == "flashinfer":
        return cache[b, side].permute(1, 0, 2)
    if kind == "vllm_cuda":
        # The layout's definition: K = t[..., :D], V = t[..., D:] of each (head, token) row.
        d = cache.shape[-1] // 2
        return cache[b, :, :, :d] if side == 0 else cache[b, :, :, d:]
    return cpu_sides(cache)[side][b]


def ref_as_is(caches, kind, ids):
    rows = []
    for b in ids:
        parts = []
        for c in caches:
            for side in (0, 1):
                x = block_hnd(c, kind, b, side).contiguous()
                parts.append(x.view(torch.uint8).reshape(-1).cpu() if x.dtype != torch.uint8 else x.reshape(-1).cpu())
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def ref_nvfp4(caches, kind, ids, ks, vs, rule):
    """kvtier NVFP4 blocks encoded with libkvtier's codec, one (block, layer, side) at a time."""
    rows = []
    for b in ids:
        parts = []
        for l, c in enumerate(caches):
            for side, sc in ((0, ks[l]), (1, vs[l])):
                x = block_hnd(c, kind, b, side).float().contiguous().cpu()
                data = torch.empty(x.numel() // 2, dtype=torch.uint8)
                scales = torch.empty(x.numel() // 16, dtype=torch.uint8)
                kvtier.nvfp4_encode(x.data_ptr(), x.numel(), sc, rule, data.data_ptr(), scales.data_ptr())
                parts += [data, scales]
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def decode_ref(block_rows, L, H, T, D, ks, vs):
    """libkvtier's decode of NVFP4 block rows: float32 [n, L, 2, H, T, D]."""
    n, vals = block_rows.shape[0], H * T * D
    out = torch.empty(n, L, 2, vals)
    for i in range(n):
        off = 0
        for l in range(L):
            for side, sc in ((0, ks[l]), (1, vs[l])):
                data = block_rows[i, off:off + vals // 2].contiguous()
                scales = block_rows[i, off + vals // 2:off + vals // 2 + vals // 16].contiguous()
                buf = torch.empty(vals)
                kvtier.nvfp4_decode(data.data_ptr(), scales.data_ptr(), vals, sc, buf.data_ptr())
                out[i, l, side] = buf
                off += vals // 2 + vals // 16
    return out.view(n, L, 2, H, T, D)


def strided_rows(n, bb, pad=4096, device="cpu", fill=0xA5):
    """[n, bb] rows with a stride past the block (as slots of an arena are), poisoned."""
    base = torch.full((n, bb + pad), fill, dtype=torch.uint8, device=device)
    return base[:, :bb + pad // 2]


def assert_eq(a, b, what):
    if not torch.equal(a.cpu(), b.cpu()):
        diff = (a.cpu().view(-1) != b.cpu().view(-1)).nonzero()
        raise AssertionError(f"{what}: {diff.numel()} bytes/elements differ, first at {diff[:4].view(-1).tolist()}")


def raises(fn, *words):
    try:
        fn()
    except P.PagesError as e:
        msg = str(e)
        for w in words:
            if w not in msg:
                raise AssertionError(f"error {msg!r} does not say {w!r}")
        return
    raise AssertionError("no PagesError")


# ---- as-is ---------------------------------------------------------------------------

def _as_is(kind, order, dtype, kv_name="auto"):
    g = torch.Generator().manual_seed(hash((kind, order, str(dtype))) & 0xFFFF)
    L, NB, T, H, D = 3, 7, 16, 2, 64
    caches = [make_cache(kind, order, NB, T, H, D, dtype, gen=g) for _ in range(L)]
    lay = P.describe(caches[0], kind, kv_name)
    assert lay.order == order and (lay.num_blocks, lay.block_tokens, lay.num_kv_heads, lay.head_dim) == (NB, T, H, D), lay
    m = P.BlockMover(caches, lay)
    ids = [5, 0, 3]
    dst = strided_rows(len(ids), m.block_bytes)
    before = dst.clone()
    m.save(ids, dst)
    assert_eq(dst[:, :m.block_bytes], ref_as_is(caches, kind, ids), f"{kind}/{order} {dtype} saved bytes")
    assert_eq(dst[:, m.block_bytes:], before[:, m.block_bytes:], "bytes past the block")
    # Load into other blocks of fresh caches: those pages equal the saved ones, the rest stay.
    fresh = [make_cache(kind, order, NB, T, H, D, dtype, gen=g) for _ in range(L)]
    keep = [f.clone() for f in fresh]
    m2 = P.BlockMover(fresh, lay)
    to = [1, 6, 2]
    m2.load(dst.to(DEV) if DEV != "cpu" else dst, to)
    for l in range(L):
        for side in (0, 1):
            for b_src, b_dst in zip(ids, to):
                assert_eq(block_hnd(fresh[l], kind, b_dst, side), block_hnd(caches[l], kind, b_src, side),
                          f"layer {l} side {side} block {b_dst}")
            for b in set(range(NB)) - set(to):
                assert_eq(block_hnd(fresh[l], kind, b, side), block_hnd(keep[l], kind, b, side), f"untouched block {b}")
    # A list of per-block buffers gives the same bytes.
    rows = [torch.zeros(m.block_bytes + 100, dtype=torch.uint8, device=DEV if DEV != "cpu" else "cpu") for _ in ids]
    m.save(ids, rows)
    for i, r in enumerate(rows):
        assert_eq(r[:m.block_bytes], dst[i, :m.block_bytes], "list row")


def test_as_is_bf16_every_layout():
    for kind, order in LAYOUTS:
        _as_is(kind, order, torch.bfloat16)


def test_as_is_fp8_every_layout():
    for kind, order in LAYOUTS:
        _as_is(kind, order, torch.uint8, "fp8")
        _as_is(kind, order, torch.float8_e4m3fn, "fp8_e4m3")


def test_fp16_and_fp32_as_is_refused():
    for dt in (torch.float16, torch.float32):
        c = make_cache("flash_attn", "NHD", 4, 16, 2, 64, dt)
        lay = P.describe(c, "flash_attn")
        raises(lambda: P.BlockMover([c], lay), "no fp", "nvfp4")


def test_bad_shapes_refused():
    c = make_cache("flash_attn", "NHD", 4, 16, 2, 64, torch.bfloat16)
    raises(lambda: P.describe(c[0], "flash_attn"), "5 dims")
    raises(lambda: P.describe(c, "paged"), "kind")
    raises(lambda: P.describe(c, "flashinfer"), "must be 2")  # (2, 4, ...) read as flashinfer
    raises(lambda: P.describe(c, "flash_attn", num_kv_heads=4), "2 KV heads", "expected 4")
    raises(lambda: P.describe(c, "flash_attn", head_dim=128), "head_dim 64")
    raises(lambda: P.describe(c.transpose(3, 4), "flash_attn"), "dense")
    raises(lambda: P.describe(c, "cpu"), "4 dims", "2 * head_dim")
    cc = make_cache("cpu", "HND", 4, 16, 2, 64, torch.bfloat16)
    raises(lambda: P.describe(cc[..., :127], "cpu"), "odd")
    raises(lambda: P.describe(cc.transpose(1, 2), "cpu"), "dense")
    raises(lambda: P.describe(cc, "cpu", num_kv_heads=4), "2 KV heads", "expected 4")
    raises(lambda: P.describe(cc, "cpu", head_dim=128), "head_dim 64")
    raises(lambda: P.describe(cc, "cpu", "nvfp4"), "needs a tensor")
    assert P.describe(cc, "cpu") == P.EngineLayout("cpu", "HND", 4, 16, 2, 64, "bf16")
    raises(lambda: P.describe(c.view(torch.int16), "flash_attn"), "kv_cache_dtype")
    raises(lambda: P.describe(c, "flash_attn", "fp8_e5m2"), "E5M2")
    raises(lambda: P.describe(c, "flash_attn", "nvfp4"), "needs a tensor")
    u = make_cache("flashinfer", "HND", 4, 16, 2, 64, torch.uint8)
    raises(lambda: P.describe(u, "flashinfer", "nvfp4"), "D/2 + D/16")
    lay = P.describe(c, "flash_attn")
    m = P.BlockMover([c, c.clone()], lay)
    other = make_cache("flash_attn", "NHD", 4, 16, 2, 32, torch.bfloat16)
    raises(lambda: P.BlockMover([c, other], lay), "layer 1")
    raises(lambda: P.BlockMover([c], lay, mode="int4"), "mode")
    raises(lambda: P.BlockMover([c], lay, mode="nvfp4"), "k_scales")
    raises(lambda: P.BlockMover([c], lay, mode="nvfp4", k_scales=[0.0], v_scales=[1.0]), "normal")
    raises(lambda: P.BlockMover([c], lay, mode="nvfp4", k_scales=[1, 1], v_scales=[1, 1]), "2 k_scales")
    dst = torch.zeros(2, m.block_bytes, dtype=torch.uint8)
    raises(lambda: m.save([0, 4], dst), "block id 4")
    raises(lambda: m.save([0, -1], dst), "block id -1")
    raises(lambda: m.save([0], dst), "need [1")
    raises(lambda: m.save([0, 1], dst[:, :-1]), "need [2")
    raises(lambda: m.save([0, 1], dst.view(torch.int8)), "uint8")
    raises(lambda: m.save([0, 1], [dst[0]]), "1 block buffers")
    snapshot = c.clone()
    raises(lambda: m.load(dst, [1, 1]), "twice")
    raises(lambda: m.load(dst, [1, 9]), "block id 9")
    assert_eq(c, snapshot, "cache after refused loads")


# ---- NVFP4 mode ----------------------------------------------------------------------

def _scales(caches, kind):
    """Per-layer K and V global scales as a contract would carry: amax / (448 * 6)."""
    ks, vs = [], []
    for c in caches:
        if kind == "cpu":
            k, v = cpu_sides(c)
        elif kind == "vllm_cuda":
            k, v = c[..., :c.shape[-1] // 2], c[..., c.shape[-1] // 2:]
        else:
            k = c[0] if kind == "flash_attn" else c[:, 0]
            v = c[1] if kind == "flash_attn" else c[:, 1]
        ks.append(float(k.float().abs().max()) / (448 * 6))
        vs.append(float(v.float().abs().max()) / (448 * 6))
    return ks, vs


def _nvfp4_mode(kind, order, dtype, rule):
    g = torch.Generator().manual_seed(7)
    L, NB, T, H, D = 2, 5, 16, 2, 64
    caches = [make_cache(kind, order, NB, T, H, D, dtype, gen=g) for _ in range(L)]
    ks, vs = _scales(caches, kind)
    lay = P.describe(caches[0], kind)
    m = P.BlockMover(caches, lay, mode="nvfp4", k_scales=ks, v_scales=vs, scale_rule=rule)
    assert m.block_bytes == L * 2 * H * T * (D // 2 + D // 16)
    ids = [4, 1]
    dst = strided_rows(len(ids), m.block_bytes)
    m.save(ids, dst)
    want = ref_nvfp4(caches, kind, ids, ks, vs, rule)
    assert_eq(dst[:, :m.block_bytes], want, f"{kind}/{order} {dtype} rule {rule}: NVFP4 bytes")
    fresh = [make_cache(kind, order, NB, T, H, D, dtype, fill=False) for _ in range(L)]
    m2 = P.BlockMover(fresh, lay, mode="nvfp4", k_scales=ks, v_scales=vs, scale_rule=rule)
    to = [0, 3]
    m2.load(dst.to(DEV) if DEV != "cpu" else dst, to)
    dec = decode_ref(want, L, H, T, D, ks, vs)
    for l in range(L):
        for side in (0, 1):
            for i, (b_src, b_dst) in enumerate(zip(ids, to)):
                got = block_hnd(fresh[l], kind, b_dst, side)
                # Equal to the codec's decode, rounded once to the cache dtype.
                assert_eq(got, dec[i, l, side].to(dtype), f"layer {l} side {side}: loaded values")
                # Within the codec's bound: |x - y| <= s_eff (1.0625 amax/6, E4M3 rounding
                # of the block scale) plus the cache dtype's rounding of y.
                x = block_hnd(caches[l], kind, b_src, side).float().cpu()
                y = got.float().cpu()
                amax = x.view(H, T, D // 16, 16).abs().amax(-1, keepdim=True).expand(H, T, D // 16, 16).reshape(H, T, D)
                sc = (ks, vs)[side][l]
                eps = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
                bound = 1.0625 * amax / 6 + eps * y.abs() + 6 * sc * 2.0 ** -9
                if not bool(((x - y).abs() <= bound).all()):
                    worst = float(((x - y).abs() - bound).max())
                    raise AssertionError(f"NVFP4 error past the bound by {worst}")
    check_corrupt_scales(m2, fresh, dst[:, :m.block_bytes], dec, kind, L, H, T, D, dtype)


def corrupt_scale_cases(L, H, T, D):
    """(row, byte offset in the row, value, what): one bad E4M3 block scale byte per case,
    in the first and last scale region of a row (layer 0's K, layer L-1's V)."""
    vals = H * T * D
    side = vals // 2 + vals // 16
    first_k = vals // 2                          # layer 0, K, first scale byte
    last_v = (2 * L - 1) * side + side - 1       # layer L-1, V, last scale byte
    return [(first_k, 0x7F, "NaN"), (last_v, 0xFF, "-NaN"), (first_k + 1, 0x80, "-0"),
            (last_v, 0xB8, "negative")]


def check_corrupt_scales(m, cache, good_rows, dec, kind, L, H, T, D, dtype):
    """Loads 2 rows (good_rows [2, bb], decoded values dec) where row 0 has one bad scale
    byte: row 0's block keeps its pages, row 1's block is loaded, and the error names
    row 0's block. Without the check the bad row would be decoded (NaN or negated values)
    into its pages and this fails."""
    for off, byte, what in corrupt_scale_cases(L, H, T, D):
        bad = good_rows.clone()
        assert int(bad[0, off]) < 0x7F, "the case must change a good byte"
        bad[0, off] = byte
        to = [1, 2]
        # Block 1 first holds row 1's values, so that a decode of row 0 into it would show.
        one = good_rows[1:2].clone()
        m.load(one.to(DEV) if DEV != "cpu" else one, [1])
        snap = [c.clone() for c in cache]
        try:
            m.load(bad.to(DEV) if DEV != "cpu" else bad, to)
            raise AssertionError(f"a {what} scale byte was accepted")
        except P.CorruptBlocksError as e:
            assert e.block_ids == [1], f"{what}: refused blocks {e.block_ids}, expected [1]"
            assert "NaN" in str(e) and "negative" in str(e), str(e)
        for l in range(L):
            for side in (0, 1):
                assert_eq(block_hnd(cache[l], kind, 1, side), block_hnd(snap[l], kind, 1, side),
                          f"{what}: layer {l} side {side}: pages of the refused block")
                assert_eq(block_hnd(cache[l], kind, 2, side), dec[1, l, side].to(dtype),
                          f"{what}: layer {l} side {side}: pages of the good block in the same load")
        # Blocks outside the load are untouched.
        for l in range(L):
            for b in range(cache[l].shape[1] if kind == "flash_attn" else cache[l].shape[0]):
                if b not in to:
                    for side in (0, 1):
                        assert_eq(block_hnd(cache[l], kind, b, side), block_hnd(snap[l], kind, b, side),
                                  f"{what}: block {b} outside the load")


def test_nvfp4_mode_every_layout():
    for kind, order in LAYOUTS:
        _nvfp4_mode(kind, order, torch.bfloat16, P.MAX6)
    _nvfp4_mode("flash_attn", "HND", torch.float16, P.MAX6)
    _nvfp4_mode("flashinfer", "NHD", torch.bfloat16, P.FOUR_OVER_SIX)
    _nvfp4_mode("cpu", "HND", torch.float16, P.FOUR_OVER_SIX)


def test_fp8_mode():
    g = torch.Generator().manual_seed(3)
    L, NB, T, H, D = 2, 4, 16, 2, 32
    for kind, order in (("flash_attn", "HND"), ("cpu", "HND")):
        caches = [make_cache(kind, order, NB, T, H, D, torch.bfloat16, gen=g) for _ in range(L)]
        ks, vs = [float(c.float().abs().max()) / 448 for c in caches], [0.01, 0.02]
        lay = P.describe(caches[0], kind)
        m = P.BlockMover(caches, lay, mode="fp8", k_scales=ks, v_scales=vs)
        assert m.block_bytes == L * 2 * H * T * D
        dst = torch.zeros(2, m.block_bytes, dtype=torch.uint8)
        m.save([2, 3], dst)
        fresh = [make_cache(kind, order, NB, T, H, D, torch.bfloat16, fill=False) for _ in range(L)]
        P.BlockMover(fresh, lay, mode="fp8", k_scales=ks, v_scales=vs).load(dst.to(DEV) if DEV != "cpu" else dst, [0, 1])
        for l in range(L):
            for side, sc in ((0, ks[l]), (1, vs[l])):
                for b_src, b_dst in ((2, 0), (3, 1)):
                    x = block_hnd(caches[l], kind, b_src, side).float()
                    # IEEE division on both devices: a 0-dim tensor on x's device (torch's CUDA
                    # kernel would multiply by the reciprocal of a Python float instead).
                    q = (x / torch.tensor(sc, device=x.device)).clamp(-448, 448).to(torch.float8_e4m3fn)
                    want = (q.float() * sc).to(torch.bfloat16)
                    assert_eq(block_hnd(fresh[l], kind, b_dst, side), want, "fp8 mode values")


# ---- vLLM's NVFP4 pages ----------------------------------------------------------------

def vllm_nvfp4_cache(kind, order, nb, t, h, d, swizzle, values_k, values_v, ks, vs, device=None):
    """A uint8 NVFP4 cache written token by token the way vLLM's reshape_and_cache_nvfp4
    kernel addresses it (vllm-project/vllm@0cd789b, nvfp4_kv_cache_kernels.cu): values_*
    [nb, t, h, d] float32, quantized with kvtier's codec one (token, head) at a time."""
    full = d // 2 + d // 16
    cache = make_cache(kind, order, nb, t, h, full, torch.uint8, device="cpu")
    cache.zero_()
    half, s_dim = d // 2, d // 16
    data_per_kv = h * t * half
    if order == "HND":
        dh, dt_, sh, st_ = t * half, half, t * s_dim, s_dim
    else:
        dh, dt_, sh, st_ = half, h * half, s_dim, h * s_dim
    for side, vals, sc in ((0, values_k, ks), (1, values_v, vs)):
        side_view = cache[:, side] if kind == "flashinfer" else cache[side]
        for b in range(nb):
            blk = side_view[b]
            raw = torch.as_strided(blk, (h * t * full,), (1,))  # the side's bytes
            for tok in range(t):
                for head in range(h):
                    x = vals[b, tok, head].contiguous()
                    data = torch.empty(half, dtype=torch.uint8)
                    scales = torch.empty(s_dim, dtype=torch.uint8)
                    kvtier.nvfp4_encode(x.data_ptr(), d, sc, 0, data.data_ptr(), scales.data_ptr())
                    o = head * dh + tok * dt_
                    raw[o:o + half] = data
                    for s in range(s_dim):
                        if side == 0 or not swizzle:
                            pos = head * sh + tok * st_ + s
                        else:
                            g = s_dim // 4
                            t2 = (tok // 4) * 4 + s // g
                            s2 = (s % g) * 4 + tok % 4
                            pos = head * sh + t2 * st_ + s2
                        raw[data_per_kv + pos] = scales[s]
    return cache.to(device or DEV)


def test_vllm_nvfp4_pages_convert_bit_exact():
    g = torch.Generator().manual_seed(11)
    nb, t, h, d = 3, 8, 2, 64
    for kind in ("flashinfer", "flash_attn"):
        for order in ("NHD", "HND"):
            for swizzle in (False, True):
                vk = torch.randn(nb, t, h, d, generator=g)
                vv = torch.randn(nb, t, h, d, generator=g) * 3
                ks, vs = 0.01, 0.02
                cache = vllm_nvfp4_cache(kind, order, nb, t, h, d, swizzle, vk, vv, ks, vs)
                lay = P.describe(cache, kind, "nvfp4", v_scale_swizzle=swizzle)
                assert (lay.order, lay.head_dim) == (order, d), lay
                m = P.BlockMover([cache], lay)
                ids = [2, 0]
                dst = strided_rows(2, m.block_bytes)
                m.save(ids, dst)
                # kvtier's own encoding of the same values, HND, linear scales.
                for i, b in enumerate(ids):
                    parts = []
                    for vals, sc in ((vk, ks), (vv, vs)):
                        x = vals[b].permute(1, 0, 2).contiguous()
                        data = torch.empty(h * t * d // 2, dtype=torch.uint8)
                        scales = torch.empty(h * t * d // 16, dtype=torch.uint8)
                        kvtier.nvfp4_encode(x.data_ptr(), x.numel(), sc, 0, data.data_ptr(), scales.data_ptr())
                        parts += [data, scales]
                    assert_eq(dst[i, :m.block_bytes], torch.cat(parts), f"{kind}/{order}/swizzle={swizzle} block {b}")
                # Back into an empty cache: the loaded blocks are vLLM's bytes exactly.
                empty = make_cache(kind, order, nb, t, h, d // 2 + d // 16, torch.uint8)
                empty.zero_()
                P.BlockMover([empty], lay).load(dst.to(DEV) if DEV != "cpu" else dst, ids)
                for b in range(nb):
                    for side in (0, 1):
                        want = block_hnd(cache, kind, b, side) if b in ids else torch.zeros_like(block_hnd(cache, kind, b, side))
                        assert_eq(block_hnd(empty, kind, b, side), want, f"{kind}/{order}/{swizzle} loaded block {b}")
    # The swizzle needs T and D/16 multiples of 4.
    c = make_cache("flashinfer", "HND", 2, 6, 1, 36, torch.uint8)
    raises(lambda: P.describe(c, "flashinfer", "nvfp4", v_scale_swizzle=True), "multiples of 4")
    raises(lambda: P.describe(make_cache("cpu", "HND", 2, 8, 1, 36, torch.uint8), "cpu", "nvfp4"), "CUDA")


# ---- vLLM 0.32's CUDA layout ("vllm_cuda") ------------------------------------------------

def _vllm_cuda_as_is(order, dtype, kv_name="auto"):
    g = torch.Generator().manual_seed(hash((order, str(dtype))) & 0xFFFF)
    L, NB, T, H, D = 3, 6, 16, 2, 64
    caches, raw = vllm_cuda_caches(order, L, NB, T, H, D, dtype, gen=g)
    lay = P.describe(caches[0], "vllm_cuda", kv_name)
    want_order = "NHD" if order in ("LBNHC", "BLNHC") else "HND"
    assert lay == P.EngineLayout("vllm_cuda", want_order, NB, T, H, D, lay.kv_dtype), (order, lay)
    m = P.BlockMover(caches, lay)
    ids = [5, 0, 3]
    dst = strided_rows(len(ids), m.block_bytes, device=DEV)
    before = dst.clone()
    m.save(ids, dst)
    assert_eq(dst[:, :m.block_bytes], ref_as_is(caches, "vllm_cuda", ids), f"vllm_cuda/{order} {dtype} saved bytes")
    assert_eq(dst[:, m.block_bytes:], before[:, m.block_bytes:], "bytes past the block")
    # Into other blocks of layers 0 and 2 of a fresh group: layer 1 (which shares each block
    # in block-outer orders), the padding and every other block keep their bytes.
    fresh, fraw = vllm_cuda_caches(order, L, NB, T, H, D, dtype, gen=g)
    keep = fraw.clone()
    m2 = P.BlockMover([fresh[0], fresh[2]], lay)
    to = [1, 4, 2]
    sub = torch.stack([torch.cat([r[:m.page_bytes], r[2 * m.page_bytes:3 * m.page_bytes]])
                       for r in dst[:, :m.block_bytes]])
    m2.load(sub, to)
    for li, l in ((0, 0), (1, 2)):
        for side in (0, 1):
            for b_src, b_dst in zip(ids, to):
                assert_eq(block_hnd(fresh[l], "vllm_cuda", b_dst, side), block_hnd(caches[l], "vllm_cuda", b_src, side),
                          f"{order}: layer {l} side {side} block {b_dst}")
    # Every element of the buffer outside the loaded (layer, block) pages is unchanged.
    idx = torch.arange(fraw.numel(), device=fraw.device)
    written = torch.zeros(fraw.numel(), dtype=torch.bool, device=fraw.device)
    for l in (0, 2):
        where = torch.as_strided(idx, fresh[l].shape, fresh[l].stride(), fresh[l].storage_offset())
        written[where[to].reshape(-1)] = True
    bits = torch.uint8 if fraw.element_size() == 1 else torch.int16
    assert_eq(fraw.view(bits)[~written], keep.view(bits)[~written], f"{order}: elements outside the loaded pages")


def test_vllm_cuda_as_is_every_order():
    for order in VLLM_CUDA_ORDERS:
        _vllm_cuda_as_is(order, torch.bfloat16)
        _vllm_cuda_as_is(order, torch.uint8, "fp8")
        _vllm_cuda_as_is(order, torch.float8_e4m3fn, "fp8_e4m3")


def _vllm_cuda_nvfp4(order, dtype, rule):
    g = torch.Generator().manual_seed(13)
    L, NB, T, H, D = 2, 5, 16, 2, 64
    caches, _ = vllm_cuda_caches(order, L, NB, T, H, D, dtype, gen=g)
    ks, vs = _scales(caches, "vllm_cuda")
    lay = P.describe(caches[0], "vllm_cuda")
    m = P.BlockMover(caches, lay, mode="nvfp4", k_scales=ks, v_scales=vs, scale_rule=rule)
    ids = [4, 1]
    dst = strided_rows(len(ids), m.block_bytes)
    m.save(ids, dst)
    want = ref_nvfp4(caches, "vllm_cuda", ids, ks, vs, rule)
    assert_eq(dst[:, :m.block_bytes], want, f"vllm_cuda/{order} {dtype} rule {rule}: NVFP4 bytes vs the codec")
    fresh, _ = vllm_cuda_caches(order, L, NB, T, H, D, dtype, fill=False)
    m2 = P.BlockMover(fresh, lay, mode="nvfp4", k_scales=ks, v_scales=vs, scale_rule=rule)
    to = [0, 3]
    m2.load(dst.to(DEV) if DEV != "cpu" else dst, to)
    dec = decode_ref(want, L, H, T, D, ks, vs)
    for l in range(L):
        for side in (0, 1):
            for i, b_dst in enumerate(to):
                assert_eq(block_hnd(fresh[l], "vllm_cuda", b_dst, side), dec[i, l, side].to(dtype),
                          f"vllm_cuda/{order} layer {l} side {side}: loaded values vs the codec's decode")
    check_corrupt_scales(m2, fresh, dst[:, :m.block_bytes], dec, "vllm_cuda", L, H, T, D, dtype)


def test_vllm_cuda_nvfp4_every_order():
    for order in VLLM_CUDA_ORDERS:
        _vllm_cuda_nvfp4(order, torch.bfloat16, P.MAX6)
    _vllm_cuda_nvfp4("LBNHC", torch.float16, P.FOUR_OVER_SIX)
    _vllm_cuda_nvfp4("BHLNC", torch.bfloat16, P.FOUR_OVER_SIX)


def test_vllm_cuda_fp8_mode():
    g = torch.Generator().manual_seed(17)
    L, NB, T, H, D = 2, 4, 16, 2, 32
    for order in ("LBHNC", "BLNHC"):
        caches, _ = vllm_cuda_caches(order, L, NB, T, H, D, torch.bfloat16, gen=g)
        ks, vs = [float(c.float().abs().max()) / 448 for c in caches], [0.01, 0.02]
        lay = P.describe(caches[0], "vllm_cuda")
        m = P.BlockMover(caches, lay, mode="fp8", k_scales=ks, v_scales=vs)
        dst = torch.zeros(2, m.block_bytes, dtype=torch.uint8)
        m.save([2, 3], dst)
        fresh, _ = vllm_cuda_caches(order, L, NB, T, H, D, torch.bfloat16, fill=False)
        P.BlockMover(fresh, lay, mode="fp8", k_scales=ks, v_scales=vs).load(dst.to(DEV) if DEV != "cpu" else dst, [0, 1])
        for l in range(L):
            for side, sc in ((0, ks[l]), (1, vs[l])):
                for b_src, b_dst in ((2, 0), (3, 1)):
                    x = block_hnd(caches[l], "vllm_cuda", b_src, side).float()
                    q = (x / torch.tensor(sc, device=x.device)).clamp(-448, 448).to(torch.float8_e4m3fn)
                    assert_eq(block_hnd(fresh[l], "vllm_cuda", b_dst, side), (q.float() * sc).to(torch.bfloat16),
                              f"vllm_cuda/{order}: fp8 mode values")


def test_vllm_cuda_and_cpu_kinds_differ():
    """The same (num_blocks, H, T, 2*D) bytes read as vLLM CPU's layout and as vLLM CUDA's give
    different blocks, each equal to its own layout's definition: the kind is the caller's to
    name, and naming the wrong one would store other values."""
    g = torch.Generator().manual_seed(19)
    NB, T, H, D = 4, 16, 2, 64
    c = (torch.randn(NB, H, T, 2 * D, generator=g) * 0.5).to(torch.bfloat16).to(DEV)
    lc, lv = P.describe(c, "cpu"), P.describe(c, "vllm_cuda")
    assert (lc.num_blocks, lc.block_tokens, lc.num_kv_heads, lc.head_dim) == \
        (lv.num_blocks, lv.block_tokens, lv.num_kv_heads, lv.head_dim), (lc, lv)
    ids = [3, 1]
    rc = torch.zeros(2, P.BlockMover([c], lc).block_bytes, dtype=torch.uint8, device=DEV)
    rv = torch.zeros_like(rc)
    P.BlockMover([c], lc).save(ids, rc)
    P.BlockMover([c], lv).save(ids, rv)
    for i, b in enumerate(ids):
        # vLLM CPU (cpu_attn.py): per head the block's T K rows, then its T V rows.
        k_cpu = c[b].reshape(H, 2 * T, D)[:, :T].contiguous()
        # vLLM CUDA (flash_attn.py): each token's row is K then V.
        k_cuda = c[b, :, :, :D].contiguous()
        assert_eq(rc[i, :H * T * D * 2], k_cpu.view(torch.uint8).reshape(-1), "cpu kind: K page")
        assert_eq(rv[i, :H * T * D * 2], k_cuda.view(torch.uint8).reshape(-1), "vllm_cuda kind: K page")
        assert not torch.equal(rc[i].cpu(), rv[i].cpu()), f"block {b}: both kinds gave the same bytes"
    # A block saved from one kind and loaded as the other lands as other values.
    other = torch.zeros_like(c)
    P.BlockMover([other], lv).load(rc, [0, 2])
    assert not torch.equal(other[0].cpu(), c[3].cpu()), "a cpu block loaded as vllm_cuda kept the values"


def test_vllm_cuda_refusals():
    caches, _ = vllm_cuda_caches("LBHNC", 1, 4, 16, 2, 64, torch.bfloat16)
    c = caches[0]
    raises(lambda: P.describe(c[0], "vllm_cuda"), "4 dims")
    raises(lambda: P.describe(c.unsqueeze(0), "vllm_cuda"), "4 dims")
    raises(lambda: P.describe(c[..., :127], "vllm_cuda"), "odd")
    raises(lambda: P.describe(c.transpose(2, 3).contiguous().transpose(2, 3), "vllm_cuda"), "contiguous")
    raises(lambda: P.describe(c, "vllm_cuda", num_kv_heads=4), "2 KV heads", "expected 4")
    raises(lambda: P.describe(c, "vllm_cuda", head_dim=128), "head_dim 64")
    raises(lambda: P.describe(c, "vllm_cuda", v_scale_swizzle=True), "NVFP4 pages only")
    raises(lambda: P.describe(c.view(torch.int16), "vllm_cuda"), "kv_cache_dtype")
    raises(lambda: P.describe(c, "vllm_cuda", "fp8_e5m2"), "E5M2")
    u = torch.zeros(4, 4, 16, 36, dtype=torch.uint8, device=DEV)
    raises(lambda: P.describe(u, "vllm_cuda", "nvfp4"), "K heads then V heads")
    # Strides that overlap: blocks on top of each other, heads inside a token's row.
    raw = torch.zeros(16384, dtype=torch.bfloat16, device=DEV)
    raises(lambda: P.describe(torch.as_strided(raw, (4, 2, 16, 128), (1024, 2048, 128, 1)), "vllm_cuda"),
           "block stride 1024 overlaps")
    raises(lambda: P.describe(torch.as_strided(raw, (2, 2, 16, 128), (4096 // 2, 64, 128, 1)), "vllm_cuda"),
           "head stride 64 overlaps")
    raises(lambda: P.describe(c.expand(4, 2, 16, 128)[:, :1].expand(4, 2, 16, 128), "vllm_cuda"), "overlaps")
    # A layer whose strides differ from layer 0's.
    other, _ = vllm_cuda_caches("LBNHC", 1, 4, 16, 2, 64, torch.bfloat16)
    raises(lambda: P.BlockMover([c, other[0]], P.describe(c, "vllm_cuda")), "layer 1")
    # Size-1 dims may carry any stride (vLLM canonicalizes them; torch gives any value).
    one = torch.as_strided(raw, (4, 1, 16, 128), (2048, 7, 128, 1))
    assert P.describe(one, "vllm_cuda").num_kv_heads == 1


def test_codec_abi_refusals():
    x = torch.randn(20)
    data = torch.full((10,), 0x55, dtype=torch.uint8)
    sc = torch.full((2,), 0x55, dtype=torch.uint8)
    for args, word in (((x.data_ptr(), 20, 1.0, 0), "multiple of 16"), ((x.data_ptr(), 16, 0.0, 0), "global scale"),
                       ((x.data_ptr(), 16, 1.0, 2), "scale rule")):
        try:
            kvtier.nvfp4_encode(*args, data.data_ptr(), sc.data_ptr())
            raise AssertionError("accepted")
        except kvtier.KvtierError as e:
            assert word in str(e), str(e)
    x[3] = float("nan")
    try:
        kvtier.nvfp4_encode(x.data_ptr(), 16, 1.0, 0, data.data_ptr(), sc.data_ptr())
        raise AssertionError("accepted a NaN")
    except kvtier.KvtierError as e:
        assert "not finite" in str(e), str(e)
    assert bool((data == 0x55).all()) and bool((sc == 0x55).all()), "a refused encode wrote"
    sc[0] = 0x7F
    out = torch.zeros(16)
    try:
        kvtier.nvfp4_decode(data.data_ptr(), sc.data_ptr(), 16, 1.0, out.data_ptr())
        raise AssertionError("decoded a NaN scale")
    except kvtier.KvtierError as e:
        assert e.args and "NaN" in str(e), str(e)


def test_torch_decode_equals_codec():
    """nvfp4_decode_torch (the CUDA path for FP16 caches) == kvtier_nvfp4_decode, bit for bit,
    on every code and scale byte combination plus random groups."""
    codes = torch.arange(256, dtype=torch.uint8)
    scales = torch.arange(256, dtype=torch.uint8)
    scales = scales[(scales & 0x7F) != 0x7F]
    data = codes.repeat(len(scales), 1).view(len(scales), 256)  # 512 values per scale row
    for kv in (1.0, 0.0123, 3.0e-5, 417.0):
        d = data.reshape(-1, 8).contiguous()
        sc = scales.repeat_interleave(32).contiguous()
        want = torch.empty(d.numel() * 2)
        kvtier.nvfp4_decode(d.data_ptr(), sc.data_ptr(), want.numel(), kv, want.data_ptr())
        got = P.nvfp4_decode_torch(d.view(-1, 8).to(DEV), sc.view(-1, 1).to(DEV),
                                   torch.tensor(kv, device=DEV)).reshape(-1).cpu()
        assert_eq(got.view(torch.int32), want.view(torch.int32), f"decode at kv_scale {kv}")


CPU_TESTS = [test_torch_decode_equals_codec, test_as_is_bf16_every_layout, test_as_is_fp8_every_layout, test_fp16_and_fp32_as_is_refused,
             test_bad_shapes_refused, test_nvfp4_mode_every_layout, test_fp8_mode,
             test_vllm_nvfp4_pages_convert_bit_exact, test_codec_abi_refusals, test_vllm_cuda_as_is_every_order,
             test_vllm_cuda_nvfp4_every_order, test_vllm_cuda_fp8_mode, test_vllm_cuda_and_cpu_kinds_differ,
             test_vllm_cuda_refusals]


# ---- GPU --------------------------------------------------------------------------------

def test_gpu_nvfp4_equals_cpu():
    """CUDA save bytes == CPU save bytes, CUDA load values == CPU load values."""
    g = torch.Generator().manual_seed(5)
    L, NB, T, H, D = 4, 9, 16, 8, 128
    for kind, order in LAYOUTS[:4]:
        for rule in (P.MAX6, P.FOUR_OVER_SIX):
            cpu = [make_cache(kind, order, NB, T, H, D, torch.bfloat16, device="cpu", gen=g) for _ in range(L)]
            gpu = [c.cuda() for c in cpu]
            ks, vs = _scales(cpu, kind)
            mc = P.BlockMover(cpu, P.describe(cpu[0], kind), "nvfp4", ks, vs, rule)
            mg = P.BlockMover(gpu, P.describe(gpu[0], kind), "nvfp4", ks, vs, rule)
            ids = [8, 0, 4, 5]
            a = torch.zeros(4, mc.block_bytes, dtype=torch.uint8)
            b = torch.zeros(4, mg.block_bytes, dtype=torch.uint8).pin_memory()
            mc.save(ids, a)
            mg.save(ids, b)
            assert_eq(b, a, f"{kind}/{order} rule {rule}: CUDA NVFP4 bytes vs CPU codec")
            mc.load(a, [1, 2, 3, 6])
            mg.load(b, [1, 2, 3, 6])
            for l in range(L):
                assert_eq(gpu[l], cpu[l], f"{kind}/{order}: CUDA NVFP4 load vs CPU")


def test_gpu_kernel_and_torch_paths_agree():
    """kvt_engine_pages (gather, scatter, NVFP4 decode) against the torch path, over blocks
    enough for several pipeline chunks, from pinned rows, shuffled slots and device rows."""
    g = torch.Generator().manual_seed(9)
    L, NB, T, H, D, n = 8, 200, 16, 8, 128, 96
    for kind, order in LAYOUTS[:4]:
        base = [make_cache(kind, order, NB, T, H, D, torch.bfloat16, device="cuda", gen=g) for _ in range(L)]
        ks, vs = _scales(base, kind)
        lay = P.describe(base[0], kind)
        ids = torch.randperm(NB, generator=g)[:2 * n]
        src_ids, to = ids[:n].tolist(), ids[n:].tolist()
        for mode in ("as_is", "nvfp4"):
            a = [c.clone() for c in base]
            b = [c.clone() for c in base]
            mk = P.BlockMover(a, lay, mode, ks, vs)
            mt = P.BlockMover(b, lay, mode, ks, vs, use_kernels=False)
            assert mk.uses_kernels() and not mt.uses_kernels(), "kernel path not taken"
            assert mode == "nvfp4" or len(mk._chunks(n)) > 1, "one chunk only"
            ra = torch.zeros(n, mk.block_bytes, dtype=torch.uint8).pin_memory()
            rb = torch.zeros(n, mt.block_bytes, dtype=torch.uint8).pin_memory()
            mk.save(src_ids, ra)
            mt.save(src_ids, rb)
            assert_eq(ra, rb, f"{kind}/{order} {mode}: saved bytes, kernel vs torch")
            if mode == "as_is":
                assert_eq(ra, ref_as_is(base, kind, src_ids), f"{kind}/{order}: saved bytes vs reference")
            mk.load(ra, to)
            mt.load(rb, to)
            for l in range(L):
                assert_eq(a[l], b[l], f"{kind}/{order} {mode}: loaded cache, kernel vs torch")
            # Rows at shuffled slots (a list) and rows already on the device.
            arena = torch.zeros(2 * n, mk.block_bytes + 512, dtype=torch.uint8).pin_memory()
            slots = torch.randperm(2 * n, generator=g)[:n].tolist()
            for i, s in enumerate(slots):
                arena[s, :mk.block_bytes] = ra[i]
            c = [x.clone() for x in base]
            P.BlockMover(c, lay, mode, ks, vs).load([arena[s] for s in slots], to)
            d = [x.clone() for x in base]
            P.BlockMover(d, lay, mode, ks, vs).load(ra.cuda(), to)
            for l in range(L):
                assert_eq(c[l], a[l], f"{kind}/{order} {mode}: load from shuffled slots")
                assert_eq(d[l], a[l], f"{kind}/{order} {mode}: load from device rows")


def test_gpu_kernel_scale_check():
    """kvt_engine_pages' device scale check over several pipeline chunks: rows with a bad
    block scale byte in the first, a middle and the last chunk (NaN, -NaN, -0, negative)
    keep their pages, every other row equals a clean load, and the error (at wait() with
    wait=False, at once with wait=True) names exactly those blocks. From pinned rows, rows
    at shuffled slots and device rows. A bad global scale refuses every row, and an NVFP4
    call without row_errors is refused."""
    from kvtier import kernels as K
    g = torch.Generator().manual_seed(11)
    L, NB, T, H, D, n = 16, 200, 16, 8, 128, 96
    kind, order = "flashinfer", "HND"
    base = [make_cache(kind, order, NB, T, H, D, torch.bfloat16, device="cuda", gen=g) for _ in range(L)]
    ks, vs = _scales(base, kind)
    lay = P.describe(base[0], kind)
    m = P.BlockMover(base, lay, "nvfp4", ks, vs)
    assert m.uses_kernels() and len(m._chunks(n)) > 1, "kernel path with several chunks not taken"
    perm = torch.randperm(NB, generator=g)
    src_ids, to = perm[:n].tolist(), perm[n:2 * n].tolist()
    rows = torch.zeros(n, m.block_bytes, dtype=torch.uint8).pin_memory()
    m.save(src_ids, rows)
    ref = [c.clone() for c in base]
    P.BlockMover(ref, lay, "nvfp4", ks, vs).load(rows, to)
    cases = corrupt_scale_cases(L, H, T, D)
    bad_rows = {0: cases[0], 5: cases[2], n // 2 + 1: cases[1], n - 1: cases[3]}
    bad = rows.clone()
    for r, (off, byte, _) in bad_rows.items():
        assert int(bad[r, off]) < 0x7F
        bad[r, off] = byte
    bad_blocks = sorted(to[r] for r in bad_rows)
    good_blocks = torch.tensor(sorted(set(to) - set(bad_blocks)), device="cuda")
    bad_idx = torch.tensor(bad_blocks, device="cuda")
    arena = torch.zeros(2 * n, m.block_bytes + 512, dtype=torch.uint8).pin_memory()
    slots = torch.randperm(2 * n, generator=g)[:n].tolist()
    for i, sl in enumerate(slots):
        arena[sl, :m.block_bytes] = bad[i]
    for source in ("pinned", "slots", "device", "wait"):
        c = [x.clone() for x in base]
        mm = P.BlockMover(c, lay, "nvfp4", ks, vs)
        src = {"pinned": bad, "wait": bad, "device": bad.cuda(), "slots": [arena[sl] for sl in slots]}[source]
        try:
            if source == "wait":
                mm.load(src, to)
            else:
                h = mm.load(src, to, wait=False)
                h.wait()
            raise AssertionError(f"{source}: bad scales accepted")
        except P.CorruptBlocksError as e:
            assert sorted(e.block_ids) == bad_blocks, f"{source}: refused {sorted(e.block_ids)}, expected {bad_blocks}"
        for l in range(L):
            assert_eq(c[l][bad_idx], base[l][bad_idx], f"{source}: layer {l}: refused blocks' pages")
            assert_eq(c[l][good_blocks], ref[l][good_blocks], f"{source}: layer {l}: the other blocks")
    # A bad global scale (NaN, inf, 0, negative, subnormal) refuses every row; the pages stay.
    ids_dev = torch.tensor(to, dtype=torch.int64, device="cuda")
    dev_rows = rows.cuda()
    for val in (float("nan"), float("inf"), 0.0, -1.0, 1e-40):
        c = [x.clone() for x in base]
        mm = P.BlockMover(c, lay, "nvfp4", ks, vs)
        sc = mm._scales_dev.clone()
        sc[L - 1, 1] = val
        p = type(mm._eng["params"]).from_buffer_copy(mm._eng["params"])
        flags = torch.full((n,), -1, dtype=torch.int32, device="cuda")
        p.scales, p.block_ids, p.n, p.rows, p.row_stride = sc.data_ptr(), ids_dev.data_ptr(), n, dev_rows.data_ptr(), \
            dev_rows.stride(0)
        p.direction, p.row_errors = 1, flags.data_ptr()
        K.engine_pages(p)
        torch.cuda.synchronize()
        assert bool((flags == 8).all()), f"global scale {val}: row errors {flags.unique().tolist()}"
        for l in range(L):
            assert_eq(c[l], base[l], f"global scale {val}: layer {l} pages")
    p.row_errors = None
    try:
        K.engine_pages(p)
        raise AssertionError("NVFP4 engine_pages without row_errors accepted")
    except K.KernelError as e:
        assert "row_errors" in str(e), str(e)


def test_gpu_vllm_cuda_kernel():
    """vllm_cuda on CUDA through kvt_engine_pages (K and V are two base addresses of one tensor
    with its strides), in every KVCacheLayout order: as-is BF16 and FP8 saved bytes equal the
    layout's definition and the torch path; loads over several pipeline chunks, from pinned
    rows, shuffled slots and device rows, equal the torch path and leave every other byte of
    the group's buffer (other layers, blocks, padding) as it was. NVFP4: CUDA bytes equal the
    CPU codec's, CUDA loads equal CPU loads, and the device scale check refuses a bad row."""
    g = torch.Generator().manual_seed(23)
    L, NB, T, H, D, n = 16, 128, 16, 8, 128, 64
    for order in VLLM_CUDA_ORDERS:
        for dtype, kvn in ((torch.bfloat16, "auto"), (torch.uint8, "fp8")):
            cpu, cpu_raw = vllm_cuda_caches(order, L, NB, T, H, D, dtype, device="cpu", gen=g)
            raw = cpu_raw.cuda()
            base = [torch.as_strided(raw, c.shape, c.stride(), c.storage_offset()) for c in cpu]
            lay = P.describe(base[0], "vllm_cuda", kvn)
            perm = torch.randperm(NB, generator=g)
            src_ids, to = perm[:n].tolist(), perm[n:2 * n].tolist()
            modes = ("as_is", "nvfp4") if dtype == torch.bfloat16 else ("as_is",)
            ks, vs = _scales(cpu, "vllm_cuda") if dtype == torch.bfloat16 else (None, None)
            for mode in modes:
                what = f"vllm_cuda/{order} {dtype} {mode}"
                mk = P.BlockMover(base, lay, mode, ks, vs)
                mt = P.BlockMover(base, lay, mode, ks, vs, use_kernels=False)
                assert mk.uses_kernels() and not mt.uses_kernels(), f"{what}: kernel path not taken"
                assert len(mk._chunks(n)) > 1, f"{what}: one chunk only"
                ra = torch.zeros(n, mk.block_bytes, dtype=torch.uint8).pin_memory()
                rb = torch.zeros(n, mt.block_bytes, dtype=torch.uint8).pin_memory()
                mk.save(src_ids, ra)
                mt.save(src_ids, rb)
                assert_eq(ra, rb, f"{what}: saved bytes, kernel vs torch")
                if mode == "as_is":
                    assert_eq(ra, ref_as_is(cpu, "vllm_cuda", src_ids), f"{what}: saved bytes vs the definition")
                else:
                    rc = torch.zeros(n, mk.block_bytes, dtype=torch.uint8)
                    P.BlockMover(cpu, P.describe(cpu[0], "vllm_cuda"), mode, ks, vs).save(src_ids, rc)
                    assert_eq(ra, rc, f"{what}: CUDA NVFP4 bytes vs the CPU codec")
                # Loads into a fresh copy of the buffer: kernel, torch, shuffled slots, device rows.
                outs = []
                arena = torch.zeros(2 * n, mk.block_bytes + 512, dtype=torch.uint8).pin_memory()
                slots = torch.randperm(2 * n, generator=g)[:n].tolist()
                for i, sl in enumerate(slots):
                    arena[sl, :mk.block_bytes] = ra[i]
                for src, kern in ((ra, True), (ra, False), ([arena[sl] for sl in slots], True), (ra.cuda(), True)):
                    r2 = raw.clone()
                    c2 = [torch.as_strided(r2, c.shape, c.stride(), c.storage_offset()) for c in cpu]
                    P.BlockMover(c2, lay, mode, ks, vs, use_kernels=kern).load(src, to)
                    outs.append(r2)
                for i, o in enumerate(outs[1:]):
                    assert_eq(o, outs[0], f"{what}: loaded buffer, source {i + 1} vs the kernel from pinned rows")
                # Elements outside the loaded pages are unchanged; inside, as-is equals the source.
                idx = torch.arange(raw.numel(), device="cuda")
                written = torch.zeros(raw.numel(), dtype=torch.bool, device="cuda")
                for c in cpu:
                    written[torch.as_strided(idx, c.shape, c.stride(), c.storage_offset())[to].reshape(-1)] = True
                bits = torch.uint8 if raw.element_size() == 1 else torch.int16
                assert_eq(outs[0].view(bits)[~written], raw.view(bits)[~written], f"{what}: elements outside the load")
                if mode == "as_is":
                    for l, c in enumerate(cpu):
                        got = torch.as_strided(outs[0], c.shape, c.stride(), c.storage_offset())[to]
                        assert_eq(got, base[l][src_ids], f"{what}: layer {l} loaded pages")
                else:
                    # CPU load of the same rows into a CPU copy of the group gives the same values.
                    cr = cpu_raw.clone()
                    cc = [torch.as_strided(cr, c.shape, c.stride(), c.storage_offset()) for c in cpu]
                    P.BlockMover(cc, P.describe(cc[0], "vllm_cuda"), mode, ks, vs).load(ra, to)
                    assert_eq(outs[0].view(torch.int16), cr.view(torch.int16), f"{what}: CUDA load vs CPU load")
                    # One bad scale byte in row 1: that block keeps its pages, the error names it.
                    bad = ra.clone()
                    off = corrupt_scale_cases(L, H, T, D)[1][0]
                    assert int(bad[1, off]) < 0x7F
                    bad[1, off] = 0xFF
                    r3 = raw.clone()
                    c3 = [torch.as_strided(r3, c.shape, c.stride(), c.storage_offset()) for c in cpu]
                    try:
                        P.BlockMover(c3, lay, mode, ks, vs).load(bad, to)
                        raise AssertionError(f"{what}: a bad scale byte was accepted")
                    except P.CorruptBlocksError as e:
                        assert e.block_ids == [to[1]], f"{what}: refused {e.block_ids}, expected [{to[1]}]"
                    for l, c in enumerate(cpu):
                        v3 = torch.as_strided(r3, c.shape, c.stride(), c.storage_offset())
                        assert_eq(v3[to[1]], base[l][to[1]], f"{what}: layer {l}: the refused block's pages")
                        keep = [b for i, b in enumerate(to) if i != 1]
                        assert_eq(v3[keep], torch.as_strided(outs[0], c.shape, c.stride(), c.storage_offset())[keep],
                                  f"{what}: layer {l}: the other blocks of the load")


GPU_TESTS = [test_gpu_nvfp4_equals_cpu, test_gpu_kernel_and_torch_paths_agree, test_gpu_kernel_scale_check,
             test_gpu_vllm_cuda_kernel]


def run(tests):
    passed, failed = 0, 0
    for t in tests:
        try:
            t()
            passed += 1
            print(f"PASS {t.__name__}", flush=True)
        except Exception:
            failed += 1
            print(f"FAIL {t.__name__}\n{traceback.format_exc()}", flush=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    group = sys.argv[1] if len(sys.argv) > 1 else "cpu"
    global DEV
    if group == "cpu":
        try:
            kvtier.library_path()
        except Exception as e:  # the C codec is part of what is tested
            print(f"FAILED: libkvtier not found: {e}")
            return 1
        return run(CPU_TESTS)
    if group == "gpu":
        if not torch.cuda.is_available():
            skip("no CUDA device")
        DEV = "cuda"
        # The CPU checks again with CUDA caches (saves to pinned host, loads from device).
        return run([test_as_is_bf16_every_layout, test_as_is_fp8_every_layout, test_nvfp4_mode_every_layout,
                    test_fp8_mode, test_vllm_nvfp4_pages_convert_bit_exact, test_torch_decode_equals_codec,
                    test_vllm_cuda_as_is_every_order, test_vllm_cuda_nvfp4_every_order, test_vllm_cuda_fp8_mode,
                    test_vllm_cuda_and_cpu_kinds_differ, test_vllm_cuda_refusals] + GPU_TESTS)
    print(f"unknown group {group!r}: cpu or gpu")
    return 2


if __name__ == "__main__":
    sys.exit(main())
