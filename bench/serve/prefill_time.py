"""Time of one long prefill on vLLM alone: what the serving benchmark's model costs here.

    python bench/serve/prefill_time.py [--size tiny|wide] [--tokens 4000] [--reps 3]

Starts `vllm serve` on the model (written by make_model.py into a temp folder unless
--model names one), prefix caching off, and sends --reps fresh random prompts of --tokens
tokens with one output token each (after one warm-up prompt); prints each time to first
token and their median. The model sizes in make_model.py are chosen with it.
"""
import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import replay_client as RC  # noqa: E402
import run_matrix as RM  # noqa: E402
import workload as W  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="tiny")
    ap.add_argument("--model", default=None)
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="kvtier-prefill-")
    py = RM.server_python()
    model = a.model or os.path.join(work, "model")
    if not a.model:
        subprocess.run([py, os.path.join(HERE, "make_model.py"), model, "--size", a.size], check=True,
                       stdout=subprocess.DEVNULL, timeout=900)
    port = RM.free_port()
    n = (a.tokens + 64 + 31) // 32 * 32
    cmd = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", "m",
           "--dtype", "bfloat16", "--enforce-eager", "--no-enable-prefix-caching", "--block-size", "32",
           "--max-model-len", str(n), "--max-num-batched-tokens", str(n), "--max-num-seqs", "2",
           "--kv-cache-memory-bytes", str(512 << 20), "--seed", "0"]
    srv = RM.Server("prefill", cmd, dict(os.environ), os.path.join(work, "vllm.log"))
    try:
        print(f"vllm serve ready in {srv.start(port, 900):.0f} s", flush=True)
        rng = random.Random(3)
        times = []
        for i in range(a.reps + 1):
            q = W.Request(0.0, [rng.randrange(2, 512) for _ in range(a.tokens)], 1)
            r = RC.stream_completion("127.0.0.1", port, "m", q, 900)
            if "error" in r:
                raise SystemExit(r["error"])
            if i:
                times.append(r["ttft_s"])
            print(f"{'warm-up' if not i else 'prompt'} {a.tokens} tokens: TTFT {r['ttft_s'] * 1e3:.0f} ms", flush=True)
        print(f"median TTFT of a {a.tokens}-token prefill: {statistics.median(times) * 1e3:.0f} ms "
              f"({a.size if not a.model else a.model})")
    finally:
        srv.stop()
        import shutil
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
