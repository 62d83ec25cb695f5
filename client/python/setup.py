"""setuptools glue for pyproject.toml: the version and the installed-package note.

The version is read from project(kvtier VERSION ...) in the top-level CMakeLists.txt of
the source tree this folder belongs to ($KVTIER_VERSION overrides it for a copy of the
folder made elsewhere). The built package gets kvtier/_installed.py with that version;
it names no library folder, so the package looks for libkvtier.so on the loader's path.
"""

import os
import re

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def kvtier_version() -> str:
    env = os.environ.get("KVTIER_VERSION")
    if env:
        return env
    cmake = os.path.join(HERE, "..", "..", "CMakeLists.txt")
    try:
        with open(cmake, encoding="utf-8") as f:
            m = re.search(r"project\(kvtier\s+VERSION\s+([0-9][0-9.]*)", f.read())
    except OSError as e:
        raise SystemExit(f"kvtier: cannot read the version from {cmake} ({e}); set KVTIER_VERSION")
    if not m:
        raise SystemExit(f"kvtier: no 'project(kvtier VERSION ...)' in {cmake}; set KVTIER_VERSION")
    return m.group(1)


VERSION = kvtier_version()


class BuildPyWithVersion(build_py):
    def run(self):
        super().run()
        out = os.path.join(self.build_lib, "kvtier", "_installed.py")
        with open(out, "w", encoding="utf-8") as f:
            f.write("# Written by setup.py at build time.\n")
            f.write(f"VERSION = {VERSION!r}\n")
            f.write("LIBDIR = None  # libkvtier.so is on the loader's search path\n")


setup(version=VERSION, cmdclass={"build_py": BuildPyWithVersion})
