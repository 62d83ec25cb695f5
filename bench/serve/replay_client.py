"""Trace-driven client of an OpenAI-compatible server (vLLM's `vllm serve`): replays
multi-turn sessions with their real prefix sharing at a fixed arrival rate and measures
what a user and an operator see.

    python bench/serve/replay_client.py --url http://127.0.0.1:8000 --model tiny \\
        --workload mooncake --sample 0.1 --block-tokens 32 --max-prompt 2048 --rate 1 \\
        --watch-pid SERVER_PID --out run.json --png run.png

Requests go to /v1/completions with "stream": true and the prompt given as token ids, so
two prompts that share a prefix in the trace share exactly those tokens on the server.
The replay is open-loop: each request is sent at its arrival time (`--rate` req/s evenly
spaced, or the source's own times times `--time-scale`) whatever the server's backlog,
with at most `--max-inflight` requests open (a request held back by that cap counts its
wait in its times).

Per request: time to first token (the first streamed token), end-to-end time, prompt
and output tokens, and the prompt tokens the server did not compute
(usage.prompt_tokens_details.cached_tokens: vLLM's own prefix cache and a KV connector's
loads together; the server needs --enable-prompt-tokens-details).

Per run: requests per second (completed requests over the time from the first send to
the last completion); the deltas of vLLM's Prometheus counters over the run, where vLLM
0.32 separates its own prefix-cache hits (vllm:prefix_cache_hits) from a KV connector's
(vllm:external_prefix_cache_hits), and counts prompt tokens by where they came from
(vllm:prompt_tokens_by_source{source="local_compute"|"local_cache_hit"|
"external_kv_transfer"}), and cached tokens by the tier that supplied them
(vllm:prompt_tokens_cached_by_source{source="device"|"host"|"disk"|"p2p"|
"external_unspecified"}: vLLM's offloading connectors name their tier, other connectors
count as external_unspecified); each watched process's peak resident memory (VmHWM of the
process and of every descendant, read at the end, and the peak of their sum, polled);
bytes written to disk (kvtierd's NVMe tier counter through `kvtierctl stats`, and the
growth of any --disk-dir folder).

A progress line (requests done / total, p50 TTFT so far) is written to stderr while it
runs. Writes a JSON file and, where matplotlib imports, a PNG of the TTFT CDF.
Uses only the standard library (matplotlib for the PNG).
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import workload as W  # noqa: E402


# ---- one request ---------------------------------------------------------------------------

def stream_completion(host, port, model, req, timeout_s):
    """Sends one streamed completion; returns the request's record."""
    body = {"model": model, "prompt": req.tokens, "max_tokens": req.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    rec = {"session": req.session, "turn": req.turn, "prompt_tokens_sent": len(req.tokens),
           "max_tokens": req.max_tokens}
    t0 = time.perf_counter()
    rec["t_send"] = t0
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("POST", "/v1/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        resp = conn.getresponse()
        if resp.status != 200:
            rec["error"] = f"HTTP {resp.status}: {resp.read(2000).decode('utf-8', 'replace').strip()}"
            return rec
        first = None
        chunks = 0
        usage = None
        while True:
            line = resp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            obj = json.loads(data)
            if obj.get("error"):
                rec["error"] = json.dumps(obj["error"])[:2000]
                break
            if obj.get("choices"):
                if first is None:
                    first = time.perf_counter()
                chunks += 1
            if obj.get("usage"):
                usage = obj["usage"]
        end = time.perf_counter()
        if first is None and "error" not in rec:
            rec["error"] = "the stream ended without a token"
        rec["ttft_s"] = (first - t0) if first is not None else None
        rec["e2e_s"] = end - t0
        rec["t_end"] = end
        rec["chunks"] = chunks
        if usage:
            rec["prompt_tokens"] = usage.get("prompt_tokens")
            rec["completion_tokens"] = usage.get("completion_tokens")
            det = usage.get("prompt_tokens_details") or {}
            rec["cached_tokens"] = det.get("cached_tokens")
    except (OSError, http.client.HTTPException, ValueError) as e:
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        conn.close()
    return rec


# ---- server-side counters ------------------------------------------------------------------

# vLLM counters kept per run (deltas): prefix cache (vLLM's own), external (a KV
# connector's), prompt tokens by source, preemptions, and whatever a connector or
# offloading backend registers under vllm:*kv_offload* / *connector*.
_METRIC_RE = re.compile(r"^(vllm:[A-Za-z0-9_:]+?)(_total)?(\{[^}]*\})?\s+([-+0-9.eE]+|NaN|[-+]Inf)$")
_KEEP = re.compile(r"prefix_cache|prompt_tokens|external|offload|connector|preemption|request_success|"
                   r"generation_tokens")
_LABEL_KEEP = ("source", "finished_reason", "connector", "transfer_type", "direction")


def scrape_vllm(base):
    """{series: value} of the counters kept, summed over labels other than _LABEL_KEEP."""
    try:
        with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
            text = r.read().decode("utf-8", "replace")
    except OSError as e:
        return {"_error": f"{type(e).__name__}: {e}"}
    out = {}
    for ln in text.splitlines():
        if ln.startswith("#"):
            continue
        m = _METRIC_RE.match(ln)
        if not m or not _KEEP.search(m.group(1)):
            continue
        name = m.group(1)
        if name.endswith(("_bucket", "_created", "_count", "_sum")):  # histograms
            continue
        labels = dict(re.findall(r'(\w+)="((?:\\.|[^"\\])*)"', m.group(3) or ""))
        keep = ",".join(f"{k}={labels[k]}" for k in _LABEL_KEEP if k in labels)
        key = name + (f"{{{keep}}}" if keep else "")
        try:
            out[key] = out.get(key, 0.0) + float(m.group(4))
        except ValueError:
            pass
    return out


def delta(after, before):
    return {k: after[k] - before.get(k, 0.0) for k in sorted(after) if not k.startswith("_")
            and after[k] - before.get(k, 0.0) != 0}


def kvtier_stats(kvtierctl, socket_path):
    """{tier: {bytes_written, bytes_read, hits, ...}} from `kvtierctl stats --json`, or
    {"_error": ...}."""
    if not (kvtierctl and os.access(kvtierctl, os.X_OK)):
        return _kvtier_stats_python(socket_path, f"{kvtierctl} not found")
    try:
        p = subprocess.run([kvtierctl, "--socket", socket_path, "stats", "--json"], capture_output=True,
                           text=True, timeout=60)
        if p.returncode != 0:
            return {"_error": (p.stderr or p.stdout).strip()[-500:]}
        doc = json.loads(p.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        return {"_error": f"{type(e).__name__}: {e}"}
    tiers = doc.get("tiers", doc) if isinstance(doc, dict) else doc
    out = {}
    for t in tiers if isinstance(tiers, list) else []:
        name = t.get("tier") or t.get("name")
        if name:
            out[name] = {k: v for k, v in t.items() if isinstance(v, (int, float))}
    if not out:
        out["_raw"] = doc
    return out


def _kvtier_stats_python(socket_path, why):
    """The same counters through the kvtier Python package (where kvtierctl is missing)."""
    try:
        import dataclasses

        import kvtier
        with kvtier.Client(socket_path, name="serve-bench-stats", timeout_ms=10000) as c:
            return {s.tier: {k: v for k, v in dataclasses.asdict(s).items() if isinstance(v, (int, float))}
                    for s in c.stats() if s.present}
    except Exception as e:  # the run goes on without the daemon's counters
        return {"_error": f"{why}; kvtier.Client: {type(e).__name__}: {e}"}


def dir_bytes(path):
    """Bytes allocated on disk under `path` (st_blocks, as du counts)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total


# ---- process memory ------------------------------------------------------------------------

def _status(pid):
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for ln in f:
                k, _, v = ln.partition(":")
                if k in ("Name", "VmHWM", "VmRSS", "PPid"):
                    out[k] = v.strip()
    except OSError:
        return None
    return out


def _kib(v):
    return int(v.split()[0]) if v else 0


def descendants(root):
    """root and every process below it (by PPid, from /proc)."""
    kids = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _status(int(d))
            if s and "PPid" in s:
                kids.setdefault(int(s["PPid"]), []).append(int(d))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _pss_kib(pid):
    """Proportional set size (shared pages split among the processes mapping them)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for ln in f:
                if ln.startswith("Pss:"):
                    return int(ln.split()[1])
    except OSError:
        pass
    return 0


class MemoryWatch:
    """Polls the memory of each watched process tree every `period_s`; keeps the peak of
    each tree's RSS sum and PSS sum (PSS splits a shared page, such as kvtierd's host
    arena mapped by an engine, among the processes that map it, so sums do not count it
    twice) and, at stop(), each live process's VmHWM (its own RSS peak)."""

    def __init__(self, pids, period_s=0.5):
        self.roots = {int(p) for p in pids}
        self.period = period_s
        self.peak_tree_kib = {p: 0 for p in self.roots}
        self.peak_tree_pss_kib = {p: 0 for p in self.roots}
        self.hwm = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def start(self):
        if self.roots:
            self._t.start()
        return self

    def _sample(self, final=False):
        for r in self.roots:
            total = pss = 0
            for p in descendants(r):
                s = _status(p)
                if not s:
                    continue
                total += _kib(s.get("VmRSS"))
                pss += _pss_kib(p)
                if final or p not in self.hwm:
                    self.hwm[p] = {"root": r, "name": s.get("Name", "?"), "vm_hwm_kib": _kib(s.get("VmHWM"))}
                else:
                    self.hwm[p]["vm_hwm_kib"] = max(self.hwm[p]["vm_hwm_kib"], _kib(s.get("VmHWM")))
            self.peak_tree_kib[r] = max(self.peak_tree_kib[r], total)
            self.peak_tree_pss_kib[r] = max(self.peak_tree_pss_kib[r], pss)

    def _run(self):
        while not self._stop.wait(self.period):
            self._sample()

    def stop(self):
        self._stop.set()
        if self._t.is_alive():
            self._t.join()
        if self.roots:
            self._sample(final=True)
        return {"peak_tree_rss_mib": {str(r): round(v / 1024, 1) for r, v in self.peak_tree_kib.items()},
                "peak_tree_pss_mib": {str(r): round(v / 1024, 1) for r, v in self.peak_tree_pss_kib.items()},
                "processes": [{"pid": p, "root": v["root"], "name": v["name"],
                               "vm_hwm_mib": round(v["vm_hwm_kib"] / 1024, 1)}
                              for p, v in sorted(self.hwm.items())]}


# ---- the replay ----------------------------------------------------------------------------

def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Progress:
    def __init__(self, label, total):
        self.label, self.total = label, total
        self.tty = sys.stderr.isatty()
        self.last = 0.0

    def show(self, done, errors, ttfts, inflight, final=False):
        now = time.time()
        if not final and now - self.last < (0.5 if self.tty else 10.0):
            return
        self.last = now
        p50 = pct(ttfts, 0.5)
        line = (f"[{self.label}] {done}/{self.total} done, {inflight} in flight, {errors} errors, "
                f"p50 TTFT {p50 * 1e3:.0f} ms" if p50 is not None else
                f"[{self.label}] {done}/{self.total} done, {inflight} in flight, {errors} errors, p50 TTFT -")
        if self.tty:
            sys.stderr.write("\r" + line.ljust(100) + ("\n" if final else ""))
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def replay(url, model, reqs, label="run", max_inflight=64, timeout_s=600.0, watch_pids=(), kvtierctl=None,
           kvtier_socket=None, disk_dirs=(), progress=True):
    """Replays `reqs` against the server at `url`; returns the run's record (see the
    module docstring)."""
    u = urllib.parse.urlparse(url)
    host, port = u.hostname, u.port or 80
    base = f"{u.scheme}://{host}:{port}"
    before = scrape_vllm(base)
    kv0 = kvtier_stats(kvtierctl, kvtier_socket) if kvtier_socket else None
    disk0 = {d: dir_bytes(d) for d in disk_dirs}
    mem = MemoryWatch(watch_pids).start()

    records = [None] * len(reqs)
    lock = threading.Lock()
    state = {"done": 0, "errors": 0, "inflight": 0}
    ttfts = []
    slots = threading.Semaphore(max_inflight)
    prog = Progress(label, len(reqs)) if progress else None

    def work(i, q, t_arrival):
        try:
            rec = stream_completion(host, port, model, q, timeout_s)
        finally:
            slots.release()
        rec["index"] = i
        rec["arrival_s"] = q.arrival_s
        rec["held_s"] = rec["t_send"] - t_arrival  # wait for a free in-flight place
        with lock:
            records[i] = rec
            state["done"] += 1
            state["inflight"] -= 1
            if "error" in rec:
                state["errors"] += 1
            elif rec.get("ttft_s") is not None:
                ttfts.append(rec["ttft_s"])

    threads = []
    start = time.perf_counter()
    for i, q in enumerate(reqs):
        due = start + q.arrival_s
        while True:
            wait = due - time.perf_counter()
            if wait <= 0:
                break
            time.sleep(min(wait, 0.5))
            if prog:
                with lock:
                    prog.show(state["done"], state["errors"], list(ttfts), state["inflight"])
        slots.acquire()
        with lock:
            state["inflight"] += 1
        th = threading.Thread(target=work, args=(i, q, due), daemon=True)
        th.start()
        threads.append(th)
    while any(t.is_alive() for t in threads):
        time.sleep(0.5)
        if prog:
            with lock:
                prog.show(state["done"], state["errors"], list(ttfts), state["inflight"])
    if prog:
        prog.show(state["done"], state["errors"], list(ttfts), 0, final=True)

    memory = mem.stop()
    after = scrape_vllm(base)
    kv1 = kvtier_stats(kvtierctl, kvtier_socket) if kvtier_socket else None
    disk1 = {d: dir_bytes(d) for d in disk_dirs}

    ok = [r for r in records if r and "error" not in r]
    first_send = min((r["t_send"] for r in records if r), default=start)
    last_end = max((r["t_end"] for r in ok), default=first_send)
    span = max(last_end - first_send, 1e-9)
    for r in records:
        if r:
            r["t_send"] -= start
            if "t_end" in r:
                r["t_end"] -= start
    tt = [r["ttft_s"] for r in ok if r.get("ttft_s") is not None]
    e2e = [r["e2e_s"] for r in ok]
    prompt = sum(r.get("prompt_tokens") or 0 for r in ok)
    cached = [r.get("cached_tokens") for r in ok]
    summary = {
        "requests": len(reqs), "completed": len(ok), "errors": len(reqs) - len(ok),
        "duration_s": round(span, 3), "requests_per_s": round(len(ok) / span, 4),
        "ttft_p50_ms": _ms(pct(tt, 0.5)), "ttft_p90_ms": _ms(pct(tt, 0.9)),
        "ttft_p95_ms": _ms(pct(tt, 0.95)), "ttft_p99_ms": _ms(pct(tt, 0.99)),
        "ttft_mean_ms": _ms(statistics.fmean(tt) if tt else None),
        "e2e_p50_ms": _ms(pct(e2e, 0.5)), "e2e_p90_ms": _ms(pct(e2e, 0.9)),
        "prompt_tokens": prompt,
        "cached_tokens": sum(c for c in cached if c is not None) if any(c is not None for c in cached) else None,
    }
    vd = delta(after, before) if "_error" not in after and "_error" not in before else \
        {"_error": after.get("_error") or before.get("_error")}
    summary.update(split_sources(vd))
    res = {"label": label, "url": url, "model": model, "summary": summary, "vllm_counters": vd,
           "memory": memory, "requests": records,
           "first_error": next((r["error"] for r in records if r and "error" in r), None)}
    if kvtier_socket:
        res["kvtier_stats_before"], res["kvtier_stats_after"] = kv0, kv1
        for tier, key, name in (("nvme", "bytes_written", "nvme_bytes_written"), ("host", "hits", "kvtier_host_hits"),
                                ("nvme", "hits", "kvtier_nvme_hits"), ("host", "bytes_written", "kvtier_host_bytes_written")):
            try:
                summary[name] = kv1[tier][key] - kv0[tier][key]
            except (KeyError, TypeError):
                summary[name] = None
    if disk_dirs:
        res["disk_bytes"] = {d: {"before": disk0[d], "after": disk1[d]} for d in disk_dirs}
        summary["disk_bytes_grown"] = sum(disk1[d] - disk0[d] for d in disk_dirs)
    return res


def split_sources(vd):
    """Prompt tokens by where they came from, from vLLM's counters: computed, vLLM's own
    prefix cache, and a KV connector (external); and the hit rates of each cache."""
    if "_error" in vd:
        return {}
    g = lambda k: vd.get(k, 0.0)  # noqa: E731
    out = {
        "tokens_computed": g("vllm:prompt_tokens_by_source{source=local_compute}"),
        "tokens_local_prefix_cache": g("vllm:prompt_tokens_by_source{source=local_cache_hit}"),
        "tokens_external": g("vllm:prompt_tokens_by_source{source=external_kv_transfer}"),
        "prefix_cache_queries": g("vllm:prefix_cache_queries"), "prefix_cache_hits": g("vllm:prefix_cache_hits"),
        "external_queries": g("vllm:external_prefix_cache_queries"),
        "external_hits": g("vllm:external_prefix_cache_hits"),
    }
    out = {k: int(v) for k, v in out.items()}
    # the tier that supplied each cached token (device = vLLM's own prefix cache; host,
    # disk, p2p where a connector reports its tier; external_unspecified otherwise)
    pre = "vllm:prompt_tokens_cached_by_source{source="
    out["cached_by_source"] = {k[len(pre):-1]: int(v) for k, v in vd.items() if k.startswith(pre)}
    return out


def _ms(x):
    return None if x is None else round(x * 1e3, 1)


# ---- plot ----------------------------------------------------------------------------------

def plot_cdf(curves, path, title="TTFT"):
    """A PNG of each curve's TTFT CDF ({label: [seconds]}); returns None, or why no PNG was
    written."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no PNG: matplotlib does not import ({e}); bench/serve/setup.sh installs it"
    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=120)
    for label, xs in curves.items():
        xs = sorted(x * 1e3 for x in xs if x is not None)
        if not xs:
            continue
        ys = [(i + 1) / len(xs) for i in range(len(xs))]
        ax.step(xs, ys, where="post", label=f"{label} (n={len(xs)})")
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("time to first token (ms, log scale)")
    ax.set_ylabel("fraction of requests")
    ax.set_ylim(0, 1.0)
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title(title)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None


# ---- command line --------------------------------------------------------------------------

def add_workload_args(ap):
    g = ap.add_argument_group("workload")
    g.add_argument("--workload", default="mooncake", choices=("mooncake", "agentic"))
    g.add_argument("--trace", default="/work/shared/traces/mooncake_synthetic_trace.jsonl")
    g.add_argument("--vocab", type=int, default=512, help="token ids lie in [2, vocab)")
    g.add_argument("--block-tokens", type=int, default=32, help="tokens per Mooncake hash id (512 in the trace)")
    g.add_argument("--max-prompt", type=int, default=2048, help="prompts are cut to this many tokens")
    g.add_argument("--max-output", type=int, default=16, help="output tokens per request at most")
    g.add_argument("--sample", type=float, default=1.0,
                   help="Mooncake: keep the requests of this fraction of prefix roots (first hash ids, picked "
                        "by a fixed hash): every kept request keeps all it shares")
    g.add_argument("--skip", type=int, default=0, help="Mooncake: trace lines skipped first")
    g.add_argument("--requests", type=int, default=None, help="at most this many requests (after --sample)")
    g.add_argument("--rate", type=float, default=None,
                   help="arrivals evenly spaced at this many req/s (0 or unset: the source's times x "
                        "--time-scale; run_matrix's default is 1)")
    g.add_argument("--time-scale", type=float, default=1.0,
                   help="without --rate: arrival = the source's time x this (Mooncake ms timestamps, or "
                        "the agentic generator's Poisson times at --agentic-rate)")
    for f in ("sessions", "system_prompts", "system_tokens", "first_turn_tokens", "turn_tokens", "max_turns"):
        g.add_argument("--agentic-" + f.replace("_", "-"), type=int, default=getattr(W.AgenticShape, f))
    g.add_argument("--agentic-zipf", type=float, default=W.AgenticShape.zipf_alpha)
    g.add_argument("--agentic-rate", type=float, default=W.AgenticShape.rate_per_s)
    g.add_argument("--seed", type=int, default=1)


def build_workload(a):
    if a.workload == "mooncake":
        reqs = W.load_mooncake(a.trace, a.vocab, a.block_tokens, a.max_prompt, a.max_output, skip=a.skip)
        if a.sample < 1.0:
            cut = int(a.sample * 1_000_000)
            reqs = [q for q in reqs if W._mix(int(q.session[4:]) + a.seed) % 1_000_000 < cut]
    else:
        shape = W.AgenticShape(requests=a.requests or W.AgenticShape.requests, output_tokens=a.max_output,
                               zipf_alpha=a.agentic_zipf, rate_per_s=a.agentic_rate, seed=a.seed,
                               **{f: getattr(a, "agentic_" + f) for f in
                                  ("sessions", "system_prompts", "system_tokens", "first_turn_tokens",
                                   "turn_tokens", "max_turns")})
        reqs = W.generate_agentic(shape, a.vocab, a.max_prompt)
    if a.requests is not None:
        reqs = reqs[:a.requests]
    return W.retime(reqs, rate=a.rate, time_scale=a.time_scale)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default="tiny", help="the served model name")
    ap.add_argument("--label", default="run")
    ap.add_argument("--max-inflight", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    ap.add_argument("--watch-pid", type=int, action="append", default=[],
                    help="a process whose tree's peak memory is reported (the server, kvtierd); repeatable")
    ap.add_argument("--kvtier-socket", default=None, help="kvtierd's socket: NVMe bytes written from its stats")
    ap.add_argument("--kvtierctl", default=os.path.join(os.environ.get("KVTIER_BIN_DIR", "build/bin"), "kvtierctl"))
    ap.add_argument("--disk-dir", action="append", default=[], help="a folder whose growth on disk is reported")
    ap.add_argument("--out", default="serve-run.json")
    ap.add_argument("--png", default=None, help="the TTFT CDF (default: --out with .png)")
    add_workload_args(ap)
    a = ap.parse_args()
    reqs = build_workload(a)
    print(f"{len(reqs)} requests, {W.total_tokens(reqs)} prompt tokens, last arrival at "
          f"{reqs[-1].arrival_s:.1f} s", file=sys.stderr)
    res = replay(a.url, a.model, reqs, label=a.label, max_inflight=a.max_inflight, timeout_s=a.timeout,
                 watch_pids=a.watch_pid, kvtierctl=a.kvtierctl, kvtier_socket=a.kvtier_socket,
                 disk_dirs=a.disk_dir)
    res["workload"] = {k: v for k, v in vars(a).items() if k not in ("watch_pid",)}
    with open(a.out, "w") as f:
        json.dump(res, f, indent=1)
    png = a.png or os.path.splitext(a.out)[0] + ".png"
    why = plot_cdf({a.label: [r.get("ttft_s") for r in res["requests"] if r and "error" not in r]}, png)
    print(json.dumps(res["summary"]))
    print(f"wrote {a.out}" + ("" if why else f" and {png}"), file=sys.stderr)
    if why:
        print(why, file=sys.stderr)
    return 0 if res["summary"]["completed"] else 1


if __name__ == "__main__":
    sys.exit(main())
