// The contract file (daemon/contract_store.h): the golden file of version 1 under
// tests/data/ is read; a torn tail is cut; other formats and versions are refused by name;
// namespace records make a file of version 2; removals rewrite the file without them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "daemon/contract_store.h"

namespace kvtier::daemon {
namespace {

// The two contracts tests/data/contracts_v1.kvc holds, in this order.
ScaleContract Golden0() {
  ScaleContract c;
  c.model_id = "kvtier/test-llama";
  c.model_revision = "r1";
  c.tokenizer_revision = "t1";
  c.geometry = {2, 2, 64, 16};
  c.k_scales = {1.0f, 0.5f};
  c.v_scales = {0.25f, 2.0f};
  return c;
}
ScaleContract Golden1() {
  ScaleContract c;
  c.model_id = "kvtier/test-80l";
  c.model_revision = "r2";
  c.tokenizer_revision = "t2";
  c.geometry = {80, 1, 128, 16};
  c.tp_rank = 1;
  c.tp_size = 8;
  c.SetUnitScales();
  c.k_scales[3] = 0.75f;
  return c;
}

std::vector<uint8_t> ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void WriteAll(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

class ContractStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("kvtier_contract_store_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  // A copy of the golden file to open (Open may truncate; the checked-in file stays as is).
  std::string CopyOfGolden() {
    const std::string p = (dir_ / "contracts.kvc").string();
    WriteAll(p, golden());
    return p;
  }
  static std::vector<uint8_t> golden() { return ReadAll(std::string(KVTIER_TEST_DATA_DIR) + "/contracts_v1.kvc"); }
  std::filesystem::path dir_;
};

TEST_F(ContractStoreTest, ReadsTheGoldenFileOfVersion1) {
  const std::vector<uint8_t> g = golden();
  ASSERT_GT(g.size(), sizeof(ContractFileHeader)) << "missing tests/data/contracts_v1.kvc";
  // The header as version 1 wrote it, byte by byte.
  const uint8_t head[16] = {'K', 'V', 'C', 'S', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(g.data(), head, sizeof head), 0);
  std::vector<ScaleContract> got;
  uint64_t dropped = 1;
  auto s = ContractStore::Open(CopyOfGolden(), &got, &dropped);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(dropped, 0u);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], Golden0());
  EXPECT_EQ(got[1], Golden1());
  EXPECT_EQ(ContractIdHex(got[0].Id()), ContractIdHex(Golden0().Id()));
  // Nothing was rewritten.
  EXPECT_EQ(ReadAll((dir_ / "contracts.kvc").string()), g);
}

// tests/data/contracts_v2.kvc: Golden0 in the implicit namespace, Golden0 in tenant
// "tenant-a"'s and Golden1 in the shared one, written by version 2 in this order.
TEST_F(ContractStoreTest, ReadsTheGoldenFileOfVersion2) {
  const std::vector<uint8_t> g = ReadAll(std::string(KVTIER_TEST_DATA_DIR) + "/contracts_v2.kvc");
  ASSERT_GT(g.size(), sizeof(ContractFileHeader)) << "missing tests/data/contracts_v2.kvc";
  const uint8_t head[16] = {'K', 'V', 'C', 'S', 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(std::memcmp(g.data(), head, sizeof head), 0);
  const std::string p = (dir_ / "contracts.kvc").string();
  WriteAll(p, g);
  std::vector<StoredContract> got;
  uint64_t dropped = 1;
  auto s = ContractStore::Open(p, &got, &dropped);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(dropped, 0u);
  const std::vector<StoredContract> want{{Golden0(), ""}, {Golden0(), "tenant-a"}, {Golden1(), "shared"}};
  EXPECT_EQ(got, want);
  EXPECT_EQ(ReadAll(p), g);  // nothing rewritten
  // The same registrations in a fresh file are the golden bytes.
  const std::string fresh = (dir_ / "fresh.kvc").string();
  {
    std::vector<StoredContract> none;
    auto f = ContractStore::Open(fresh, &none);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (const StoredContract& c : want) ASSERT_TRUE((*f)->Add(c.contract, c.ns).ok());
  }
  EXPECT_EQ(ReadAll(fresh), g);
}

TEST_F(ContractStoreTest, AddingAKnownContractWritesNothingAndANewOneAppends) {
  const std::string p = CopyOfGolden();
  {
    std::vector<ScaleContract> got;
    auto s = ContractStore::Open(p, &got);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Add(Golden1()).ok());
    EXPECT_EQ(ReadAll(p), golden());
    ScaleContract c = Golden0();
    c.model_revision = "r9";
    ASSERT_TRUE((*s)->Add(c).ok());
  }
  std::vector<ScaleContract> got;
  auto s = ContractStore::Open(p, &got);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].model_revision, "r9");
}

