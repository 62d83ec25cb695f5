#!/bin/bash
# Stages, on the build machine, what tools/gpu/run.sh needs on the GPU machine:
#   $DC/build/  the build tree minus objects and archives (test and bench binaries,
#                     shared libraries, CTest files), so `ctest -L gpu` works there
#   $DC/lib/    shared libraries the binaries link that the GPU image lacks (ldd)
# Usage: tools/gpu/stage.sh [BUILD_DIR]   (default build-kernels; .devcarry is gitignored)
# DEVCARRY=.devcarry-NAME stages into another gitignored folder (one per worktree).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-kernels}
DC=${DEVCARRY:-.devcarry}
case "$DC" in .devcarry|.devcarry-*) ;; *) echo "DEVCARRY must be .devcarry or .devcarry-NAME" >&2; exit 2 ;; esac
rm -rf $DC/build $DC/lib
mkdir -p $DC/build $DC/lib
# The tree's CTest files, binaries and shared libraries only.
(cd "$BUILD" && find . \( -name 'CTestTestfile.cmake' -o -name '*_include.cmake' -o -name '*_tests.cmake' -o -name '*_discovery.cmake' \
    -o -path './bin/*' -o -path './lib/*.so*' \) -print0 | tar --null -T - -cf -) | tar -C $DC/build -xf -
# Non-system shared libraries the binaries need (the GPU image has glibc/libstdc++).
for f in $DC/build/bin/* $DC/build/lib/*.so*; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
  | grep -v "$PWD" | while read -r lib; do cp -L "$lib" $DC/lib/; done
# gtest_discover_tests' include (CMake 3) or discovery (CMake 4) files load this CMake
# module by its absolute path; CMake 4's includes its GoogleTest/ folder beside it.
mkdir -p $DC/cmake
grep -h -o '/[^ "]*GoogleTestAddTests.cmake' -r $DC/build --include='*_include.cmake' --include='*_discovery.cmake' | sort -u \
  | while read -r m; do
      cp "$m" $DC/cmake/; echo "$m" > $DC/cmake/path.txt
      if [ -d "$(dirname "$m")/GoogleTest" ]; then cp -r "$(dirname "$m")/GoogleTest" $DC/cmake/; fi
    done
# Debug info makes a full build ~200 MB; the device tool carries at most 64 MiB.
strip --strip-debug $DC/build/bin/* $DC/build/lib/*.so* $DC/lib/*.so* 2>/dev/null || true
du -sh "$DC"
ls $DC/lib
