// FaultDevice behind a real NvmeStore (real O_DIRECT files, io_uring, RocksDB): each
// kind of fault at probability 1, so that its outcome is exact. Every fault is counted,
// becomes a refused write or a miss (never wrong bytes), and leaves the store serving.
#include "tiers/nvme/fault_device.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>

#include "tiers/nvme/nvme_store.h"

namespace kvtier::tiers {
namespace {

constexpr uint64_t kSlot = 16 * 1024;
constexpr uint64_t kLen = kSlot - 100;

struct Dir {
  Dir() {
    char t[] = "/tmp/kvtier-fault-XXXXXX";
    path = ::mkdtemp(t);
  }
  ~Dir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string path;
};

struct Buf {
  explicit Buf(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(kIoAlign, n))) {}
  ~Buf() { std::free(p); }
  uint8_t* p;
};

void Fill(uint8_t* p, size_t n, uint64_t seed) {
  std::mt19937_64 r(seed);
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(r());
}
BlockId Id(uint64_t i) { return BlockId{0x77, Key128{0xFA17ull << 32 | i, i * 31 + 1}}; }

NvmeStoreOptions Opts(const std::string& dir) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.slot_bytes = kSlot;
  o.capacity_bytes = 16 * (kSlot + 4096);
  o.queue_depth = 8;
  return o;
}

struct Store {
  std::unique_ptr<NvmeStore> s;
  FaultDevice* fd = nullptr;
};
Store Open(const std::string& dir, const FaultOptions& fo) {
  Store st;
  auto s = NvmeStore::Open(Opts(dir), [&](std::unique_ptr<Device> real) {
    FaultOptions o = fo;
    o.record_bytes = kSlot + 4096;
    auto d = std::make_unique<FaultDevice>(std::move(real), o);
    st.fd = d.get();
    return std::unique_ptr<Device>(std::move(d));
  });
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  if (s.ok()) st.s = std::move(s.value());
  return st;
}

Status Write(NvmeStore& s, uint64_t i) {
  Buf b(kSlot);
  Fill(b.p, kLen, i);
  NvmeWrite w;
  w.id = Id(i);
  w.payload = b.p;
  w.len = kLen;
  (void)s.WriteBatch(std::span<NvmeWrite>(&w, 1));
  return w.result;
}

// Reads block i; a read that reports Ok must carry exactly the block's bytes.
Status Read(NvmeStore& s, uint64_t i) {
  Buf b(kSlot);
  NvmeRead r;
  r.id = Id(i);
  r.dst = b.p;
  r.dst_capacity = kSlot;
  (void)s.ReadBatch(std::span<NvmeRead>(&r, 1));
  if (r.result.ok()) {
    Buf want(kSlot);
    Fill(want.p, kLen, i);
    EXPECT_EQ(r.len, kLen);
    EXPECT_EQ(std::memcmp(b.p, want.p, kLen), 0) << "block " << i << ": wrong bytes served";
  }
  return r.result;
}

TEST(FaultDevice, SpecParsesAndRefusesBadInput) {
  auto o = ParseFaultSpec("read_error=0.25,enospc=0.5,seed=9,flip_header=0.1");
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->read_error, 0.25);
  EXPECT_EQ(o->enospc, 0.5);
  EXPECT_EQ(o->seed, 9u);
  for (const char* bad : {"read_error", "read_error=x", "bogus=0.1", "read_error=1.5",
                          "write_error=0.6,enospc=0.6", "record_bytes=100", "seed=-"}) {
    EXPECT_FALSE(ParseFaultSpec(bad).ok()) << bad;
  }
}

TEST(FaultDevice, WriteErrorsAndEnospcAreRefusedWritesAndStoreKeepsServing) {
  for (const char* kind : {"write_error", "enospc"}) {
    Dir d;
    FaultOptions fo;
    (std::string(kind) == "enospc" ? fo.enospc : fo.write_error) = 1.0;
    Store st = Open(d.path, fo);
    ASSERT_TRUE(st.s);
    st.fd->set_enabled(false);
    ASSERT_TRUE(Write(*st.s, 1).ok());
    st.fd->set_enabled(true);
    Status w = Write(*st.s, 2);
    EXPECT_EQ(w.code(), StatusCode::kIoError) << w.ToString();
    if (std::string(kind) == "enospc") {
      EXPECT_NE(w.message().find("ENOSPC"), std::string::npos) << w.message();
    }
    EXPECT_FALSE(st.s->Contains(Id(2)));
    EXPECT_EQ(st.s->free_count(0), 15u);  // the refused write's record was given back
    EXPECT_TRUE(Read(*st.s, 1).ok());       // reads are untouched by write faults
    const FaultCounts c = st.fd->counts();
    EXPECT_EQ(std::string(kind) == "enospc" ? c.enospc : c.write_errors, 2u);  // header + payload op
    st.fd->set_enabled(false);
    EXPECT_TRUE(Write(*st.s, 2).ok());  // the store still writes
    EXPECT_TRUE(Read(*st.s, 2).ok());
  }
}

