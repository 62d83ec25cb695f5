#!/usr/bin/env python3
"""What a KV cache format costs a trained model: perplexity on held-out text with kvtier's
NVFP4 (max6 and 4over6), FP8 and BF16 caches, and each cache's KL divergence and top-1
agreement against the BF16 cache, position by position.

Each sequence is prefilled for `--context` bytes, then teacher-forced one byte at a time
for `--steps` decode steps; every decode step reads all earlier K/V from the cache's
pages (so the score measures the cache), and the scored positions are the decode steps.

    python3 examples/transformers/train_bytes.py --out /tmp/bytes-llama --seconds 240
    python3 examples/transformers/quality.py --model /tmp/bytes-llama
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402
import models  # noqa: E402

CACHES = (("bf16", "max6"), ("fp8", "max6"), ("nvfp4", "max6"), ("nvfp4", "4over6"))


def held_out_batch(batch: int, length: int, seed: int = 1) -> torch.Tensor:
    from train_bytes import corpus
    data = corpus("test", max_bytes=8 << 20)
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, len(data) - length - 1, batch)
    return torch.from_numpy(np.stack([data[s:s + length + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def teacher_forced_logprobs(model, client, ids: torch.Tensor, context: int, kv_format: str, rule: str,
                            calib: torch.Tensor) -> torch.Tensor:
    """log-probabilities [B, steps, vocab] of positions context..end-1, each from a decode
    step over the cache."""
    ks, vs = kt.calibrate(model, kv_format, input_ids=calib)
    contract = kt.contract_for(model, kv_format, 16, rule, ks, vs)
    ids = ids.cuda()
    B, total = ids.shape
    steps = total - 1 - context
    cache = kt.prefix_cache(model, client, ids[:, :context], max_new_tokens=steps + 1, contract=contract)
    try:
        out = []
        logits = model(input_ids=ids[:, :context], past_key_values=cache, use_cache=True,
                       logits_to_keep=1).logits[:, -1]
        out.append(torch.log_softmax(logits.float(), -1))
        for i in range(context, context + steps - 1):
            logits = model(input_ids=ids[:, i:i + 1], position_ids=torch.full((B, 1), i, device="cuda"),
                           past_key_values=cache, use_cache=True).logits[:, -1]
            out.append(torch.log_softmax(logits.float(), -1))
        return torch.stack(out, 1)
    finally:
        cache.release()


def evaluate(model_path: str, batch: int = 8, context: int = 512, steps: int = 512, seed: int = 1,
             caches=CACHES) -> dict:
    model = kt.use_kvtier(models.load(model_path))
    ids = held_out_batch(batch, context + steps, seed)
    calib = held_out_batch(1, 2048, seed + 100)[:, :2048]
    targets = ids[:, context + 1:context + steps].cuda()     # the bytes each decode step predicts
    res = {}
    with Daemon.shipped({"tiers.hbm.capacity": "4GiB", "tiers.host.capacity": "1GiB", "tiers.nvme.capacity": "1GiB"}) as d:
        client = kvtier.Client(d.socket, name="quality", has_gpu=True)
        lp = {}
        for fmt, rule in caches:
            name = fmt if fmt != "nvfp4" else f"nvfp4-{rule}"
            lp[name] = teacher_forced_logprobs(model, client, ids, context, fmt, rule, calib)[:, 1:]
        client.close()
    ref = lp["bf16"]
    for name, x in lp.items():
        nll = -x.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        kl = (ref.exp() * (ref - x)).sum(-1)
        res[name] = {"ppl": math.exp(float(nll.mean())), "bits_per_byte": float(nll.mean()) / math.log(2),
                     "kl_vs_bf16": float(kl.mean()),
                     "top1_vs_bf16": float((x.argmax(-1) == ref.argmax(-1)).float().mean())}
    base = res["bf16"]["ppl"]
    for name in res:
        res[name]["ppl_vs_bf16"] = res[name]["ppl"] / base - 1
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a folder written by train_bytes.py")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=512)
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run: a 2-layer byte model trained for 30 steps into a temp folder, 2 "
                         "sequences of 64 + 32 bytes, every cache; exits 1 unless every score is finite and the "
                         "BF16 cache scores itself exactly")
    a = ap.parse_args(argv)
    if a.smoke:
        import tempfile
        import train_bytes
        if not a.model:
            smoke_dir = tempfile.TemporaryDirectory(prefix="kvtier-quality-smoke-")  # removed at exit
            a.model = smoke_dir.name
            train_bytes.train(a.model, seconds=0, steps=30, batch=8, seq=128, layers=2, log_every=1e9)
        a.batch, a.context, a.steps = 2, 64, 32
    elif not a.model:
        ap.error("--model is required (or --smoke)")
    res = evaluate(a.model, a.batch, a.context, a.steps)
    print(f"| cache | perplexity | vs BF16 | KL vs BF16 (nats) | top-1 vs BF16 |")
    print(f"|---|---|---|---|---|")
    for name, r in res.items():
        print(f"| {name} | {r['ppl']:.4f} | {100 * r['ppl_vs_bf16']:+.2f}% | {r['kl_vs_bf16']:.5f} | "
              f"{100 * r['top1_vs_bf16']:.2f}% |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.smoke:
        finite = all(math.isfinite(v) for r in res.values() for v in r.values())
        exact = res["bf16"]["kl_vs_bf16"] == 0.0 and res["bf16"]["top1_vs_bf16"] == 1.0
        if not (finite and exact and set(res) == {"bf16", "fp8", "nvfp4-max6", "nvfp4-4over6"}):
            print(f"--smoke: failed (finite {finite}, bf16 exact {exact}, caches {sorted(res)})")
            return 1
        print("--smoke: every cache scored")
    return 0


if __name__ == "__main__":
    sys.exit(main())
