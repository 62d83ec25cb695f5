// Fuzz target: the export-file reader (tools/export_file.h over formats/export.h), which
// `kvtierctl import` runs on files from elsewhere. The input is placed in a memfd and
// opened through /proc/self/fd. The reader's promise: VerifyAll() accepts a file exactly
// when reading it record by record reaches the end with every record intact -- so an
// import that verifies first never stores part of a bad file. Every record handed out
// must match its own record header.
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "formats/record.h"
#include "tests/fuzz/fuzz_util.h"
#include "tools/export_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > (1u << 20)) return 0;
  const int fd = ::memfd_create("fuzz-export", 0);
  if (fd < 0) return 0;
  if (::write(fd, data, size) != static_cast<ssize_t>(size)) {
    ::close(fd);
    return 0;
  }
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  auto r = kvtier::ExportReader::Open(path);
  if (!r.ok()) {
    FUZZ_CHECK(!r.status().message().empty());
    ::close(fd);
    return 0;
  }
  uint64_t records = 0;
  const bool verified = (*r)->VerifyAll(nullptr, &records).ok();
  bool read_all = false;
  uint64_t n = 0;
  for (;;) {
    kvtier::RecordHeader rec;
    std::vector<uint8_t> payload;
    bool eof = false;
    if (!(*r)->Next(&rec, &payload, &eof).ok()) break;
    if (eof) {
      read_all = true;
      break;
    }
    ++n;
    FUZZ_CHECK(rec.contract_id == (*r)->contract_id());
    FUZZ_CHECK(kvtier::VerifyPayload(rec, payload).ok());
    FUZZ_CHECK(payload.size() <= (*r)->contract().block_bytes());
  }
  FUZZ_CHECK(verified == read_all);
  if (verified) FUZZ_CHECK(n == records);
  ::close(fd);
  return 0;
}
