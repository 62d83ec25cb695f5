#!/usr/bin/env python3
"""The README's quickstart, C and Python, extracted and run as written against a real
kvtierd (host tier, no GPU), so that it never rots.

Run by ctest with KVTIER_BIN_DIR, KVTIER_LIB, KVTIER_CC, KVTIER_SOURCE_DIR,
KVTIER_GENERATED_INCLUDE (the build's kvtier/version.h) and PYTHONPATH set.
"""
import os
import re
import signal
import subprocess
import sys
import tempfile
import unittest

import kvtier.daemon

SRC = os.environ["KVTIER_SOURCE_DIR"]


def snippet(lang: str) -> str:
    with open(os.path.join(SRC, "README.md")) as f:
        text = f.read()
    m = re.search(r"<!-- quickstart:%s -->\n```%s\n(.*?)\n```" % (lang, lang), text, re.S)
    if not m:
        raise AssertionError(f"README.md has no quickstart:{lang} block")
    return m.group(1) + "\n"


class QuickstartTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="kvtier-qs-")
        d = self.tmp.name
        self.sock = os.path.join(d, "kvtierd.sock")
        cfg = os.path.join(d, "kvtier.toml")
        with open(cfg, "w") as f:
            f.write(f'[daemon]\nsocket = "{self.sock}"\nmetrics_port = 0\n[tiers.host]\ncapacity = "64MiB"\n'
                    f'[tiers.nvme]\ncapacity = "64MiB"\ndir = "{d}/nvme"\n')
        self.log = open(os.path.join(d, "kvtierd.log"), "w")
        self.proc = kvtier.daemon.start_kvtierd(cfg, self.sock, self.log)
        self.env = dict(os.environ, KVTIER_SOCKET=self.sock)

    def tearDown(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=20)
        self.log.close()
        self.tmp.cleanup()
        self.assertEqual(rc, 0)

    def check_output(self, out: str):
        self.assertIn("stored 6 blocks", out)
        self.assertIn("partial hit: 64 of 120 tokens cached, 56 to prefill", out)
        self.assertIn("miss: 0 tokens cached", out)

    def test_c(self):
        src = os.path.join(self.tmp.name, "quickstart.c")
        exe = os.path.join(self.tmp.name, "quickstart")
        with open(src, "w") as f:
            f.write(snippet("c"))
        libdir = os.path.dirname(os.environ["KVTIER_LIB"])
        cc = [os.environ["KVTIER_CC"], "-std=c11", "-Wall", "-Werror", src, "-I", os.path.join(SRC, "client", "include"),
              "-I", os.environ["KVTIER_GENERATED_INCLUDE"], "-L", libdir, "-lkvtier", "-Wl,-rpath," + libdir, "-o", exe]
        r = subprocess.run(cc, capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = subprocess.run([exe], capture_output=True, text=True, env=self.env, timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.check_output(r.stdout)

    def test_python(self):
        r = subprocess.run([sys.executable, "-c", snippet("python")], capture_output=True, text=True, env=self.env,
                           timeout=60)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.check_output(r.stdout)
        self.assertIn("lookup: 64 tokens cached", r.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)
