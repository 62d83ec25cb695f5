"""Time to first token on vLLM's CPU backend: a long prompt whose prefix comes from kvtier
(host tier; NVMe tier) against vLLM computing it, over prompt lengths, in one run.

    scripts/install-vllm.sh && eval "$(scripts/install-vllm.sh --env)"
    KVTIER_LIB=build/lib/libkvtier.so python examples/vllm/ttft.py [--lengths 512,1024,2048,4096,8000]

Two engines serve the same tiny random Llama (tests/vllm/make_model.py; 8,192 positions):
one with KvtierConnector and one without a connector (the baseline: vLLM recomputing, no
connector cost at all). Both run with vLLM's own prefix cache off, so a repeat is served by
kvtier or recomputed. Per length and repetition, with a fresh random prompt each time:

- recompute: the prompt on the baseline engine;
- host: the prompt on the kvtier engine once (it computes and stores), then again (its
  prefix loads from kvtierd's host tier);
- nvme: the daemon's blocks flushed to NVMe (operator flush), then the prompt again (the
  daemon promotes from NVMe, the engine loads from the host arena).

Each request asks for one token (max_tokens 1), so its time is the time to first token as
the client sees it (HTTP included, the same for all three). Medians of --reps.

The two engines share the machine's cores, and a vLLM worker busy-polls its message queue
for a second after its last step (vLLM's shm_broadcast.py, busy_loop_s = 1): on a 2-core
machine the engine served last takes a core from the other for that second. So each timed
request waits until the other engine has been idle for --quiet-s (1.2 s).
--kv-format nvfp4 runs the kvtier engine with NVFP4 blocks in the tiers (quantized on save,
dequantized on load). The last line says tokens per GiB of tier capacity for the model's
blocks in the format the run stored and in the other one (the contracts' block sizes).
"""
import argparse
import os
import random
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "vllm"))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import e2e  # noqa: E402  (the test's kvtierd and vLLM launchers)
import kvtier  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="512,1024,2048,4096,8000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--quiet-s", type=float, default=1.2,
                    help="before a timed request, the other engine's idle time (vLLM polls for 1 s after a step)")
    ap.add_argument("--kv-format", default="as-is", choices=("as-is", "nvfp4"),
                    help="the kvtier engine's kv_connector_extra_config kv_format")
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    work = tempfile.mkdtemp(prefix="kvtier-vllm-ttft-")
    model = os.path.join(work, "tiny")
    import subprocess
    subprocess.run([sys.executable, os.path.join(ROOT, "tests", "vllm", "make_model.py"), model, "--positions",
                    "8192", "--layers", str(a.layers)], check=True, stdout=subprocess.DEVNULL, timeout=300)
    L, H, T, D = a.layers, 2, e2e.BLOCK, 64
    block_bytes = L * 2 * H * T * D * 2
    d = e2e.Kvtierd(os.path.join(work, "kvtierd"))  # the shipped config (e2e.SHIPPED_SETS)
    procs = [d]
    e2e.MAX_TOKENS = 1
    e2e.REQUEST_TIMEOUT_S = 600
    try:
        d.start()
        kv = e2e.Vllm("kvtier", model, work, d.socket, max_model_len=8192, extra={"kv_format": a.kv_format})
        procs.append(kv)
        kv.start()
        base = e2e.Vllm("baseline", model, work, d.socket, max_model_len=8192, connector=False)
        procs.append(base)
        base.start()
        rng = random.Random(11)
        rows = []
        last = {}  # engine -> when its last request ended

        def timed(engine, toks):
            """A request's time, once the other engine has been idle --quiet-s."""
            other = kv if engine is base else base
            wait = last.get(other, 0.0) + a.quiet_s - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            t = time.perf_counter()
            engine.complete(toks)
            last[engine] = time.perf_counter()
            return last[engine] - t
        for n in lengths:
            rec, host, nvme = [], [], []
            for r in range(a.reps + 1):  # the first repetition warms both engines up at this length
                toks = [rng.randrange(2, 512) for _ in range(n)]
                t_rec = timed(base, toks)
                b0 = d.counters()["host"].blocks
                timed(kv, toks)  # computes and stores (the commit may end after the response)
                d.stored(b0 + n // T)
                h0 = d.counters()["host"].hits
                t_host = timed(kv, toks)
                if d.counters()["host"].hits <= h0:
                    print(f"warning: length {n}: the host run did not load from the host tier", flush=True)
                with d.client() as c:
                    c.flush("nvme")
                nv0 = d.counters()["nvme"].hits
                t_nvme = timed(kv, toks)
                if d.counters()["nvme"].hits <= nv0:
                    print(f"warning: length {n}: the NVMe run did not read NVMe", flush=True)
                if r:
                    rec.append(t_rec); host.append(t_host); nvme.append(t_nvme)
            m = [statistics.median(x) * 1e3 for x in (rec, host, nvme)]
            rows.append((n, *m))
            print(f"{n:6d} tokens: recompute {m[0]:8.1f} ms  host {m[1]:8.1f} ms ({m[0] / m[1]:.2f}x)  "
                  f"nvme {m[2]:8.1f} ms ({m[0] / m[2]:.2f}x)", flush=True)
        per_tok = block_bytes / T
        nv = kvtier.Contract(model_id="x", num_layers=L, num_kv_heads=H, head_dim=D, block_tokens=T,
                             kv_format="nvfp4").block_bytes() / T
        print("\n| prompt tokens | recompute TTFT (ms) | prefix from host (ms) | speedup | prefix from NVMe (ms) "
              "| speedup |")
        print("|---:|---:|---:|---:|---:|---:|")
        for n, r_, h_, v_ in rows:
            print(f"| {n} | {r_:.1f} | {h_:.1f} | {r_ / h_:.2f}x | {v_:.1f} | {r_ / v_:.2f}x |")
        print(f"\nkvtier engine kv_format {a.kv_format}; tokens per GiB of tier: as-is BF16 {2**30 / per_tok:,.0f} "
              f"({per_tok:.0f} B/token); NVFP4 {2**30 / nv:,.0f} ({nv:.0f} B/token, {per_tok / nv:.2f}x)")
    finally:
        for p in reversed(procs):
            p.stop()
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
