"""Runs the serving benchmark over configurations and host-memory budgets: for each, it
starts `vllm serve` (the same model, vLLM flags and KV cache), and kvtierd where the
configuration uses it, replays the same workload with replay_client, stops them, and
writes one markdown table, one JSON file and one PNG of the TTFT CDFs.

    eval "$(scripts/install-vllm.sh --env)"; bench/serve/setup.sh
    export PYTHONPATH=$PWD/client/python KVTIER_LIB=$PWD/build/lib/libkvtier.so KVTIER_BIN_DIR=$PWD/build/bin
    python bench/serve/run_matrix.py --out /tmp/serve            # the full matrix
    python bench/serve/run_matrix.py --smoke --out /tmp/serve-smoke --configs vllm,kvtier

Configurations (--configs, comma-separated):

  vllm           vLLM alone, its prefix cache on. Its KV cache is the base KV cache plus the
                 budget (on the CPU backend vLLM's KV cache is host memory, so every
                 configuration has the same host memory for KV; --alone-kv base gives it
                 the base KV cache only).
  kvtier         KvtierConnector (kv_connector_module_path kvtier.vllm), kvtierd on the
                 shipped config/kvtier.toml with tiers.host.capacity = the budget (and its
                 NVMe tier in the run's folder).
  kvtier-nvfp4   the same with kv_format "nvfp4" (NVFP4 blocks in the tiers).
  lmcache        LMCacheConnectorV1 (LMCache's in-process connector) with its local CPU
                 backend at the budget and its local disk backend at kvtierd's NVMe
                 capacity, in an environment where LMCache imports beside vLLM
                 (scripts/lmcache-venv.sh --beside-vllm). A server whose LMCache engine
                 does not start (LMCache then runs "degraded": recompute) keeps its row
                 with LMCache's exception instead of a run.
  lmcache-native the same through vLLM's bundled copy of LMCache's adapter ("use_native").
  lmcache-mp     LMCacheMPConnector against LMCache's multiprocess cache server
                 (lmcache.v1.multiprocess.server, started per run): its L1 (host memory)
                 at the budget, its file-system L2 in the run's folder, both transfer
                 modes on (a CPU engine's worker copies its pages itself, "engine-driven",
                 through the server's shared-memory segment).
  offloading     vLLM's OffloadingConnector (CPUOffloadingSpec), cpu_bytes_to_use = budget.
  simple-cpu     vLLM's SimpleCPUOffloadConnector, cpu_bytes_to_use = budget.

Every configuration but vLLM alone gets the base KV cache in vLLM and the budget in its
tier. vLLM's own KV cache (--kv-base) defaults to two requests of --max-model-len (one with
--smoke) and vLLM's null block: smaller than the working set, so that prefixes leave it
and come back from the tier. Budgets (--budgets): sizes (512MiB, 2GiB) or "ws" / "ws/4": the workload's working
set (its distinct full blocks x the model's BF16 KV bytes per block) or a quarter of it.

A configuration that does not start, or fails during the run, keeps its row with the
error: the root exception of the server's log and the file:line in vLLM (or kvtier) it was
raised at. --smoke: 16 agentic requests of at most 1,024 tokens, budget "ws"; a few minutes
per configuration on a 2-core machine (most of it vLLM's start).
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
import replay_client as RC  # noqa: E402
import workload as W  # noqa: E402
from make_model import geometry, kv_bytes_per_token  # noqa: E402

CONFIGS = ("vllm", "kvtier", "kvtier-nvfp4", "lmcache", "lmcache-native", "lmcache-mp", "offloading", "simple-cpu")
SERVED = "bench"


def parse_size(s):
    m = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", s, re.I)
    if not m:
        raise ValueError(f"not a size: {s!r}")
    return int(float(m.group(1)) * 1024 ** " KMGT".index((m.group(2) or " ").upper()))


def fmt_size(n):
    for unit, k in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << k:
            return f"{n / (1 << k):.3g} {unit}"
    return f"{n} B"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ---- errors from a server log --------------------------------------------------------------

_PREFIX = re.compile(r"^\((?:EngineCore|APIServer|Worker)[\w]* pid=\d+\)\s?")
_LOGHEAD = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[[^\]]*\] ?")
_FRAME = re.compile(r'^\s*File "([^"]+)", line (\d+), in (\S+)')
_EXC = re.compile(r"^((?:[A-Za-z_][\w.]*)?(?:Error|Exception|Exit|Interrupt|Failure))(:.*)?$")


def root_error(log_text):
    """(exception line, "path:line" of its deepest vLLM or kvtier frame) of the first
    traceback in a server log whose exception is not vLLM's wrapper ("Engine core
    initialization failed"); (None, None) when there is none."""
    lines = [_LOGHEAD.sub("", _PREFIX.sub("", ln)) for ln in log_text.splitlines()]
    blocks, cur = [], None
    for ln in lines:
        if "Traceback (most recent call last)" in ln:
            cur = {"frames": [], "exc": None}
            blocks.append(cur)
            continue
        if cur is None or cur["exc"] is not None:
            continue
        m = _FRAME.match(ln)
        if m:
            cur["frames"].append((m.group(1), int(m.group(2))))
            continue
        if _EXC.match(ln.strip()):
            cur["exc"] = ln.strip()
    picked = None
    for b in blocks:
        if b["exc"] and "Engine core initialization failed" not in b["exc"]:
            picked = b
            break
    picked = picked or next((b for b in blocks if b["exc"]), None)
    if not picked:
        return None, None
    where = None
    for path, line in reversed(picked["frames"]):
        if "/vllm/" in path or "/kvtier/" in path or "/lmcache/" in path:
            i = max(path.rfind("/vllm/"), path.rfind("/kvtier/"), path.rfind("/lmcache/"))
            where = f"{path[i + 1:]}:{line}"
            break
    if where is None and picked["frames"]:
        path, line = picked["frames"][-1]
        where = f"{path}:{line}"
    return picked["exc"], where


