// NvmeStore with several record classes (tiers/nvme/nvme_store.h): each block takes a
// record of the smallest class that holds it, the classes share the store's slabs, a
// restart rebuilds the allocator from the index, a folder of another geometry is refused
// naming both, a folder of index version 1 is emptied and counted, an entry that does not
// fit the geometry is dropped and counted, and the index format matches its golden copy
// (tests/data/nvme_index_v2.bin).
#include <gtest/gtest.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "formats/bytes.h"
#include "tests/tiers/test_util.h"
#include "tiers/nvme/nvme_store.h"

namespace kvtier::tiers {
namespace {

using testing::Aligned;
using testing::K;

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * KiB;
// Small classes keep the suite fast: records of 20 KiB and 68 KiB in 1 MiB slabs (51 and
// 15 a slab, 4 KiB left over in each).
constexpr uint64_t kSmall = 16 * KiB, kBig = 64 * KiB, kSlab = 1 * MiB;

NvmeStoreOptions Opts(const std::string& dir, std::vector<uint64_t> classes = {kSmall, kBig}) {
  NvmeStoreOptions o;
  o.dir = dir;
  o.slot_bytes = kBig;
  o.classes = std::move(classes);
  o.slab_bytes = kSlab;
  o.capacity_bytes = 6 * kSlab;
  o.file_bytes = 2 * kSlab;  // 3 files of 2 slabs
  o.queue_depth = 16;
  return o;
}

BlockId Id(uint64_t i) { return BlockId{0x5151, K(i)}; }
// Block i's payload: small (kSmall - 100 bytes) for even i, big (kBig - 3000) for odd i.
uint64_t LenOf(uint64_t i) { return i % 2 == 0 ? kSmall - 100 : kBig - 3000; }

Status Write(NvmeStore& s, uint64_t from, uint64_t to, uint64_t (*len)(uint64_t) = LenOf) {
  std::vector<testing::AlignedBuf> bufs;
  std::vector<NvmeWrite> w;
  for (uint64_t i = from; i < to; ++i) {
    bufs.push_back(Aligned(kBig));
    testing::Fill(bufs.back().get(), len(i), i);
    NvmeWrite x;
    x.id = Id(i);
    x.parent = K(i + 1000000);
    x.payload = bufs.back().get();
    x.len = len(i);
    w.push_back(x);
  }
  return s.WriteBatch(w);
}

Status Read(NvmeStore& s, uint64_t i, uint64_t (*len)(uint64_t) = LenOf) {
  auto buf = Aligned(kBig);
  NvmeRead r;
  r.id = Id(i);
  r.dst = buf.get();
  r.dst_capacity = kBig;
  (void)s.ReadBatch(std::span<NvmeRead>(&r, 1));
  if (r.result.ok()) {
    EXPECT_EQ(r.len, len(i));
    EXPECT_TRUE(testing::Matches(buf.get(), len(i), i)) << "block " << i << " bytes differ";
  }
  return r.result;
}

// The record class of block i, from where its record is.
uint64_t RecordBytesOf(const NvmeStore& s, uint64_t i) {
  const uint32_t r = s.Find(Id(i))->record;
  return s.class_bytes(s.SlabClass(s.SlabOf(r)));
}

TEST(NvmeClasses, EachBlockTakesTheSmallestRecordThatHoldsIt) {
  testing::TempDir d;
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  const NvmeGeometry& g = (*s)->geometry();
  EXPECT_EQ(g.record_bytes, (std::vector<uint64_t>{20 * KiB, 68 * KiB}));
  EXPECT_EQ(g.num_slabs, 6u);
  EXPECT_EQ(g.slabs_per_file, 2u);
  EXPECT_EQ((*s)->slots_per_slab(0), 51u);
  EXPECT_EQ((*s)->slots_per_slab(1), 15u);
  ASSERT_TRUE(Write(**s, 0, 40).ok());
  uint64_t bytes = 0;
  std::map<uint32_t, uint64_t> at;  // record -> block
  for (uint64_t i = 0; i < 40; ++i) {
    const uint64_t want = i % 2 == 0 ? 20 * KiB : 68 * KiB;
    EXPECT_EQ(RecordBytesOf(**s, i), want) << i;
    bytes += want;
    at[(*s)->Find(Id(i))->record] = i;
    EXPECT_TRUE(Read(**s, i).ok()) << i;
  }
  // Records of one slab are back to back from its start and never cross a file.
  for (auto it = at.begin(); std::next(it) != at.end(); ++it) {
    const uint32_t a = it->first, b = std::next(it)->first;
    if ((*s)->SlabOf(a) != (*s)->SlabOf(b)) continue;
    EXPECT_EQ(uint64_t{b - a} * 4096, RecordBytesOf(**s, it->second));
    uint32_t fa, fb;
    uint64_t oa, ob;
    (*s)->RecordLocation(a, &fa, &oa);
    (*s)->RecordLocation(b, &fb, &ob);
    EXPECT_EQ(fa, fb);
  }
  for (const auto& [r, i] : at) {
    uint32_t f;
    uint64_t o;
    (*s)->RecordLocation(r, &f, &o);
    EXPECT_LE(o + RecordBytesOf(**s, i), 2 * kSlab) << "record " << r << " spans two files";
    EXPECT_EQ(uint64_t{r} * 4096 % kSlab % RecordBytesOf(**s, i), 0u);
  }
  const NvmeStoreStats st = (*s)->Stats();
  EXPECT_EQ(st.used_bytes, bytes);
  EXPECT_EQ(st.capacity_bytes, 6 * kSlab);
  EXPECT_EQ(st.records_used, 40u);
  EXPECT_EQ((*s)->used(0), 20u);
  EXPECT_EQ((*s)->used(1), 20u);
  EXPECT_EQ((*s)->slabs(0), 1u);
  EXPECT_EQ((*s)->slabs(1), 2u);  // 20 big records: 15 + 5
}

// The data files take the tier's slabs and no more disk: with 5 slabs of 2 a file, the
// last file holds one slab. Every record of it, the store's last, is written and read back,
// before and after a restart.
TEST(NvmeClasses, DataFilesTakeTheTiersSlabsAndNoMore) {
  testing::TempDir d;
  NvmeStoreOptions o = Opts(d.path(), {kBig});
  o.capacity_bytes = 5 * kSlab;
  auto big = [](uint64_t) { return kBig - 3000; };
  {
    auto s = NvmeStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->geometry().num_slabs, 5u);
    EXPECT_EQ((*s)->geometry().slabs_per_file, 2u);
    uint64_t on_disk = 0;
    for (uint32_t f = 0; f < 3; ++f) {
      const uint64_t size = std::filesystem::file_size((*s)->DataPath(f));
      EXPECT_EQ(size, (f < 2 ? 2 : 1) * kSlab) << "file " << f;
      on_disk += size;
    }
    EXPECT_EQ(on_disk, 5 * kSlab);
    EXPECT_FALSE(std::filesystem::exists((*s)->DataPath(3)));
    ASSERT_TRUE(Write(**s, 0, 75, big).ok());  // 15 records a slab: every record
    uint32_t last_file = 0;
    for (uint64_t i = 0; i < 75; ++i) {
      uint32_t f;
      uint64_t off;
      (*s)->RecordLocation((*s)->Find(Id(i))->record, &f, &off);
      last_file = std::max(last_file, f);
      EXPECT_TRUE(Read(**s, i, big).ok()) << i;
    }
    EXPECT_EQ(last_file, 2u);
  }
  auto s = NvmeStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (uint64_t i = 0; i < 75; ++i) EXPECT_TRUE(Read(**s, i, big).ok()) << i;
  EXPECT_EQ(std::filesystem::file_size((*s)->DataPath(2)), kSlab);
}

// A folder written before the last file was sized to its slabs (every file whole) opens as
// it is: nothing truncated, and every record written before a restart reads back after it.
TEST(NvmeClasses, AFolderWithAWholeLastFileOpensAsItIs) {
  testing::TempDir d;
  NvmeStoreOptions o = Opts(d.path(), {kBig});
  o.capacity_bytes = 5 * kSlab;
  auto big = [](uint64_t) { return kBig - 3000; };
  std::string last;
  {
    auto s = NvmeStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    last = (*s)->DataPath(2);
  }
  std::filesystem::resize_file(last, 2 * kSlab);  // the size the older release gave it
  {
    auto s = NvmeStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE(Write(**s, 0, 75, big).ok());
  }
  auto s = NvmeStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  for (uint64_t i = 0; i < 75; ++i) EXPECT_TRUE(Read(**s, i, big).ok()) << i;
  EXPECT_EQ(std::filesystem::file_size(last), 2 * kSlab);
}

// Every block of both classes comes back after a restart, byte-exact, in the same
// records; the rebuilt allocator goes on from where it was.
TEST(NvmeClasses, RestartWithMixedClassesBringsEveryBlockBack) {
  testing::TempDir d;
  std::map<uint64_t, uint32_t> records;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(Write(**s, 0, 60).ok());
    for (uint64_t i : {3, 10, 11}) ASSERT_TRUE((*s)->Remove(Id(i)).ok());
    for (uint64_t i = 0; i < 60; ++i) {
      if (auto e = (*s)->Find(Id(i))) records[i] = e->record;
    }
  }
  for (int round = 0; round < 2; ++round) {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->Stats().index_entries_dropped, 0u);
    EXPECT_EQ((*s)->Stats().loaded_at_open, records.size());
    for (uint64_t i = 0; i < 60u + 10u * static_cast<uint64_t>(round); ++i) {
      Status r = Read(**s, i);
      if (records.count(i)) {
        EXPECT_TRUE(r.ok()) << i << ": " << r.ToString();
        EXPECT_EQ((*s)->Find(Id(i))->record, records[i]);
      } else {
        EXPECT_TRUE(r.IsNotFound()) << i;
      }
    }
    EXPECT_EQ((*s)->used(0) + (*s)->used(1), records.size());
    if (round == 0) {  // new blocks take free records, never a taken one
      ASSERT_TRUE(Write(**s, 60, 70).ok());
      for (uint64_t i = 60; i < 70; ++i) {
        for (const auto& [j, r] : records) EXPECT_NE((*s)->Find(Id(i))->record, r);
        records[i] = (*s)->Find(Id(i))->record;
      }
    }
  }
}

