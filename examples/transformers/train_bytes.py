#!/usr/bin/env python3
"""Trains a small byte-level Llama on the Python sources of this machine and saves it with
save_pretrained: a model with real attention patterns and outlier channels, for measuring
what a 4-bit or 8-bit KV cache costs in quality (quality.py).

The corpus is every .py file under the running Python's standard library and
site-packages, in sorted order; a file goes to the held-out split when the SHA-1 of its
path is 0 mod 10, so training never sees the evaluation text.

    python3 examples/transformers/train_bytes.py --out /tmp/bytes-llama --seconds 240
"""
import argparse
import glob
import hashlib
import json
import math
import os
import sys
import sysconfig
import time

import numpy as np
import torch


def corpus(split: str, max_bytes: int = 64 << 20) -> np.ndarray:
    """Bytes of the 'train' or 'test' split as uint8 (files joined by a NUL byte)."""
    roots = sorted({sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]})
    files = sorted(set(f for r in roots for f in glob.glob(os.path.join(r, "**", "*.py"), recursive=True)))
    out, n = [], 0
    for f in files:
        held_out = int(hashlib.sha1(os.path.relpath(f, "/").encode()).hexdigest(), 16) % 10 == 0
        if held_out != (split == "test"):
            continue
        try:
            with open(f, "rb") as fh:
                b = fh.read()
        except OSError:
            continue
        out.append(b + b"\0")
        n += len(b) + 1
        if n >= max_bytes:
            break
    if not out:
        raise SystemExit(f"no Python sources found under {roots}")
    return np.frombuffer(b"".join(out)[:max_bytes], dtype=np.uint8)


def model_config(layers=8, hidden=512, heads=8, kv_heads=2, intermediate=1536, max_pos=4096):
    """A Llama config of ~24M parameters: byte vocabulary, GQA 4, head_dim 64."""
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
                       num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                       max_position_embeddings=max_pos, rope_theta=10000.0, rms_norm_eps=1e-5,
                       bos_token_id=None, eos_token_id=None, pad_token_id=0, tie_word_embeddings=False)


def train(out: str, seconds: float, seed: int = 0, batch: int = 64, seq: int = 512, lr: float = 2e-3,
          log_every: float = 15.0, steps: int | None = None, **cfg_kw) -> dict:
    """Trains for `seconds` of wall time, or for exactly `steps` steps when given (the
    same model for the same seed on any machine, whatever its speed)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    data = torch.from_numpy(corpus("train").astype(np.int64)).cuda()
    cfg = model_config(**cfg_kw)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="sdpa")
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    g = torch.Generator(device="cuda").manual_seed(seed)
    t0 = time.perf_counter()
    step, last_log, loss_v = 0, t0, float("nan")
    warm = 100
    while True:
        el = time.perf_counter() - t0
        if (step >= steps) if steps is not None else (el >= seconds):
            break
        frac = step / steps if steps is not None else el / seconds
        for pg in opt.param_groups:
            pg["lr"] = lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        idx = torch.randint(0, data.numel() - seq - 1, (batch,), device="cuda", generator=g)
        x = torch.stack([data[i:i + seq + 1] for i in idx.tolist()])
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, 256), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if time.perf_counter() - last_log >= log_every:
            loss_v = float(loss)
            print(f"train: step {step}, {el:.0f} s, loss {loss_v:.3f} nats/byte", flush=True)
            last_log = time.perf_counter()
    loss_v = float(loss)
    model = model.to(torch.bfloat16)
    model.save_pretrained(out)
    info = {"params": params, "steps": step, "seconds": round(time.perf_counter() - t0, 1),
            "final_train_loss": round(loss_v, 4), "batch": batch, "seq": seq, "seed": seed}
    with open(os.path.join(out, "training.json"), "w") as f:
        json.dump(info, f, indent=1)
    print(f"train: {params / 1e6:.1f}M parameters, {step} steps in {info['seconds']} s, loss {loss_v:.3f}; "
          f"saved to {out}", flush=True)
    return info


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seconds", type=float, default=240)
    ap.add_argument("--steps", type=int, default=None, help="train this many steps instead of --seconds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=8)
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("train_bytes: needs a CUDA device")
    train(a.out, a.seconds, a.seed, layers=a.layers, steps=a.steps)


if __name__ == "__main__":
    main()