def connector_warnings(log_text, limit=3):
    """The first distinct WARNING or ERROR lines of a server log that come from a KV
    connector (kvtier, LMCache, vLLM's offloading code), as "message [file:line]"."""
    out = []
    head = re.compile(r"^(?:WARNING|ERROR) \d\d-\d\d \d\d:\d\d:\d\d \[([^\]]*)\] ?(.*)$")
    for ln in log_text.splitlines():
        m = head.match(_PREFIX.sub("", ln))
        if not m or not re.search(r"kvtier|lmcache|offload|connector", m.group(0), re.I):
            continue
        if m.group(2)[:1].isspace() or "experimental" in m.group(2):
            continue
        msg = f"{m.group(2).strip()[:300]} [{m.group(1)}]"
        if msg not in out:
            out.append(msg)
        if len(out) >= limit:
            break
    return out


def error_lines(log_text, limit=3):
    """The first distinct ERROR lines of a server log that are not traceback lines, each
    as "message [logger's file:line]"."""
    out = []
    head = re.compile(r"^(?:ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d \[([^\]]*)\] ?(.*)$")
    for ln in log_text.splitlines():
        m = head.match(_PREFIX.sub("", ln))
        if not m:
            continue
        msg = m.group(2)
        if not msg.strip() or msg[0].isspace() or msg.startswith("Traceback") or set(msg.strip()) <= set("^~ "):
            continue
        msg = f"{msg.strip()[:400]} [{m.group(1)}]"
        if msg not in out:
            out.append(msg)
        if len(out) >= limit:
            break
    return out


# ---- processes -----------------------------------------------------------------------------