TEST(NvmeClasses, AnotherGeometryIsRefusedNamingBothAndChangesNothing) {
  testing::TempDir d;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(Write(**s, 0, 4).ok());
  }
  auto other_classes = Opts(d.path(), {32 * KiB, kBig});
  auto other_slab = Opts(d.path());
  other_slab.slab_bytes = 2 * kSlab;
  auto one_class = Opts(d.path(), {});
  for (const NvmeStoreOptions& o : {other_classes, other_slab, one_class}) {
    auto bad = NvmeStore::Open(o);
    ASSERT_TRUE(bad.status().IsInvalid()) << bad.status().ToString();
    const std::string m = bad.status().message();
    EXPECT_NE(m.find("was made with 6 slabs of 1 MiB (2 a file), records of 20 KiB, 68 KiB"), std::string::npos) << m;
    EXPECT_NE(m.find("the settings give"), std::string::npos) << m;
  }
  auto m = NvmeStore::Open(other_classes).status().message();
  EXPECT_NE(m.find("the settings give 6 slabs of 1 MiB (2 a file), records of 36 KiB, 68 KiB"), std::string::npos) << m;
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok());
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(Read(**s, i).ok()) << i;
}

// Writes index entries straight into the folder's RocksDB (what a crash, a bad restore or
// an older build could leave).
void PutRaw(const std::string& dir, const std::vector<std::pair<std::string, std::string>>& kv) {
  rocksdb::Options ro;
  ro.create_if_missing = true;
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::Open(ro, dir + "/index", &db).ok());
  for (const auto& [k, v] : kv) ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), k, v).ok());
  delete db;
}

