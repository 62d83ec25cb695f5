#!/usr/bin/env python3
"""Turn-2 time to first token of a full-depth Llama-3-8B-shaped transformers model (random
bf16 weights) when the conversation's prefix is restored by kvtier from HBM, host memory
or NVMe, against transformers recomputing the whole prompt (DynamicCache, sdpa), in one run.

Each daemon runs the shipped config/kvtier.toml, with only its tiers' capacities (and
trace_copies) set. Turn 1 prefills --context tokens through an NVFP4 KvtierCache and
commits its blocks.
Turn 2 is the same conversation plus --new-tokens: kvtier's TTFT is prefix_cache (one
acquire per row: the daemon promotes the prefix into HBM) + the forward of the uncached
tail with logits_to_keep=1; the baseline is the forward of the whole prompt. Before each
kvtier repetition the prefix is flushed back down to the tier being measured.

--prefill-rules max6,4over6 also times turn 1's prefill into NVFP4 pages once per scale
rule (median of --reps after one warm-up, nothing committed), in the same daemon and run,
with transformers' own prefill (DynamicCache, sdpa) as the baseline: what each rule's
quantize_append costs a whole prefill.

    python3 examples/transformers/bench_ttft.py --context 32768 --json ttft.json
    python3 examples/transformers/bench_ttft.py --context 32768 --prefill-rules max6,4over6
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))

import kvtier  # noqa: E402
import kvtier.transformers as kt  # noqa: E402
from kvtier.daemon import Daemon  # noqa: E402
import models  # noqa: E402


def log(*a):
    print(*a, flush=True)


def timed(fn, reps):
    ts = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3, ts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=32768)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--nvme-dir", default=None, help="NVMe tier folder (default: a temp folder)")
    ap.add_argument("--formats", default="nvfp4", help="page formats of the kvtier caches (comma separated)")
    ap.add_argument("--json")
    ap.add_argument("--trace-copies", action="store_true",
                    help="the daemon logs each acquire's timeline and copy batch (daemon.trace_copies; "
                         "KVTIER_DAEMON_LOG_LEVEL=info KVTIER_DAEMON_LOG=FILE keeps the log)")
    ap.add_argument("--prefill-rules", default="",
                    help="NVFP4 scale rules (max6, 4over6; comma separated) whose turn-1 prefill is timed")
    ap.add_argument("--smoke", action="store_true",
                    help="the smallest run: a 2-layer model, 256 + 16 tokens, one repetition, every page format, "
                         "both prefill rules")
    a = ap.parse_args(argv)
    if a.smoke:
        a.context, a.new_tokens, a.reps, a.formats = 256, 16, 1, ",".join(kt.FORMATS)
        a.prefill_rules = "max6,4over6"
    formats = [f for f in a.formats.split(",") if f]
    rules = [r for r in a.prefill_rules.split(",") if r]
    for r in rules:
        if r not in ("max6", "4over6"):
            ap.error(f"--prefill-rules: {r!r} is not max6 or 4over6")
    with torch.no_grad():
        model = models.build(models.config("llama", small=a.smoke), seed=0)
        kt.use_kvtier(model)
        g = torch.Generator().manual_seed(5)
        conv1 = torch.randint(0, model.config.vocab_size, (1, a.context), generator=g).cuda()
        conv2 = torch.cat([conv1, torch.randint(0, model.config.vocab_size, (1, a.new_tokens), generator=g).cuda()], 1)
        S = conv2.shape[1]
        res = {"gpu": torch.cuda.get_device_name(), "context": a.context, "new_tokens": a.new_tokens}
        for fmt in formats:
            kvtier_ttft(model, fmt, conv1, conv2, a, res)
        if rules:
            prefill_by_rule(model, rules, conv1, a, res)
        model.set_attn_implementation("sdpa")
        ms, _ = timed(lambda: model(input_ids=conv2, use_cache=False, logits_to_keep=1), a.reps)
        res["recompute_ms"] = round(ms, 1)
        log(f"turn 2 recomputed by transformers (sdpa, {S} tokens): TTFT {ms:.1f} ms")
        if rules:
            # transformers' own turn-1 prefill (DynamicCache, sdpa), the rules' baseline
            timed(lambda: model(input_ids=conv1, use_cache=True, logits_to_keep=1), 1)
            ms, _ = timed(lambda: model(input_ids=conv1, use_cache=True, logits_to_keep=1), a.reps)
            res["prefill_dynamic_ms"] = round(ms, 1)
    log("| turn-2 prefix from | TTFT ms | speedup vs recompute |")
    log("|---|---|---|")
    log(f"| recompute (transformers, sdpa) | {res['recompute_ms']} | 1.00x |")
    for fmt in formats:
        for tier in ("hbm", "host", "nvme"):
            key = _key(fmt, tier)
            v = res[f"{key}_ms"]
            res[f"speedup_{key[len('kvtier_'):]}"] = round(res["recompute_ms"] / v, 2)
            log(f"| kvtier {fmt} {tier} | {v} | {res['recompute_ms'] / v:.2f}x |")
    if rules:
        base = res["prefill_dynamic_ms"]
        log(f"| turn-1 prefill of {a.context} tokens into | ms | vs DynamicCache (sdpa) | vs kvtier max6 |")
        log("|---|---|---|---|")
        log(f"| DynamicCache (transformers, sdpa) | {base} | 1.00x | |")
        for r in rules:
            v = res[f"prefill_{r}_ms"]
            vs6 = f"{v / res['prefill_max6_ms']:.3f}x" if "prefill_max6_ms" in res else ""
            log(f"| kvtier nvfp4 {r} | {v} | {v / base:.3f}x | {vs6} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


def _key(fmt, tier):
    """Result key of a tier's TTFT: kvtier_<tier> for NVFP4 pages (the default), else
    kvtier_<fmt>_<tier>."""
    return f"kvtier_{tier}" if fmt == "nvfp4" else f"kvtier_{fmt}_{tier}"


def _tier_gib(block_bytes, a):
    """GiB of a tier that holds the conversation's blocks (each rounded to 4 KiB), plus one."""
    blocks = a.context // a.block_tokens + 8
    return -(-blocks * ((block_bytes + 4095) // 4096 * 4096) // (1 << 30)) + 1


def prefill_by_rule(model, rules, conv1, a, res):
    """Turn 1's prefill into NVFP4 pages under each scale rule, one daemon, nothing
    committed: prefill_<rule>_ms in res (median of a.reps after one warm-up)."""
    contracts = {r: kt.contract_for(model, "nvfp4", a.block_tokens, scale_rule=r) for r in rules}
    gib = _tier_gib(max(c.block_bytes() for c in contracts.values()), a)
    with Daemon.shipped({"tiers.hbm.capacity": f"{gib}GiB", "tiers.nvme.capacity": "1GiB"}, timeout_s=300) as d:
        client = kvtier.Client(d.socket, name="bench-ttft-rules", has_gpu=True)

        def prefill(contract):
            with kt.prefix_cache(model, client, conv1, max_new_tokens=1, contract=contract) as c:
                model(input_ids=conv1, past_key_values=c, use_cache=True, logits_to_keep=1)

        for r in rules:
            timed(lambda: prefill(contracts[r]), 1)
            ms, _ = timed(lambda: prefill(contracts[r]), a.reps)
            res[f"prefill_{r}_ms"] = round(ms, 1)
            log(f"turn 1 prefill of {conv1.shape[1]} tokens into nvfp4 pages, {r}: {res[f'prefill_{r}_ms']} ms")
        client.close()


def kvtier_ttft(model, fmt, conv1, conv2, a, res):
    """Turn 1 through a `fmt` KvtierCache (committed), then turn 2's TTFT with the prefix
    restored from each tier, into res."""
    S = conv2.shape[1]
    contract = kt.contract_for(model, fmt, a.block_tokens)
    bb = contract.block_bytes()
    gib = _tier_gib(bb, a)
    res[f"{fmt}_block_bytes"] = bb
    scratch = None if a.nvme_dir else tempfile.TemporaryDirectory(prefix="kvtier-ttft-nvme-")  # removed on return
    nvme_dir = os.path.join(a.nvme_dir, fmt) if a.nvme_dir else scratch.name
    sets = {f"tiers.{t}.capacity": f"{gib}GiB" for t in ("hbm", "host", "nvme")}
    sets.update({"tiers.nvme.dir": nvme_dir, "daemon.trace_copies": "true" if a.trace_copies else "false"})
    with Daemon.shipped(sets, timeout_s=300) as d:
        client = kvtier.Client(d.socket, name="bench-ttft", has_gpu=True)
        with kt.prefix_cache(model, client, conv1, max_new_tokens=1, contract=contract) as c1:
            t0 = time.perf_counter()
            model(input_ids=conv1, past_key_values=c1, use_cache=True, logits_to_keep=1)
            torch.cuda.synchronize()
            res["turn1_prefill_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
            res["committed_blocks"] = c1.commit(conv1)
        log(f"turn 1 ({fmt}): prefilled {a.context} tokens through kvtier in {res['turn1_prefill_ms']} ms, "
            f"committed {res['committed_blocks']} blocks")

        def kvtier_turn2():
            with kt.prefix_cache(model, client, conv2, max_new_tokens=1, contract=contract) as c:
                col = c._columns
                pos = torch.arange(col, S, device="cuda").unsqueeze(0)
                model(input_ids=conv2[:, col:], position_ids=pos, past_key_values=c, use_cache=True,
                      logits_to_keep=1)
                return c.hit_tiers[0], col

        for tier in ("hbm", "host", "nvme"):
            ts = []
            for _ in range(a.reps):
                if tier != "hbm":
                    client.flush(tier)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                tiers, col = kvtier_turn2()
                torch.cuda.synchronize()
                ts.append(time.perf_counter() - t0)
                assert set(tiers) == {tier}, f"expected the prefix in {tier}, it came from {set(tiers)}"
            res[f"{_key(fmt, tier)}_ms"] = round(statistics.median(ts) * 1e3, 2)
            res["restored_tokens"] = col
            assert col > 0, f"{fmt}: turn 2 restored nothing from {tier}"
            log(f"turn 2 ({fmt}) from {tier}: TTFT {res[f'{_key(fmt, tier)}_ms']} ms ({col} tokens restored, "
                f"{S - col} computed)")
        client.close()


if __name__ == "__main__":
    main()