TEST_F(ContractStoreTest, ATornTailIsCutAndTheRestKept) {
  std::vector<uint8_t> g = golden();
  const size_t whole = g.size();
  g.resize(whole - 5);  // the second record cut short
  const std::string p = (dir_ / "contracts.kvc").string();
  WriteAll(p, g);
  std::vector<ScaleContract> got;
  uint64_t dropped = 0;
  auto s = ContractStore::Open(p, &got, &dropped);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], Golden0());
  const size_t first_record = sizeof(ContractFileHeader) + sizeof(ContractRecordHeader) + Golden0().Serialize().size();
  EXPECT_EQ(dropped, g.size() - first_record);
  EXPECT_EQ(std::filesystem::file_size(p), first_record);
}

TEST_F(ContractStoreTest, AnotherVersionIsRefusedByNameAndLeftAsItIs) {
  std::vector<uint8_t> g = golden();
  g[4] = static_cast<uint8_t>(kContractFileVersion + 1);  // a version after this build's
  const std::string p = (dir_ / "contracts.kvc").string();
  WriteAll(p, g);
  std::vector<ScaleContract> got;
  auto s = ContractStore::Open(p, &got);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnsupported) << s.status().ToString();
  EXPECT_NE(s.status().message().find("contract file version " + std::to_string(kContractFileVersion + 1)),
            std::string::npos)
      << s.status().ToString();
  EXPECT_TRUE(got.empty());
  EXPECT_EQ(ReadAll(p), g);
}

TEST_F(ContractStoreTest, AnotherMagicIsRefusedByName) {
  std::vector<uint8_t> g = golden();
  g[0] = 'X';
  auto r = ParseContractFile(g, "f.kvc", nullptr);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(r.status().message().find("f.kvc is not a kvtier contract file"), std::string::npos);
}

TEST_F(ContractStoreTest, ParseReturnsTheIntactPrefix) {
  const std::vector<uint8_t> g = golden();
  std::vector<ScaleContract> got;
  auto r = ParseContractFile(g, "f", &got);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(*r, g.size());
  EXPECT_EQ(got.size(), 2u);
  std::vector<uint8_t> flipped = g;
  flipped.back() ^= 1;  // the second record's payload no longer matches its checksum
  got.clear();
  r = ParseContractFile(flipped, "f", &got);
  ASSERT_TRUE(r.ok());
  EXPECT_LT(*r, g.size());
  EXPECT_EQ(got.size(), 1u);
}

TEST_F(ContractStoreTest, NamespaceRecordsMakeAFileOfVersion2AndComeBackWithTheirNamespace) {
  const std::string p = CopyOfGolden();
  {
    std::vector<StoredContract> got;
    auto s = ContractStore::Open(p, &got);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Add(Golden0(), "").ok());  // already there (the golden file's)
    EXPECT_EQ(ReadAll(p), golden()) << "a known contract wrote something";
    ASSERT_TRUE((*s)->Add(Golden0(), "team-a").ok());  // the same contract in a tenant's namespace
    ASSERT_TRUE((*s)->Add(Golden1(), "shared").ok());
    ASSERT_TRUE((*s)->Add(Golden1(), "shared").ok());  // a repeat: nothing new
    EXPECT_EQ((*s)->size(), 4u);
  }
  const std::vector<uint8_t> now = ReadAll(p);
  ASSERT_GT(now.size(), sizeof(ContractFileHeader));
  EXPECT_EQ(now[4], 2) << "a file with namespace records is version 2";
  std::vector<StoredContract> got;
  auto s = ContractStore::Open(p, &got);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0], (StoredContract{Golden0(), ""}));
  EXPECT_EQ(got[1], (StoredContract{Golden1(), ""}));
  EXPECT_EQ(got[2], (StoredContract{Golden0(), "team-a"}));
  EXPECT_EQ(got[3], (StoredContract{Golden1(), "shared"}));
  EXPECT_FALSE(std::filesystem::exists(p + ".tmp"));
}

TEST_F(ContractStoreTest, RemovedContractsAreGoneAfterAReopenAndTheRestStays) {
  const std::string p = CopyOfGolden();
  {
    std::vector<StoredContract> got;
    auto s = ContractStore::Open(p, &got);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    ASSERT_TRUE((*s)->Add(Golden1(), "team-a").ok());
    const uint64_t ids[] = {Golden1().Id(), 12345};
    ASSERT_TRUE((*s)->Remove("", ids).ok());  // the implicit tenant's copy only
    ASSERT_TRUE((*s)->Remove("nobody", ids).ok());  // nothing stored there: nothing changes
    ASSERT_TRUE((*s)->Add(Golden1(), "").ok());  // appended again after the rewrite
    const uint64_t g0[] = {Golden0().Id()};
    ASSERT_TRUE((*s)->Remove("", g0).ok());
  }
  std::vector<StoredContract> got;
  auto s = ContractStore::Open(p, &got);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0], (StoredContract{Golden1(), "team-a"}));
  EXPECT_EQ(got[1], (StoredContract{Golden1(), ""}));
  {
    const uint64_t g1[] = {Golden1().Id()};
    ASSERT_TRUE((*s)->Remove("team-a", g1).ok());
  }
  s->reset();
  const std::vector<uint8_t> now = ReadAll(p);
  EXPECT_EQ(now[4], 3) << "a file with deletion records is version 3";
  got.clear();
  s = ContractStore::Open(p, &got);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], (StoredContract{Golden1(), ""}));
}

