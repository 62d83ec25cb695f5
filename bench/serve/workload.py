"""Workloads for the serving benchmark: lists of requests whose prompts are token ids, with
the prefix sharing of the trace they come from, scaled to a small model's context.

Two sources:

- Mooncake FAST'25 trace lines ({"timestamp" ms, "input_length", "output_length",
  "hash_ids"}): each hash id is a block of 512 tokens in the trace; here it becomes a block
  of `block_tokens` token ids that derive from the id alone (equal ids, equal tokens, so
  two requests that share leading ids share that prefix exactly). A request's last id
  covers the remainder of input_length, scaled by block_tokens / 512. `max_prompt` cuts a
  prompt at the end (its prefix, and what it shares, is kept).
- The agentic generator's shapes (tools/replay/trace.h GenerateAgentic): shared system
  prompts, sessions whose turns append `turn_tokens` to the context, Zipf popularity over
  sessions, Poisson arrivals, a session starting again from turn 0 after `max_turns`.
  Segments' token ids derive from their names, as in tools/replay (not the same ids: this
  model's vocabulary is small).

Token ids lie in [2, vocab): 0 and 1 are the tokenizer's <s> and </s>.
"""
import json
import math
import random
from dataclasses import dataclass

MOONCAKE_BLOCK = 512
_M64 = (1 << 64) - 1


def _mix(x):
    """splitmix64's finalizer: a fixed, well-spread function of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def block_tokens_of(seed, count, vocab):
    """`count` token ids in [2, vocab) that depend only on (seed, position)."""
    return [2 + _mix((seed << 20) ^ j) % (vocab - 2) for j in range(count)]


def _name_seed(name):
    h = 1469598103934665603
    for b in name.encode():
        h = ((h ^ b) * 1099511628211) & _M64
    return h >> 20


@dataclass
class Request:
    arrival_s: float
    tokens: list
    max_tokens: int
    session: str = ""
    turn: int = 0


def load_mooncake(path, vocab, block_tokens=64, max_prompt=4096, max_output=16, requests=None, skip=0):
    out = []
    with open(path) as f:
        for i, line in enumerate(f):
            if i < skip:
                continue
            if requests is not None and len(out) >= requests:
                break
            r = json.loads(line)
            ids = r["hash_ids"]
            if not ids:
                continue
            rem = r["input_length"] - MOONCAKE_BLOCK * (len(ids) - 1)
            rem = max(1, min(block_tokens, math.ceil(rem * block_tokens / MOONCAKE_BLOCK)))
            toks = []
            for k, h in enumerate(ids):
                n = block_tokens if k < len(ids) - 1 else rem
                n = min(n, max_prompt - len(toks))
                if n <= 0:
                    break
                toks += block_tokens_of(int(h) + 1, n, vocab)
            out.append(Request(arrival_s=r["timestamp"] / 1e3, tokens=toks,
                               max_tokens=max(1, min(max_output, int(r.get("output_length") or 1))),
                               session=f"root{ids[0]}", turn=0))
    # turn = the request's place among those of its root (first hash id), in arrival order
    seen = {}
    for q in out:
        q.turn = seen.get(q.session, 0)
        seen[q.session] = q.turn + 1
    return out


@dataclass
class AgenticShape:
    """GenerateAgentic's parameters, at this benchmark's scale (tools/replay's defaults are
    2,048 / 1,024 / 384 tokens, 24 turns, 200 sessions, 4 system prompts, 20 req/s)."""
    requests: int = 200
    sessions: int = 24
    system_prompts: int = 2
    system_tokens: int = 1024
    first_turn_tokens: int = 512
    turn_tokens: int = 256
    max_turns: int = 8
    zipf_alpha: float = 1.0
    rate_per_s: float = 1.0
    output_tokens: int = 16
    seed: int = 1


def generate_agentic(s, vocab, max_prompt=None):
    rng = random.Random(s.seed)
    weights = [1.0 / (i + 1) ** s.zipf_alpha for i in range(s.sessions)]
    turn = [0] * s.sessions
    epoch = [0] * s.sessions
    t = 0.0
    out = []
    for _ in range(s.requests):
        t += rng.expovariate(s.rate_per_s)
        k = rng.choices(range(s.sessions), weights)[0]
        if turn[k] >= s.max_turns:
            turn[k] = 0
            epoch[k] += 1
        sess = f"s{k}.{epoch[k]}"
        segs = [(f"sys-{k % s.system_prompts}", s.system_tokens), (sess + "-u0", s.first_turn_tokens)]
        segs += [(f"{sess}-t{j}", s.turn_tokens) for j in range(1, turn[k] + 1)]
        toks = []
        for name, n in segs:
            toks += block_tokens_of(_name_seed(name), n, vocab)
        if max_prompt is not None:
            toks = toks[:max_prompt]
        out.append(Request(arrival_s=t, tokens=toks, max_tokens=s.output_tokens, session=sess, turn=turn[k]))
        turn[k] += 1
    return out


def working_set_tokens(reqs, page_tokens):
    """Tokens in the distinct full pages of `page_tokens` the requests' prompts hold: what a
    cache of whole prefixes must keep to hit every repeated page (a page is named by the
    prompt up to its end, as vLLM and kvtier name blocks)."""
    seen = set()
    for q in reqs:
        n = len(q.tokens) // page_tokens
        h = 0
        for i in range(n):
            h = hash((h, tuple(q.tokens[i * page_tokens:(i + 1) * page_tokens])))
            seen.add(h)
    return len(seen) * page_tokens


def total_tokens(reqs):
    return sum(len(q.tokens) for q in reqs)


def retime(reqs, rate=None, time_scale=None):
    """Arrival times: `rate` req/s, evenly spaced (a fixed rate); else the source's own
    times times `time_scale`; the first request at 0."""
    if not reqs:
        return reqs
    t0 = reqs[0].arrival_s
    for i, q in enumerate(reqs):
        if rate:
            q.arrival_s = i / rate
        else:
            q.arrival_s = (q.arrival_s - t0) * (time_scale if time_scale is not None else 1.0)
    return reqs
