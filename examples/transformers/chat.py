#!/usr/bin/env python3
"""A multi-turn conversation with a Hugging Face transformers model whose KV cache lives in
kvtier: every turn restores the conversation so far from the daemon (HBM, host or NVMe),
computes only the new tokens, generates, and commits the new blocks for the next turn (in
this process or any other).

    # a running daemon with an HBM tier, and a checkpoint folder:
    python3 examples/transformers/chat.py --socket ./kvtier-data/kvtierd.sock --model PATH
    # or everything made here (a daemon in a temp folder, a small random Llama):
    python3 examples/transformers/chat.py --spawn --demo --turns 3 --evict-between-turns nvme

Token ids stand in for text (no tokenizer is needed): each turn appends --turn-tokens
pseudo-random ids as the user's message.
"""
import argparse
import os
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402
import models  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--socket", help="a running kvtierd's socket (default: $KVTIER_SOCKET, else the shipped config's); its HBM tier must fit the model's blocks")
    ap.add_argument("--spawn", action="store_true", help="start a kvtierd in a temp folder for this run")
    ap.add_argument("--model", help="a checkpoint folder (save_pretrained layout)")
    ap.add_argument("--demo", action="store_true", help="a small random Llama written to a temp folder")
    ap.add_argument("--format", default="nvfp4", choices=kt.FORMATS)
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--turn-tokens", type=int, default=128)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--evict-between-turns", default="none", choices=["none", "host", "nvme"],
                    help="push the conversation's blocks down a tier before every later turn")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run of every page format and eviction mode (--spawn --demo, 200 + 40 tokens, "
                         "3 turns of 8 new tokens); exits 1 unless every later turn restores its conversation from "
                         "the tier it was pushed to")
    a = ap.parse_args(argv)
    if a.smoke:
        a.spawn, a.demo, a.prompt_tokens, a.turn_tokens, a.max_new, a.turns = True, True, 200, 40, 8, 3
    if not (a.socket or a.spawn) or not (a.model or a.demo):
        ap.error("give --socket or --spawn, and --model or --demo")
    demo = None if a.model else tempfile.TemporaryDirectory(prefix="demo-llama-")  # removed at exit
    path = a.model or models.save_random(models.config("llama", small=True), demo.name)
    model = kt.use_kvtier(models.load(path))
    model.generation_config.pad_token_id = 0
    runs = [(f, e) for f in kt.FORMATS for e in ("none", "host", "nvme")] if a.smoke else \
        [(a.format, a.evict_between_turns)]
    ok = True
    for fmt, evict in runs:
        if a.smoke:
            print(f"-- {fmt} pages, evict between turns: {evict}")
        ok &= conversation(model, fmt, evict, a)
    if a.smoke:
        print("--smoke: every turn restored its conversation" if ok else "--smoke: a turn missed its conversation")
    return 0 if ok else 1


def conversation(model, fmt, evict, a) -> bool:
    """Runs a.turns turns; True when every turn after the first restored the conversation
    so far (its whole blocks) from the tier it was left in."""
    contract = kt.contract_for(model, fmt)
    daemon = None
    ok = True
    if a.spawn:
        from kvtier.daemon import Daemon
        hbm, host, nvme = ("1GiB", "1GiB", "2GiB") if a.smoke else ("4GiB", "4GiB", "8GiB")
        daemon = Daemon.shipped({"tiers.hbm.capacity": hbm, "tiers.host.capacity": host, "tiers.nvme.capacity": nvme})
    try:
        from kvtier.engine import socket_path
        client = kvtier.Client(daemon.socket if daemon else socket_path(a.socket), name="chat", has_gpu=True)
        g = torch.Generator().manual_seed(0)
        vocab = model.config.vocab_size
        conv = torch.randint(1, vocab, (1, a.prompt_tokens), generator=g).cuda()
        for turn in range(1, a.turns + 1):
            if turn > 1:
                if evict != "none":
                    client.flush(evict)
                conv = torch.cat([conv, torch.randint(1, vocab, (1, a.turn_tokens), generator=g).cuda()], 1)
            t0 = time.perf_counter()
            with kt.prefix_cache(model, client, conv, max_new_tokens=a.max_new, contract=contract) as cache:
                out = model.generate(conv, attention_mask=torch.ones_like(conv), past_key_values=cache,
                                     max_new_tokens=a.max_new, do_sample=False)
                torch.cuda.synchronize()
                took = time.perf_counter() - t0
                committed = cache.commit(out)
                where = sorted(set(cache.hit_tiers[0]))
                print(f"turn {turn}: {conv.shape[1]} prompt tokens, {cache.cached_tokens[0]} restored from "
                      f"{where or 'nowhere'}, {conv.shape[1] - cache.cached_tokens[0]} computed, {a.max_new} "
                      f"generated in {took * 1e3:.0f} ms, {committed} blocks committed")
                if turn > 1:
                    # Everything but the last token of the conversation so far, in whole blocks.
                    want = (conv.shape[1] - a.turn_tokens - 1) // cache.T * cache.T
                    tier = "hbm" if evict == "none" else evict
                    ok &= cache.cached_tokens[0] >= want and where == [tier]
            conv = out
        client.close()
    finally:
        if daemon is not None:
            daemon.stop()
    return ok


if __name__ == "__main__":
    sys.exit(main())
