// The TierManager's remote wiring, in process: two TierManagers (two "hosts", each with
// its own host arena and NVMe folder) sharing the fixture's Redis Cluster. Also run under
// ThreadSanitizer (docs/remote.md): the remote threads, the mover and callers race here.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <mutex>
#include <random>
#include <thread>

#include "formats/contract.h"
#include "testing/test_point.h"
#include "tests/remote/redis_env.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {
namespace {

using remote::testing::SharedNodes;

struct Host {
  std::string dir;
  std::unique_ptr<TierManager> tm;
  ~Host() {
    tm.reset();
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

ScaleContract Contract(const std::string& model) {
  ScaleContract c;
  c.model_id = model;
  c.geometry = Geometry{2, 1, 64, 16};  // 2 layers x 1 head x 64 dim x 16 tokens
  c.SetUnitScales();
  return c;
}

std::unique_ptr<Host> Open(remote::RemoteWrite write, uint32_t host_slots, uint32_t nvme_slots,
                           const ScaleContract& c) {
  auto h = std::make_unique<Host>();
  char tmpl[] = "/tmp/kvtier-tmr-XXXXXX";
  h->dir = mkdtemp(tmpl);
  TierManagerOptions o;
  o.slot_bytes = 4096;
  o.host.capacity_bytes = uint64_t{host_slots} * 4096;
  o.host.high_watermark = 0.75;
  o.host.low_watermark = 0.5;
  o.nvme.tier.capacity_bytes = uint64_t{nvme_slots} * 8192;
  o.nvme.dir = h->dir + "/nvme";
  o.remote.nodes = SharedNodes();
  o.remote.write = write;
  o.remote.batch = 4;
  auto tm = TierManager::Open(o);
  EXPECT_TRUE(tm.ok()) << tm.status().ToString();
  h->tm = std::move(tm.value());
  EXPECT_TRUE(h->tm->RegisterContract(c).ok());
  return h;
}

uint8_t ByteOf(const Key128& k, size_t i) { return static_cast<uint8_t>((k.lo >> (i % 64)) ^ k.hi ^ i); }

// Stores keys through alloc / fill / commit / unpin, a few at a time.
void Store(TierManager& tm, uint64_t cid, uint64_t block, const std::vector<Key128>& keys) {
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<SlotRef> s;
    Status st;
    for (int tries = 0; tries < 200; ++tries) {
      st = tm.AllocSlots(cid, 1, Tier::kHost, &s);
      if (st.code() != StatusCode::kRetry) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The TierManager's own (writable) mapping of the slot: clients map the arena read-only.
    uint8_t* p = tm.host_slot_ptr(s[0].slot);
    ASSERT_NE(p, nullptr);
    for (size_t j = 0; j < block; ++j) p[j] = ByteOf(keys[i], j);
    ASSERT_TRUE(tm.Commit(cid, s[0], keys[i], i ? keys[i - 1] : Key128{}).ok());
    ASSERT_TRUE(tm.Unpin(s[0]).ok());
  }
}

// Acquires into host and checks bytes; returns blocks served or -1 on a wrong block.
// from (optional) gets where the acquire found each block.
long AcquireChecked(TierManager& tm, uint64_t cid, uint64_t block, const std::vector<Key128>& keys,
                    std::vector<Tier>* from = nullptr) {
  std::promise<std::vector<SlotRef>> pr;
  tm.Acquire(cid, keys, Tier::kHost, [&](Status, std::vector<SlotRef> v) { pr.set_value(std::move(v)); });
  auto got = pr.get_future().get();
  if (from != nullptr) {
    from->clear();
    for (const SlotRef& s : got) from->push_back(s.from);
  }
  uint8_t* p = static_cast<uint8_t*>(mmap(nullptr, tm.host_arena_bytes(), PROT_READ, MAP_SHARED, tm.host_arena_fd(), 0));
  long ok = static_cast<long>(got.size());
  for (size_t i = 0; i < got.size(); ++i) {
    for (size_t j = 0; j < block; ++j) {
      if (p[got[i].slot * tm.slot_bytes() + j] != ByteOf(keys[i], j)) {
        ok = -1;
        break;
      }
    }
  }
  munmap(p, tm.host_arena_bytes());
  for (auto s : got) EXPECT_TRUE(tm.Unpin(s).ok());
  return ok;
}

std::vector<Key128> Keys(size_t n) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<Key128> k(n);
  for (auto& x : k) x = Key128{rng(), rng()};
  return k;
}

TierStats RemoteStats(TierManager& tm) {
  for (const auto& s : tm.Stats()) {
    if (s.tier == Tier::kRemote) return s;
  }
  ADD_FAILURE() << "no remote tier in Stats()";
  return {};
}

// Host evictions under the watermarks (not a flush) write blocks on their way out; with
// NVMe absent they are dropped locally and survive only remotely.
TEST(TierManagerRemote, EvictionWritesOnDemoteAndAnotherHostRestores) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const ScaleContract c = Contract("tmr/evict");
  const uint64_t cid = c.Id(), block = c.block_bytes();
  auto a = Open(remote::RemoteWrite::kOnDemote, 8, 0, c);
  auto b = Open(remote::RemoteWrite::kOff, 32, 0, c);
  const auto keys = Keys(20);
  Store(*a->tm, cid, block, keys);
  a->tm->Drain();
  const TierStats ra = RemoteStats(*a->tm);
  EXPECT_GE(ra.demotions_out, 12u);  // at least the 20 - 8 that left host
  EXPECT_EQ(ra.write_errors, 0u);
  // The first blocks are the coldest: evicted from A, so on the cluster.
  const std::vector<Key128> head(keys.begin(), keys.begin() + 10);
  LookupResult lr = b->tm->Lookup(cid, head);
  ASSERT_EQ(lr.hit_blocks, 10u);
  for (Tier t : lr.tiers) EXPECT_EQ(t, Tier::kRemote);
  EXPECT_GT(lr.est_seconds_to_hbm, 0.0);
  std::vector<Tier> from;
  EXPECT_EQ(AcquireChecked(*b->tm, cid, block, head, &from), 10);
  ASSERT_EQ(from.size(), 10u);
  for (Tier t : from) EXPECT_EQ(t, Tier::kRemote) << "the acquire fetched them from the remote tier";
  lr = b->tm->Lookup(cid, head);
  EXPECT_EQ(lr.tiers[0], Tier::kHost);
  EXPECT_EQ(AcquireChecked(*b->tm, cid, block, head, &from), 10);  // now local
  for (Tier t : from) EXPECT_EQ(t, Tier::kHost);
  EXPECT_EQ(RemoteStats(*b->tm).promotions_in, 10u);
}

// Prefetch goes remote too: returns at once, and after Drain the blocks are local and
// unpinned (evictable).
TEST(TierManagerRemote, PrefetchFetchesRemoteBlocksAndLeavesThemUnpinned) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const ScaleContract c = Contract("tmr/prefetch");
  const uint64_t cid = c.Id(), block = c.block_bytes();
  auto a = Open(remote::RemoteWrite::kWriteThrough, 16, 0, c);
  auto b = Open(remote::RemoteWrite::kOff, 16, 0, c);
  const auto keys = Keys(6);
  Store(*a->tm, cid, block, keys);
  a->tm->Drain();
  b->tm->Prefetch(cid, keys, Tier::kHost);
  b->tm->Drain();
  const LookupResult lr = b->tm->Lookup(cid, keys);
  ASSERT_EQ(lr.hit_blocks, 6u);
  for (Tier t : lr.tiers) EXPECT_EQ(t, Tier::kHost);
  for (const auto& s : b->tm->Stats()) {
    if (s.tier == Tier::kHost) {
      EXPECT_EQ(s.pinned, 0u);
    }
  }
  EXPECT_EQ(AcquireChecked(*b->tm, cid, block, keys), 6);
}

