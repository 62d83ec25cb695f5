"""A fault run, as LMCache's CI runs one: a real vLLM (CPU backend) serving 50 prompts with long
shared prefixes through kvtier.vllm.KvtierConnector, kvtierd (the shipped config/kvtier.toml,
only its folder and capacities set) killed -9 while a request is in flight at about 40% of
the run, then started again on the same folder. Run by tests/vllm/run.sh (ctest vllm_fault).

Checks:
  - every request completes, and its output agrees with vLLM's with the connector off on the
    same prompts sent the same way (one at a time; e2e.py's agree() and measured tolerance)
  - before the kill, later prompts of a shared prefix load it from kvtier (host hits)
  - the outage is logged once per connector role (scheduler, worker), not per request
  - after the restart the engine reattaches by itself at its next call (one "is back" line
    per role; the new socket file ends the back-off) and later requests load again (host
    hits after the restart)

The last line is "N passed, N failed, N skipped"; the exit code is 1 on any failure.
"""
import os
import random
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import e2e  # noqa: E402
from e2e import (BLOCK, Kvtierd, Vllm, agree, batch_noise, check, engine_noise, make_model,  # noqa: E402
                 prefill_noise, run_checks, tolerance)

PROMPTS = 50
PREFIXES = 5
PREFIX_TOKENS = 16 * BLOCK   # 512 tokens shared by every prompt of a prefix
TAIL_TOKENS = 96
KILL_AT = 20                 # the request in flight when kvtierd is killed (40% of the run)
RESTART_AT = 30              # the first request after kvtierd is back


def prompts():
    rng = random.Random(1234)
    heads = [[rng.randrange(2, 512) for _ in range(PREFIX_TOKENS)] for _ in range(PREFIXES)]
    return [heads[i % PREFIXES] + [rng.randrange(2, 512) for _ in range(TAIL_TOKENS)] for i in range(PROMPTS)]


def run(work, procs):
    model = os.path.join(work, "tiny")
    make_model(model, 0)
    d = Kvtierd(os.path.join(work, "kvtierd"))
    procs.append(d)
    d.start()
    ref = Vllm("ref", model, work, d.socket, connector=False)
    # The tolerance's prefill-shape noise: vLLM's own prefix cache, no connector.
    pc = Vllm("ref-prefix-cache", model, work, d.socket, connector=False, prefix_caching=True)
    kv = Vllm("kv", model, work, d.socket)
    for v in (ref, pc, kv):
        procs.append(v)
        v.launch()
    for v in (ref, pc, kv):
        v.wait_ready()
    tol = tolerance(batch_noise(ref, e2e.prompt(90), e2e.prompt(91)), prefill_noise(ref, pc, 93),
                    engine_noise(ref, kv, (95, 96, 97), salt="calibration"))
    pc.stop()
    ps = prompts()
    refs = [ref.complete(p) for p in ps]
    ref.stop()

    outs, errs, hits = [None] * PROMPTS, [], {}
    in_flight = threading.Event()
    killed = threading.Event()

    def client():
        for i, p in enumerate(ps):
            if i == KILL_AT:
                in_flight.set()
            if i == RESTART_AT:
                killed.wait(60)
                d.start()
                hits["restart"] = d.counters()["host"].hits
            try:
                outs[i] = kv.complete(p)
            except Exception as e:
                errs.append(f"request {i}: {type(e).__name__}: {e}")
            if i == KILL_AT - 1:
                hits["before_kill"] = d.counters()["host"].hits
            print(f"request {i + 1}/{PROMPTS} done", flush=True)
    seen = len(kv.log_text())
    t = threading.Thread(target=client, daemon=True)
    t.start()
    in_flight.wait(600)
    time.sleep(0.05)  # request KILL_AT is being served
    d.kill()
    killed.set()
    t.join(1800)
    hits["end"] = d.counters()["host"].hits

    check("every request completes", not t.is_alive() and not errs and all(o is not None for o in outs),
          f"errors {errs}")
    res = [agree(r, o, tol) if o is not None else (False, "no output") for r, o in zip(refs, outs)]
    bad = [f"request {i}: {how}" for i, (ok, how) in enumerate(res) if not ok]
    check(f"every output agrees with the connector-off engine's ({PROMPTS} requests)", not bad, "; ".join(bad[:5]))
    check("before the kill, prompts of a shared prefix load it from kvtier", hits.get("before_kill", 0) > 0,
          f"host hits before the kill: {hits.get('before_kill')}")
    lines = [ln for ln in kv.log_text()[seen:].splitlines() if "kvtier: " in ln]
    gone = [ln for ln in lines if "the engine recomputes what it would have loaded" in ln]
    back = [ln for ln in lines if "is back; caching again" in ln]
    check("the outage is logged once per connector role, not per request", 1 <= len(gone) <= 2,
          f"{len(gone)} outage lines: {gone}")
    check("the engine reattaches by itself", 1 <= len(back) <= 2, f"{len(back)} 'is back' lines: {back}")
    other = [ln for ln in lines if ln not in gone and ln not in back]
    check("after the restart later requests load from kvtier", hits.get("end", 0) > hits.get("restart", 0),
          f"host hits at the restart {hits.get('restart')}, at the end {hits.get('end')}; the connector's other "
          f"lines: {other[:5]}")


def main():
    return run_checks("fault", run, keep="--keep" in sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
