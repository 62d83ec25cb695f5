#!/usr/bin/env python3
"""kvtier installed as a user or an operator gets it: one ctest entry per case.

    install_test.py CASE --source DIR --build DIR --version X.Y.Z [--cuda ON|OFF]

prefix      cmake --install into <build>/install-test/prefix (the fixture the other cases
            use) and with DESTDIR; checks the layout, the soname, the config's paths
version     every place the version shows: kvtierd/kvtierctl --version, the C ABI, the
            Python package, kvtier_build_info, the attach log line
systemd     systemd-analyze verify on the installed kvtierd.service
pkgconfig   tests/install/consumer/consumer.c built with pkg-config, run against the
            installed kvtierd (lookup, alloc, commit, acquire)
cmake       the same program, and one on the C++ wrapper, as a CMake project using
            find_package(kvtier CONFIG)
python      the installed package loads the installed libkvtier.so without environment
            variables and still honours KVTIER_LIB; pip installs client/python offline
promtool    promtool check metrics accepts the installed kvtierd's /metrics
grafana     every query of tools/grafana/kvtier.json names a metric the daemon exports
deb         cpack -G DEB from the build folder; Depends, conffiles, contents; dpkg-deb -x
            into a temporary root and the daemon and CLI run from there

A case whose tool is missing prints "SKIPPED: <reason>" (ctest reports it as skipped).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ARGS = None


class Skip(Exception):
    pass


def fail(msg: str):
    raise AssertionError(msg)


def run(cmd, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("timeout", 300)
    p = subprocess.run(cmd, **kw)
    if p.returncode != 0:
        fail(f"{' '.join(map(str, cmd))} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


def need(tool: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise Skip(f"{tool} not found (scripts/install-deps.sh installs it)")
    return path


def prefix() -> str:
    return os.path.join(ARGS.build, "install-test", "prefix")


def need_prefix() -> str:
    p = prefix()
    if not os.path.exists(os.path.join(p, "bin", "kvtierd")):
        fail(f"{p} has no bin/kvtierd: the install_prefix case must run first (ctest fixture)")
    return p


def clean_env() -> dict:
    """The environment without kvtier's lookup variables (KVTIER_LIB, ...)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KVTIER_") and k != "PYTHONPATH"
            and k != "LD_LIBRARY_PATH"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Daemon:
    """An installed kvtierd on the installed config, with the socket and the NVMe tier
    moved into a temporary folder and small tiers."""

    def __init__(self, root: str, kvtierd: str, config: str, env=None, metrics=False):
        self.dir = tempfile.mkdtemp(prefix="kvtier-install-", dir=root)
        self.socket = os.path.join(self.dir, "kvtierd.sock")
        self.port = free_port() if metrics else 0
        self.log_path = os.path.join(self.dir, "kvtierd.log")
        cmd = [kvtierd, "--config", config,
               "--set", f"daemon.socket={self.socket}",
               "--set", f"tiers.nvme.dir={os.path.join(self.dir, 'nvme')}",
               # NVMe holds one record of the largest block the shipped config allows
               # (tiers.slot_bytes 64 MiB + a 4 KiB header), twice over.
               "--set", "tiers.host.capacity=64MiB", "--set", "tiers.nvme.capacity=160MiB",
               "--set", f"daemon.metrics_port={self.port}"]
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env or clean_env(),
                                     cwd=self.dir)
        deadline = time.time() + 30
        while not os.path.exists(self.socket):
            if self.proc.poll() is not None or time.time() > deadline:
                self.stop()
                fail(f"kvtierd did not start ({' '.join(cmd)}):\n{self.output()}")
            time.sleep(0.05)

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        with open(self.log_path) as f:
            return f.read()

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as r:
            return r.read().decode()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def installed_daemon(**kw) -> Daemon:
    p = need_prefix()
    return Daemon(os.path.join(ARGS.build, "install-test"), os.path.join(p, "bin", "kvtierd"),
                  os.path.join(p, "etc", "kvtier", "kvtier.toml"), **kw)


def soname(path: str) -> str:
    out = run(["readelf", "-d", path]).stdout
    m = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", out)
    return m.group(1) if m else ""


# ---- cases ---------------------------------------------------------------------------