// Entries that name a record the geometry does not have for their class are dropped and
// counted, never reinterpreted; the blocks around them stay.
TEST(NvmeClasses, AnEntryThatDoesNotFitTheGeometryIsDroppedAndCounted) {
  testing::TempDir d;
  NvmeEntry small, big;
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(Write(**s, 0, 4).ok());
    small = *(*s)->Find(Id(0));  // slab 0: class 20 KiB
    big = *(*s)->Find(Id(1));    // slab 1: class 68 KiB
    EXPECT_EQ((*s)->SlabOf(small.record), 0u);
    EXPECT_EQ((*s)->SlabOf(big.record), 1u);
  }
  std::vector<std::pair<std::string, std::string>> bad;
  // Of another contract: their keys sort after the good entries' (an entry that claims a
  // free slab for its class first would hold it: the index is read in key order).
  auto add = [&](uint64_t i, NvmeEntry e, uint32_t record) {
    e.id = BlockId{0x5152, K(i)};
    e.record = record;
    bad.emplace_back(nvme_index::Key(e.id), nvme_index::EncodeEntry(e));
  };
  add(100, small, small.record + 1);                 // inside a record, not its start
  add(101, small, big.record);                       // a small block in a slab of the big class
  add(102, big, small.record + 5);                   // 20 KiB into slab 0: a 20 KiB record start, not 68
  add(103, small, small.record);                     // a record already taken
  add(104, small, 6 * kSlab / 4096);                 // past the last slab
  add(105, small, static_cast<uint32_t>((2 * kSlab + 68 * KiB) / 4096));  // a free slab, but no 20 KiB record start
  PutRaw(d.path(), bad);
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->Stats().index_entries_dropped, 6u);
  EXPECT_EQ((*s)->Stats().loaded_at_open, 4u);
  for (uint64_t i = 100; i < 106; ++i) EXPECT_FALSE((*s)->Contains(BlockId{0x5152, K(i)})) << i;
  for (uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(Read(**s, i).ok()) << i;
  auto again = std::move(*s);
  again.reset();
  auto s2 = NvmeStore::Open(Opts(d.path()));  // the drops are durable
  ASSERT_TRUE(s2.ok());
  EXPECT_EQ((*s2)->Stats().index_entries_dropped, 0u);
}

