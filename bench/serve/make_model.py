"""Writes a random-weight Llama and a local tokenizer into a folder, for the serving
benchmark (nothing is downloaded; no model hub is reached).

    python bench/serve/make_model.py OUT_DIR [--size tiny|wide] [--layers N --hidden N ...]

Sizes (--size; each field can be overridden by its flag):

  tiny  2 layers, hidden 256, 4 query heads over 2 KV heads of head_dim 64,
        intermediate 512: the vLLM tests' model (tests/vllm/make_model.py), 1 KiB of KV
        per token (BF16). A 4,000-token prefill on vLLM's CPU backend (which computes on
        one core of two and keeps the other for itself) took a median 2.7 s on the 2-core
        development machine under a load average of 5 to 6 (bench/serve/prefill_time.py),
        0.97 s in an earlier run (bench/README.md "vllm"). The benchmark's model: the
        closest to a second per 4,000 tokens that runs here.
  wide  4 layers, hidden 512, 8 query heads over 4 KV heads of head_dim 64,
        intermediate 1,536 (4 KiB of KV per token): 24.3 s for the same prefill on the same
        machine, too slow here; for machines with more cores.

The tokenizer is a byte-level BPE trained on a fixed text and padded with added tokens up
to the vocabulary (default 512), so every id the model can emit decodes. Weights are drawn
with initializer_range 0.25: a random model's logits are then far apart and greedy outputs
do not flip on rounding noise. The same arguments write the same files, byte for byte.
Prints the folder, then one JSON line with the geometry (the runner reads it).
"""
import argparse
import json
import os

SIZES = {
    "tiny": dict(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, intermediate=512),
    "wide": dict(layers=4, hidden=512, heads=8, kv_heads=4, head_dim=64, intermediate=1536),
}

_TEXT = """The quick brown fox jumps over the lazy dog. A tiered cache keeps the keys and values of
attention for prompts that come back: system prompts, documents, conversations, tools. Blocks
move between device memory, host memory, solid state drives and a remote store. Each block is
named by the tokens before it, so the same prefix finds the same blocks in every engine.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000; punctuation , . ; : ! ? ( ) [ ] { } - + = / * & % $ #.
"""


def make_tokenizer(out, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=min(vocab, 512) - 2, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_TEXT] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.add_tokens([f"<x{i}>" for i in range(vocab - len(fast))])
    assert len(fast) == vocab, len(fast)
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)
    return fast


def geometry(size="tiny", **over):
    g = dict(SIZES[size])
    g.update({k: v for k, v in over.items() if v is not None})
    return g


def kv_bytes_per_token(g, dtype_bytes=2):
    """Bytes of K and V per token over all layers (BF16 by default)."""
    return g["layers"] * 2 * g["kv_heads"] * g["head_dim"] * dtype_bytes


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--size", default="tiny", choices=sorted(SIZES))
    for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "intermediate"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=None)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--positions", type=int, default=8192)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    g = geometry(a.size, **{k: getattr(a, k) for k in ("layers", "hidden", "heads", "kv_heads", "head_dim",
                                                      "intermediate")})
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    os.makedirs(a.out, exist_ok=True)
    fast = make_tokenizer(a.out, a.vocab)
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=g["hidden"], intermediate_size=g["intermediate"],
                      num_hidden_layers=g["layers"], num_attention_heads=g["heads"],
                      num_key_value_heads=g["kv_heads"], head_dim=g["head_dim"],
                      max_position_embeddings=a.positions, initializer_range=0.25, tie_word_embeddings=False,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out)
    print(a.out)
    print(json.dumps(dict(g, vocab=a.vocab, positions=a.positions, kv_bytes_per_token=kv_bytes_per_token(g))))


if __name__ == "__main__":
    main()
