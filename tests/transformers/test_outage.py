"""kvtier.transformers under the engine core's outage policy (pytest; ctest runs it on the CPU
through run_tests.py --cpu).

With kvtierd down, prefix_cache on attach()'s link gives a RecomputeCache: generate runs with
SDPA and gives exactly the output of the same model with plain SDPA and a DynamicCache (the
connector-off reference, the same batch), commit stores nothing, release is a no-op, and one
log line says the daemon is gone (not one per call). The model's attention stays kvtier's once
the link reaches a daemon again (the flag that tells prefix_cache to switch back).
"""
import logging
import os
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("transformers")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import kvtier.transformers as kt  # noqa: E402


def tiny():
    cfg = tf.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=64, vocab_size=512, max_position_embeddings=512)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, r):
        self.lines.append(r.getMessage())


def test_daemon_down_recomputes_with_sdpa():
    model = tiny()
    ids = torch.randint(2, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :5] = 0  # a left-padded row
    model.set_attn_implementation("sdpa")  # the reference: SDPA, as the recompute runs
    ref = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False,
                         past_key_values=tf.DynamicCache(config=model.config))
    kt.use_kvtier(model)
    assert model.config._attn_implementation == kt.ATTN_IMPLEMENTATION
    lines = _Lines()
    logging.getLogger("kvtier.transformers").addHandler(lines)
    none = tempfile.TemporaryDirectory(prefix="kvtier-none-")
    link = kt.attach(os.path.join(none.name, "kvtierd.sock"))
    contract = kt.contract_for(model, "bf16", 16)
    for _ in range(3):
        cache = kt.prefix_cache(model, link, ids, mask, max_new_tokens=8, contract=contract)
        assert isinstance(cache, kt.RecomputeCache) and isinstance(cache, tf.DynamicCache)
        assert cache.cached_tokens == [0, 0]
        out = model.generate(ids, attention_mask=mask, max_new_tokens=8, do_sample=False, past_key_values=cache)
        assert torch.equal(out, ref), "the recompute's output differs from plain SDPA's"
        assert cache.commit(out) == 0
        cache.release()
    gone = [ln for ln in lines.lines if "recomputes" in ln]
    assert len(gone) == 1, lines.lines
    assert model._kvtier_recomputing and model.config._attn_implementation == "sdpa"