// A folder of index version 1 (one record size: "meta" = u32 1 | u64 slot_bytes | u32
// records_per_file | u32 num_files, entries naming record numbers) is emptied at open:
// every entry dropped and counted, the meta rewritten as version 2; the store works.
TEST(NvmeClasses, AFolderOfIndexVersion1IsEmptiedAndCounted) {
  testing::TempDir d;
  std::filesystem::create_directories(d.path() + "/data");
  ByteWriter w;
  w.PutU32(1);
  w.PutU64(kBig);
  w.PutU32(8);
  w.PutU32(4);
  std::vector<std::pair<std::string, std::string>> kv{{"meta", std::string(w.bytes().begin(), w.bytes().end())}};
  for (uint64_t i = 0; i < 5; ++i) {
    NvmeEntry e;
    e.id = Id(i);
    e.record = static_cast<uint32_t>(i);
    e.payload_len = kBig - 3000;
    std::string v = nvme_index::EncodeEntry(e);
    v[0] = 1;  // entry version 1
    kv.emplace_back(nvme_index::Key(e.id), v);
  }
  PutRaw(d.path(), kv);
  {
    auto s = NvmeStore::Open(Opts(d.path()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->Stats().index_entries_dropped, 5u);
    EXPECT_EQ((*s)->Stats().loaded_at_open, 0u);
    for (uint64_t i = 0; i < 5; ++i) EXPECT_FALSE((*s)->Contains(Id(i)));
    ASSERT_TRUE(Write(**s, 10, 14).ok());
  }
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->Stats().index_entries_dropped, 0u);
  for (uint64_t i = 10; i < 14; ++i) EXPECT_TRUE(Read(**s, i).ok()) << i;
}

TEST(NvmeClasses, AnIndexOfAnUnknownVersionIsRefusedByName) {
  testing::TempDir d;
  std::filesystem::create_directories(d.path() + "/data");
  ByteWriter w;
  w.PutU32(3);
  w.PutU64(kSlab);
  PutRaw(d.path(), {{"meta", std::string(w.bytes().begin(), w.bytes().end())}});
  auto s = NvmeStore::Open(Opts(d.path()));
  ASSERT_TRUE(s.status().IsInvalid());
  EXPECT_NE(s.status().message().find("index of version 3"), std::string::npos) << s.status().message();
}

// The default classes in 64 MiB slabs: floor(slab / record) records a slab, under 2% of
// it left over, and a record (4 KiB + class) within 10% of each default block size.
TEST(NvmeClasses, DefaultClassesWasteLittle) {
  const std::vector<uint64_t> classes{144 * KiB, 576 * KiB, 720 * KiB, 1440 * KiB};
  auto a = SlabAllocator::Make("nvme", kDefaultSlabBytes, kDefaultSlabBytes,
                               {148 * KiB, 580 * KiB, 724 * KiB, 1444 * KiB});
  ASSERT_TRUE(a.ok());
  const uint32_t want[] = {442, 112, 90, 45};
  for (int c = 0; c < 4; ++c) {
    const uint64_t rec = classes[static_cast<size_t>(c)] + 4096;
    EXPECT_EQ(a->slots_per_slab(c), kDefaultSlabBytes / rec);
    EXPECT_EQ(a->slots_per_slab(c), want[c]);
    const uint64_t tail = kDefaultSlabBytes - a->slots_per_slab(c) * rec;
    EXPECT_LT(tail * 50, kDefaultSlabBytes) << rec;
    EXPECT_LE(rec, 1.1 * static_cast<double>(classes[static_cast<size_t>(c)] + 4096));
  }
  EXPECT_EQ(a->granule(), 4096u);  // record ids are 4 KiB units
}