// A forget appends a deletion record: the file grows by it and no record before it is
// rewritten; once the dead records pass kCompactAfterDeadRecords and outnumber the live
// ones, the file is compacted to the live records.
TEST_F(ContractStoreTest, ForgetsAppendAndCompactionKeepsTheLiveRecords) {
  const std::string p = (dir_ / "contracts.kvc").string();
  std::vector<StoredContract> none;
  auto s = ContractStore::Open(p, &none);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  auto model = [](int i) {
    ScaleContract c = Golden0();
    c.model_id = "m/" + std::to_string(i);
    return c;
  };
  const int n = static_cast<int>(kCompactAfterDeadRecords);
  for (int i = 0; i < n; ++i) ASSERT_TRUE((*s)->Add(model(i)).ok());
  const std::vector<uint8_t> before = ReadAll(p);
  const uint64_t id0[] = {model(0).Id()};
  ASSERT_TRUE((*s)->Remove("", id0).ok());
  const std::vector<uint8_t> after = ReadAll(p);
  ASSERT_GT(after.size(), before.size());
  EXPECT_EQ(after[4], 3);
  EXPECT_EQ(std::memcmp(after.data() + 16, before.data() + 16, before.size() - 16), 0)
      << "a forget rewrote records before its own";
  EXPECT_LT(after.size() - before.size(), 64u) << "a forget wrote more than its deletion record";
  EXPECT_EQ((*s)->compactions(), 0u);
  // Forget all but the last 100: the dead records outnumber the live ones.
  for (int i = 1; i < n - 100; ++i) {
    const uint64_t id[] = {model(i).Id()};
    ASSERT_TRUE((*s)->Remove("", id).ok());
  }
  EXPECT_GE((*s)->compactions(), 1u);
  EXPECT_EQ((*s)->size(), 100u);
  s->reset();
  EXPECT_LT(ReadAll(p).size(), before.size()) << "the file holds every forgotten record still";
  std::vector<StoredContract> got;
  ContractParseReport rep;
  auto r = ContractStore::Open(p, &got, nullptr, &rep);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(got.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i].contract, model(n - 100 + i)) << i;
  EXPECT_EQ(rep.corrupt_records, 0u);
}

// One flipped bit in a record in the middle: that record is skipped (counted as
// corruption), every record after it is kept, and the file is compacted without it (not
// truncated at it).
TEST_F(ContractStoreTest, ACorruptRecordInTheMiddleIsSkippedAndTheRecordsAfterItKept) {
  const std::string p = (dir_ / "contracts.kvc").string();
  auto model = [](int i) {
    ScaleContract c = Golden0();
    c.model_id = "m/" + std::to_string(i);
    return c;
  };
  std::vector<size_t> ends;
  {
    std::vector<StoredContract> none;
    auto s = ContractStore::Open(p, &none);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 100; ++i) {
      ASSERT_TRUE((*s)->Add(model(i)).ok());
      ends.push_back(std::filesystem::file_size(p));
    }
  }
  for (const size_t flip : {ends[40] + 5 /* record 41's length */, ends[40] + 20 /* its payload */,
                            ends[40] + 1 /* its magic */}) {
    std::vector<uint8_t> b = ReadAll(p);
    std::vector<uint8_t> bad = b;
    bad[flip] ^= 0x10;
    const std::string q = (dir_ / "corrupt.kvc").string();
    WriteAll(q, bad);
    std::vector<StoredContract> got;
    ContractParseReport rep;
    uint64_t dropped = 0;
    auto s = ContractStore::Open(q, &got, &dropped, &rep);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    EXPECT_EQ(rep.corrupt_records, 1u) << "flip at " << flip;
    EXPECT_EQ(dropped, 0u) << "the records after the corrupt one were dropped as a torn tail";
    ASSERT_EQ(got.size(), 99u) << "flip at " << flip;
    for (int i = 0, j = 0; i < 100; ++i) {
      if (i == 41) continue;
      EXPECT_EQ(got[j++].contract, model(i)) << i;
    }
    s->reset();
    got.clear();
    s = ContractStore::Open(q, &got, &dropped, &rep);
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(rep.corrupt_records, 0u) << "the compaction at open left the corruption in the file";
    EXPECT_EQ(got.size(), 99u);
  }
}

TEST_F(ContractStoreTest, ANamespaceRecordInAFileOfVersion1IsATornTail) {
  // A version-1 header followed by a KVCN record: not a record of that version.
  const std::string p = CopyOfGolden();
  {
    std::vector<StoredContract> got;
    auto s = ContractStore::Open(p, &got);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Add(Golden0(), "team-a").ok());
  }
  std::vector<uint8_t> b = ReadAll(p);
  ASSERT_EQ(b[4], 2);
  b[4] = 1;
  std::vector<StoredContract> got;
  auto r = ParseContractRecords(b, "f", &got);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(got.size(), 2u) << "only the two plain records";
  EXPECT_LT(*r, b.size());
}

}  // namespace
}  // namespace kvtier::daemon