class Server:
    """`vllm serve` in a process group of its own (its engine core and worker are child
    processes; stop() signals the group by its id)."""

    def __init__(self, name, cmd, env, log):
        self.name, self.cmd, self.env, self.log = name, cmd, env, log
        self.proc = None

    def start(self, port, timeout_s):
        """Starts `vllm serve`: ready once its /v1/models answers 200."""
        def ready():
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=5) as r:
                return r.status == 200
        return self._spawn(ready, timeout_s, "vllm serve")

    def start_listening(self, port, timeout_s):
        """Starts a process that is ready once it accepts TCP connections on port."""
        def ready():
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return True
        return self._spawn(ready, timeout_s, self.name)

    def _spawn(self, ready, timeout_s, what):
        """Starts the command in a process group of its own and asks ready() once a second;
        returns the seconds it took, or raises RuntimeError when the process exits or is not
        ready within timeout_s."""
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     start_new_session=True, env=self.env)
        while time.time() < self.t0 + timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {self.proc.returncode}")
            try:
                if ready():
                    return time.time() - self.t0
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(1)
        raise RuntimeError(f"{what} not ready within {timeout_s} s")

    def text(self):
        try:
            with open(self.log, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def stop(self, timeout_s=60):
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def server_python():
    """The Python that `vllm` on PATH runs under (its shebang)."""
    vllm = shutil.which("vllm")
    if not vllm:
        return None
    with open(vllm, "rb") as f:
        first = f.readline().decode(errors="replace").strip()
    return first[2:].strip() if first.startswith("#!") else None


def import_error(python, module):
    """None if `module` imports in `python`, else its exception's last line."""
    if not python:
        return "vllm is not on PATH"
    p = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=600)
    if p.returncode == 0:
        return None
    return (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]


def shipped_nvme_capacity():
    """tiers.nvme.capacity in the shipped config/kvtier.toml, in bytes."""
    import tomllib
    with open(os.path.join(ROOT, "config", "kvtier.toml"), "rb") as f:
        return parse_size(tomllib.load(f)["tiers"]["nvme"]["capacity"])


