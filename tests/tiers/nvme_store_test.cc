// NvmeStore on real files (O_DIRECT), a real io_uring and a real RocksDB under /tmp.
#include "tiers/nvme/nvme_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "formats/record.h"
#include "tests/tiers/test_util.h"
#include "testing/test_point.h"

namespace kvtier::tiers {
namespace {

using testing::Aligned;
using testing::K;

constexpr uint64_t kSlot = 64 * 1024;  // small blocks keep the suite fast
constexpr uint64_t kLen = kSlot - 1000;  // not a 4 KiB multiple: exercises padding

NvmeStoreOptions Opts(const std::string& dir, uint32_t records = 32) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.slot_bytes = kSlot;
  o.capacity_bytes = uint64_t{records} * (kSlot + 4096);
  o.file_bytes = 8 * (kSlot + 4096);  // several files
  o.queue_depth = 16;
  return o;
}

BlockId Id(uint64_t i) { return BlockId{0x1234, K(i)}; }

// Writes blocks [from, to) with payload pattern = index.
void WriteBlocks(NvmeStore& s, uint64_t from, uint64_t to) {
  std::vector<testing::AlignedBuf> bufs;
  std::vector<NvmeWrite> w;
  for (uint64_t i = from; i < to; ++i) {
    bufs.push_back(Aligned(kSlot));
    testing::Fill(bufs.back().get(), kLen, i);
    NvmeWrite x;
    x.id = Id(i);
    x.parent = i == 0 ? Key128{} : K(i - 1);
    x.payload = bufs.back().get();
    x.len = kLen;
    w.push_back(x);
  }
  ASSERT_TRUE(s.WriteBatch(w).ok());
  for (auto& x : w) ASSERT_TRUE(x.result.ok()) << x.result.ToString();
}

// Reads block i; returns its status and checks the bytes when Ok.
Status ReadBlock(NvmeStore& s, uint64_t i) {
  auto buf = Aligned(kSlot);
  NvmeRead r;
  r.id = Id(i);
  r.dst = buf.get();
  r.dst_capacity = kSlot;
  (void)s.ReadBatch(std::span<NvmeRead>(&r, 1));
  if (r.result.ok()) {
    EXPECT_EQ(r.len, kLen);
    EXPECT_TRUE(testing::Matches(buf.get(), kLen, i)) << "block " << i << " bytes differ";
  }
  return r.result;
}

TEST(NvmeStore, WriteReadBatchAcrossFiles) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->records_total(), 32u);
  WriteBlocks(**s, 0, 20);
  std::vector<testing::AlignedBuf> bufs;
  std::vector<NvmeRead> r(20);
  for (uint64_t i = 0; i < 20; ++i) {
    bufs.push_back(Aligned(kSlot));
    r[i].id = Id(i);
    r[i].dst = bufs.back().get();
    r[i].dst_capacity = kSlot;
  }
  ASSERT_TRUE((*s)->ReadBatch(r).ok());
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_TRUE(r[i].result.ok());
    EXPECT_TRUE(testing::Matches(bufs[i].get(), kLen, i)) << i;
  }
  auto e = (*s)->Find(Id(5));
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->parent, K(4));
  EXPECT_EQ(e->hits, 1u);
  EXPECT_TRUE(ReadBlock(**s, 99).IsNotFound());
  auto st = (*s)->Stats();
  EXPECT_EQ(st.blocks_written, 20u);
  EXPECT_EQ(st.blocks_read, 20u);
  EXPECT_EQ(st.records_used, 20u);
}

TEST(NvmeStore, BadWritesChangeNothing) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  auto buf = Aligned(2 * kSlot);
  NvmeWrite w;
  w.id = Id(1);
  w.payload = buf.get();
  w.len = kSlot + 1;  // too large
  EXPECT_TRUE((*s)->WriteBatch(std::span<NvmeWrite>(&w, 1)).IsInvalid());
  w.len = kLen;
  w.payload = buf.get() + 1;  // misaligned for O_DIRECT
  EXPECT_TRUE((*s)->WriteBatch(std::span<NvmeWrite>(&w, 1)).IsInvalid());
  EXPECT_FALSE((*s)->Contains(Id(1)));
  EXPECT_EQ((*s)->free_count(0), 32u);
}

