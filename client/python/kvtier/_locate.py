"""Where the package finds libkvtier.so and libkvtier_kernels.so, and its version.

The version is written once, in project(kvtier VERSION ...) of the top-level
CMakeLists.txt. An installed package (cmake --install, the .deb, pip) carries it in
_installed.py, written at install time; a source checkout reads it from CMakeLists.txt.

libkvtier.so, first that exists:
  1. $KVTIER_LIB (a path), and nothing else when it is set;
  2. build/lib/libkvtier.so of the source tree this package sits in;
  3. the library folder installed beside this package (_installed.LIBDIR, relative to it);
  4. the loader's search path: ctypes.util.find_library("kvtier"), then the soname.
libkvtier_kernels.so: $KVTIER_KERNELS_LIB, then next to $KVTIER_LIB, then the source
tree's build folders, then the installed library folder, then the loader's search path.
"""

from __future__ import annotations

import ctypes.util
import os
import re
from typing import List, Optional

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))

try:
    from . import _installed  # written by the install rules or by setup.py
except ImportError:  # a source checkout
    _installed = None

LIB_SONAME = getattr(_installed, "SONAME", None) or "libkvtier.so.1"


def _installed_libdir() -> Optional[str]:
    rel = getattr(_installed, "LIBDIR", None)
    return os.path.normpath(os.path.join(_HERE, rel)) if rel else None


def package_version() -> str:
    """The version this package was installed as, or the source tree's CMake version."""
    v = getattr(_installed, "VERSION", None)
    if v:
        return v
    try:
        with open(os.path.join(_SOURCE_ROOT, "CMakeLists.txt"), encoding="utf-8") as f:
            m = re.search(r"project\(kvtier\s+VERSION\s+([0-9][0-9.]*)", f.read())
        if m:
            return m.group(1)
    except OSError:
        pass
    return "0+unknown"


def library_candidates() -> List[str]:
    env = os.environ.get("KVTIER_LIB")
    if env:
        return [env]
    out = [os.path.join(_SOURCE_ROOT, "build", "lib", "libkvtier.so")]
    libdir = _installed_libdir()
    if libdir:
        out.append(os.path.join(libdir, LIB_SONAME))
    found = ctypes.util.find_library("kvtier")
    if found:
        out.append(found)
    out.append(LIB_SONAME)
    return out


def kernels_candidates() -> List[str]:
    out = []
    env = os.environ.get("KVTIER_KERNELS_LIB")
    if env:
        out.append(env)
    klib = os.environ.get("KVTIER_LIB")
    if klib:  # usually next to libkvtier.so
        out.append(os.path.join(os.path.dirname(klib), "libkvtier_kernels.so"))
    for build in ("build", "build-gpu"):
        out.append(os.path.join(_SOURCE_ROOT, build, "lib", "libkvtier_kernels.so"))
    libdir = _installed_libdir()
    if libdir:
        out.append(os.path.join(libdir, "libkvtier_kernels.so"))
    out.append("libkvtier_kernels.so")
    return out