// Tokens a GiB of NVMe tier for a Llama-3-8B-shaped contract (576 KiB blocks of 16 tokens)
// beside an 80-layer one (1440 KiB): a 1 GiB store takes 64 blocks of the 80-layer
// contract, then Llama blocks until it is full; one record size (4 KiB + 1440 KiB, the
// store before record classes) against the default classes in 64 MiB slabs. Printed for
// bench/README.md ("slot classes").
TEST(NvmeClasses, TokensPerGiBOfALlamaContractBesideAn80LayerOne) {
  constexpr uint64_t kLlama = 576 * KiB, kBig80 = 1440 * KiB, kGiB = 1024 * MiB;
  auto buf = Aligned(kBig80);
  testing::Fill(buf.get(), kBig80, 1);
  auto fill = [&](const std::vector<uint64_t>& classes, uint64_t slab) {
    testing::TempDir d;
    NvmeStoreOptions o;
    o.dir = d.path();
    o.slot_bytes = kBig80;
    o.classes = classes;
    o.slab_bytes = slab;
    o.capacity_bytes = kGiB;
    o.queue_depth = 64;
    auto s = NvmeStore::Open(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    if (!s.ok()) return std::pair<uint64_t, uint64_t>{0, 0};
    uint64_t n = 0, big = 0;
    bool full = false;
    for (uint64_t batch = 0; !full; ++batch) {
      std::vector<NvmeWrite> w(64);
      for (uint64_t i = 0; i < 64; ++i) {
        w[i].id = BlockId{batch == 0 ? 80u : 32u, K(batch * 64 + i)};
        w[i].payload = buf.get();
        w[i].len = batch == 0 ? kBig80 : kLlama;
      }
      (void)(*s)->WriteBatch(w);
      for (const auto& x : w) {
        full = full || !x.result.ok();
        if (x.result.ok()) ++(batch == 0 ? big : n);
      }
    }
    return std::pair<uint64_t, uint64_t>{n, big};
  };
  const auto [before, big_before] = fill({}, 0);
  const auto [after, big_after] = fill({144 * KiB, 576 * KiB, 720 * KiB, 1440 * KiB}, kDefaultSlabBytes);
  std::printf("NVMe tier of 1 GiB, 64 blocks of 1440 KiB first: one record size %llu Llama blocks "
              "(%llu tokens per GiB), record classes %llu (%llu tokens per GiB): %.2fx\n",
              static_cast<unsigned long long>(before), static_cast<unsigned long long>(before * 16),
              static_cast<unsigned long long>(after), static_cast<unsigned long long>(after * 16),
              static_cast<double>(after) / static_cast<double>(before));
  EXPECT_EQ(big_before, 64u);
  EXPECT_EQ(big_after, 64u);
  EXPECT_EQ(before, 726u - 64u);    // 1 GiB / 1444 KiB records
  EXPECT_EQ(after, (16u - 2u) * 112u);  // 2 slabs of 45 records for the 64 big blocks
}

TEST(NvmeClasses, OpenRefusesAStoreRecordIdsCannotReach) {
  NvmeStoreOptions o = Opts("/tmp/kvtier-nvme-never-made");
  o.capacity_bytes = (uint64_t{16} << 40) + kSlab;  // 16 TiB + a slab
  auto s = NvmeStore::Open(o);
  ASSERT_TRUE(s.status().IsInvalid());
  EXPECT_NE(s.status().message().find("16 TiB"), std::string::npos) << s.status().message();
  EXPECT_FALSE(std::filesystem::exists("/tmp/kvtier-nvme-never-made"));
}

// ---- the index format golden -------------------------------------------------------------

// tests/data/nvme_index_v2.bin: the "meta" value of Opts()' geometry, then the key and
// value of the entry GoldenEntry(), as index version 2 writes them.
NvmeEntry GoldenEntry() {
  NvmeEntry e;
  e.id = BlockId{0x0123456789ABCDEFull, Key128{0x1111222233334444ull, 0x5555666677778888ull}};
  e.parent = Key128{0x99990000AAAABBBBull, 0xCCCCDDDDEEEEFFFFull};
  e.record = 261;  // 1 MiB + 20 KiB: the second record of slab 1 in 20 KiB records
  e.payload_len = 16 * KiB - 100;
  e.payload_xxh3 = 0xFEEDFACECAFEBEEFull;
  e.header_xxh3 = 0x0BADC0DEDEADBEEFull;
  e.sequence = 4242;
  e.hits = 7;
  return e;
}

std::string ReadGolden() {
  std::ifstream f(std::string(KVTIER_TEST_DATA_DIR) + "/nvme_index_v2.bin", std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

TEST(NvmeIndexFormat, MatchesTheGoldenFileOfVersion2) {
  const std::string g = ReadGolden();
  NvmeGeometry geo;
  geo.slab_bytes = kSlab;
  geo.slabs_per_file = 2;
  geo.num_slabs = 6;
  geo.record_bytes = {20 * KiB, 68 * KiB};
  const std::string meta = nvme_index::EncodeMeta(geo);
  const std::string key = nvme_index::Key(GoldenEntry().id), value = nvme_index::EncodeEntry(GoldenEntry());
  ASSERT_EQ(g.size(), 40u + 25u + 57u) << "missing or resized tests/data/nvme_index_v2.bin";
  EXPECT_EQ(meta, g.substr(0, 40));
  EXPECT_EQ(key, g.substr(40, 25));
  EXPECT_EQ(value, g.substr(65, 57));
  // Decoded, the golden is the geometry and the entry.
  NvmeGeometry back;
  EXPECT_EQ(nvme_index::DecodeMeta(g.substr(0, 40), &back), 2u);
  EXPECT_EQ(back, geo);
  NvmeEntry e;
  ASSERT_TRUE(nvme_index::ParseKey(g.substr(40, 25), &e.id));
  ASSERT_TRUE(nvme_index::DecodeEntry(g.substr(65, 57), &e));
  const NvmeEntry want = GoldenEntry();
  EXPECT_EQ(e.id, want.id);
  EXPECT_EQ(e.parent, want.parent);
  EXPECT_EQ(e.record, want.record);
  EXPECT_EQ(e.payload_len, want.payload_len);
  EXPECT_EQ(e.payload_xxh3, want.payload_xxh3);
  EXPECT_EQ(e.header_xxh3, want.header_xxh3);
  EXPECT_EQ(e.sequence, want.sequence);
  EXPECT_EQ(e.hits, want.hits);
  // And it is what the store writes: a store of Opts() puts the golden "meta".
  testing::TempDir d;
  { ASSERT_TRUE(NvmeStore::Open(Opts(d.path())).ok()); }
  rocksdb::DB* db = nullptr;
  ASSERT_TRUE(rocksdb::DB::OpenForReadOnly(rocksdb::Options(), d.path() + "/index", &db).ok());
  std::string have;
  EXPECT_TRUE(db->Get(rocksdb::ReadOptions(), "meta", &have).ok());
  delete db;
  EXPECT_EQ(have, g.substr(0, 40));
}

// A golden entry of another version is refused, not read as version 2.
TEST(NvmeIndexFormat, RefusesAnEntryOfAnotherVersion) {
  std::string v = ReadGolden().substr(65, 57);
  ASSERT_EQ(v.size(), 57u);
  NvmeEntry e;
  ASSERT_TRUE(nvme_index::DecodeEntry(v, &e));
  v[0] = 1;
  EXPECT_FALSE(nvme_index::DecodeEntry(v, &e));
  v[0] = 3;
  EXPECT_FALSE(nvme_index::DecodeEntry(v, &e));
}

}  // namespace
}  // namespace kvtier::tiers

namespace kvtier::tiers {
namespace {

NvmeStoreOptions BySize(const std::string& dir) {
  NvmeStoreOptions o = Opts(dir, {});
  o.records_by_size = true;
  return o;
}

// Records sized by their blocks (records_by_size): a class is made the first time a size
// comes, a record is 4096 + the payload rounded to 4 KiB, and after a restart every slab's
// class comes from the records on disk: the classes were made big first before it, small
// first (the index's key order) after it, and every block is read back byte-exact.
TEST(NvmeClasses, RecordsSizedByTheirBlocksSurviveARestartInAnyClassOrder) {
  testing::TempDir d;
  std::map<uint64_t, uint32_t> records;
  {
    auto s = NvmeStore::Open(BySize(d.path()));
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ((*s)->num_classes(), 0);
    EXPECT_EQ((*s)->ClassFor(LenOf(1)), -1);
    EXPECT_NE((*s)->geometry().ToString().find("records of the sizes of their blocks"), std::string::npos)
        << (*s)->geometry().ToString();
    for (uint64_t i = 1; i < 40; i += 2) ASSERT_TRUE(Write(**s, i, i + 1).ok());  // big ones first
    for (uint64_t i = 0; i < 40; i += 2) ASSERT_TRUE(Write(**s, i, i + 1).ok());
    ASSERT_EQ((*s)->num_classes(), 2);
    EXPECT_EQ((*s)->class_bytes(0), 4 * KiB + 64 * KiB);
    EXPECT_EQ((*s)->class_bytes(1), 4 * KiB + 16 * KiB);
    for (uint64_t i = 0; i < 40; ++i) {
      EXPECT_EQ(RecordBytesOf(**s, i), 4 * KiB + RoundUp4K(LenOf(i))) << i;
      records[i] = (*s)->Find(Id(i))->record;
    }
    const NvmeStoreStats st = (*s)->Stats();
    EXPECT_EQ(st.used_bytes, 20 * (68 + 20) * KiB);
    EXPECT_EQ(st.record_bytes, 20 * KiB);
    // A payload larger than a record may hold is refused, and no class is made for it.
    auto big = Aligned(2 * kBig);
    NvmeWrite w;
    w.id = Id(999);
    w.payload = big.get();
    w.len = kBig + 4096;
    (void)(*s)->WriteBatch(std::span<NvmeWrite>(&w, 1));
    EXPECT_TRUE(w.result.IsInvalid()) << w.result.ToString();
    EXPECT_EQ((*s)->num_classes(), 2);
  }
  auto s = NvmeStore::Open(BySize(d.path()));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ((*s)->Stats().index_entries_dropped, 0u);
  EXPECT_EQ((*s)->Stats().loaded_at_open, records.size());
  ASSERT_EQ((*s)->num_classes(), 2);
  EXPECT_EQ((*s)->class_bytes(0), 4 * KiB + 16 * KiB) << "the index's first entry is block 0, a small one";
  for (uint64_t i = 0; i < 40; ++i) {
    EXPECT_TRUE(Read(**s, i).ok()) << i;
    EXPECT_EQ((*s)->Find(Id(i))->record, records[i]) << i;
    EXPECT_EQ(RecordBytesOf(**s, i), 4 * KiB + RoundUp4K(LenOf(i))) << i;
  }
  // A third size makes a third class; new blocks never take a taken record.
  ASSERT_TRUE(Write(**s, 100, 104, [](uint64_t) -> uint64_t { return 40 * KiB; }).ok());
  EXPECT_EQ((*s)->num_classes(), 3);
  for (uint64_t i = 100; i < 104; ++i) {
    EXPECT_EQ(RecordBytesOf(**s, i), 44 * KiB);
    for (const auto& [j, r] : records) EXPECT_NE((*s)->Find(Id(i))->record, r);
  }
}

TEST(NvmeClasses, AFolderOfRecordsBySizeAndOneOfListedClassesRefuseEachOther) {
  testing::TempDir a, b;
  ASSERT_TRUE(NvmeStore::Open(BySize(a.path())).ok());
  auto listed = NvmeStore::Open(Opts(a.path()));
  ASSERT_FALSE(listed.ok());
  EXPECT_NE(listed.status().message().find("the sizes of their blocks"), std::string::npos)
      << listed.status().ToString();
  ASSERT_TRUE(NvmeStore::Open(Opts(b.path())).ok());
  EXPECT_FALSE(NvmeStore::Open(BySize(b.path())).ok());
  NvmeStoreOptions both = BySize(a.path());
  both.classes = {kSmall, kBig};
  EXPECT_TRUE(NvmeStore::Open(both).status().IsInvalid());
}

}  // namespace
}  // namespace kvtier::tiers