TEST(NvmeStore, FullStoreRejectsAndRemoveFrees) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path(), 4));
  ASSERT_TRUE(s.ok());
  WriteBlocks(**s, 0, 4);
  auto buf = Aligned(kSlot);
  NvmeWrite w;
  w.id = Id(9);
  w.payload = buf.get();
  w.len = kLen;
  Status st = (*s)->WriteBatch(std::span<NvmeWrite>(&w, 1));
  EXPECT_EQ(st.code(), StatusCode::kRejected);
  ASSERT_TRUE((*s)->Remove(Id(2)).ok());
  EXPECT_TRUE((*s)->Remove(Id(2)).IsNotFound());
  EXPECT_TRUE(ReadBlock(**s, 2).IsNotFound());
  WriteBlocks(**s, 10, 11);
  EXPECT_TRUE(ReadBlock(**s, 10).ok());
  EXPECT_TRUE(ReadBlock(**s, 3).ok());
}

TEST(NvmeStore, WarmRestartFindsEveryBlockAndRemovalsStay) {
  testing::TempDir d;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    WriteBlocks(**s, 0, 12);
    ASSERT_TRUE((*s)->Remove(Id(4)).ok());
  }
  for (int round = 0; round < 2; ++round) {  // write/read/evict/restart cycles
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->Stats().loaded_at_open, 11u + round);
    for (uint64_t i = 0; i < 12; ++i) {
      Status r = ReadBlock(**s, i);
      if (i == 4) {
        EXPECT_TRUE(r.IsNotFound());
      } else {
        EXPECT_TRUE(r.ok()) << i << ": " << r.ToString();
      }
    }
    if (round == 0) WriteBlocks(**s, 20, 21);
  }
}

TEST(NvmeStore, OtherGeometryIsRefusedAndChangesNothing) {
  testing::TempDir d;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    WriteBlocks(**s, 0, 2);
  }
  auto o = Opts(d.path());
  o.slot_bytes = 2 * kSlot;
  o.capacity_bytes = 32 * (2 * kSlot + 4096);
  auto bad = NvmeStore::Open(o);
  EXPECT_TRUE(bad.status().IsInvalid()) << bad.status().ToString();
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ReadBlock(**s, 1).ok());
}

// Flip one payload byte on disk: the read is refused (Corrupt), counted, and the entry dropped.
TEST(NvmeStore, FlippedPayloadByteIsRefusedAndCounted) {
  testing::TempDir d;
  uint32_t file;
  uint64_t off;
  std::string path;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    WriteBlocks(**s, 0, 3);
    (*s)->RecordLocation((*s)->Find(Id(1))->record, &file, &off);
    path = (*s)->DataPath(file);
  }
  {
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b;
    ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 4096 + 777)), 1);
    b ^= 0x10;
    ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 4096 + 777)), 1);
    fsync(fd);
    close(fd);
  }
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ReadBlock(**s, 1).IsCorrupt());
  EXPECT_EQ((*s)->Stats().checksum_failures, 1u);
  EXPECT_TRUE(ReadBlock(**s, 1).IsNotFound());  // dropped, not served again
  EXPECT_TRUE(ReadBlock(**s, 0).ok());
  EXPECT_TRUE(ReadBlock(**s, 2).ok());
}

// A header byte flipped: caught on the first read after restart (verify_on_restart).
TEST(NvmeStore, FlippedHeaderByteIsRefusedAfterRestart) {
  testing::TempDir d;
  uint32_t file;
  uint64_t off;
  std::string path;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    WriteBlocks(**s, 0, 2);
    (*s)->RecordLocation((*s)->Find(Id(0))->record, &file, &off);
    path = (*s)->DataPath(file);
  }
  int fd = open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  uint8_t b;
  ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 66)), 1);  // inside `sequence`
  b ^= 0x01;
  ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 66)), 1);
  close(fd);
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  EXPECT_TRUE(ReadBlock(**s, 0).IsCorrupt());
  EXPECT_EQ((*s)->Stats().checksum_failures, 1u);
  EXPECT_TRUE(ReadBlock(**s, 1).ok());
}

// Crash (a child process _exit()s) after the payload is durable but before its index
// entry: after restart the block is absent and its record is free. A crash right
// after the index write keeps the block.
TEST(NvmeStore, CrashBeforeIndexWriteLeavesNoBlock) {
  testing::TempDir d;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    WriteBlocks(**s, 0, 3);
  }
  for (const char* point : {"NvmeStore::WriteBatch:AfterPayloadSync", "NvmeStore::WriteBatch:AfterIndex"}) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      auto s = NvmeStore::Open(Opts(d.path()));
      if (!s.ok()) _exit(2);
      std::string want = point;
      SetTestPointCallback([want](std::string_view n) {
        if (n == want) _exit(0);
      });
      auto buf = Aligned(kSlot);
      testing::Fill(buf.get(), kLen, 7);
      NvmeWrite w;
      w.id = Id(7);
      w.payload = buf.get();
      w.len = kLen;
      (void)(*s)->WriteBatch(std::span<NvmeWrite>(&w, 1));
      _exit(3);  // the test point did not fire
    }
    int st = 0;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT_TRUE(WIFEXITED(st));
    ASSERT_EQ(WEXITSTATUS(st), 0) << point;
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    for (uint64_t i = 0; i < 3; ++i) EXPECT_TRUE(ReadBlock(**s, i).ok());
    if (std::string(point) == "NvmeStore::WriteBatch:AfterPayloadSync") {
      EXPECT_FALSE((*s)->Contains(Id(7)));
      EXPECT_EQ((*s)->free_count(0), 32u - 3u);
    } else {
      EXPECT_TRUE(ReadBlock(**s, 7).ok());
    }
  }
}