def lmcache_vllm(a):
    """(`vllm` of an environment where LMCache imports beside the vLLM on PATH, None), or
    (None, why not). --lmcache-vllm names one; otherwise scripts/lmcache-venv.sh
    --beside-vllm makes it (once per machine)."""
    if a.lmcache_vllm:
        return a.lmcache_vllm, None
    vllm = shutil.which("vllm")
    venv = os.path.dirname(os.path.dirname(os.path.realpath(vllm))) if vllm else None
    if not venv:
        return None, "vllm is not on PATH"
    p = subprocess.run([os.path.join(ROOT, "scripts", "lmcache-venv.sh"), "--beside-vllm", venv],
                       capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        last = (p.stderr.strip().splitlines() or ["exit %d" % p.returncode])[-1]
        return None, f"LMCache does not install beside vLLM ({venv}): {last}"
    a.lmcache_vllm = p.stdout.strip().splitlines()[-1]
    return a.lmcache_vllm, None


# A connector that started but switched itself off: (marker in the server log, what it means).
_DEGRADED = (("System will operate in degraded mode", "LMCache's engine did not start; it runs degraded "
              "(recompute)"),)


def degraded_error(log_text):
    """(error, "path:line") when the server log says its connector runs switched off, else None."""
    for marker, meaning in _DEGRADED:
        if marker in log_text:
            exc, where = root_error(log_text)
            return (f"{meaning}: {exc}" if exc else meaning), where
    return None


# ---- one configuration at one budget -------------------------------------------------------

def vllm_command(a, model, port, kv_bytes, transfer=None):
    cmd = ["vllm", "serve", model, "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED,
           "--dtype", "bfloat16", "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
           "--disable-hybrid-kv-cache-manager", "--block-size", str(a.block_size),
           "--max-model-len", str(a.max_model_len), "--max-num-seqs", str(a.max_num_seqs),
           "--max-num-batched-tokens", str(a.max_model_len), "--kv-cache-memory-bytes", str(kv_bytes),
           "--seed", "0"]
    if transfer:
        cmd += ["--kv-transfer-config", json.dumps(transfer)]
    return cmd


def run_one(a, cfg, budget, model, reqs, work, env, py):
    """Returns the row's record: the client's result, or the error that stopped it."""
    rec = {"config": cfg, "budget_bytes": budget}
    folder = os.path.join(work, f"{cfg}-{budget >> 20}MiB")
    os.makedirs(folder, exist_ok=True)
    port = free_port()
    daemon = None
    side = None  # a peer's own server process (LMCache's cache server)
    disk_dirs = []
    transfer = None
    kv_bytes = a.kv_base_bytes
    renv = dict(env)
    try:
        if cfg == "vllm":
            if a.alone_kv == "base+budget":
                kv_bytes = a.kv_base_bytes + budget
        elif cfg in ("kvtier", "kvtier-nvfp4"):
            import kvtier.daemon  # the client package (PYTHONPATH)
            nvme_dir = os.path.join(folder, "nvme")
            sets = {"tiers.host.capacity": str(budget), "tiers.nvme.dir": nvme_dir}
            if a.nvme_capacity:
                sets["tiers.nvme.capacity"] = a.nvme_capacity
            daemon = kvtier.daemon.Daemon.shipped(sets)
            rec["kvtierd_sets"] = sets
            disk_dirs.append(nvme_dir)
            extra = {"socket": daemon.socket}
            if cfg == "kvtier-nvfp4":
                extra["kv_format"] = "nvfp4"
            transfer = {"kv_connector": "KvtierConnector", "kv_connector_module_path": "kvtier.vllm",
                        "kv_role": "kv_both", "kv_connector_extra_config": extra}
        elif cfg in ("lmcache", "lmcache-native", "lmcache-mp"):
            vllm_bin, err = lmcache_vllm(a)
            if err:
                rec["error"] = err
                return rec
            # LMCache's local CPU backend at the budget, its local disk backend at kvtierd's
            # NVMe capacity (both in GB of 2^30 bytes; no disk where that is 0), its chunks
            # one vLLM block.
            renv.update({"LMCACHE_LOCAL_CPU": "True", "LMCACHE_CHUNK_SIZE": str(a.block_size),
                         "LMCACHE_MAX_LOCAL_CPU_SIZE": f"{budget / (1 << 30):.4f}", "PYTHONHASHSEED": "0"})
            if a.disk_bytes:
                disk_dir = os.path.join(folder, "lmcache-disk")
                os.makedirs(disk_dir, exist_ok=True)
                disk_dirs.append(disk_dir)
                renv.update({"LMCACHE_LOCAL_DISK": f"file://{disk_dir}/",
                             "LMCACHE_MAX_LOCAL_DISK_SIZE": f"{a.disk_bytes / (1 << 30):.4f}"})
            rec["lmcache_env"] = {k: v for k, v in renv.items() if k.startswith("LMCACHE_")}
            transfer = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
            if cfg == "lmcache-native":
                transfer["kv_connector_extra_config"] = {"use_native": True}
            elif cfg == "lmcache-mp":
                mp_port = free_port()
                mp_cmd = [os.path.join(os.path.dirname(vllm_bin), "python"), "-m", "lmcache.v1.multiprocess.server",
                          "--host", "127.0.0.1", "--port", str(mp_port), "--chunk-size", str(a.block_size),
                          "--l1-size-gb", f"{budget / (1 << 30):.4f}", "--eviction-policy", "LRU",
                          # a CPU engine's worker copies its pages itself (engine-driven), through
                          # a shared-memory segment of the server's
                          "--supported-transfer-mode", "auto", "--shm-name", f"kvtier-bench-lmcache-{mp_port}"]
                if a.disk_bytes:
                    # LMCache's file-system L2 (its fs adapter has no capacity setting; the
                    # working set is far below kvtierd's NVMe capacity, so neither limit binds)
                    l2_dir = os.path.join(folder, "lmcache-l2")
                    os.makedirs(l2_dir, exist_ok=True)
                    disk_dirs.append(l2_dir)
                    mp_cmd += ["--l2-adapter", json.dumps({"type": "fs", "base_path": l2_dir})]
                rec["lmcache_server"] = " ".join(mp_cmd[1:])
                side = Server("lmcache-server", mp_cmd, renv, os.path.join(folder, "lmcache-server.log"))
                try:
                    side.start_listening(mp_port, a.start_timeout)
                except RuntimeError as e:
                    exc, where = root_error(side.text())
                    rec["error"], rec["error_at"] = f"LMCache's cache server: {exc or e}", where
                    side.stop()
                    return rec
                transfer = {"kv_connector": "LMCacheMPConnector", "kv_role": "kv_both",
                            "kv_connector_extra_config": {"lmcache.mp.host": "tcp://127.0.0.1",
                                                          "lmcache.mp.port": mp_port}}
        elif cfg == "offloading":
            transfer = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": budget}}
        elif cfg == "simple-cpu":
            transfer = {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
                        "kv_connector_extra_config": {"cpu_bytes_to_use": budget}}
        else:
            raise ValueError(f"unknown configuration {cfg}")
        rec["vllm_kv_cache_bytes"] = kv_bytes
        cmd = vllm_command(a, model, port, kv_bytes, transfer)
        if cfg.startswith("lmcache"):
            cmd[0] = vllm_bin
        rec["command"] = " ".join(cmd[:3]) + " ... " + " ".join(cmd[5:])
        srv = Server(cfg, cmd, renv, os.path.join(folder, "vllm.log"))
        print(f"== {cfg}, budget {fmt_size(budget)}: starting vllm serve (log {srv.log})", flush=True)
        try:
            rec["start_s"] = round(srv.start(port, a.start_timeout), 1)
        except RuntimeError as e:
            exc, where = root_error(srv.text())
            rec["error"] = exc or str(e)
            rec["error_at"] = where
            rec["server_errors"] = error_lines(srv.text())
            srv.stop()
            return rec
        print(f"   ready in {rec['start_s']} s", flush=True)
        degraded = degraded_error(srv.text())
        if degraded:
            # The connector is off in this server (every request recomputes, and LMCache's
            # lookups wait out their RPC timeout): the row keeps the reason, not a run.
            rec["error"], rec["error_at"] = degraded
            rec["server_errors"] = error_lines(srv.text())
            srv.stop()
            return rec
        try:
            url = f"http://127.0.0.1:{port}"
            warm = W.Request(arrival_s=0.0, tokens=[1] * (2 * a.block_size), max_tokens=2)
            w = RC.stream_completion("127.0.0.1", port, SERVED, warm, a.request_timeout)
            if "error" in w:
                rec["warmup_error"] = w["error"]
            tier = daemon.proc if daemon else side.proc if side else None  # the tier's own process
            watch = [srv.proc.pid] + ([tier.pid] if tier else [])
            res = RC.replay(url, SERVED, reqs, label=f"{cfg} @ {fmt_size(budget)}", max_inflight=a.max_inflight,
                            timeout_s=a.request_timeout, watch_pids=watch, kvtierctl=a.kvtierctl,
                            kvtier_socket=daemon.socket if daemon else None, disk_dirs=disk_dirs)
            res["server_pid"] = srv.proc.pid
            res["kvtierd_pid"] = tier.pid if tier else None  # kvtierd, or LMCache's cache server
            rec["result"] = res
            if srv.proc.poll() is not None:
                rec["error"] = f"vllm serve exited with {srv.proc.returncode} during the run"
            text = srv.text()
            errs = error_lines(text)
            if errs:
                rec["server_errors"] = errs
                exc, where = root_error(text)
                if exc:
                    rec["server_exception"], rec["server_exception_at"] = exc, where
            warns = connector_warnings(text)
            if warns:
                rec["connector_warnings"] = warns
            if daemon:
                rec["kvtierd_log_tail"] = daemon.tail(10)
        finally:
            srv.stop()
    except Exception as e:  # a configuration that cannot be set up keeps its row
        rec["error"] = f"{type(e).__name__}: {e}"
    finally:
        if daemon:
            daemon.stop()
        if side:
            side.stop()
        if not a.keep_data:  # the tiers' files are measured; a full run would leave gigabytes
            for d in disk_dirs:
                shutil.rmtree(d, ignore_errors=True)
    return rec


# ---- table ---------------------------------------------------------------------------------

def row_cells(r):
    s = (r.get("result") or {}).get("summary") or {}
    mem = (r.get("result") or {}).get("memory") or {}

    def peak(kind, pid):
        v = (mem.get(kind) or {}).get(str(pid)) if pid else None
        return f"{v:,.0f}" if v is not None else "-"

    res = r.get("result") or {}
    f = lambda v, d=0: "-" if v is None else f"{v:,.{d}f}"  # noqa: E731
    cached = s.get("cached_tokens")
    prompt = s.get("prompt_tokens") or 0
    ext = s.get("tokens_external")
    local = s.get("tokens_local_prefix_cache")
    nv = s.get("nvme_bytes_written")  # kvtierd's counter; a peer's disk folder's growth otherwise
    if nv is None:
        nv = s.get("disk_bytes_grown")
    note = r.get("error") or ""
    if r.get("error_at"):
        note += f" ({r['error_at']})"
    if not note and r.get("server_errors"):
        note = "server log: " + r["server_errors"][0]
        if r.get("server_exception"):
            note += f"; {r['server_exception']} ({r.get('server_exception_at')})"
    if not note and r.get("connector_warnings"):
        note = "warning: " + r["connector_warnings"][0]
    if s and s.get("errors"):
        note = (note + "; " if note else "") + f"{s['errors']} requests failed: {(res.get('first_error') or '')[:200]}"
    return [r["config"], fmt_size(r["budget_bytes"]),
            f"{s['completed']}/{s['requests']}" if s else "-",
            f(s.get("requests_per_s"), 3), f(s.get("ttft_p50_ms")), f(ttft_p95(r)), f(s.get("e2e_p50_ms")),
            f"{(cached or 0) / prompt:.1%}" if s and prompt and cached is not None else "-",
            f(local), f(ext),
            peak("peak_tree_pss_mib", res.get("server_pid")), peak("peak_tree_pss_mib", res.get("kvtierd_pid")),
            "-" if nv is None else fmt_size(nv) if nv else "0",
            note.replace("|", "\\|").replace("\n", " ")[:600]]


def ttft_p95(r):
    """TTFT p95 (ms) of a row: the client's summary, else its requests (a JSON written before
    the summary had it)."""
    res = r.get("result") or {}
    s = res.get("summary") or {}
    if s.get("ttft_p95_ms") is not None:
        return s["ttft_p95_ms"]
    tt = [q["ttft_s"] for q in res.get("requests") or [] if q and "error" not in q and q.get("ttft_s") is not None]
    v = RC.pct(tt, 0.95)
    return None if v is None else round(v * 1000, 1)


HEADER = ["configuration", "host budget", "done", "req/s", "TTFT p50 (ms)", "TTFT p95 (ms)", "e2e p50 (ms)",
          "prompt tokens cached", "from vLLM prefix cache", "from connector", "server peak PSS (MiB)",
          "tier process peak PSS (MiB)", "disk written", "error / note"]


def table(rows):
    out = ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * 11 + ["---"]) + "|"]
    for r in rows:
        out.append("| " + " | ".join(row_cells(r)) + " |")
    return "\n".join(out)