// Several threads acquire overlapping prefixes of remote blocks at once while the writer
// keeps writing: every served block is right, and the prefix only grows.
TEST(TierManagerRemote, ConcurrentAcquiresWhileWriting) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const ScaleContract c = Contract("tmr/concurrent");
  const uint64_t cid = c.Id(), block = c.block_bytes();
  auto a = Open(remote::RemoteWrite::kWriteThrough, 64, 64, c);
  auto b = Open(remote::RemoteWrite::kOff, 64, 0, c);
  const auto keys = Keys(24);
  std::atomic<bool> wrong{false};
  std::thread writer([&] { Store(*a->tm, cid, block, keys); });
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      for (int r = 0; r < 6; ++r) {
        const std::vector<Key128> pre(keys.begin(), keys.begin() + 6 + 3 * t);
        if (AcquireChecked(*b->tm, cid, block, pre) < 0) wrong = true;
        if (r % 2) {
          for (const Key128& k : pre) (void)b->tm->Evict(cid, k);  // read remotely again
        }
      }
    });
  }
  writer.join();
  for (auto& t : readers) t.join();
  EXPECT_FALSE(wrong) << "a wrong block was served";
  a->tm->Drain();
  for (const Key128& k : keys) (void)b->tm->Evict(cid, k);
  EXPECT_EQ(AcquireChecked(*b->tm, cid, block, keys), 24);
  EXPECT_EQ(RemoteStats(*b->tm).checksum_failures, 0u);
}

// A fetch stages its blocks into host held, and they stay held until the acquire that
// follows has pinned them. At the point between the two, an eviction of a staged block
// is refused and the acquire serves every block; were they committed and left unpinned
// and unheld there (or did the eviction ignore holds), the evictions would go through and
// the acquire would stop at the first evicted block.
TEST(TierManagerRemote, RemoteFetchHoldsStagedBlocksUntilAcquired) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
#if !KVTIER_TEST_POINTS
  GTEST_SKIP() << "built without KVTIER_TEST_POINTS: the staging point is compiled out";
