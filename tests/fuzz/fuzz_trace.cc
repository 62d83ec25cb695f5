// Fuzz target: the replay trace parsers (tools/replay/trace.h): kvtier JSON lines and
// the Mooncake format. They read files, so the input is placed in a memfd and read back
// through /proc/self/fd. Every malformed line is refused with a message; what loads has
// bounded token counts.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_util.h"
#include "tools/replay/trace.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 16)) return 0;
  const int fd = ::memfd_create("fuzz-trace", 0);
  if (fd < 0) return 0;
  if (::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  using namespace kvtier::replay;
  for (int which = 0; which < 3; ++which) {
    auto r = which == 0 ? LoadTrace(path) : which == 1 ? LoadKvtierTrace(path) : LoadMooncakeTrace(path);
    if (r.ok()) {
      for (const auto& q : *r) FUZZ_CHECK(q.tokens.size() <= kMaxTraceTokens);
    } else {
      FUZZ_CHECK(!r.status().message().empty());
    }
  }
  ::close(fd);
  return 0;
}