def case_prefix():
    root = os.path.join(ARGS.build, "install-test")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    p = prefix()
    run(["cmake", "--install", ARGS.build, "--prefix", p])
    expect = ["bin/kvtierd", "bin/kvtierctl", "bin/kvtier-bench", "lib/libkvtier.so", "lib/libkvtier.so.1",
              "include/kvtier/kvtier.h", "include/kvtier/kvtier.hpp", "include/kvtier/version.h",
              "include/kvtier/tier_stats.h", "include/kvtier/tier_stats_fields.h",
              "include/kvtier/kernels.h", "lib/pkgconfig/kvtier.pc", "lib/cmake/kvtier/kvtierConfig.cmake",
              "lib/cmake/kvtier/kvtierConfigVersion.cmake", "etc/kvtier/kvtier.toml",
              "lib/systemd/system/kvtierd.service", "lib/sysusers.d/kvtier.conf",
              "lib/python3/dist-packages/kvtier/__init__.py", "lib/python3/dist-packages/kvtier/_installed.py",
              "share/kvtier/grafana/kvtier.json"]
    kernels = "lib/libkvtier_kernels.so"
    if ARGS.cuda == "ON":
        expect.append(kernels)
    elif os.path.exists(os.path.join(p, kernels)):
        fail(f"{kernels} installed by a build without CUDA")
    missing = [e for e in expect if not os.path.exists(os.path.join(p, e))]
    if missing:
        fail(f"not installed under {p}: {missing}")
    if soname(os.path.join(p, "lib", "libkvtier.so.1")) != "libkvtier.so.1":
        fail("libkvtier.so.1 has no soname libkvtier.so.1")
    if os.path.realpath(os.path.join(p, "lib", "libkvtier.so")) != os.path.realpath(os.path.join(p, "lib", "libkvtier.so.1")):
        fail("libkvtier.so is not a link to libkvtier.so.1")
    toml = open(os.path.join(p, "etc", "kvtier", "kvtier.toml")).read()
    unit = open(os.path.join(p, "lib", "systemd", "system", "kvtierd.service")).read()
    for key, value in (("socket", "/run/kvtier/kvtierd.sock"), ("dir", "/var/lib/kvtier/nvme")):
        if f'\n{key} = "{value}"' not in toml:
            fail(f"installed config does not set {key} = \"{value}\"")
    for line in ("RuntimeDirectory=kvtier", "StateDirectory=kvtier", "LimitMEMLOCK=infinity",
                 "ExecReload=/bin/kill -HUP $MAINPID",
                 f"ExecStart={p}/bin/kvtierd --config {p}/etc/kvtier/kvtier.toml"):
        if line not in unit.splitlines():
            fail(f"kvtierd.service lacks '{line}'")
    # The installed config is valid as it stands (its folders aside, which --check needs).
    d = tempfile.mkdtemp(dir=root)
    run([os.path.join(p, "bin", "kvtierd"), "--config", os.path.join(p, "etc", "kvtier", "kvtier.toml"),
         "--set", f"daemon.socket={d}/s.sock", "--set", f"tiers.nvme.dir={d}/nvme", "--check"], env=clean_env())

    # DESTDIR: files land under it, and nothing in them names it.
    dest = os.path.join(root, "destdir")
    env = dict(os.environ, DESTDIR=dest)
    run(["cmake", "--install", ARGS.build, "--prefix", "/opt/kvtier"], env=env)
    for e in expect:
        if not os.path.exists(os.path.join(dest, "opt", "kvtier", e)):
            fail(f"DESTDIR install lacks opt/kvtier/{e}")
    dunit = open(os.path.join(dest, "opt/kvtier/lib/systemd/system/kvtierd.service")).read()
    if "ExecStart=/opt/kvtier/bin/kvtierd --config /opt/kvtier/etc/kvtier/kvtier.toml" not in dunit or dest in dunit:
        fail("DESTDIR install: the unit does not name /opt/kvtier paths alone")
    # Prefix /usr puts the config in /etc (what the .deb holds).
    dest2 = os.path.join(root, "destdir-usr")
    run(["cmake", "--install", ARGS.build, "--prefix", "/usr"], env=dict(os.environ, DESTDIR=dest2))
    if not os.path.exists(os.path.join(dest2, "etc/kvtier/kvtier.toml")):
        fail("prefix /usr: config not in /etc/kvtier/kvtier.toml")
    if "--config /etc/kvtier/kvtier.toml" not in open(os.path.join(dest2, "usr/lib/systemd/system/kvtierd.service")).read():
        fail("prefix /usr: the unit does not name /etc/kvtier/kvtier.toml")
    shutil.rmtree(dest, ignore_errors=True)
    shutil.rmtree(dest2, ignore_errors=True)
    print(f"installed {len(expect)} files into {p}; DESTDIR and prefix /usr installs checked")


