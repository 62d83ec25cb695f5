#!/usr/bin/env python3
"""A small PyTorch inference engine that keeps its KV cache in kvtier.

It is written against libkvtier's Python package the way a vLLM or SGLang connector
would use it:

  turn = tokens -> key chain -> lookup -> acquire the cached prefix into HBM (kvtierd
  promotes it from host or NVMe if needed) -> alloc HBM slots for the rest -> prefill
  only the new tokens (attention over the dequantized prefix + the new K/V) while
  quantize_append writes the new K/V into the slots -> decode every further token with
  kvtier's fused paged decode over the block table -> commit the full blocks -> release.

The KV cache is NVFP4 by default (kvtier's kernels); FP8 and BF16 caches of the same
engine run through the same daemon and the same decode kernel for comparison. Nothing
falls back silently: a step that cannot run on the GPU in the chosen format stops the
run with a message that names it (EngineError).

Usage (a GPU machine, a built tree):
  python3 examples/torch_engine/engine.py --spawn --prompt-tokens 8192 --turns 2 \
      --evict-between-turns host
  python3 examples/torch_engine/engine.py --socket ./kvtier-data/kvtierd.sock ...
"""
import argparse
import hashlib
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "client", "python"))
sys.path.insert(0, HERE)

import kvtier  # noqa: E402
from kvtier import kernels  # noqa: E402
from model import Llama, ModelConfig, attention_prefill  # noqa: E402
import daemon as daemon_mod  # noqa: E402


class EngineError(RuntimeError):
    """A step would have run in another format, on the CPU, or not at all."""


class _CudaBytes:
    """A raw device allocation seen by torch (the IPC-mapped HBM arena)."""

    def __init__(self, ptr, nbytes):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def now():
    torch.cuda.synchronize()
    return time.perf_counter()


@dataclass
class TurnResult:
    tokens: List[int]                 # generated tokens
    logits: List[torch.Tensor]        # logits (float32, vocab) of every generated position
    hit_blocks: int = 0
    tiers: List[str] = field(default_factory=list)   # where each hit block was (acquire's from_tiers)
    ttft_s: float = 0.0               # request start -> first token on the host
    restore_s: float = 0.0            # the acquire: one round trip that finds and promotes into HBM
    prefill_s: float = 0.0
    decode_s: float = 0.0
    prefill_tokens: int = 0
    committed_blocks: int = 0


