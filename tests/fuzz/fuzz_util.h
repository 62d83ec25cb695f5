// Shared by the fuzz targets (tests/fuzz): a check that aborts (so libFuzzer reports the
// input, and the gcc replay test fails) when a parser breaks one of its own promises.
#pragma once

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                         \
  do {                                                                           \
    if (!(cond)) {                                                               \
      std::fprintf(stderr, "%s:%d: fuzz check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                              \
    }                                                                            \
  } while (0)
