"""The README's transformers example on the shipped config (pytest; ctest runs it through
run_tests.py, label gpu): kvtierd started from config/kvtier.toml with only
tiers.hbm.capacity set, as a new user starts it, and models with the attention geometry of
Llama-3-8B (32 layers, 32 query heads, 8 KV heads, head_dim 128) and Llama-3-70B (80
layers, 64 query heads, 8 KV heads) with a small MLP and vocabulary, all in one daemon.

For every model, format (NVFP4, FP8, BF16) and block size (the default and 64 tokens), the
example's two turns: the first computes its prompt and commits prompt and output; the
second, on the first turn's output and more tokens, must restore exactly the committed
blocks (cached_tokens = committed blocks x block tokens) and generate.

The shipped config makes each contract's slot size as it registers (tiers.slot_classes =
"per-contract", tiers.slot_bytes the largest block, 64 MiB): every case registers, the
Llama-3-70B BF16 64-token block (20 MiB) included.
"""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device: kvtier's kernels need one", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "examples", "transformers"))

import tomllib  # noqa: E402

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402
from kvtier import kernels as K  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402
import models  # noqa: E402

# Attention geometry of the real checkpoints; MLP and vocabulary small.
GEOMETRIES = {
    "llama-3-8b": dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096),
    "llama-3-70b": dict(num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8, hidden_size=8192),
}
PROMPT, NEW, MORE = 200, 24, 40


def _size(v):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if str(v).endswith(u):
            return int(float(v[:-len(u)]) * m)
    return int(v)


with open(os.path.join(ROOT, "config", "kvtier.toml"), "rb") as f:
    SHIPPED_SLOT = _size(tomllib.load(f)["tiers"]["slot_bytes"])


def _cases():
    for name, g in GEOMETRIES.items():
        for fmt in kt.FORMATS:
            for T in sorted({kt.DEFAULT_BLOCK_TOKENS, 64}):
                block = K.page_bytes(K.FORMAT_BY_NAME[fmt], g["num_key_value_heads"], 128, T) * g["num_hidden_layers"]
                assert block <= SHIPPED_SLOT, f"{name} {fmt} T={T}: a block of {block} bytes passes the shipped limit"
                yield pytest.param(name, fmt, T, id=f"{name}-{fmt}-{T}")


@pytest.fixture(scope="module")
def shipped_daemon():
    with Daemon.shipped({"tiers.hbm.capacity": "16GiB"}) as d:
        yield d


_models = {}


def make_model(name):
    if name not in _models:
        _models.clear()  # one model at a time on the GPU (the 70B-shaped one is ~23 GB)
        torch.cuda.empty_cache()
        cfg = models.config("llama", small=False, intermediate_size=256, vocab_size=512, **GEOMETRIES[name])
        torch.manual_seed(0)
        with torch.device("cuda"):
            model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16,
                                                                  attn_implementation="kvtier")
        _models[name] = model.eval()
    return _models[name]


@pytest.mark.parametrize("name,fmt,T", list(_cases()))
@torch.no_grad()
def test_readme_example_on_shipped_config(name, fmt, T, shipped_daemon):
    model = make_model(name)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 512, (1, PROMPT), generator=g).cuda()
    client = kvtier.Client(shipped_daemon.socket, name=f"{name}-{fmt}-{T}", has_gpu=True)
    try:
        contract = kt.contract_for(model, fmt, block_tokens=T)
        # Turn 1: nothing cached yet; prompt and output committed.
        with kt.prefix_cache(model, client, ids, max_new_tokens=NEW, kv_format=fmt, block_tokens=T) as cache:
            assert cache.cached_tokens[0] == 0, f"{name} {fmt} T={T}: a hit on a new prompt"
            out = model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=cache,
                                 max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
            committed = cache.commit(out)
        # The cache wrote the K/V of the prompt and of every output token but the last.
        assert committed == (PROMPT + NEW - 1) // T, f"{name} {fmt} T={T}: committed {committed}"
        # Turn 2: the conversation so far and a new message.
        ids2 = torch.cat([out, torch.randint(3, 512, (1, MORE), generator=g).cuda()], 1)
        with kt.prefix_cache(model, client, ids2, max_new_tokens=NEW, kv_format=fmt, block_tokens=T) as cache:
            assert cache.cached_tokens[0] == committed * T, \
                f"{name} {fmt} T={T}: restored {cache.cached_tokens[0]} of {committed * T} committed tokens"
            tiers = set(cache.hit_tiers[0])
            assert tiers and tiers <= {"hbm", "host", "nvme"}, cache.hit_tiers
            out2 = model.generate(ids2, attention_mask=torch.ones_like(ids2), past_key_values=cache,
                                  max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False)
        assert out2.shape[1] == ids2.shape[1] + NEW
        print(f"{name} {fmt:5s} T={T:2d}: block {contract.block_bytes()} B, {committed} blocks committed, "
              f"turn 2 restored {committed * T} tokens from {sorted(tiers)}")
    finally:
        client.close()
