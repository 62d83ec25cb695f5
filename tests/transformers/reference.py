"""References for kvtier.transformers tests, in plain torch, sharing no code with kvtier's
kernels: the model's own sdpa forward over transformers' DynamicCache, optionally with its
K/V fake-quantized to FP8 or NVFP4 pages' values first.

The fake quantization follows the page formats' rules (docs/kernels.md) in float32 with
the same operation order as the codec (formats/nvfp4_math.h), so a correct cache decodes
the very values the reference attends to:
- FP8: E4M3(x / scale), round to nearest even, saturating at +-448; value q * scale.
- NVFP4 (max6): per group of 16 values along head_dim, sf = E4M3((amax / 6) / scale),
  s = sf * scale, code = E2M1(x / s) (ties as the codec: 0.25 down, 0.75 up, 1.25 down,
  1.75 up, 2.5 down, 3.5 up, 5 down); value code * s.
"""
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

FAKEQUANT = "kvtier_test_fakequant"
_state = {"fmt": None, "k": None, "v": None}


def _e4m3(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float()


def _e2m1(a: torch.Tensor) -> torch.Tensor:
    """E2M1 value of |x| (a >= 0), rounded as the codec's FloatToE2M1."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=a.device)
    idx = ((a > 0.25).int() + (a >= 0.75).int() + (a > 1.25).int() + (a >= 1.75).int() + (a > 2.5).int() +
           (a >= 3.5).int() + (a > 5.0).int())
    return grid[idx.long()]


def fake_quant(x: torch.Tensor, fmt: str, scale: float) -> torch.Tensor:
    """x [..., D] -> the values pages of `fmt` with global `scale` hold (float32)."""
    x = x.float()
    if fmt == "bf16":
        return x
    if fmt == "fp8":
        return _e4m3(x / scale) * scale
    assert fmt == "nvfp4", fmt
    g = x.reshape(*x.shape[:-1], x.shape[-1] // 16, 16)
    amax = g.abs().amax(-1, keepdim=True)
    sf = _e4m3((amax / 6.0) / scale)
    s = sf * scale
    q = torch.where(s > 0, _e2m1((g / torch.where(s > 0, s, 1.0)).abs()), torch.zeros_like(g))
    return (torch.sign(g) * q * s).reshape(x.shape)


def _fakequant_attention(module, query, key, value, attention_mask, **kwargs):
    """A prefill (several query tokens) attends to its own K/V as computed, as kvtier's
    prefill does; a decode step attends to every K/V as the pages hold them."""
    if query.shape[2] > 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    layer = module.layer_idx
    fmt = _state["fmt"]
    k = fake_quant(key, fmt, _state["k"][layer]).to(key.dtype)
    v = fake_quant(value, fmt, _state["v"][layer]).to(value.dtype)
    return sdpa_attention_forward(module, query, k, v, attention_mask, **kwargs)


AttentionInterface.register(FAKEQUANT, _fakequant_attention)
AttentionMaskInterface.register(FAKEQUANT, sdpa_mask)


@torch.no_grad()
def logits(model, ids, mask, forced, fmt="bf16", k_scales=None, v_scales=None):
    """[B, 1 + steps, vocab] float32: the prefill's last logits, then one per forced token,
    with transformers' DynamicCache and sdpa; with `fmt` FP8 or NVFP4, each decode step
    attends to the K/V as `fmt` pages hold them (the prefill to its K/V as computed, as
    kvtier's prefill does)."""
    impl = model.config._attn_implementation
    if fmt == "bf16":
        model.set_attn_implementation("sdpa")
    else:
        _state.update(fmt=fmt, k=list(k_scales), v=list(v_scales))
        model.set_attn_implementation(FAKEQUANT)
    try:
        dc = DynamicCache(config=model.config)
        pos = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = [model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=dc,
                     use_cache=True).logits[:, -1].float()]
        last = pos[:, -1:]
        for i in range(forced.shape[1]):
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
            last = last + 1
            out.append(model(input_ids=forced[:, i:i + 1], attention_mask=mask, position_ids=last,
                             past_key_values=dc, use_cache=True).logits[:, -1].float())
        return torch.stack(out, 1)
    finally:
        model.set_attn_implementation(impl)


def rel_l2(a, b) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def top1(a, b) -> float:
    return float((a.argmax(-1) == b.argmax(-1)).double().mean())
