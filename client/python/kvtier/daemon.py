"""A private kvtierd for a test, an example or a benchmark: a temp folder with a config
sized for the run, the daemon's log in it, and a stop() that sends SIGTERM (clean drain)
and removes the folder.

    with kvtier.daemon.Daemon(slot_bytes=contract.block_bytes(), hbm="8GiB") as d:
        client = kvtier.Client(d.socket, has_gpu=True)

    # the shipped config/kvtier.toml as a user runs it, with only the keys below set
    with kvtier.daemon.Daemon.shipped({"tiers.hbm.capacity": "8GiB"}) as d: ...

    # an outage: kill -9 and a restart on the same NVMe folder, socket and log
    d = kvtier.daemon.Daemon.shipped({"tiers.host.capacity": "64MiB"}, folder=work)
    d.kill(); d.start(); d.stop()

Every engine test starts its daemon with Daemon.shipped (the config users run), unless it
tests another config and says which and why.

The binary comes from $KVTIER_BIN_DIR, else the repo's build/bin or build-gpu/bin, else
kvtierd on $PATH. $KVTIER_DAEMON_LOG_LEVEL overrides the daemon's log level (default
warn), and $KVTIER_DAEMON_LOG names a file that stop() appends the daemon's log to
before the temp folder goes. trace_copies=True sets the config's daemon.trace_copies, which
logs the timeline of every large acquire and copy batch.
"""
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))


def kvtierd_path():
    cands = []
    if os.environ.get("KVTIER_BIN_DIR"):
        cands.append(os.path.join(os.environ["KVTIER_BIN_DIR"], "kvtierd"))
    cands += [os.path.join(ROOT, b, "bin", "kvtierd") for b in ("build", "build-gpu")]
    found = shutil.which("kvtierd")
    if found:
        cands.append(found)
    for c in cands:
        if os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("kvtierd not found (set KVTIER_BIN_DIR): tried " + ", ".join(cands))


def wait_listening(proc, socket_path: str, timeout_s: float = 20.0, log: str = "") -> None:
    """Waits until kvtierd (proc) accepts on socket_path; RuntimeError when it exits first or
    timeout_s passes (with the tail of `log`, a file, when given)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kvtierd exited with {proc.returncode}: {_tail(log)}")
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect(socket_path)
            return
        except OSError:
            time.sleep(0.02)
        finally:
            s.close()
    raise RuntimeError(f"kvtierd did not listen on {socket_path} within {timeout_s} s: {_tail(log)}")


def wait_until(fn, timeout_s: float = 30.0, every_s: float = 0.2):
    """Calls fn until it returns something true or timeout_s passes; returns its last result
    (for a test waiting on a daemon that comes back, with a bound)."""
    deadline = time.time() + timeout_s
    while True:
        r = fn()
        if r or time.time() > deadline:
            return r
        time.sleep(every_s)


def start_kvtierd(config: str, socket_path: str, log=None, timeout_s: float = 20.0):
    """kvtierd --config `config` as a child process, returned once it listens on socket_path
    (for a test that writes its own config; Daemon and Daemon.shipped for the rest). log: a
    file path or an open file for its output (default: none)."""
    out = open(log, "a") if isinstance(log, str) else (log if log is not None else subprocess.DEVNULL)
    proc = subprocess.Popen([kvtierd_path(), "--config", config], stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_listening(proc, socket_path, timeout_s, log if isinstance(log, str) else "")
    except RuntimeError:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    return proc


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path) as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""


class Daemon:
    @classmethod
    def shipped(cls, sets=None, log_level=None, timeout_s=120, folder=None):
        """kvtierd on the repo's config/kvtier.toml, changed only by `sets` ({"section.key":
        value}, each passed as --set) and by what a private daemon must own: its socket and
        log in a temp folder, no metrics port, and its NVMe folder (a temp folder unless
        `sets` names tiers.nvme.dir). folder: a folder of the caller's for the socket, log
        and NVMe tier instead, kept at stop(), so that the daemon can be killed and started
        again on the same NVMe folder and socket (start())."""
        d = cls.__new__(cls)
        d._prepare(folder)
        shipped = os.path.join(ROOT, "config", "kvtier.toml")
        sets = dict(sets or {})
        sets.setdefault("daemon.log_level", log_level or os.environ.get("KVTIER_DAEMON_LOG_LEVEL", "warn"))
        sets.setdefault("tiers.nvme.dir", os.path.join(d.dir, "nvme"))
        own = {"daemon.socket": d.socket, "daemon.metrics_port": 0}
        args = ["--config", shipped]
        for k, v in {**sets, **own}.items():
            args += ["--set", f"{k}={v}"]
        d._start(args, timeout_s)
        return d

    def _prepare(self, folder=None):
        self._own_dir = folder is None
        self.dir = tempfile.mkdtemp(prefix="kvtierd-") if folder is None else folder
        os.makedirs(self.dir, exist_ok=True)
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.log = os.path.join(self.dir, "kvtierd.log")
        self.proc = None

    def __init__(self, slot_bytes, hbm="8GiB", host="16GiB", nvme="32GiB", nvme_dir=None, policy="prefix-lru",
                 log_level=None, timeout_s=120, trace_copies=False, slot_classes="auto",
                 slab_bytes="auto", host_watermarks=(0.95, 0.85), client_share=None):
        """hbm=None starts a daemon without an HBM tier. slot_classes: the slot sizes
        (tiers.slot_classes: "auto", the daemon's default; "per-contract", a slot size made
        for each contract as it registers, slot_bytes then the largest block; or a list of
        bytes whose largest is slot_bytes rounded up to 4 KiB; [] or None: one slot size),
        sharing slabs of
        slab_bytes (tiers.slab_bytes, "auto" or a size). host_watermarks: the host tier's
        (high, low) watermarks. client_share: daemon.max_tier_share_per_client, the share of
        each tier's bytes one client may hold under its leases (None: the daemon's default,
        0.75; 1.0 where the one engine under test is the daemon's only client and its pages
        fill the HBM tier sized for them)."""
        log_level = log_level or os.environ.get("KVTIER_DAEMON_LOG_LEVEL", "warn")
        self._prepare(None)
        slot = (int(slot_bytes) + 4095) // 4096 * 4096
        nvme_dir = nvme_dir or os.path.join(self.dir, "nvme")
        os.makedirs(nvme_dir, exist_ok=True)
        cfg = f"""[daemon]