# ---- main ----------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="serve-bench", help="folder for the results (and the model, logs)")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--budgets", default=None, help='default "ws,ws/4" ("ws" with --smoke)')
    ap.add_argument("--model", default=None, help="a model folder (default: written by make_model.py)")
    ap.add_argument("--model-size", default="tiny", choices=("tiny", "wide"), help="make_model.py --size")
    ap.add_argument("--block-size", type=int, default=32, help="vLLM's --block-size (CPU: a multiple of 32)")
    ap.add_argument("--max-model-len", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--kv-base", default=None,
                    help="vLLM's own KV cache (default: 2 x --max-model-len tokens of the model)")
    ap.add_argument("--alone-kv", default="base+budget", choices=("base+budget", "base"))
    ap.add_argument("--nvme-capacity", default=None, help="kvtierd's tiers.nvme.capacity (default: shipped); "
                    "LMCache's local disk gets the same")
    ap.add_argument("--keep-data", action="store_true",
                    help="keep each row's tier files (kvtierd's NVMe folder, LMCache's disk); removed by default once "
                         "the row is measured")
    ap.add_argument("--lmcache-vllm", default=None,
                    help="the `vllm` of an environment with LMCache (default: scripts/lmcache-venv.sh --beside-vllm)")
    ap.add_argument("--max-inflight", type=int, default=64)
    ap.add_argument("--request-timeout", type=float, default=900.0)
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument("--kvtierctl", default=os.path.join(os.environ.get("KVTIER_BIN_DIR", os.path.join(ROOT, "build",
                                                                                                   "bin")),
                                                         "kvtierctl"))
    ap.add_argument("--table-from", metavar="SERVE_JSON", default=None,
                    help="write serve.md and serve.png again from a run's serve.json (nothing is run)")
    RC.add_workload_args(ap)
    ap.set_defaults(sample=0.1, rate=1.0)
    a = ap.parse_args()
    if a.table_from:
        return render_saved(a.table_from)
    if a.smoke:
        a.budgets = a.budgets or "ws"
        if "--workload" not in sys.argv:
            a.workload = "agentic"
        if a.workload == "agentic":
            a.requests = a.requests or 16
            a.agentic_sessions, a.agentic_system_prompts = 4, 1
            a.agentic_system_tokens, a.agentic_first_turn_tokens, a.agentic_turn_tokens = 512, 256, 128
            a.agentic_max_turns = 4
        a.max_prompt = min(a.max_prompt, 1024)
        a.max_output = min(a.max_output, 8)
        a.rate = a.rate if "--rate" in sys.argv else 0.5
    a.budgets = a.budgets or "ws,ws/4"
    bs = a.block_size
    a.max_model_len = a.max_model_len or (a.max_prompt + a.max_output + 2 * bs - 1) // bs * bs

    os.makedirs(a.out, exist_ok=True)
    work = os.path.abspath(a.out)
    py = server_python()
    if not py:
        sys.exit('vllm is not on PATH: eval "$(scripts/install-vllm.sh --env)" first')
    geo = geometry(a.model_size)
    model = a.model
    if model is None:
        model = os.path.join(work, f"model-{a.model_size}")
        if not os.path.exists(os.path.join(model, "config.json")):
            print(f"writing the {a.model_size} model to {model}", flush=True)
            subprocess.run([py, os.path.join(HERE, "make_model.py"), model, "--size", a.model_size, "--vocab",
                            str(a.vocab), "--positions", str(max(8192, a.max_model_len))], check=True,
                           stdout=subprocess.DEVNULL, timeout=900)
    else:
        with open(os.path.join(model, "config.json")) as f:
            c = json.load(f)
        geo = dict(layers=c["num_hidden_layers"], kv_heads=c["num_key_value_heads"],
                   head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"])
    per_tok = kv_bytes_per_token(geo)
    a.disk_bytes = parse_size(a.nvme_capacity) if a.nvme_capacity else shipped_nvme_capacity()
    if a.kv_base:
        a.kv_base_bytes = parse_size(a.kv_base)
    else:  # two requests of max_model_len; one with --smoke (its few requests come one at a time)
        a.kv_base_bytes = ((1 if a.smoke else 2) * a.max_model_len + a.block_size) * per_tok

    reqs = RC.build_workload(a)
    ws_tokens = W.working_set_tokens(reqs, a.block_size)
    ws = ws_tokens * per_tok
    budgets = []
    for b in a.budgets.split(","):
        b = b.strip()
        budgets.append(ws if b == "ws" else ws // int(b[3:]) if b.startswith("ws/") else parse_size(b))
    budgets = [max(b, 1 << 20) for b in budgets]
    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    for c in configs:
        if c not in CONFIGS:
            sys.exit(f"unknown configuration {c}; known: {', '.join(CONFIGS)}")
    print(f"{len(reqs)} requests, {W.total_tokens(reqs):,} prompt tokens, working set {ws_tokens:,} tokens "
          f"= {fmt_size(ws)} ({per_tok} B/token BF16); vLLM KV cache {fmt_size(a.kv_base_bytes)}; budgets "
          + ", ".join(fmt_size(b) for b in budgets) + f"; last arrival {reqs[-1].arrival_s:.0f} s", flush=True)

    env = dict(os.environ)
    rows = []
    meta = {"started": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "argv": sys.argv, "model": model, "geometry": geo, "kv_bytes_per_token": per_tok,
            "requests": len(reqs), "prompt_tokens": W.total_tokens(reqs), "working_set_tokens": ws_tokens,
            "working_set_bytes": ws, "kv_base_bytes": a.kv_base_bytes, "budgets": budgets,
            "args": {k: v for k, v in vars(a).items()}}
    out_json = os.path.join(work, "serve.json")
    for b in budgets:
        for c in configs:
            r = run_one(a, c, b, model, reqs, work, env, py)
            rows.append(r)
            s = (r.get("result") or {}).get("summary")
            print(f"   {c} @ {fmt_size(b)}: " + (json.dumps({k: s[k] for k in ("completed", "requests_per_s",
                                                                               "ttft_p50_ms", "cached_tokens")})
                                                 if s else "") + (f" error: {r['error']}" if r.get("error") else ""),
                  flush=True)
            with open(out_json, "w") as f:
                json.dump({"meta": meta, "rows": rows}, f, indent=1)
    render(rows, work, f"TTFT, {a.workload} ({len(reqs)} requests), {a.model_size} model")


def render(rows, work, title):
    """Writes serve.md (the table) and serve.png (one TTFT CDF per row that ran) into work."""
    md = table(rows)
    with open(os.path.join(work, "serve.md"), "w") as f:
        f.write(md + "\n")
    curves = {f"{r['config']} @ {fmt_size(r['budget_bytes'])}":
              [q.get("ttft_s") for q in r["result"]["requests"] if q and "error" not in q]
              for r in rows if r.get("result")}
    why = RC.plot_cdf(curves, os.path.join(work, "serve.png"), title=title)
    print(md)
    print(f"wrote {os.path.join(work, 'serve.md')}" + ("" if why else f", {os.path.join(work, 'serve.png')}"))
    if why:
        print(why)


def render_saved(path):
    """--table-from: the table and the CDF again from a run's serve.json, into its folder."""
    with open(path) as f:
        saved = json.load(f)
    meta = saved.get("meta") or {}
    args = meta.get("args") or {}
    render(saved["rows"], os.path.dirname(os.path.abspath(path)),
           f"TTFT, {args.get('workload', '?')} ({meta.get('requests', '?')} requests), "
           f"{args.get('model_size', '?')} model")


if __name__ == "__main__":
    main()