def case_version():
    v = ARGS.version
    p = need_prefix()
    for prog, pattern in (("kvtierd", rf"^kvtierd {re.escape(v)} \(protocol \d+\)$"),
                          ("kvtierctl", rf"^kvtierctl {re.escape(v)}$")):
        out = run([os.path.join(p, "bin", prog), "--version"], env=clean_env()).stdout.strip()
        if not re.match(pattern, out):
            fail(f"{prog} --version printed {out!r}, expected {pattern}")
    header = open(os.path.join(p, "include", "kvtier", "version.h")).read()
    if f'#define KVTIER_VERSION_STRING "{v}"' not in header:
        fail("kvtier/version.h does not define KVTIER_VERSION_STRING " + v)
    code = ("import kvtier; print(kvtier.__version__); print(kvtier.library_version()); "
            "print(kvtier.library_path())")
    env = clean_env()
    env["PYTHONPATH"] = os.path.join(p, "lib", "python3", "dist-packages")
    out = run([sys.executable, "-c", code], env=env).stdout.split()
    if out[0] != v or out[1] != v:
        fail(f"Python __version__ {out[0]}, library_version() {out[1]}, expected {v}")
    with installed_daemon(metrics=True) as d:
        m = re.search(r'^kvtier_build_info\{version="([^"]+)",protocol="(\d+)",cuda="(yes|no)"\} 1$', d.metrics(), re.M)
        if not m or m.group(1) != v:
            fail(f"kvtier_build_info with version {v} not on /metrics")
        if m.group(3) != ("yes" if ARGS.cuda == "ON" else "no"):
            fail(f"kvtier_build_info cuda={m.group(3)} for a build with CUDA {ARGS.cuda}")
        run([sys.executable, "-c", f"import kvtier; kvtier.Client({d.socket!r}, name='version-check').close()"],
            env=env)
        deadline = time.time() + 10
        pat = re.compile(rf"client \d+ \(version-check, pid \d+\) attached to kvtierd {re.escape(v)} \(protocol \d+\)")
        while not pat.search(d.output()):
            if time.time() > deadline:
                fail(f"no attach line naming kvtierd {v} in the log:\n{d.output()}")
            time.sleep(0.05)
    print(f"version {v}: kvtierd, kvtierctl, version.h, Python, kvtier_build_info and the attach line agree")


def case_systemd():
    tool = need("systemd-analyze")
    unit = os.path.join(need_prefix(), "lib", "systemd", "system", "kvtierd.service")
    p = subprocess.run([tool, "verify", unit], capture_output=True, text=True, timeout=120)
    # verify also reports on the system's own units; lines about kvtierd.service count.
    ours = [l for l in (p.stdout + p.stderr).splitlines() if "kvtierd.service" in l]
    if p.returncode != 0 or ours:
        fail(f"systemd-analyze verify {unit} (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    print(f"systemd-analyze verify: {unit} clean")


def run_consumer(exe: str, done: str = "consumer: ok"):
    with installed_daemon() as d:
        out = run([exe, d.socket], env=clean_env()).stdout
        if done not in out:
            fail(f"{exe} did not finish:\n{out}")
        print(out.strip())


def case_pkgconfig():
    need("pkg-config")
    cc = need("cc")
    p = need_prefix()
    work = tempfile.mkdtemp(dir=os.path.join(ARGS.build, "install-test"))
    env = clean_env()
    env["PKG_CONFIG_PATH"] = os.path.join(p, "lib", "pkgconfig")
    ver = run(["pkg-config", "--modversion", "kvtier"], env=env).stdout.strip()
    if ver != ARGS.version:
        fail(f"pkg-config --modversion kvtier: {ver}, expected {ARGS.version}")
    flags = run(["pkg-config", "--cflags", "--libs", "kvtier"], env=env).stdout.split()
    libdir = run(["pkg-config", "--variable=libdir", "kvtier"], env=env).stdout.strip()
    if os.path.realpath(libdir) != os.path.realpath(os.path.join(p, "lib")):
        fail(f"kvtier.pc libdir {libdir} is not {p}/lib")
    exe = os.path.join(work, "consumer")
    src = os.path.join(ARGS.source, "tests", "install", "consumer", "consumer.c")
    run([cc, "-std=c11", "-Wall", "-Werror", "-o", exe, src] + flags + [f"-Wl,-rpath,{libdir}"], env=env)
    run_consumer(exe)
    shutil.rmtree(work, ignore_errors=True)


def case_cmake():
    p = need_prefix()
    work = tempfile.mkdtemp(dir=os.path.join(ARGS.build, "install-test"))
    src = os.path.join(ARGS.source, "tests", "install", "consumer")
    bld = os.path.join(work, "build")
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", src, "-B", bld, *gen, f"-DCMAKE_PREFIX_PATH={p}",
         f"-DKVTIER_CONSUMER_EXPECT_KERNELS={ARGS.cuda}"], env=clean_env())
    run(["cmake", "--build", bld], env=clean_env())
    run_consumer(os.path.join(bld, "kvtier-consumer"))
    run_consumer(os.path.join(bld, "kvtier-consumer-cxx"), "consumer-cxx: ok")
    shutil.rmtree(work, ignore_errors=True)


