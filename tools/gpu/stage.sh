#!/bin/bash
# Stages, on the build machine, what tools/gpu/run.sh needs on the GPU machine:
#   .devcarry/build/  the build tree minus objects and archives (test and bench binaries,
#                     shared libraries, CTest files), so `ctest -L gpu` works there
#   .devcarry/lib/    shared libraries the binaries link that the GPU image lacks (ldd)
# Usage: tools/gpu/stage.sh [BUILD_DIR]   (default build-kernels; .devcarry is gitignored)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-kernels}
rm -rf .devcarry/build .devcarry/lib
mkdir -p .devcarry/build .devcarry/lib
# The tree's CTest files, binaries and shared libraries only.
(cd "$BUILD" && find . \( -name 'CTestTestfile.cmake' -o -name '*_include.cmake' -o -name '*_tests.cmake' \
    -o -path './bin/*' -o -path './lib/*.so*' \) -print0 | tar --null -T - -cf -) | tar -C .devcarry/build -xf -
# Non-system shared libraries the binaries need (the GPU image has glibc/libstdc++).
for f in .devcarry/build/bin/* .devcarry/build/lib/*.so*; do
  ldd "$f" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
  | grep -v "$PWD" | while read -r lib; do cp -L "$lib" .devcarry/lib/; done
# gtest_discover_tests' include files load this CMake module by its absolute path.
mkdir -p .devcarry/cmake
grep -h -o '/[^ "]*GoogleTestAddTests.cmake' -r .devcarry/build --include='*_include.cmake' | sort -u \
  | while read -r m; do cp "$m" .devcarry/cmake/; echo "$m" > .devcarry/cmake/path.txt; done
# Debug info makes a full build ~200 MB; the device tool carries at most 64 MiB.
strip --strip-debug .devcarry/build/bin/* .devcarry/build/lib/*.so* .devcarry/lib/*.so* 2>/dev/null || true
du -sh .devcarry
ls .devcarry/lib