class KvtierEngine:
    def __init__(self, model: Llama, client: kvtier.Client, kv_format="nvfp4", block_tokens=16,
                 k_scales=None, v_scales=None, scale_rule="max6", model_id=None):
        if not torch.cuda.is_available():
            raise EngineError("no CUDA device: kvtier's decode would have to run on the CPU; refusing")
        self.model, self.client = model, client
        c = model.cfg
        self.fmt = kernels.FORMAT_BY_NAME[kv_format]
        self.kv_format = kv_format
        self.T = block_tokens
        self.rule = {"max6": kernels.MAX6, "4over6": kernels.FOUR_OVER_SIX}[scale_rule]
        if self.fmt == kernels.BF16:
            k_scales = v_scales = [1.0] * c.layers
        if k_scales is None or v_scales is None:
            raise EngineError(f"{kv_format} cache needs per-layer K/V scales (calibrate first)")
        self.k_scales, self.v_scales = [float(x) for x in k_scales], [float(x) for x in v_scales]
        self.contract = kvtier.Contract(
            model_id=model_id or f"kvtier-example/llama-{c.layers}L-{c.hidden}h",
            model_revision=model_revision(c, model.checkpoint), tokenizer_revision="synthetic-ids",
            num_layers=c.layers, num_kv_heads=c.kv_heads, head_dim=c.head_dim, block_tokens=block_tokens,
            kv_format=kv_format, scale_rule=scale_rule, k_scales=self.k_scales, v_scales=self.v_scales)
        self.cid = client.register_contract(self.contract)
        self.block_bytes = self.contract.block_bytes()
        hbm = [s for s in client.stats() if s.tier == "hbm"]
        if not hbm or not hbm[0].present or hbm[0].slots_total == 0:
            raise EngineError("kvtierd has no HBM tier: the decode would have to read another tier; refusing")
        self.num_slots = hbm[0].slots_total
        base = client.hbm_device_ptr()  # cudaIpcOpenMemHandle of the daemon's arena
        sb = client.slot_bytes
        self.pool = kernels.Pool(base, sb, self.num_slots, c.layers, c.kv_heads, c.head_dim, block_tokens, self.fmt)
        kernels.check_pool(self.pool)
        self.arena = torch.as_tensor(_CudaBytes(base, sb * self.num_slots), device="cuda")
        self.page_bytes = kernels.page_bytes(self.fmt, c.kv_heads, c.head_dim, block_tokens)
        self.sm_scale = 1.0 / math.sqrt(c.head_dim)
        self._decoders = {}

    # ---- page writes ---------------------------------------------------------------------
    def _side_view(self, layer, side, dtype, elem):
        """[num_slots, H, T, D] view of one side (K 0 / V 1) of one layer's pages (FP8/BF16)."""
        c = self.model.cfg
        vals = c.kv_heads * self.T * c.head_dim
        off = layer * self.page_bytes + side * vals * elem
        sb = self.pool.slot_bytes
        return self.arena.view(dtype).as_strided((self.num_slots, c.kv_heads, self.T, c.head_dim),
                                                 (sb // elem, self.T * c.head_dim, c.head_dim, 1), off // elem)

    def write_kv(self, layer, k, v, slot_ids, offs):
        if self.fmt == kernels.NVFP4:
            kernels.quantize_append(self.pool, k, v, slot_ids, offs, layer, self.k_scales[layer],
                                    self.v_scales[layer], self.rule)
        elif self.fmt == kernels.BF16:
            self._side_view(layer, 0, torch.bfloat16, 2)[slot_ids.long(), :, offs.long(), :] = k.to(torch.bfloat16)
            self._side_view(layer, 1, torch.bfloat16, 2)[slot_ids.long(), :, offs.long(), :] = v.to(torch.bfloat16)
        else:  # FP8 E4M3 with the layer's per-tensor scale (saturating, round to nearest even)
            for side, x, s in ((0, k, self.k_scales[layer]), (1, v, self.v_scales[layer])):
                q = (x.float() / s).clamp(-kernels.E4M3_MAX, kernels.E4M3_MAX).to(torch.float8_e4m3fn)
                self._side_view(layer, side, torch.uint8, 1)[slot_ids.long(), :, offs.long(), :] = q.view(torch.uint8)

    def read_kv(self, layer, slot_ids, offs):
        """Dequantized BF16 K and V [n, H, D] of the given token positions (kvt_dequantize_pages)."""
        c = self.model.cfg
        n = slot_ids.shape[0]
        k = torch.empty(n, c.kv_heads, c.head_dim, dtype=torch.bfloat16, device="cuda")
        v = torch.empty_like(k)
        kernels.dequantize_pages(self.pool, k, slot_ids, offs, layer, 0, self.k_scales[layer])
        kernels.dequantize_pages(self.pool, v, slot_ids, offs, layer, 1, self.v_scales[layer])
        return k, v

    def decoder(self, max_blocks):
        d = self._decoders.get(max_blocks)
        if d is None:
            d = kernels.Decoder(self.pool, 1, self.model.cfg.heads, max_blocks, self.sm_scale)
            self._decoders[max_blocks] = d
        return d

    def probe(self, tokens):
        """The daemon's view of a request's cached prefix before the request runs, for
        reports: (LookupResult over the usable prefix or None, seconds the lookup took).
        run_turn does not call it: its restore is a single acquire."""
        tokens = np.asarray(tokens, dtype=np.uint32)
        usable = (len(tokens) - 1) // self.T
        if usable == 0:
            return None, 0.0
        keys = kvtier.key_chain_array(self.cid, tokens, self.T)
        t = time.perf_counter()
        lk = self.client.lookup(self.cid, keys[:usable])
        return lk, time.perf_counter() - t

    # ---- one turn --------------------------------------------------------------------------
    def run_turn(self, tokens, max_new=16, use_cache=True, commit=True, forced=None) -> TurnResult:
        """Runs one request: tokens (the whole conversation so far, np.uint32) -> max_new
        greedy tokens (or `forced` tokens, teacher forcing, for comparisons)."""
        m, c, T = self.model, self.model.cfg, self.T
        tokens = np.asarray(tokens, dtype=np.uint32)
        n_prompt = len(tokens)
        res = TurnResult([], [])
        t0 = now()
        keys = kvtier.key_chain_array(self.cid, tokens, T)
        # The restore is one acquire of the usable prefix: the daemon finds the cached prefix,
        # promotes it into HBM and says where each block was (from_tiers). No lookup round
        # trip first (that was 0.1-0.5 ms of the restore; probe() still asks, for reports).
        t_restore = time.perf_counter()
        acq = None
        hit = 0
        hit_ids = np.zeros(0, np.int32)
        usable = (n_prompt - 1) // T  # the last prompt token is always computed (its logits)
        if use_cache and usable:
            acq = self.client.acquire(self.cid, keys[:usable], tier="hbm")
            hit_ids = acq.slot_ids()
            hit = len(hit_ids)
            if hit == 0:
                acq = None  # nothing cached: no lease was made
            else:
                res.tiers = acq.from_tier_names()
                bad = int((acq.tiers() != kvtier.TIER_HBM).sum())
                if bad:
                    self.client.release(acq)
                    raise EngineError(f"acquire returned {bad} slots outside HBM: decode needs HBM slots")
        res.hit_blocks = hit
        res.restore_s = time.perf_counter() - t_restore
        P = hit * T
        total_blocks = -(-(n_prompt + max_new) // T)
        alloc = self.client.alloc(self.cid, total_blocks - hit, tier="hbm")
        table = np.concatenate([hit_ids, alloc.slot_ids()]).astype(np.int32)
        table_dev = torch.from_numpy(table).to("cuda")
        try:
            # Prefill of the new tokens.
            t1 = time.perf_counter()
            pos = torch.arange(P, n_prompt, device="cuda", dtype=torch.int64)
            new_slots, new_offs = table_dev[pos // T].contiguous(), (pos % T).to(torch.int32).contiguous()
            if P:
                ppos = torch.arange(0, P, device="cuda", dtype=torch.int64)
                pre_slots, pre_offs = table_dev[ppos // T].contiguous(), (ppos % T).to(torch.int32).contiguous()
            h = m.embed[torch.from_numpy(tokens[P:].astype(np.int64)).to("cuda")]
            for li in range(c.layers):
                q, k, v = m.qkv(li, h, pos)
                self.write_kv(li, k, v, new_slots, new_offs)
                if P:
                    kp, vp = self.read_kv(li, pre_slots, pre_offs)
                    k, v = torch.cat([kp, k]), torch.cat([vp, v])
                h = m.finish_layer(li, h, attention_prefill(q, k, v, P, self.sm_scale))
            logits = m.logits(h[-1:])[0]
            first = int(forced[0]) if forced is not None else int(torch.argmax(logits).item())
            t2 = time.perf_counter()
            res.ttft_s, res.prefill_s, res.prefill_tokens = t2 - t0, t2 - t1, n_prompt - P
            res.tokens.append(first)
            res.logits.append(logits)
            # Decode: one token at a time through kvtier's fused paged decode.
            dec = self.decoder(len(table))
            seq = torch.zeros(1, dtype=torch.int32, device="cuda")
            out = torch.empty(1, c.heads, c.head_dim, dtype=torch.bfloat16, device="cuda")
            cur = first
            for i in range(1, max_new):
                p = n_prompt + i - 1
                pos1 = torch.tensor([p], device="cuda", dtype=torch.int64)
                slot1 = table_dev[p // T:p // T + 1]
                off1 = torch.tensor([p % T], device="cuda", dtype=torch.int32)
                seq.fill_(p + 1)
                h = m.embed[torch.tensor([cur], device="cuda")]
                for li in range(c.layers):
                    q, k, v = m.qkv(li, h, pos1)
                    self.write_kv(li, k, v, slot1, off1)
                    dec(q, out, table_dev, seq, li, self.k_scales[li], self.v_scales[li])
                    h = m.finish_layer(li, h, out)
                logits = m.logits(h)[0]
                cur = int(forced[i]) if forced is not None else int(torch.argmax(logits).item())
                res.tokens.append(cur)
                res.logits.append(logits)
            torch.cuda.synchronize()
            res.decode_s = time.perf_counter() - t2
            if commit:
                # K/V exist for the prompt and every generated token but the last.
                kv_tokens = np.concatenate([tokens, np.asarray(res.tokens[:-1], dtype=np.uint32)])
                all_keys = kvtier.key_chain_array(self.cid, kv_tokens, T)
                items = []
                for b in range(hit, len(all_keys)):
                    items.append((alloc.slots[b - hit], all_keys[b], all_keys[b - 1] if b > 0 else None))
                if items:
                    res.committed_blocks = self.client.commit(self.cid, alloc, items)
        finally:
            self.client.release(alloc)
            if acq is not None:
                self.client.release(acq)
        return res

    # ---- checks ----------------------------------------------------------------------------
    def decode_reference_error(self, tokens, layer=0, seed=0):
        """Relative L2 error of kvtier's decode (one random query) against a float64
        attention over the dequantized cache of `tokens`' cached prefix."""
        c, T = self.model.cfg, self.T
        keys = kvtier.key_chain_array(self.cid, np.asarray(tokens, dtype=np.uint32), T)
        acq = self.client.acquire(self.cid, keys, tier="hbm")
        try:
            n = len(acq.slot_ids()) * T
            if n == 0:
                raise EngineError("nothing cached to check")
            table = torch.from_numpy(acq.slot_ids()).to("cuda")
            g = torch.Generator(device="cuda")
            g.manual_seed(seed)
            q = torch.randn(1, c.heads, c.head_dim, generator=g, device="cuda").to(torch.bfloat16)
            out = torch.empty_like(q)
            seq = torch.tensor([n], dtype=torch.int32, device="cuda")
            self.decoder(n // T)(q, out, table, seq, layer, self.k_scales[layer], self.v_scales[layer])
            pos = torch.arange(n, device="cuda")
            k, v = self.read_kv(layer, table[pos // T].contiguous(), (pos % T).to(torch.int32).contiguous())
            rep = c.heads // c.kv_heads
            kk = k.double().repeat_interleave(rep, dim=1)  # [n, Hq, D]
            vv = v.double().repeat_interleave(rep, dim=1)
            s = torch.einsum("hd,nhd->hn", q[0].double(), kk) * self.sm_scale
            ref = torch.einsum("hn,nhd->hd", torch.softmax(s, dim=-1), vv)
            return float(torch.linalg.norm(out[0].double() - ref) / torch.linalg.norm(ref))
        finally:
            self.client.release(acq)


def model_revision(cfg: ModelConfig, checkpoint=None):
    """Weights identity for the contract: the seed and shape, or the checkpoint's hash."""
    if checkpoint:
        h = hashlib.sha256()
        with open(checkpoint, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 24), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()[:32]
    return "random-seed{seed}-{layers}x{hidden}-{heads}q{kv_heads}kv{head_dim}-ff{intermediate}-v{vocab}".format(
        **cfg.as_dict())


def calibrate(model: Llama, kv_format: str, tokens=2048, seed=7, margin=2.0):
    """Per-layer global scales from a deterministic calibration prompt: the same model
    gives the same scales, hence the same contract id, in every process."""
    c = model.cfg
    if kv_format == "bf16":
        return [1.0] * c.layers, [1.0] * c.layers
    rng = np.random.default_rng(seed)
    ids = torch.from_numpy(rng.integers(0, c.vocab, tokens).astype(np.int64)).to("cuda")
    kamax, vamax = [0.0] * c.layers, [0.0] * c.layers
    with torch.no_grad():
        h = model.embed[ids]
        pos = torch.arange(tokens, device="cuda")
        for li in range(c.layers):
            q, k, v = model.qkv(li, h, pos)
            kamax[li] = float(k.float().abs().max())
            vamax[li] = float(v.float().abs().max())
            h = model.finish_layer(li, h, attention_prefill(q, k, v, 0, 1.0 / math.sqrt(c.head_dim)))
    top = kernels.E4M3_MAX * (kernels.E2M1_MAX if kv_format == "nvfp4" else 1.0)
    to32 = lambda x: float(np.float32(x))  # noqa: E731  the contract stores float32
    return [to32(a * margin / top) for a in kamax], [to32(a * margin / top) for a in vamax]


def synthetic_prompt(n, vocab, seed):
    return np.random.default_rng(seed).integers(0, vocab, n).astype(np.uint32)


def add_model_args(ap):
    d = ModelConfig()
    ap.add_argument("--layers", type=int, default=d.layers)
    ap.add_argument("--hidden", type=int, default=d.hidden)
    ap.add_argument("--heads", type=int, default=d.heads)
    ap.add_argument("--kv-heads", type=int, default=d.kv_heads)
    ap.add_argument("--head-dim", type=int, default=d.head_dim)
    ap.add_argument("--intermediate", type=int, default=d.intermediate)
    ap.add_argument("--vocab", type=int, default=d.vocab)
    ap.add_argument("--seed", type=int, default=d.seed, help="weights seed (no checkpoint)")
    ap.add_argument("--checkpoint", default=None, help="safetensors file with Llama tensor names")


def model_from_args(a):
    cfg = ModelConfig(layers=a.layers, hidden=a.hidden, heads=a.heads, kv_heads=a.kv_heads, head_dim=a.head_dim,
                      intermediate=a.intermediate, vocab=a.vocab, seed=a.seed)
    if cfg.heads % cfg.kv_heads or cfg.heads // cfg.kv_heads not in (1, 2, 4, 8):
        raise EngineError(f"--heads/--kv-heads = {cfg.heads}/{cfg.kv_heads}: kvtier's decode supports GQA groups "
                          "1, 2, 4, 8")
    return Llama(cfg, checkpoint=a.checkpoint)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--socket", help="a running kvtierd's socket")
    ap.add_argument("--spawn", action="store_true", help="start a kvtierd for this run in a temp folder")
    ap.add_argument("--hbm", default="8GiB", help="HBM tier of a spawned daemon")
    ap.add_argument("--host", default="16GiB", help="host tier of a spawned daemon")
    ap.add_argument("--nvme", default="16GiB", help="NVMe tier of a spawned daemon")
    ap.add_argument("--nvme-dir", default=None, help="NVMe folder of a spawned daemon (default: in its temp folder)")
    ap.add_argument("--format", default="nvfp4", choices=["nvfp4", "fp8", "bf16"])
    ap.add_argument("--block-tokens", type=int, default=16, choices=[16, 32, 64])
    ap.add_argument("--prompt-tokens", type=int, default=4096, help="turn 1 prompt length")
    ap.add_argument("--turn-tokens", type=int, default=256, help="new user tokens of every later turn")
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--evict-between-turns", default="none", choices=["none", "host", "nvme"],
                    help="force the session's blocks down a tier before every later turn")
    ap.add_argument("--prompt-seed", type=int, default=42)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if not (a.socket or a.spawn):
        ap.error("give --socket PATH of a running kvtierd, or --spawn")
    if not torch.cuda.is_available():
        raise SystemExit("engine: no CUDA device; kvtier's kernels need one (nothing runs on the CPU)")
    torch.manual_seed(0)
    with torch.no_grad():
        model = model_from_args(a)
        ks, vs = calibrate(model, a.format)
        d = None
        try:
            if a.spawn:
                c = model.cfg
                bb = kvtier.Contract(model_id="probe", num_layers=c.layers, num_kv_heads=c.kv_heads,
                                     head_dim=c.head_dim, block_tokens=a.block_tokens,
                                     kv_format=a.format).block_bytes()
                d = daemon_mod.Daemon(slot_bytes=bb, hbm=a.hbm, host=a.host, nvme=a.nvme, nvme_dir=a.nvme_dir)
                sock = d.socket
            else:
                sock = a.socket
            client = kvtier.Client(sock, name="torch-engine", has_gpu=True)
            eng = KvtierEngine(model, client, a.format, a.block_tokens, ks, vs,
                               model_id=None if not a.checkpoint else os.path.basename(a.checkpoint))
            conv = synthetic_prompt(a.prompt_tokens, model.cfg.vocab, a.prompt_seed)
            report = []
            for t in range(a.turns):
                if t > 0:
                    if a.evict_between_turns != "none":
                        client.flush(a.evict_between_turns)
                    conv = np.concatenate([conv, synthetic_prompt(a.turn_tokens, model.cfg.vocab, a.prompt_seed + t)])
                lk, _ = eng.probe(conv)  # the daemon's estimate, asked before the turn
                est_ms = round(lk.est_seconds_to_hbm * 1e3, 3) if lk is not None else 0.0
                r = eng.run_turn(conv, a.max_new)
                conv = np.concatenate([conv, np.asarray(r.tokens, dtype=np.uint32)])
                row = {"turn": t + 1, "prompt_tokens": int(len(conv) - len(r.tokens)), "hit_blocks": r.hit_blocks,
                       "hit_tiers": {x: r.tiers.count(x) for x in sorted(set(r.tiers))},
                       "prefill_tokens": r.prefill_tokens, "ttft_ms": round(r.ttft_s * 1e3, 3),
                       "restore_ms": round(r.restore_s * 1e3, 3), "est_restore_ms": est_ms,
                       "decode_ms_per_token": round(r.decode_s * 1e3 / max(1, len(r.tokens) - 1), 3),
                       "committed_blocks": r.committed_blocks, "tokens": r.tokens[:8]}
                report.append(row)
                if not a.json:
                    print(f"turn {row['turn']}: prompt {row['prompt_tokens']} tokens, hit {r.hit_blocks} blocks "
                          f"{row['hit_tiers']}, prefilled {r.prefill_tokens}, TTFT {row['ttft_ms']} ms "
                          f"(restore {row['restore_ms']} ms, daemon's estimate {row['est_restore_ms']} ms), "
                          f"decode {row['decode_ms_per_token']} ms/token, committed {r.committed_blocks} blocks, "
                          f"first tokens {r.tokens[:8]}")
            if a.json:
                print(json.dumps({"format": a.format, "contract": f"{eng.cid:016x}", "turns": report}, indent=2))
            client.close()
        finally:
            if d is not None:
                d.stop()


if __name__ == "__main__":
    try:
        main()
    except (EngineError, kernels.KernelError, kvtier.KvtierError) as e:
        print(f"engine: {e}", file=sys.stderr)
        sys.exit(1)