def case_python():
    p = need_prefix()
    site = os.path.join(p, "lib", "python3", "dist-packages")
    env = clean_env()
    env["PYTHONPATH"] = site
    code = "import kvtier; print(kvtier.library_path())"
    with installed_daemon() as d:
        # Without variables: the library installed beside the package.
        path = run([sys.executable, "-c", code], env=env).stdout.strip()
        if os.path.realpath(path) != os.path.realpath(os.path.join(p, "lib", "libkvtier.so.1")):
            fail(f"installed package loaded {path}, not {p}/lib/libkvtier.so.1")
        script = ("import kvtier\n"
                  f"c = kvtier.Client({d.socket!r}, name='python-installed')\n"
                  "cid = c.register_contract(kvtier.Contract(model_id='py/test', num_layers=2, num_kv_heads=1,"
                  " head_dim=128, block_tokens=16))\n"
                  "keys = kvtier.key_chain(cid, list(range(32)), 16)\n"
                  "assert c.lookup(cid, keys).hit_blocks == 0\n"
                  "c.close()\nprint('python: ok')\n")
        out = run([sys.executable, "-c", script], env=env).stdout
        if "python: ok" not in out:
            fail(out)
    if ARGS.cuda == "ON":  # the kernels library installed beside it, without variables
        kpath = run([sys.executable, "-c", "import kvtier.kernels as k; print(k.library()._name)"],
                    env=env).stdout.strip()
        if os.path.realpath(kpath) != os.path.realpath(os.path.join(p, "lib", "libkvtier_kernels.so")):
            fail(f"installed package loaded kernels {kpath}, not {p}/lib/libkvtier_kernels.so")
    # KVTIER_LIB still wins, and a wrong one fails naming it.
    bogus = os.path.join(ARGS.build, "install-test", "no-such-libkvtier.so")
    env2 = dict(env, KVTIER_LIB=bogus)
    q = subprocess.run([sys.executable, "-c", code], env=env2, capture_output=True, text=True, timeout=60)
    if q.returncode == 0 or bogus not in q.stderr:
        fail(f"KVTIER_LIB={bogus} was not honoured (exit {q.returncode}): {q.stdout}{q.stderr}")
    build_lib = os.path.join(ARGS.build, "lib", "libkvtier.so")
    out = run([sys.executable, "-c", code], env=dict(env, KVTIER_LIB=build_lib)).stdout.strip()
    if out != build_lib:
        fail(f"KVTIER_LIB={build_lib} loaded {out}")

    # pip, offline, setuptools only, from a copy of the source folder, with the first
    # python3 that has pip, setuptools and wheel (Debian's: python3-pip pulls them in).
    py = None
    for cand in dict.fromkeys([sys.executable, "/usr/bin/python3"]):
        if os.path.exists(cand) and all(subprocess.run([cand, *c], capture_output=True).returncode == 0 for c in (
                ["-m", "pip", "--version"], ["-c", "import setuptools, wheel"])):
            py = cand
            break
    if py is None:
        raise Skip("no python3 with pip, setuptools and wheel (Debian: python3-pip); "
                   "the installed package's checks passed")
    work = tempfile.mkdtemp(dir=os.path.join(ARGS.build, "install-test"))
    src = os.path.join(work, "src")
    shutil.copytree(os.path.join(ARGS.source, "client", "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    target = os.path.join(work, "site")
    penv = dict(clean_env(), KVTIER_VERSION=ARGS.version, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    run([py, "-m", "pip", "install", "--no-build-isolation", "--no-deps", "--no-index",
         "--target", target, src], env=penv)
    env3 = dict(clean_env(), PYTHONPATH=target, KVTIER_LIB=build_lib)
    out = run([py, "-c", "import kvtier; print(kvtier.__version__, kvtier.library_version())"],
              env=env3).stdout.split()
    if out != [ARGS.version, ARGS.version]:
        fail(f"pip-installed package: version {out}, expected {ARGS.version} twice")
    shutil.rmtree(work, ignore_errors=True)
    print(f"python: installed package finds its library; KVTIER_LIB honoured; {py} -m pip install works offline")


def traffic(d: Daemon):
    """Requests of every kind the dashboard plots, and one that fails."""
    p = need_prefix()
    env = dict(clean_env(), PYTHONPATH=os.path.join(p, "lib", "python3", "dist-packages"))
    script = ("import kvtier\n"
              f"c = kvtier.Client({d.socket!r}, name='metrics')\n"
              "cid = c.register_contract(kvtier.Contract(model_id='m/test', num_layers=2, num_kv_heads=1,"
              " head_dim=128, block_tokens=16))\n"
              "keys = kvtier.key_chain(cid, list(range(64)), 16)\n"
              "c.lookup(cid, keys)\n"
              "try:\n    c.acquire(cid, keys, tier='host')\nexcept kvtier.KvtierError:\n    pass\n"
              "c.stats()\nc.close()\n")
    run([sys.executable, "-c", script], env=env)


def case_promtool():
    tool = need("promtool")
    with installed_daemon(metrics=True) as d:
        traffic(d)
        page = d.metrics()
    p = subprocess.run([tool, "check", "metrics"], input=page, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        fail(f"promtool check metrics (exit {p.returncode}):\n{p.stdout}{p.stderr}")
    families = len(re.findall(r"^# TYPE ", page, re.M))
    print(f"promtool check metrics: {families} families, {len(page.splitlines())} lines accepted")


def exported_names(page: str) -> set:
    """Sample names a scrape can hold: each # TYPE family, with _bucket/_sum/_count for
    histograms (and _sum/_count for summaries)."""
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", page, re.M):
        names.add(name)
        if kind == "histogram":
            names.update({name + "_bucket", name + "_sum", name + "_count"})
        elif kind == "summary":
            names.update({name + "_sum", name + "_count"})
    return names


def case_grafana():
    path = os.path.join(ARGS.source, "tools", "grafana", "kvtier.json")
    dash = json.load(open(path))
    exprs = []

    def walk(panels):
        for pnl in panels:
            for t in pnl.get("targets", []):
                exprs.append((pnl.get("title", "?"), t.get("expr", "")))
            walk(pnl.get("panels", []))

    walk(dash.get("panels", []))
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            exprs.append((f"variable {var.get('name')}", q if isinstance(q, str) else q.get("query", "")))
    if not exprs:
        fail(f"{path}: no queries")
    with installed_daemon(metrics=True) as d:
        traffic(d)
        names = exported_names(d.metrics())
    bad = []
    used = set()
    for title, e in exprs:
        metrics = set(re.findall(r"\bkvtier_[a-z0-9_]+", e))
        if not metrics:
            bad.append(f"{title}: query names no kvtier metric: {e}")
        for m in metrics - names:
            bad.append(f"{title}: {m} is not exported by kvtierd")
        used |= metrics
    if bad:
        fail("\n".join(bad))
    print(f"grafana: {len(exprs)} queries over {len(used)} metrics, all exported")


def case_deb():
    need("cpack")
    need("dpkg-deb")
    need("dpkg-shlibdeps")
    root = os.path.join(ARGS.build, "install-test")
    os.makedirs(root, exist_ok=True)
    out = tempfile.mkdtemp(prefix="deb-", dir=root)
    run(["cpack", "-G", "DEB", "--config", os.path.join(ARGS.build, "CPackConfig.cmake"), "-B", out], timeout=600)
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    deb = os.path.join(out, f"kvtier_{ARGS.version}_{arch}.deb")
    if not os.path.exists(deb):
        fail(f"{deb} not built; {out} holds {os.listdir(out)}")
    info = run(["dpkg-deb", "-f", deb, "Package", "Version", "Depends"]).stdout
    depends = re.search(r"^Depends: (.*)$", info, re.M).group(1)
    dep_names = {d.strip().split(" ")[0] for d in depends.split(",")}
    # Runtime packages of libraries the binaries link (read back from the build's ELF).
    for lib_pkg in ("libc6", "libstdc++6", "libxxhash0", "liburing2", "python3"):
        if lib_pkg not in dep_names:
            fail(f"Depends lacks {lib_pkg}: {depends}")
    if any(n.endswith("-dev") for n in dep_names):
        fail(f"Depends names a -dev package: {depends}")
    ctrl = os.path.join(out, "control")
    run(["dpkg-deb", "-e", deb, ctrl])
    if open(os.path.join(ctrl, "conffiles")).read().split() != ["/etc/kvtier/kvtier.toml"]:
        fail("conffiles is not /etc/kvtier/kvtier.toml")
    x = os.path.join(out, "root")
    run(["dpkg-deb", "-x", deb, x])
    for f in ("usr/bin/kvtierd", "usr/bin/kvtierctl", "usr/lib/libkvtier.so.1", "etc/kvtier/kvtier.toml",
              "usr/lib/systemd/system/kvtierd.service", "usr/lib/python3/dist-packages/kvtier/__init__.py",
              "usr/include/kvtier/kvtier.h", "usr/lib/pkgconfig/kvtier.pc") + (
                  ("usr/lib/libkvtier_kernels.so",) if ARGS.cuda == "ON" else ()):
        if not os.path.exists(os.path.join(x, f)):
            fail(f"the .deb lacks /{f}")
    unit = open(os.path.join(x, "usr/lib/systemd/system/kvtierd.service")).read()
    if "ExecStart=/usr/bin/kvtierd --config /etc/kvtier/kvtier.toml" not in unit:
        fail("the packaged unit does not start /usr/bin/kvtierd with /etc/kvtier/kvtier.toml")
    kvtierd = os.path.join(x, "usr", "bin", "kvtierd")
    kvtierctl = os.path.join(x, "usr", "bin", "kvtierctl")
    v = run([kvtierd, "--version"], env=clean_env()).stdout.strip()
    if not v.startswith(f"kvtierd {ARGS.version} "):
        fail(f"packaged kvtierd --version: {v}")
    with Daemon(root, kvtierd, os.path.join(x, "etc", "kvtier", "kvtier.toml")) as d:
        st = run([kvtierctl, "--socket", d.socket, "stats"], env=clean_env()).stdout
        if "host" not in st:
            fail(f"packaged kvtierctl stats printed no host tier:\n{st}")
        env = dict(clean_env(), PYTHONPATH=os.path.join(x, "usr/lib/python3/dist-packages"))
        lib = run([sys.executable, "-c", "import kvtier; print(kvtier.library_path())"], env=env).stdout.strip()
        if os.path.realpath(lib) != os.path.realpath(os.path.join(x, "usr/lib/libkvtier.so.1")):
            fail(f"packaged Python package loaded {lib}")
    size = os.path.getsize(deb)
    shutil.rmtree(out, ignore_errors=True)
    print(f"deb: {os.path.basename(deb)} ({size / 1e6:.1f} MB); Depends: {depends}")


CASES = {n[len("case_"):]: f for n, f in globals().items() if n.startswith("case_")}


def main() -> int:
    global ARGS
    ap = argparse.ArgumentParser()
    ap.add_argument("case", choices=sorted(CASES))
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--cuda", default="OFF", choices=["ON", "OFF"])
    ARGS = ap.parse_args()
    ARGS.source = os.path.abspath(ARGS.source)
    ARGS.build = os.path.abspath(ARGS.build)
    try:
        CASES[ARGS.case]()
    except Skip as e:
        print(f"SKIPPED: {e}")
        return 0
    except AssertionError as e:
        print(f"FAILED: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
