"""The kernels' table of decode shapes (kvt_decode_shapes) against what kvtier serves
(pytest; ctest runs it through run_tests.py).

- CPU (a build without CUDA answers the table too): every (format, head_dim, group,
  block_tokens) of a grid around the table is served by kvt_decode_supports exactly when
  it is in kvt_decode_shapes; and for tiny Llama models of every (head_dim, group) of the
  grid, use_kvtier accepts the model exactly when some format serves it, and
  check_format(model, format, block_tokens) exactly when the table has that shape.
- GPU: kvt_decode runs every shape of the table (finite output) and refuses every shape
  of the grid outside it before launching anything.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples", "transformers"))

from kvtier import kernels as K  # noqa: E402
import kvtier.transformers as kt  # noqa: E402

HEAD_DIMS = (32, 64, 80, 96, 128, 160, 256, 512)
GROUPS = (1, 2, 3, 4, 6, 8, 16)
BLOCK_TOKENS = (8, 16, 24, 32, 64, 128)


def grid():
    for f in K.FORMAT_NAMES:
        for d in HEAD_DIMS:
            for g in GROUPS:
                for t in BLOCK_TOKENS:
                    yield f, d, g, t


def test_table_agrees_with_supports():
    table = K.decode_shapes()
    assert len(table) == len(set(table)) and table, table
    for shape in table:
        assert K.decode_unsupported(*shape) is None, shape
    for shape in grid():
        why = K.decode_unsupported(*shape)
        assert (why is None) == (shape in table), (shape, why)
        if why is not None:
            assert why.startswith("decode: ") and "unsupported" in why, why


def tiny(head_dim, group, kv_heads=2):
    import transformers as tf
    heads = group * kv_heads
    cfg = tf.LlamaConfig(hidden_size=16 * heads, intermediate_size=64, num_hidden_layers=1, num_attention_heads=heads,
                         num_key_value_heads=kv_heads, head_dim=head_dim, vocab_size=64, pad_token_id=0,
                         bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    with torch.device("cpu"):
        return tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()


def test_models_are_refused_by_the_table():
    table = set(K.decode_shapes())
    for d in (64, 96, 128, 256):
        for g in (1, 2, 3, 4, 8, 16):
            model = tiny(d, g)
            served = {(f, t) for f, dd, gg, t in table if dd == d and gg == g}
            if served:
                kt.use_kvtier(model)
            else:
                with pytest.raises(kt.UnsupportedModel, match="not served by kvtier's decode"):
                    kt.use_kvtier(model)
                continue
            for f, name in K.FORMAT_NAMES.items():
                for t in BLOCK_TOKENS:
                    if (f, t) in served:
                        kt.check_format(model, name, t)
                    else:
                        with pytest.raises(kt.UnsupportedModel, match="unsupported"):
                            kt.check_format(model, name, t)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the decode needs one")
def test_decode_runs_every_table_shape_and_refuses_the_rest():
    from kvtier import torch_ops
    if not K.built_with_cuda():
        pytest.skip("libkvtier_kernels.so was built without CUDA")
    table = set(K.decode_shapes())
    H, L, n = 2, 1, 40
    gen = torch.Generator(device="cuda").manual_seed(3)
    for f, d, g, t in sorted(set(grid())):
        if d % 16:
            continue   # no pool geometry of this head_dim exists (the page formats need 16 | D)
        block = K.page_bytes(f, H, d, t) * L
        slots = -(-n // t)
        arena = torch.zeros(block * slots, dtype=torch.uint8, device="cuda")
        geom = [block, slots, L, H, d, t, f]
        q = torch.randn(1, g * H, d, device="cuda", generator=gen).bfloat16()
        out = torch.full_like(q, float("nan"))
        table_t = torch.arange(slots, dtype=torch.int32, device="cuda").unsqueeze(0)
        seq = torch.tensor([n], dtype=torch.int32, device="cuda")
        if f != K.BF16 and (f, d, g, t) in table:
            pos = torch.arange(n, device="cuda")
            kv = torch.randn(n, H, d, device="cuda", generator=gen).bfloat16()
            torch_ops.quantize_append_impl(arena, kv, kv, table_t[0][pos // t].contiguous(), (pos % t).to(torch.int32),
                                           geom, 0, 2.0 ** -6, 2.0 ** -6, 0)
        scale = 1.0 if f == K.BF16 else 2.0 ** -6
        if (f, d, g, t) in table:
            ws = torch.empty(max(16, torch_ops.decode_workspace_bytes(arena, geom, q, out, table_t, seq, n)),
                             dtype=torch.uint8, device="cuda")
            torch_ops.decode_impl(arena, q, out, table_t, seq, ws, geom, 0, scale, scale, d ** -0.5, n, 0)
            torch.cuda.synchronize()
            assert bool(torch.isfinite(out).all()), (f, d, g, t)
        else:
            ws = torch.empty(1 << 20, dtype=torch.uint8, device="cuda")
            with pytest.raises(K.KernelError) as e:
                torch_ops.decode_impl(arena, q, out, table_t, seq, ws, geom, 0, scale, scale, d ** -0.5, n, 0)
            assert "unsupported" in str(e.value) or "geometry" in str(e.value), (f, d, g, t, str(e.value))
            assert bool(torch.isnan(out).all()), "a refused decode wrote its output"
