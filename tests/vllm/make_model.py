"""Writes a tiny random-weight Llama and a local tokenizer into a folder, for vLLM tests
and benchmarks that must not reach a model hub.

    python make_model.py OUT_DIR [--seed 0] [--layers 2]

The model: 2 layers, hidden 256, 4 query heads of head_dim 64 over 2 KV heads (GQA 2),
vocabulary 512, bf16, 2,048 positions. The tokenizer: a byte-level BPE trained on a fixed
text (so it is the same on every machine), saved as a PreTrainedTokenizerFast. Weights are
drawn with initializer_range 0.25 (not the usual 0.02): a random model's next-token
logits are then far apart, so greedy outputs do not flip on rounding noise between runs.
The same seed writes the same files, byte for byte."""
import argparse
import os

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

VOCAB = 512
_TEXT = """The quick brown fox jumps over the lazy dog. A tiered cache keeps the keys and values of
attention for prompts that come back: system prompts, documents, conversations, tools. Blocks
move between device memory, host memory, solid state drives and a remote store. Each block is
named by the tokens before it, so the same prefix finds the same blocks in every engine.
Numbers 0 1 2 3 4 5 6 7 8 9 10 100 1000; punctuation , . ; : ! ? ( ) [ ] { } - + = / * & % $ #.
"""


def make_tokenizer(out):
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 2, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([_TEXT] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    # Every id the model can emit is a token: the vocabulary is filled up to VOCAB.
    fast.add_tokens([f"<x{i}>" for i in range(VOCAB - len(fast))])
    assert len(fast) == VOCAB, len(fast)
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    fast.save_pretrained(out)
    return fast


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--positions", type=int, default=2048)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    fast = make_tokenizer(a.out)
    torch.manual_seed(a.seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=a.layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                      max_position_embeddings=a.positions, initializer_range=0.25, tie_word_embeddings=False,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, dtype="bfloat16")
    model = LlamaForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(a.out)
    print(a.out)


if __name__ == "__main__":
    main()