TEST(FaultDevice, TornWritesAndPayloadFlipsBecomeCountedMisses) {
  for (const char* kind : {"short_write", "flip_payload"}) {
    Dir d;
    FaultOptions fo;
    (std::string(kind) == "short_write" ? fo.short_write : fo.flip_payload) = 1.0;
    Store st = Open(d.path, fo);
    ASSERT_TRUE(st.s);
    ASSERT_TRUE(Write(*st.s, 3).ok());  // the device lied: Ok
    st.fd->set_enabled(false);
    Status r = Read(*st.s, 3);
    if (std::string(kind) == "short_write") {
      // The header op (4 KiB) is torn to nothing; the payload to its first half: the
      // payload checksum catches it.
      EXPECT_TRUE(r.IsCorrupt()) << r.ToString();
    } else {
      EXPECT_TRUE(r.IsCorrupt()) << r.ToString();
    }
    EXPECT_FALSE(st.s->Contains(Id(3)));  // dropped
    EXPECT_EQ(st.s->Stats().checksum_failures, 1u);
    EXPECT_EQ(st.s->free_count(0), 16u);
    EXPECT_TRUE(Read(*st.s, 3).IsNotFound());
    EXPECT_GT(st.fd->counts().total(), 0u);
    ASSERT_TRUE(Write(*st.s, 4).ok());
    EXPECT_TRUE(Read(*st.s, 4).ok());
  }
}

TEST(FaultDevice, HeaderFlipIsCaughtOnTheFirstReadAfterRestart) {
  Dir d;
  {
    FaultOptions fo;
    fo.flip_header = 1.0;
    Store st = Open(d.path, fo);
    ASSERT_TRUE(st.s);
    ASSERT_TRUE(Write(*st.s, 5).ok());
    EXPECT_EQ(st.fd->counts().header_flips, 1u);
    EXPECT_EQ(st.fd->counts().payload_flips, 0u);
    st.fd->set_enabled(false);
    EXPECT_TRUE(Read(*st.s, 5).ok());  // this process wrote it: header trusted, payload right
  }
  Store st = Open(d.path, FaultOptions{});
  ASSERT_TRUE(st.s);
  ASSERT_TRUE(st.s->Contains(Id(5)));
  Status r = Read(*st.s, 5);
  EXPECT_TRUE(r.IsCorrupt()) << r.ToString();
  EXPECT_FALSE(st.s->Contains(Id(5)));
  EXPECT_EQ(st.s->Stats().checksum_failures, 1u);
}

TEST(FaultDevice, ReadErrorsAndShortReadsAreMissesNeverBytes) {
  Dir d;
  FaultOptions fo;
  fo.read_error = 1.0;
  Store st = Open(d.path, fo);
  ASSERT_TRUE(st.s);
  ASSERT_TRUE(Write(*st.s, 6).ok());
  ASSERT_TRUE(Write(*st.s, 7).ok());
  Status r = Read(*st.s, 6);
  EXPECT_EQ(r.code(), StatusCode::kIoError) << r.ToString();
  EXPECT_TRUE(st.s->Contains(Id(6)));  // an I/O error is not corruption: the entry stays
  EXPECT_EQ(st.fd->counts().read_errors, 1u);
  st.fd->set_enabled(false);
  EXPECT_TRUE(Read(*st.s, 6).ok());  // and serves again once the device recovers
  // A short read that claims success: the poisoned half fails the payload checksum.
  Store st2;
  st.s.reset();
  FaultOptions so;
  so.short_read = 1.0;
  st2 = Open(d.path, so);
  ASSERT_TRUE(st2.s);
  r = Read(*st2.s, 7);
  EXPECT_TRUE(r.IsCorrupt()) << r.ToString();
  EXPECT_GE(st2.fd->counts().short_reads, 1u);
  EXPECT_EQ(st2.s->Stats().checksum_failures, 1u);
}

TEST(FaultDevice, RandomMixNeverServesWrongBytes) {
  Dir d;
  FaultOptions fo;
  fo.read_error = fo.short_read = 0.1;
  fo.write_error = fo.short_write = fo.enospc = fo.flip_payload = fo.flip_header = 0.05;
  fo.seed = 42;
  Store st = Open(d.path, fo);
  ASSERT_TRUE(st.s);
  uint64_t ok_reads = 0, failed = 0;
  for (uint64_t i = 0; i < 400; ++i) {
    const uint64_t b = i % 24;
    if (!st.s->Contains(Id(b))) {
      (void)Write(*st.s, b);
      if (st.s->free_count(0) == 0) (void)st.s->Remove(Id((b + 1) % 24));
    }
    Status r = Read(*st.s, b);  // checks the bytes whenever Ok
    (r.ok() ? ok_reads : failed)++;
  }
  EXPECT_GT(ok_reads, 0u);
  EXPECT_GT(failed, 0u);
  EXPECT_GT(st.fd->counts().total(), 0u);
  std::printf("RELIABILITY fault-device mix: %llu faults injected, %llu good reads, %llu misses\n",
              (unsigned long long)st.fd->counts().total(), (unsigned long long)ok_reads,
              (unsigned long long)failed);
}

}  // namespace
}  // namespace kvtier::tiers