socket = "{self.socket}"
log_level = "{log_level}"
metrics_port = 0
ring_data_bytes = "16MiB"
trace_copies = {"true" if trace_copies else "false"}
{"" if client_share is None else f"max_tier_share_per_client = {float(client_share)!r}"}
[tiers]
slot_bytes = {slot}
slot_classes = {f'"{slot_classes}"' if isinstance(slot_classes, str) else
                 "[" + ", ".join(str((int(x) + 4095) // 4096 * 4096) for x in (slot_classes or [])) + "]"}
slab_bytes = "{slab_bytes}"
{{hbm_section}}[tiers.host]
capacity = "{host}"
high_watermark = {float(host_watermarks[0])!r}
low_watermark = {float(host_watermarks[1])!r}
policy = "{policy}"
on_evict = "demote"
[tiers.nvme]
capacity = "{nvme}"
dir = "{nvme_dir}"
policy = "lru"
admission = "always"
"""
        self.config = os.path.join(self.dir, "kvtier.toml")
        cfg = cfg.replace("{hbm_section}", "" if hbm is None else
                          f'[tiers.hbm]\ncapacity = "{hbm}"\npolicy = "{policy}"\non_evict = "demote"\n')
        with open(self.config, "w") as f:
            f.write(cfg)
        self._start(["--config", self.config], timeout_s)

    def _start(self, args, timeout_s):
        self._args, self._timeout_s = args, timeout_s
        with open(self.log, "a") as out:
            self.proc = subprocess.Popen([kvtierd_path()] + args, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_listening(self.proc, self.socket, timeout_s, self.log)  # a large host tier takes a while to pin
        except RuntimeError:
            self.stop(keep=not self._own_dir)
            raise

    def tail(self, n=20):
        return _tail(self.log, n)

    def start(self):
        """Starts the daemon again (after stop(keep=True) or kill()) with the same config,
        socket and NVMe folder; returns once it listens."""
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("kvtierd is running")
        self._start(self._args, self._timeout_s)

    def kill(self):
        """SIGKILL: the daemon dies at once (an outage as a crash makes it); start() brings it
        back on the same NVMe folder."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, keep=False):
        """SIGTERM (a clean drain). The temp folder goes too unless keep=True (or the folder
        is the caller's)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if keep:
            return
        keep = os.environ.get("KVTIER_DAEMON_LOG")
        if keep:
            try:
                with open(self.log) as src, open(keep, "a") as dst:
                    dst.write(src.read())
            except OSError:
                pass
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