#else
  const ScaleContract c = Contract("tmr/staged");
  const uint64_t cid = c.Id(), block = c.block_bytes();
  auto a = Open(remote::RemoteWrite::kWriteThrough, 16, 0, c);
  auto b = Open(remote::RemoteWrite::kOff, 16, 0, c);
  const auto keys = Keys(6);
  Store(*a->tm, cid, block, keys);
  a->tm->Drain();
  TierManager* tb = b->tm.get();
  std::mutex mu;
  int hits = 0;
  std::vector<Status> evicts;
  SetTestPointCallback([&](std::string_view name) {
    if (name != "TierManager::RemoteFetch:Staged") return;
    std::lock_guard<std::mutex> l(mu);
    ++hits;
    for (const Key128& k : keys) evicts.push_back(tb->Evict(cid, k));
  });
  std::vector<Tier> from;
  const long got = AcquireChecked(*b->tm, cid, block, keys, &from);
  SetTestPointCallback({});
  std::lock_guard<std::mutex> l(mu);
  EXPECT_EQ(hits, 1) << "the fetch passes its staging point once";
  ASSERT_EQ(evicts.size(), keys.size());
  for (const Status& s : evicts) EXPECT_EQ(s.code(), StatusCode::kRejected) << s.ToString();
  EXPECT_EQ(got, 6);
  ASSERT_EQ(from.size(), 6u);
  for (Tier t : from) EXPECT_EQ(t, Tier::kRemote);
  // Acquired and unpinned: nothing holds them any more.
  b->tm->Drain();
  EXPECT_TRUE(b->tm->Evict(cid, keys[0]).ok());
#endif
}

// Contracts registered with a remote namespace (the daemon's tenants: their names; the
// shared namespace: "shared") write their blocks as <key_prefix><ns>:{...} keys and fetch
// only keys of their own namespace: one contract id and prompt under two namespaces are
// two keys, and neither host is served the other's; one namespace on two hosts is one key,
// written by one and served to the other.
TEST(TierManagerRemote, RemoteNamespacesAreKeysOfTheirOwn) {
  KVTIER_REQUIRE_SHARED_CLUSTER();
  const ScaleContract c = Contract("tmr/namespaces");
  const uint64_t block = c.block_bytes();
  auto a = Open(remote::RemoteWrite::kWriteThrough, 32, 0, c);
  auto b = Open(remote::RemoteWrite::kWriteThrough, 32, 0, c);
  remote::RemoteOptions ro;
  ro.nodes = SharedNodes();
  auto probe = remote::RemoteTier::Open(ro);
  ASSERT_TRUE(probe.ok()) << probe.status().ToString();
  // One id under two namespaces (a daemon derives its tenants' ids, but the namespace
  // alone must keep them apart in the cluster).
  const uint64_t id = Contract("tmr/namespaces/tenant").Id();
  const ScaleContract ct = Contract("tmr/namespaces/tenant");
  ASSERT_TRUE(a->tm->RegisterContractAs(ct, id, 0, "tenant-a").ok());
  ASSERT_TRUE(b->tm->RegisterContractAs(ct, id, 0, "tenant-b").ok());
  EXPECT_TRUE(b->tm->RegisterContractAs(ct, id, 0, "tenant-a").IsInvalid()) << "another namespace for the same id";
  EXPECT_TRUE(b->tm->RegisterContractAs(ct, id + 1, 0, "bad{ns}").IsInvalid());
  const auto keys = Keys(4);
  Store(*a->tm, id, block, keys);
  a->tm->Drain();
  EXPECT_EQ((*probe)->ExistsPrefix(id, keys, "tenant-a"), keys.size());
  EXPECT_EQ((*probe)->ExistsPrefix(id, keys, ""), 0u) << "a namespaced block was written without its namespace";
  EXPECT_EQ(b->tm->Lookup(id, keys).hit_blocks, 0u) << "tenant-b sees tenant-a's remote blocks";
  EXPECT_EQ(AcquireChecked(*b->tm, id, block, keys), 0) << "tenant-b was served tenant-a's remote blocks";
  Store(*b->tm, id, block, keys);  // the same prompt under tenant-b: a key of its own
  b->tm->Drain();
  EXPECT_EQ((*probe)->ExistsPrefix(id, keys, "tenant-b"), keys.size());
  EXPECT_EQ((*probe)->ExistsPrefix(id, keys, "tenant-a"), keys.size());
  // The shared namespace: one key, written by a, served to b.
  const ScaleContract sc = Contract("tmr/namespaces/shared");
  const uint64_t sid = sc.Id();
  ASSERT_TRUE(a->tm->RegisterContractAs(sc, sid, 0, "shared").ok());
  ASSERT_TRUE(b->tm->RegisterContractAs(sc, sid, 0, "shared").ok());
  const auto shared_keys = Keys(4);
  Store(*a->tm, sid, block, shared_keys);
  a->tm->Drain();
  EXPECT_EQ((*probe)->ExistsPrefix(sid, shared_keys, "shared"), shared_keys.size());
  std::vector<Tier> from;
  EXPECT_EQ(AcquireChecked(*b->tm, sid, block, shared_keys, &from), 4);
  for (Tier t : from) EXPECT_EQ(t, Tier::kRemote);
}

}  // namespace
}  // namespace kvtier::tiers
