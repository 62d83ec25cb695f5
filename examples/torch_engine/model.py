"""A Llama-architecture decoder in plain PyTorch: RMSNorm, RoPE, GQA attention, SwiGLU.

The model only computes; where K/V live is the caller's business (engine.py passes a
cache object with write / prefix / decode). Weights are deterministic random from a seed
(nothing can be downloaded on the GPU machine), or loaded from a safetensors checkpoint
with Llama's tensor names (model.layers.N.self_attn.q_proj.weight, ...).
"""
from dataclasses import dataclass, asdict
import math

import torch
import torch.nn.functional as F


@dataclass
class ModelConfig:
    layers: int = 8
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    intermediate: int = 14336
    vocab: int = 128256
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5
    seed: int = 1234

    def as_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def rope_tables(cfg: ModelConfig, max_pos: int, device):
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float64) / cfg.head_dim))
    t = torch.arange(max_pos, device=device, dtype=torch.float64)
    f = torch.outer(t, inv)
    return torch.cos(f).float(), torch.sin(f).float()


def apply_rope(x, cos, sin):
    """x [n, heads, D]; cos/sin [n, D/2] (rotate-half convention, as Llama)."""
    d2 = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :d2], xf[..., d2:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


class Llama:
    def __init__(self, cfg: ModelConfig, device="cuda", dtype=torch.bfloat16, checkpoint=None):
        self.cfg, self.device, self.dtype, self.checkpoint = cfg, device, dtype, checkpoint
        if checkpoint:
            self._load(checkpoint)
        else:
            self._init_random()
        self._rope_len = 0
        self.cos = self.sin = None

    # ---- weights -------------------------------------------------------------------
    def _init_random(self):
        c = self.cfg
        g = torch.Generator(device=self.device)
        g.manual_seed(c.seed)

        def w(out_f, in_f):
            # N(0, 1/in_f): activations keep their scale through the layers.
            t = torch.randn(out_f, in_f, generator=g, device=self.device, dtype=torch.float32)
            return (t / math.sqrt(in_f)).to(self.dtype)

        self.embed = (torch.randn(c.vocab, c.hidden, generator=g, device=self.device) * 1.0).to(self.dtype)
        self.blocks = []
        for _ in range(c.layers):
            self.blocks.append({
                "wq": w(c.heads * c.head_dim, c.hidden),
                "wk": w(c.kv_heads * c.head_dim, c.hidden),
                "wv": w(c.kv_heads * c.head_dim, c.hidden),
                "wo": w(c.hidden, c.heads * c.head_dim),
                "w1": w(c.intermediate, c.hidden),
                "w3": w(c.intermediate, c.hidden),
                "w2": w(c.hidden, c.intermediate),
                "n1": torch.ones(c.hidden, device=self.device, dtype=self.dtype),
                "n2": torch.ones(c.hidden, device=self.device, dtype=self.dtype),
            })
        self.norm = torch.ones(c.hidden, device=self.device, dtype=self.dtype)
        self.lm_head = w(c.vocab, c.hidden)

    def _load(self, path):
        from safetensors.torch import load_file
        c = self.cfg
        sd = load_file(path, device=str(self.device))

        def get(name):
            if name not in sd:
                raise KeyError(f"checkpoint {path} has no tensor {name}")
            return sd[name].to(self.dtype)

        self.embed = get("model.embed_tokens.weight")
        self.blocks = []
        for i in range(c.layers):
            p = f"model.layers.{i}."
            self.blocks.append({
                "wq": get(p + "self_attn.q_proj.weight"), "wk": get(p + "self_attn.k_proj.weight"),
                "wv": get(p + "self_attn.v_proj.weight"), "wo": get(p + "self_attn.o_proj.weight"),
                "w1": get(p + "mlp.gate_proj.weight"), "w3": get(p + "mlp.up_proj.weight"),
                "w2": get(p + "mlp.down_proj.weight"),
                "n1": get(p + "input_layernorm.weight"), "n2": get(p + "post_attention_layernorm.weight"),
            })
        self.norm = get("model.norm.weight")
        self.lm_head = get("lm_head.weight") if "lm_head.weight" in sd else self.embed
        if self.embed.shape != (c.vocab, c.hidden):
            raise ValueError(f"checkpoint embed shape {tuple(self.embed.shape)} does not match --vocab/--hidden "
                             f"({c.vocab}, {c.hidden})")

    # ---- pieces ------------------------------------------------------------------------
    def rope(self, positions):
        need = int(positions.max().item()) + 1
        if need > self._rope_len:
            n = max(need, 2 * self._rope_len, 4096)
            self.cos, self.sin = rope_tables(self.cfg, n, self.device)
            self._rope_len = n
        return self.cos[positions], self.sin[positions]

    def qkv(self, li, h, positions):
        c, b = self.cfg, self.blocks[li]
        a = rms_norm(h, b["n1"], c.norm_eps)
        q = (a @ b["wq"].T).view(-1, c.heads, c.head_dim)
        k = (a @ b["wk"].T).view(-1, c.kv_heads, c.head_dim)
        v = (a @ b["wv"].T).view(-1, c.kv_heads, c.head_dim)
        cos, sin = self.rope(positions)
        return apply_rope(q, cos, sin).contiguous(), apply_rope(k, cos, sin).contiguous(), v.contiguous()

    def finish_layer(self, li, h, attn):
        """attn [n, heads, D] -> residual stream after o_proj and the MLP."""
        c, b = self.cfg, self.blocks[li]
        h = h + attn.reshape(h.shape[0], -1) @ b["wo"].T
        a = rms_norm(h, b["n2"], c.norm_eps)
        return h + (F.silu(a @ b["w1"].T) * (a @ b["w3"].T)) @ b["w2"].T

    def logits(self, h_last):
        return (rms_norm(h_last, self.norm, self.cfg.norm_eps) @ self.lm_head.T).float()


def attention_prefill(q, k, v, prefix_len, softmax_scale):
    """q [n, Hq, D] for positions prefix_len..prefix_len+n-1; k/v [prefix_len + n, Hkv, D].
    Causal over the whole sequence; GQA by repeating K/V heads; torch SDPA (flash or
    memory-efficient attention, never a materialized score matrix of the whole sequence)."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    rep = hq // hkv
    # [1, heads, S, D]: 4-D inputs, so that SDPA picks flash / memory-efficient attention.
    kk = k.transpose(0, 1).repeat_interleave(rep, dim=0)[None]
    vv = v.transpose(0, 1).repeat_interleave(rep, dim=0)[None]
    qq = q.transpose(0, 1)[None]
    if prefix_len == 0:  # a square causal problem: one flash-attention call
        out = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True, scale=softmax_scale)
        return out[0].transpose(0, 1).contiguous()
    if _causal_lower_right is not None:  # queries aligned to the end of the keys
        out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=_causal_lower_right(n, k.shape[0]),
                                             scale=softmax_scale)
        return out[0].transpose(0, 1).contiguous()
    out = torch.empty_like(qq)
    chunk = 4096
    for s in range(0, n, chunk):
        e = min(n, s + chunk)
        kv_end = prefix_len + e
        qpos = torch.arange(prefix_len + s, prefix_len + e, device=q.device)
        kpos = torch.arange(kv_end, device=q.device)
        mask = kpos[None, :] <= qpos[:, None]
        out[:, :, s:e] = F.scaled_dot_product_attention(qq[:, :, s:e], kk[:, :, :kv_end], vv[:, :, :kv_end],
                                                        attn_mask=mask, scale=softmax_scale)
    return out[0].transpose(0, 1).contiguous()


try:
    from torch.nn.attention.bias import causal_lower_right as _causal_lower_right
except ImportError:  # torch < 2.3
    _causal_lower_right = None
