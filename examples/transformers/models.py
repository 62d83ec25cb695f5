"""Models for the examples, tests and benchmarks: configs shaped like real checkpoints,
initialised from a seed, written with save_pretrained and read back with from_pretrained
(the real loading path). No weights are downloaded.

    cfg = config("llama", small=True)
    path = save_random(cfg, "/tmp/tiny-llama", seed=0)
    model = load(path)                       # bf16, on the GPU, attn_implementation="kvtier"
"""
import os

import torch

ARCHS = ("llama", "qwen3", "qwen2", "mistral")


def config(arch: str, small: bool = True, **overrides):
    """A transformers config of `arch`. small=False gives the real model's shape
    (Llama-3-8B, Qwen3-8B, Qwen2-72B, Mistral-7B-v0.3); small=True the same attention
    geometry (GQA group, head_dim) with fewer layers and a narrow MLP, for tests."""
    import transformers as tf
    if arch == "llama":
        kw = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=128256, rope_theta=500000.0,
                  max_position_embeddings=131072, rms_norm_eps=1e-5)
        cls = tf.LlamaConfig
    elif arch == "qwen3":
        kw = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=151936, rope_theta=1000000.0,
                  max_position_embeddings=40960, rms_norm_eps=1e-6, use_sliding_window=False)
        cls = tf.Qwen3Config
    elif arch == "qwen2":
        # Qwen2-72B: GQA group 8 (Qwen2-7B's 28/4 = 7 is a group the kernels refuse).
        kw = dict(hidden_size=8192, intermediate_size=29568, num_hidden_layers=80, num_attention_heads=64,
                  num_key_value_heads=8, vocab_size=152064, rope_theta=1000000.0, max_position_embeddings=32768,
                  rms_norm_eps=1e-6, use_sliding_window=False)
        cls = tf.Qwen2Config
    elif arch == "mistral":
        kw = dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, head_dim=128, vocab_size=32768, rope_theta=1000000.0,
                  max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=None)
        cls = tf.MistralConfig
    else:
        raise ValueError(f"unknown arch {arch!r} (one of {ARCHS})")
    if small:
        # The same head_dim and GQA group as the real model, two layers, a narrow MLP.
        heads, kv = kw["num_attention_heads"], kw["num_key_value_heads"]
        group = heads // kv
        small_heads = max(group, 8)
        kw.update(num_hidden_layers=2, intermediate_size=512, vocab_size=4096, hidden_size=small_heads * 128,
                  num_attention_heads=small_heads, num_key_value_heads=small_heads // group, head_dim=128)
    kw.update(overrides)
    return cls(**kw)


# Decoder families beyond ARCHS, each for one thing a generic integration must honour
# (tests/transformers/test_families.py runs every one on BF16, FP8 and NVFP4 pages).
FAMILIES = {
    "granite": "a softmax scale other than 1/sqrt(head_dim) (attention_multiplier 0.05)",
    "gemma": "head_dim 256 (served for NVFP4 pages only)",
    "phi3": "K and V sliced out of one fused qkv projection",
    "olmo2": "QK-norm over the whole projection",
    "stablelm": "partial rotary (a quarter of head_dim)",
    "gpt_neox": "a parallel residual, partial rotary, a per-head interleaved fused qkv, no GQA",
    "cohere": "a parallel residual, interleaved rotary",
    "smollm3": "layers without RoPE (every fourth)",
}
# Families kvtier must refuse, with what it cannot serve.
REFUSED_FAMILIES = {
    "gemma2": "attention logit soft-capping and sliding-window layers",
}


def family_config(name: str, **overrides):
    """A tiny config of family `name` (FAMILIES or REFUSED_FAMILIES): 4 layers, hidden 256,
    4 query heads over 2 KV heads of head_dim 64 (Gemma: 256; GPT-NeoX: 4 KV heads, it has
    no GQA), a 1024-token vocabulary."""
    import transformers as tf
    kw = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
              num_key_value_heads=2, vocab_size=1024, max_position_embeddings=2048, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
    if name == "granite":
        cls, kw = tf.GraniteConfig, dict(kw, attention_multiplier=0.05)
    elif name == "gemma":
        cls, kw = tf.GemmaConfig, dict(kw, head_dim=256)
    elif name == "phi3":
        cls = tf.Phi3Config
    elif name == "olmo2":
        cls = tf.Olmo2Config
    elif name == "stablelm":
        cls = tf.StableLmConfig
    elif name == "gpt_neox":
        kw.pop("num_key_value_heads")
        cls = tf.GPTNeoXConfig
    elif name == "cohere":
        cls = tf.CohereConfig
    elif name == "smollm3":
        cls = tf.SmolLM3Config
    elif name == "gemma2":
        cls, kw = tf.Gemma2Config, dict(kw, head_dim=64)
    else:
        raise ValueError(f"unknown family {name!r} (one of {list(FAMILIES) + list(REFUSED_FAMILIES)})")
    kw.update(overrides)
    return cls(**kw)


def build(cfg, seed: int = 0, device: str = "cuda"):
    """A causal LM of `cfg` with seeded random bf16 weights, in eval mode."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
    return model.eval()


def save_random(cfg, path: str, seed: int = 0) -> str:
    """Initialises `cfg` from `seed` and writes it with save_pretrained (safetensors)."""
    os.makedirs(path, exist_ok=True)
    build(cfg, seed).save_pretrained(path)
    return path


def load(path: str, attn_implementation: str = "kvtier"):
    """from_pretrained in bf16 on the GPU (kvtier.transformers must be imported first for
    attn_implementation="kvtier")."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16, device_map="cuda",
                                                 attn_implementation=attn_implementation)
    return model.eval()