// A data file cut short under the store (another process, a bad restore): the kernel
// returns a short read for the record that straddles the new end and 0 bytes after it.
// The device resubmits the remainder, gets 0, and fails that read; it never treats the
// partial buffer as a block. The records before the cut still read fine.
TEST(NvmeStore, ShortReadAtATruncatedFileFailsThatBlockOnly) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  WriteBlocks(**s, 0, 3);
  uint32_t file;
  uint64_t off;
  (*s)->RecordLocation((*s)->Find(Id(2))->record, &file, &off);
  const uint64_t cut = off + 4096 + 8 * 4096;  // inside block 2's payload, 4 KiB aligned
  ASSERT_EQ(truncate((*s)->DataPath(file).c_str(), static_cast<off_t>(cut)), 0);
  Status r2 = ReadBlock(**s, 2);
  EXPECT_EQ(r2.code(), StatusCode::kIoError) << r2.ToString();
  EXPECT_NE(r2.message().find("returned 0 bytes"), std::string::npos) << r2.ToString();
  EXPECT_TRUE(ReadBlock(**s, 0).ok());
  EXPECT_TRUE(ReadBlock(**s, 1).ok());
  EXPECT_GE((*s)->device()->stats().read_errors, 1u);
}

// Fault injection behind the real device: writes of one file fail; those blocks are not
// indexed, the others are, and the failure is reported per block.
class FailFileDevice : public Device {
 public:
  FailFileDevice(std::unique_ptr<Device> real, uint32_t bad)
      : Device(real->num_files(), real->file_bytes(), real->last_file_bytes()), real_(std::move(real)), bad_(bad) {}

 protected:
  void BatchImpl(std::span<IoOp> ops) override {
    std::vector<IoOp> pass;
    std::vector<size_t> where;
    for (size_t i = 0; i < ops.size(); ++i) {
      if (!ops[i].result.ok()) continue;
      if (ops[i].kind == IoOp::Kind::kWrite && ops[i].file == bad_) {
        ops[i].result = Status::IoError("injected write error");
      } else {
        pass.push_back(ops[i]);
        where.push_back(i);
      }
    }
    if (!pass.empty()) (void)real_->Batch(pass);
    for (size_t k = 0; k < pass.size(); ++k) ops[where[k]].result = pass[k].result;
  }
  Status SyncImpl(std::span<const uint32_t> files) override { return real_->Sync(files); }

 private:
  std::unique_ptr<Device> real_;
  uint32_t bad_;
};

TEST(NvmeStore, InjectedWriteErrorsAreReportedAndNotIndexed) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path()), [](std::unique_ptr<Device> real) {
    return std::unique_ptr<Device>(new FailFileDevice(std::move(real), 0));
  });
  ASSERT_TRUE(s.ok());
  std::vector<testing::AlignedBuf> bufs;
  std::vector<NvmeWrite> w(12);
  for (uint64_t i = 0; i < 12; ++i) {
    bufs.push_back(Aligned(kSlot));
    testing::Fill(bufs.back().get(), kLen, i);
    w[i].id = Id(i);
    w[i].payload = bufs.back().get();
    w[i].len = kLen;
  }
  EXPECT_FALSE((*s)->WriteBatch(w).ok());
  size_t ok = 0;
  for (uint64_t i = 0; i < 12; ++i) {
    uint32_t file = 0;
    uint64_t off;
    if (w[i].result.ok()) {
      ++ok;
      (*s)->RecordLocation((*s)->Find(Id(i))->record, &file, &off);
      EXPECT_NE(file, 0u);
      EXPECT_TRUE(ReadBlock(**s, i).ok());
    } else {
      EXPECT_FALSE((*s)->Contains(Id(i)));
    }
  }
  EXPECT_EQ(ok, 4u);  // 8 records per file: the first 8 land in the failing file 0
  EXPECT_EQ((*s)->free_count(0), 32u - 4u);
}

}  // namespace
}  // namespace kvtier::tiers
