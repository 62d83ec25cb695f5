"""The serving benchmark as users run it: bench/serve/run_matrix.py --smoke with vLLM alone
and vLLM on kvtier (kvtierd on the shipped config/kvtier.toml with only its capacities and
folder set), 16 agentic requests each through `vllm serve`.

Checks what must hold on any machine, never a time:
- every request of both rows completed, and neither row has an error;
- kvtier's row took prompt tokens from the connector (vLLM's external prefix-cache
  counter), vLLM alone none;
- the connector's load-or-compute measurements crossed vLLM's processes: the kvtier
  server's log has the scheduler's line with the workers' first measurements (seconds per
  loaded block, seconds per computed token);
- the table names both rows.
The TTFTs are printed for the reader.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))

passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {name}", flush=True)
    else:
        failed += 1
        print(f"FAIL {name}: {detail}", flush=True)


def main():
    out = tempfile.mkdtemp(prefix="kvtier-serve-smoke-")
    cmd = [sys.executable, os.path.join(ROOT, "bench", "serve", "run_matrix.py"), "--smoke", "--out", out,
           "--configs", "vllm,kvtier"]
    print(" ".join(cmd), flush=True)
    env = dict(os.environ)  # the client package from this tree, as the benchmark's README exports it
    pkg = os.path.join(ROOT, "client", "python")
    env["PYTHONPATH"] = pkg + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    p = subprocess.run(cmd, timeout=1500, env=env)
    check("run_matrix.py --smoke exits 0", p.returncode == 0, p.returncode)
    try:
        with open(os.path.join(out, "serve.json")) as f:
            rows = {r["config"]: r for r in json.load(f)["rows"]}
    except (OSError, ValueError, KeyError) as e:
        check("serve.json is written", False, e)
        return 1
    for cfg in ("vllm", "kvtier"):
        r = rows.get(cfg) or {}
        s = (r.get("result") or {}).get("summary") or {}
        check(f"{cfg}: every request completed, no error",
              not r.get("error") and s.get("requests") and s.get("completed") == s.get("requests")
              and not s.get("errors"), (r.get("error"), {k: s.get(k) for k in ("requests", "completed", "errors")}))
        print(f"    {cfg}: TTFT p50 {s.get('ttft_p50_ms')} ms, p95 {s.get('ttft_p95_ms')} ms, "
              f"cached {s.get('cached_tokens')} of {s.get('prompt_tokens')} prompt tokens", flush=True)
    ext = {c: ((rows.get(c) or {}).get("result") or {}).get("summary", {}).get("tokens_external") for c in rows}
    check("kvtier's row took prompt tokens from the connector, vLLM alone none",
          (ext.get("kvtier") or 0) > 0 and not ext.get("vllm"), ext)
    log = ""
    for name in sorted(os.listdir(out)):
        if name.startswith("kvtier-") and os.path.isfile(os.path.join(out, name, "vllm.log")):
            with open(os.path.join(out, name, "vllm.log"), errors="replace") as f:
                log = f.read()
    m = re.search(r"load or compute: the workers' first measurements: a block loaded in ([0-9.]+) ms, a token "
                  r"computed in ([0-9.]+) ms", log)
    check("the workers' load and step times reached the scheduler (its first-measurements line)", m is not None,
          [ln for ln in log.splitlines() if "load or compute" in ln][:2] or "no such line")
    if m:
        print(f"    measured: a block loads in {m.group(1)} ms, a token computes in {m.group(2)} ms", flush=True)
    try:
        md = open(os.path.join(out, "serve.md")).read()
    except OSError as e:
        md = str(e)
    check("the table names both rows", "| vllm |" in md and "| kvtier |" in md, md[:300])
    if failed:
        print(f"{passed} passed, {failed} failed (results and logs kept in {out})")
    else:
        shutil.rmtree(out, ignore_errors=True)
        print(f"{passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
