// HBM tier tests (ctest label `gpu`). They skip, saying why, without a CUDA build or
// without a device; on the H200 machine they run the HBM pool and the TierManager's
// HBM paths (NVMe -> host -> HBM promotion, HBM -> host demotion, merged acquires).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <future>
#include <random>

#include "formats/contract.h"
#include "tests/tiers/test_util.h"
#include "common/cuda_env.h"
#include "tiers/hbm/block_hash.h"
#include "tiers/hbm/hbm_pool.h"
#include "tiers/host/host_pool.h"
#include "tiers/nvme/nvme_store.h"
#include "tiers/tier_manager.h"

#if KVTIER_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace kvtier::tiers {
namespace {

using testing::K;

#define SKIP_WITHOUT_GPU()                                                      \
  do {                                                                          \
    std::string why;                                                            \
    if (!cuda::Compiled()) GTEST_SKIP() << "built without CUDA";                \
    if (cuda::DeviceCount(&why) == 0) GTEST_SKIP() << "no CUDA device: " << why; \
  } while (0)

#if KVTIER_HAVE_CUDA
bool DeviceMatches(const uint8_t* dev, size_t n, uint64_t seed) {
  auto buf = testing::Aligned(n);
  if (cudaMemcpy(buf.get(), dev, n, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  return testing::Matches(buf.get(), n, seed);
}
// Returns once the bytes are in HBM, as an engine's writes must be before it commits:
// cudaMemcpy from pageable memory may return before its DMA lands, and the commit's hash
// runs on a stream of the pool's own.
bool DeviceFill(uint8_t* dev, size_t n, uint64_t seed) {
  auto buf = testing::Aligned(n);
  testing::Fill(buf.get(), n, seed);
  return cudaMemcpy(dev, buf.get(), n, cudaMemcpyHostToDevice) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
}
// Flips the low bit of one device byte, as a stray write through an IPC mapping would,
// after the device is idle (so after the hash the commit queued on the pool's stream).
bool DeviceFlip(uint8_t* dev) {
  if (cudaDeviceSynchronize() != cudaSuccess) return false;
  uint8_t b = 0;
  if (cudaMemcpy(&b, dev, 1, cudaMemcpyDeviceToHost) != cudaSuccess) return false;
  b ^= 1;
  return cudaMemcpy(dev, &b, 1, cudaMemcpyHostToDevice) == cudaSuccess;
}
#else
bool DeviceFlip(uint8_t*) { return false; }
bool DeviceMatches(const uint8_t*, size_t, uint64_t) { return false; }
bool DeviceFill(uint8_t*, size_t, uint64_t) { return false; }
#endif

TEST(HbmPool, CopiesRoundTripAndExportsAnIpcHandle) {
  SKIP_WITHOUT_GPU();
  const uint64_t slot = 1474560;
  HostPoolOptions ho;
  ho.slot_bytes = slot;
  ho.slots = 4;
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok());
  EXPECT_TRUE((*host)->cuda_registered());
  HbmPoolOptions o;
  o.slot_bytes = slot;
  o.slots = 8;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  auto s = pool.Alloc();
  ASSERT_TRUE(s.has_value());
  testing::Fill((*host)->slot_ptr(0), slot, 5);
  std::promise<Status> up, down;
  ASSERT_TRUE(pool.CopyToDevice(*s, (*host)->slot_ptr(0), slot, [&](Status st) { up.set_value(st); }).ok());
  ASSERT_TRUE(up.get_future().get().ok());
  EXPECT_TRUE(DeviceMatches(pool.slot_ptr(*s), slot, 5));
  ASSERT_TRUE(pool.CopyToHost(*s, (*host)->slot_ptr(1), slot, [&](Status st) { down.set_value(st); }).ok());
  ASSERT_TRUE(down.get_future().get().ok());
  EXPECT_TRUE(testing::Matches((*host)->slot_ptr(1), slot, 5));
  uint8_t h[64] = {};
  ASSERT_TRUE(pool.IpcHandle(h).ok());
  bool nonzero = false;
  for (uint8_t b : h) nonzero |= b != 0;
  EXPECT_TRUE(nonzero);
  EXPECT_TRUE(pool.Free(*s).ok());
  EXPECT_TRUE(pool.Free(*s).IsInvalid());
  EXPECT_TRUE(pool.CopyToDevice(99, (*host)->slot_ptr(0), slot, [](Status) {}).IsInvalid());
}

// The arena's allocation is whole 2 MiB pages whatever the slots add up to: a process that
// imports an allocation of another size over CUDA IPC maps it with small pages, and the
// decode's reads of pages spread over the arena then run several times slower
// (docs/tiers.md "Layer-major HBM"). 8 slots of 1440 KiB are 11.25 MiB.
TEST(HbmPool, ArenaIsAllocatedInWhole2MiBPages) {
  SKIP_WITHOUT_GPU();
  HbmPoolOptions o;
  o.slot_bytes = 1474560;
  o.slots = 8;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  ASSERT_NE((*p)->arena_bytes() % (2u << 20), 0u) << "the case needs an arena that is not a 2 MiB multiple";
  using GetRange = int (*)(unsigned long long*, size_t*, unsigned long long);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &q), cudaSuccess);
  ASSERT_NE(fn, nullptr);
  unsigned long long base = 0;
  size_t size = 0;
  ASSERT_EQ(reinterpret_cast<GetRange>(fn)(&base, &size, reinterpret_cast<uintptr_t>((*p)->base())), 0);
  EXPECT_EQ(base, reinterpret_cast<uintptr_t>((*p)->base()));
  EXPECT_EQ(size % (2u << 20), 0u) << size;
  EXPECT_GE(size, (*p)->arena_bytes());
  EXPECT_LT(size, (*p)->arena_bytes() + (2u << 20));
}

// The block hash taken on the GPU (at commit: HashSlots; after a promotion: CopyBatch and
// CopyToDevice) equals the CPU's BlockHash of the same bytes, for one-chunk, many-chunk and
// ragged sizes on fresh random bytes; a slot never hashed, or freed since, has none.
TEST(HbmPool, GpuHashEqualsTheCpuHash) {
  SKIP_WITHOUT_GPU();
  const uint64_t slot = 1474560;  // 45 chunks of 32 KiB
  HostPoolOptions ho;
  ho.slot_bytes = slot;
  ho.slots = 8;
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok());
  HbmPoolOptions o;
  o.slot_bytes = slot;
  o.slots = 8;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  const uint64_t fresh = std::random_device{}();
  const uint64_t sizes[] = {slot, 576, 32768, 32769, 1000003, 16, 1};
  std::vector<HbmPool::HashItem> items;
  for (uint32_t i = 0; i < 7; ++i) {
    auto s = pool.Alloc();
    ASSERT_TRUE(s.has_value());
    EXPECT_FALSE(pool.SlotHash(*s).has_value()) << "slot " << *s << " has a hash before any";
    testing::Fill((*host)->slot_ptr(i), slot, fresh + i);
    ASSERT_TRUE(DeviceFill(pool.slot_ptr(*s), slot, fresh + i));
    items.push_back({*s, sizes[i]});
  }
  ASSERT_TRUE(pool.HashSlots(items).ok());
  // A copy out of the arena waits for the hashes queued before it.
  ASSERT_TRUE(pool.CopyToHostSync(items[0].slot, (*host)->slot_ptr(7), slot).ok());
  for (uint32_t i = 0; i < 7; ++i) {
    const auto h = pool.SlotHash(items[i].slot);
    ASSERT_TRUE(h.has_value()) << i;
    EXPECT_EQ(*h, BlockHash((*host)->slot_ptr(i), sizes[i], pool.hash_seed())) << "size " << sizes[i];
  }
  // One changed byte: the CPU hash of the changed bytes differs from the one taken.
  testing::Fill((*host)->slot_ptr(7), slot, fresh);
  (*host)->slot_ptr(7)[777] ^= 1;
  EXPECT_NE(*pool.SlotHash(items[0].slot), BlockHash((*host)->slot_ptr(7), slot, pool.hash_seed()));
  // A promotion's copies are hashed after they land.
  std::vector<HbmPool::CopyItem> up;
  for (uint32_t i = 0; i < 3; ++i) up.push_back({items[i].slot, (*host)->slot_ptr(4 + i), sizes[4 + i]});
  std::promise<Status> done;
  ASSERT_TRUE(pool.CopyBatch(up, true, [&](Status st) { done.set_value(st); }).ok());
  ASSERT_TRUE(done.get_future().get().ok());
  ASSERT_TRUE(pool.CopyToHostSync(items[0].slot, (*host)->slot_ptr(7), slot).ok());
  for (uint32_t i = 0; i < 3; ++i) {
    EXPECT_EQ(*pool.SlotHash(items[i].slot), BlockHash((*host)->slot_ptr(4 + i), sizes[4 + i], pool.hash_seed())) << i;
  }
  ASSERT_TRUE(pool.Free(items[0].slot).ok());
  EXPECT_FALSE(pool.SlotHash(items[0].slot).has_value());
}

// CopyBatch merges adjacent slots with adjacent host buffers into one copy. Pure: runs
// without a GPU.
TEST(HbmPool, CoalesceMergesOnlyAdjacentFullSlotsWithAdjacentHostBuffers) {
  const uint64_t S = 8192;
  std::vector<uint8_t> h(16 * S);
  auto at = [&](size_t i) { return static_cast<void*>(h.data() + i * S); };
  // slots 3,4,5 <- host 0,1,2 (one run); slot 6 <- host 7 (host gap: new run); slot 8 <-
  // host 8 (slot gap); slots 10,11 <- host 10,11 but 10 is partial (no merge past it).
  std::vector<HbmPool::CopyItem> items = {
      {5, at(2), S}, {3, at(0), S}, {4, at(1), S}, {6, at(7), S}, {8, at(8), S - 100},
      {10, at(10), S - 4096}, {11, at(11), S}};
  auto runs = HbmPool::CoalesceCopies(items, S);
  ASSERT_EQ(runs.size(), 5u);
  EXPECT_EQ(runs[0].slot, 3u);
  EXPECT_EQ(runs[0].host, at(0));
  EXPECT_EQ(runs[0].bytes, 3 * S);
  EXPECT_EQ(runs[1].slot, 6u);
  EXPECT_EQ(runs[1].bytes, S);
  EXPECT_EQ(runs[2].slot, 8u);
  EXPECT_EQ(runs[2].bytes, S - 100);
  EXPECT_EQ(runs[3].slot, 10u);
  EXPECT_EQ(runs[3].bytes, S - 4096);
  EXPECT_EQ(runs[4].slot, 11u);
  // A partial slot may end a run: slot 12 (full) + 13 (partial) <- host 12, 13.
  runs = HbmPool::CoalesceCopies({{13, at(13), 100}, {12, at(12), S}}, S);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].slot, 12u);
  EXPECT_EQ(runs[0].bytes, S + 100);
  EXPECT_TRUE(HbmPool::CoalesceCopies({}, S).empty());
}

// A batch whose copies coalesce (and one that does not) lands every byte where it belongs.
TEST(HbmPool, CoalescedBatchCopiesRoundTripExactly) {
  SKIP_WITHOUT_GPU();
  const uint64_t slot = 1474560;
  HostPoolOptions ho;
  ho.slot_bytes = slot;
  ho.slots = 12;
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok());
  HbmPoolOptions o;
  o.slot_bytes = slot;
  o.slots = 8;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  // host 0..3 -> hbm 2..5 (one run), host 5 -> hbm 0, host 7 -> hbm 1 (partial block).
  std::vector<HbmPool::CopyItem> up = {{4, (*host)->slot_ptr(2), slot}, {2, (*host)->slot_ptr(0), slot},
                                       {5, (*host)->slot_ptr(3), slot}, {3, (*host)->slot_ptr(1), slot},
                                       {0, (*host)->slot_ptr(5), slot}, {1, (*host)->slot_ptr(7), slot - 8192}};
  for (const auto& it : up) testing::Fill(static_cast<uint8_t*>(it.host), it.bytes, 100 + it.slot);
  std::promise<Status> a;
  ASSERT_TRUE(pool.CopyBatch(up, true, [&](Status st) { a.set_value(st); }).ok());
  ASSERT_TRUE(a.get_future().get().ok());
  for (const auto& it : up) EXPECT_TRUE(DeviceMatches(pool.slot_ptr(it.slot), it.bytes, 100 + it.slot)) << it.slot;
  // Back down into other host slots 8..11 (a run) and 6.
  std::vector<HbmPool::CopyItem> down = {{3, (*host)->slot_ptr(9), slot}, {2, (*host)->slot_ptr(8), slot},
                                         {5, (*host)->slot_ptr(11), slot}, {4, (*host)->slot_ptr(10), slot},
                                         {0, (*host)->slot_ptr(6), slot}};
  std::promise<Status> b;
  ASSERT_TRUE(pool.CopyBatch(down, false, [&](Status st) { b.set_value(st); }).ok());
  ASSERT_TRUE(b.get_future().get().ok());
  for (const auto& it : down) EXPECT_TRUE(testing::Matches(static_cast<uint8_t*>(it.host), slot, 100 + it.slot)) << it.slot;
}

// A host arena of parts (HostPoolOptions::part_shares: a memfd and a mapping per part, in
// one reservation) is registered part by part, and copies between HBM and slots of every
// part round-trip exactly, a coalesced run across the boundary of two parts included.
TEST(HbmPool, CopiesRoundTripFromEveryPartOfAPartedHostArena) {
  SKIP_WITHOUT_GPU();
  const uint64_t slot = 1474560;
  HostPoolOptions ho;
  ho.slot_bytes = slot;
  ho.slots = 12;
  ho.part_shares = {0.25, 0.25};  // slots 0..2, 3..5; the common pool 6..11
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  ASSERT_EQ((*host)->num_parts(), 2);
  EXPECT_TRUE((*host)->cuda_registered());
  HbmPoolOptions o;
  o.slot_bytes = slot;
  o.slots = 8;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  // As the TierManager does: a copy starts afresh at each part's start (registered apart).
  pool.SetHostBreaks({reinterpret_cast<uintptr_t>((*host)->base() + (*host)->part_offset(1)),
                      reinterpret_cast<uintptr_t>((*host)->base() + (*host)->part_offset(2))});
  // host 1..4 (parts 0 and 1) -> hbm 0..3 (two runs: 1..2 and 3..4), host 6 (the common
  // pool) -> hbm 5.
  std::vector<HbmPool::CopyItem> up = {{0, (*host)->slot_ptr(1), slot}, {1, (*host)->slot_ptr(2), slot},
                                       {2, (*host)->slot_ptr(3), slot}, {3, (*host)->slot_ptr(4), slot},
                                       {5, (*host)->slot_ptr(6), slot}};
  for (const auto& it : up) testing::Fill(static_cast<uint8_t*>(it.host), it.bytes, 200 + it.slot);
  std::promise<Status> a;
  ASSERT_TRUE(pool.CopyBatch(up, true, [&](Status st) { a.set_value(st); }).ok());
  ASSERT_TRUE(a.get_future().get().ok());
  for (const auto& it : up) EXPECT_TRUE(DeviceMatches(pool.slot_ptr(it.slot), it.bytes, 200 + it.slot)) << it.slot;
  // Back into host 2..5 (across the parts' boundary) and 11.
  std::vector<HbmPool::CopyItem> down = {{0, (*host)->slot_ptr(2), slot}, {1, (*host)->slot_ptr(3), slot},
                                         {2, (*host)->slot_ptr(4), slot}, {3, (*host)->slot_ptr(5), slot},
                                         {5, (*host)->slot_ptr(11), slot}};
  std::promise<Status> b;
  ASSERT_TRUE(pool.CopyBatch(down, false, [&](Status st) { b.set_value(st); }).ok());
  ASSERT_TRUE(b.get_future().get().ok());
  for (const auto& it : down) EXPECT_TRUE(testing::Matches(static_cast<uint8_t*>(it.host), slot, 200 + it.slot)) << it.slot;
}

// The coalescing rule at a granule below the block size (HBM slot classes): a block joins
// its predecessor's copy when its slot starts where that block's bytes end and its host
// buffer too; a slot of another class, or a gap, starts a new copy.
TEST(HbmPool, CoalesceFollowsOffsetsAtTheGranule) {
  const uint64_t G = 4096;
  std::vector<uint8_t> h(64 * G);
  auto at = [&](size_t off) { return static_cast<void*>(h.data() + off); };
  // 12 KiB blocks at slots 0, 3, 6 (offsets 0, 12K, 24K) from host 0, 12K, 24K: one copy.
  // A 4 KiB block at slot 9 from host 36K: joins (offset 36K). Slot 12 (48K) from host 52K:
  // host gap, new copy. Slot 16 from host 60K after a 4 KiB block at 48K: slot gap.
  auto runs = HbmPool::CoalesceCopies({{6, at(24 * 1024), 3 * G},
                                       {0, at(0), 3 * G},
                                       {3, at(12 * 1024), 3 * G},
                                       {9, at(36 * 1024), G},
                                       {12, at(52 * 1024), G},
                                       {16, at(60 * 1024), G}},
                                      G);
  ASSERT_EQ(runs.size(), 3u);
  EXPECT_EQ(runs[0].slot, 0u);
  EXPECT_EQ(runs[0].bytes, 10 * G);
  EXPECT_EQ(runs[1].slot, 12u);
  EXPECT_EQ(runs[1].bytes, G);
  EXPECT_EQ(runs[2].slot, 16u);
  // A host break (the start of separately registered host memory) splits a run there.
  auto split = HbmPool::CoalesceCopies({{0, at(0), 3 * G}, {3, at(12 * 1024), 3 * G}, {6, at(24 * 1024), 3 * G}}, G,
                                       {reinterpret_cast<uintptr_t>(at(12 * 1024))});
  ASSERT_EQ(split.size(), 2u);
  EXPECT_EQ(split[0].bytes, 3 * G);
  EXPECT_EQ(split[1].slot, 3u);
  EXPECT_EQ(split[1].bytes, 6 * G);
}

// HBM slot classes in the pool: slots of two sizes in slabs of one arena, slot s at
// base + s * granule, none overlapping another, each class's blocks copied in and out
// byte for byte (one batch of both classes), and copies that would pass the arena's end
// refused.
TEST(HbmPool, SlotClassesShareTheArenaAtTheGranule) {
  SKIP_WITHOUT_GPU();
  HostPoolOptions ho;
  ho.slot_bytes = 12288;
  ho.slots = 32;
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  HbmPoolOptions o;
  o.classes = {4096, 12288};
  o.slab_bytes = 48 * 1024;
  o.arena_bytes = 10 * 48 * 1024;
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  EXPECT_EQ(pool.granule(), 4096u);
  EXPECT_EQ(pool.num_classes(), 2);
  EXPECT_EQ(pool.arena_bytes(), 10u * 48 * 1024);
  std::vector<std::pair<uint32_t, uint64_t>> taken;  // slot, bytes
  std::vector<HbmPool::CopyItem> up;
  for (int i = 0; i < 16; ++i) {
    const int cls = i % 3 == 0 ? 1 : 0;
    auto s = pool.Alloc(cls);
    ASSERT_TRUE(s.has_value()) << i;
    EXPECT_EQ(pool.slot_ptr(*s), pool.base() + uint64_t{*s} * 4096);
    const uint64_t bytes = cls == 1 ? 11520 : 4032;
    for (const auto& [t, tb] : taken) {
      const uint64_t a = uint64_t{*s} * 4096, b = uint64_t{t} * 4096;
      EXPECT_TRUE(a + (cls == 1 ? 12288 : 4096) <= b || b + (tb > 4096 ? 12288 : 4096) <= a)
          << "slots " << *s << " and " << t << " overlap";
    }
    taken.push_back({*s, bytes});
    up.push_back({*s, (*host)->slot_ptr(static_cast<uint32_t>(i)), bytes});
    testing::Fill((*host)->slot_ptr(static_cast<uint32_t>(i)), bytes, 700 + i);
  }
  EXPECT_EQ(pool.used_bytes(), 6u * 12288 + 10u * 4096);
  std::promise<Status> a;
  ASSERT_TRUE(pool.CopyBatch(up, true, [&](Status st) { a.set_value(st); }).ok());
  ASSERT_TRUE(a.get_future().get().ok());
  for (size_t i = 0; i < up.size(); ++i) {
    EXPECT_TRUE(DeviceMatches(pool.slot_ptr(up[i].slot), up[i].bytes, 700 + i)) << "slot " << up[i].slot;
  }
  std::vector<HbmPool::CopyItem> down;
  for (size_t i = 0; i < up.size(); ++i) down.push_back({up[i].slot, (*host)->slot_ptr(16 + i), up[i].bytes});
  std::promise<Status> b;
  ASSERT_TRUE(pool.CopyBatch(down, false, [&](Status st) { b.set_value(st); }).ok());
  ASSERT_TRUE(b.get_future().get().ok());
  for (size_t i = 0; i < down.size(); ++i) {
    EXPECT_TRUE(testing::Matches(static_cast<uint8_t*>(down[i].host), down[i].bytes, 700 + i)) << down[i].slot;
  }
  // The last granule of the arena holds 4 KiB: a copy of more from it is refused.
  const uint32_t last = pool.id_space() - 1;
  EXPECT_TRUE(pool.CopyToDeviceSync(last, (*host)->slot_ptr(0), 8192).IsInvalid());
  EXPECT_TRUE(pool.CopyToDeviceSync(pool.id_space(), (*host)->slot_ptr(0), 4096).IsInvalid());
}

// Layer-major classes (HbmPool::AddClass): a block's pages go layer after layer into its
// slab, page l of slot j at slab + l * N * P + j * P, through every copy path (the gather
// kernel, cudaMemcpy2DAsync from the loop and the batch paths, the synchronous copies),
// come back block-major, and hash as the CPU hashes the block-major bytes.
class HbmLayerMajor : public ::testing::TestWithParam<HbmCopy> {};

TEST_P(HbmLayerMajor, PagesLieLayerAfterLayerAndRoundTripExactly) {
  SKIP_WITHOUT_GPU();
#if KVTIER_HAVE_CUDA
  HostPoolOptions ho;
  ho.slot_bytes = 36864;
  ho.slots = 48;
  auto host = HostPool::Create(ho);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  HbmPoolOptions o;
  o.classes = {12288, 36864};
  o.slab_bytes = 12 * 12288;  // 12 slots of 12 KiB or 4 of 36 KiB
  o.arena_bytes = 10 * o.slab_bytes;
  o.copy = GetParam();
  auto p = HbmPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HbmPool& pool = **p;
  // Three geometries: two share a slot size but not a page size, so never a slab.
  auto big = pool.AddClass(36864, 3072);      // up to 12 pages
  auto small_a = pool.AddClass(12288, 1024);  // up to 12 pages
  auto small_b = pool.AddClass(12288, 2048);  // up to 6 pages
  ASSERT_TRUE(big.ok() && small_a.ok() && small_b.ok()) << big.status().ToString();
  EXPECT_EQ(*pool.AddClass(12288, 1024), *small_a) << "the same geometry is the same class";
  EXPECT_EQ(pool.num_classes(), 5);
  EXPECT_TRUE(pool.AddClass(20480, 1024).status().IsInvalid()) << "not one of the arena's sizes";
  EXPECT_TRUE(pool.AddClass(12288, 0).status().IsInvalid());
  EXPECT_TRUE(pool.AddClass(12288, 24).status().IsInvalid()) << "not a multiple of 16";
  EXPECT_TRUE(pool.AddClass(12288, 16384).status().IsInvalid()) << "larger than the slot";
  struct Want {
    int cls;
    uint64_t bytes;
  };
  // Whole pages, and a last page cut short.
  const Want wants[] = {{*big, 12 * 3072}, {*big, 7 * 3072 + 48}, {*small_a, 12 * 1024}, {*small_a, 5 * 1024},
                        {*small_b, 6 * 2048}, {*small_b, 3 * 2048 + 16}};
  const uint64_t fresh = std::random_device{}();
  std::vector<HbmPool::CopyItem> up;
  std::vector<int> cls_of;
  for (uint32_t i = 0; i < 24; ++i) {
    const Want& w = wants[i % 6];
    auto s = pool.Alloc(w.cls);
    ASSERT_TRUE(s.has_value()) << i;
    testing::Fill((*host)->slot_ptr(i), w.bytes, fresh + i);
    up.push_back({*s, (*host)->slot_ptr(i), w.bytes});
    cls_of.push_back(w.cls);
  }
  for (size_t a = 0; a < up.size(); ++a) {
    for (size_t b = 0; b < up.size(); ++b) {
      if (cls_of[a] != cls_of[b]) {
        EXPECT_NE(pool.SlabOf(up[a].slot), pool.SlabOf(up[b].slot)) << a << " " << b;
      }
    }
  }
  std::promise<Status> in;
  ASSERT_TRUE(pool.CopyBatch(up, true, [&](Status st) { in.set_value(st); }).ok());
  ASSERT_TRUE(in.get_future().get().ok());
  // The arena as the kernels see it.
  std::vector<uint8_t> arena(pool.arena_bytes());
  ASSERT_EQ(cudaMemcpy(arena.data(), pool.base(), arena.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < up.size(); ++i) {
    const uint64_t P = pool.page_bytes(cls_of[i]), S = pool.class_bytes(cls_of[i]);
    const uint64_t N = o.slab_bytes / S, off = pool.slot_offset(up[i].slot);
    const uint64_t slab = off - off % o.slab_bytes, j = off % o.slab_bytes / S;
    for (uint64_t k = 0; k < up[i].bytes; k += P) {
      const uint64_t n = std::min(P, up[i].bytes - k);
      ASSERT_EQ(0, std::memcmp(arena.data() + slab + (k / P) * N * P + j * P, static_cast<uint8_t*>(up[i].host) + k, n))
          << "item " << i << " page " << k / P;
    }
  }
  // Hashed after the copies: the hash of the block-major bytes.
  ASSERT_TRUE(pool.CopyToHostSync(up[0].slot, (*host)->slot_ptr(47), up[0].bytes).ok());
  for (size_t i = 0; i < up.size(); ++i) {
    const auto h = pool.SlotHash(up[i].slot);
    ASSERT_TRUE(h.has_value()) << i;
    EXPECT_EQ(*h, BlockHash(up[i].host, up[i].bytes, pool.hash_seed())) << "item " << i;
  }
  // Back to the host, block-major.
  std::vector<HbmPool::CopyItem> down;
  for (size_t i = 0; i < up.size(); ++i) down.push_back({up[i].slot, (*host)->slot_ptr(24 + static_cast<uint32_t>(i)), up[i].bytes});
  std::promise<Status> out;
  ASSERT_TRUE(pool.CopyBatch(down, false, [&](Status st) { out.set_value(st); }).ok());
  ASSERT_TRUE(out.get_future().get().ok());
  for (size_t i = 0; i < down.size(); ++i) {
    EXPECT_TRUE(testing::Matches(static_cast<uint8_t*>(down[i].host), down[i].bytes, fresh + i)) << "item " << i;
  }
  // The single-slot copies, both ways.
  testing::Fill((*host)->slot_ptr(46), up[1].bytes, fresh + 99);
  ASSERT_TRUE(pool.CopyToDeviceSync(up[1].slot, (*host)->slot_ptr(46), up[1].bytes).ok());
  ASSERT_TRUE(pool.CopyToHostSync(up[1].slot, (*host)->slot_ptr(47), up[1].bytes).ok());
  EXPECT_TRUE(testing::Matches((*host)->slot_ptr(47), up[1].bytes, fresh + 99));
  std::promise<Status> one_in, one_out;
  ASSERT_TRUE(pool.CopyToDevice(up[2].slot, (*host)->slot_ptr(46), up[2].bytes, [&](Status st) { one_in.set_value(st); }).ok());
  ASSERT_TRUE(one_in.get_future().get().ok());
  ASSERT_TRUE(pool.CopyToHost(up[2].slot, (*host)->slot_ptr(45), up[2].bytes, [&](Status st) { one_out.set_value(st); }).ok());
  ASSERT_TRUE(one_out.get_future().get().ok());
  EXPECT_TRUE(testing::Matches((*host)->slot_ptr(45), up[2].bytes, fresh + 99));
  EXPECT_EQ(*pool.SlotHash(up[1].slot), BlockHash((*host)->slot_ptr(46), up[1].bytes, pool.hash_seed()));
  // More bytes than the slot: refused, nothing copied.
  EXPECT_TRUE(pool.CopyToDeviceSync(up[0].slot, (*host)->slot_ptr(0), 36864 + 16).IsInvalid());
  // Classes up to kMaxArenaClasses, then a clear refusal.
  for (uint64_t page = 16; pool.num_classes() < static_cast<int>(kMaxArenaClasses); page += 16) {
    ASSERT_TRUE(pool.AddClass(12288, page).ok());
  }
  auto over = pool.AddClass(12288, 4096);
  ASSERT_TRUE(over.status().IsInvalid());
  EXPECT_NE(over.status().message().find("slot classes already"), std::string::npos) << over.status().ToString();
#endif
}

INSTANTIATE_TEST_SUITE_P(Methods, HbmLayerMajor,
                         ::testing::Values(HbmCopy::kAuto, HbmCopy::kKernel, HbmCopy::kLoop, HbmCopy::kBatch),
                         [](const auto& info) { return std::string(HbmCopyName(info.param)); });

class HbmTierManager : public ::testing::Test {
 protected:
  void SetUp() override {
    c_.model_id = "test/model";
    c_.geometry = Geometry{8, 8, 128, 16};
    c_.SetUnitScales();
    cid_ = c_.Id();
    slot_ = c_.slot_bytes();
    o_.slot_bytes = slot_;
    o_.hbm.capacity_bytes = 8 * slot_;
    o_.hbm.high_watermark = 0.75;
    o_.hbm.low_watermark = 0.5;
    o_.host.capacity_bytes = 16 * slot_;
    o_.nvme.tier.capacity_bytes = 64 * (slot_ + 4096);
    o_.nvme.dir = dir_.path() + "/nvme";
  }
  void OpenTm() {
    auto tm = TierManager::Open(o_);
    ASSERT_TRUE(tm.ok()) << tm.status().ToString();
    tm_ = std::move(tm.value());
    ASSERT_TRUE(tm_->has_tier(Tier::kHbm));
    ASSERT_TRUE(tm_->RegisterContract(c_).ok());
    arena_ = tm_->host_slot_ptr(0);  // the daemon side of the arena: writable in this process only
    ASSERT_NE(arena_, nullptr);
  }
  void TearDown() override {
    tm_.reset();
  }
  std::vector<Key128> Keys(uint64_t a, uint64_t b) {
    std::vector<Key128> k;
    for (uint64_t i = a; i < b; ++i) k.push_back(K(i));
    return k;
  }
  std::vector<SlotRef> AcquireSync(const std::vector<Key128>& keys, Tier t) {
    std::promise<std::vector<SlotRef>> p;
    tm_->Acquire(cid_, keys, t, [&](Status s, std::vector<SlotRef> v) {
      EXPECT_TRUE(s.ok()) << s.ToString();
      p.set_value(std::move(v));
    });
    return p.get_future().get();
  }
  uint8_t* Hbm(SlotRef r) { return tm_->hbm_base() + uint64_t{r.slot} * slot_; }

  testing::TempDir dir_;
  ScaleContract c_;
  uint64_t cid_ = 0, slot_ = 0;
  TierManagerOptions o_;
  std::unique_ptr<TierManager> tm_;
  uint8_t* arena_ = nullptr;
};

// Stored through host, flushed to NVMe, then acquired into HBM: NVMe -> host -> HBM.
TEST_F(HbmTierManager, PromotesFromNvmeIntoHbmExactly) {
  SKIP_WITHOUT_GPU();
  OpenTm();
  const size_t n = c_.block_bytes();
  for (uint64_t i = 0; i < 6; ++i) {
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
    testing::Fill(arena_ + uint64_t{s[0].slot} * slot_, n, i);
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(i), i ? K(i - 1) : Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  ASSERT_TRUE(tm_->Flush().ok());
  auto slots = AcquireSync(Keys(0, 6), Tier::kHbm);
  ASSERT_EQ(slots.size(), 6u);
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(slots[i].tier, Tier::kHbm);
    EXPECT_TRUE(DeviceMatches(Hbm(slots[i]), n, i)) << "block " << i;
  }
  for (auto s : slots) ASSERT_TRUE(tm_->Unpin(s).ok());
}

// Flush(kHost) empties HBM into host and stops there (the torch engine's
// --evict-between-turns host); Flush(kNvme) then takes them on to NVMe only.
TEST_F(HbmTierManager, FlushToHostStopsAtHost) {
  SKIP_WITHOUT_GPU();
  OpenTm();
  const size_t n = c_.block_bytes();
  for (uint64_t i = 0; i < 4; ++i) {
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
    testing::Fill(arena_ + uint64_t{s[0].slot} * slot_, n, i);
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(i), i ? K(i - 1) : Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  auto slots = AcquireSync(Keys(0, 4), Tier::kHbm);  // now in HBM (and host)
  ASSERT_EQ(slots.size(), 4u);
  for (auto s : slots) ASSERT_TRUE(tm_->Unpin(s).ok());
  EXPECT_TRUE(tm_->Flush(Tier::kHbm).IsInvalid());
  ASSERT_TRUE(tm_->Flush(Tier::kHost).ok());
  for (uint64_t i = 0; i < 4; ++i) {
    auto info = tm_->InspectBlock(cid_, K(i));
    ASSERT_TRUE(info.ok());
    EXPECT_LT(info->hbm_slot, 0) << i;
    EXPECT_GE(info->host_slot, 0) << i;
    EXPECT_FALSE(info->in_nvme) << i;
  }
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  for (uint64_t i = 0; i < 4; ++i) {
    auto info = tm_->InspectBlock(cid_, K(i));
    ASSERT_TRUE(info.ok());
    EXPECT_LT(info->host_slot, 0) << i;
    EXPECT_TRUE(info->in_nvme) << i;
  }
  slots = AcquireSync(Keys(0, 4), Tier::kHbm);
  ASSERT_EQ(slots.size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_TRUE(DeviceMatches(Hbm(slots[i]), n, i)) << "block " << i;
  for (auto s : slots) ASSERT_TRUE(tm_->Unpin(s).ok());
}

// Blocks written straight into HBM slots, then pushed out by the watermark: HBM -> host
// by DMA (and on to NVMe); they come back byte-exact in host.
TEST_F(HbmTierManager, DemotesFromHbmUnderPressure) {
  SKIP_WITHOUT_GPU();
  OpenTm();
  const size_t n = c_.block_bytes();
  for (uint64_t i = 0; i < 14; ++i) {
    std::vector<SlotRef> s;
    Status st;
    for (int t = 0; t < 100; ++t) {
      s.clear();
      st = tm_->AllocSlots(cid_, 1, Tier::kHbm, &s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(DeviceFill(Hbm(s[0]), n, 100 + i));
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(100 + i), i ? K(99 + i) : Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  tm_->Drain();
  auto stats = tm_->Stats();
  EXPECT_LE(stats[0].slots_used, 6u);
  EXPECT_GT(stats[0].demotions_out, 0u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(100, 114)).hit_blocks, 14u);
  for (uint64_t i = 100; i < 114; i += 2) {
    auto slots = AcquireSync(Keys(i, i + 2), Tier::kHost);
    ASSERT_EQ(slots.size(), 2u);
    for (size_t k = 0; k < 2; ++k) {
      EXPECT_TRUE(testing::Matches(arena_ + uint64_t{slots[k].slot} * slot_, n, i + k)) << i + k;
      ASSERT_TRUE(tm_->Unpin(slots[k]).ok());
    }
  }
}

TEST_F(HbmTierManager, ConcurrentAcquiresIntoHbmShareOnePromotion) {
  SKIP_WITHOUT_GPU();
  OpenTm();
  const size_t n = c_.block_bytes();
  for (uint64_t i = 0; i < 3; ++i) {
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
    testing::Fill(arena_ + uint64_t{s[0].slot} * slot_, n, i);
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(i), i ? K(i - 1) : Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  ASSERT_TRUE(tm_->Flush().ok());
  std::promise<std::vector<SlotRef>> a, b;
  tm_->Acquire(cid_, Keys(0, 3), Tier::kHbm, [&](Status, std::vector<SlotRef> v) { a.set_value(v); });
  tm_->Acquire(cid_, Keys(0, 3), Tier::kHbm, [&](Status, std::vector<SlotRef> v) { b.set_value(v); });
  auto va = a.get_future().get(), vb = b.get_future().get();
  ASSERT_EQ(va.size(), 3u);
  ASSERT_EQ(vb.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(va[i].slot, vb[i].slot);
    EXPECT_EQ(va[i].from, Tier::kNvme);  // the first acquire found them on NVMe only
    EXPECT_TRUE(DeviceMatches(Hbm(va[i]), n, i));
  }
  EXPECT_EQ(tm_->Stats()[0].promotions_in, 3u);
  for (size_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(tm_->Unpin(va[i]).ok());
    ASSERT_TRUE(tm_->Unpin(vb[i]).ok());
  }
}

// A record flipped on disk, acquired into HBM: the NVMe -> host step refuses it, the
// chained host -> HBM promotion ends with it, and the prefix stops there.
TEST_F(HbmTierManager, CorruptRecordEndsAnHbmAcquire) {
  SKIP_WITHOUT_GPU();
  OpenTm();
  const size_t n = c_.block_bytes();
  for (uint64_t i = 0; i < 3; ++i) {
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(cid_, 1, Tier::kHost, &s).ok());
    testing::Fill(arena_ + uint64_t{s[0].slot} * slot_, n, i);
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(i), i ? K(i - 1) : Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  ASSERT_TRUE(tm_->Flush().ok());
  arena_ = nullptr;
  tm_.reset();
  {
    NvmeStoreOptions no;
    no.dir = o_.nvme.dir;
    no.slot_bytes = slot_;
    no.capacity_bytes = o_.nvme.tier.capacity_bytes;
    auto st = NvmeStore::Open(no);
    ASSERT_TRUE(st.ok()) << st.status().ToString();
    uint32_t file;
    uint64_t off;
    (*st)->RecordLocation((*st)->Find(BlockId{cid_, K(1)})->record, &file, &off);
    const std::string path = (*st)->DataPath(file);
    st->reset();
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t b = 0;
    ASSERT_EQ(pread(fd, &b, 1, static_cast<off_t>(off + 4096 + 4321)), 1);
    b ^= 0x40;
    ASSERT_EQ(pwrite(fd, &b, 1, static_cast<off_t>(off + 4096 + 4321)), 1);
    close(fd);
  }
  OpenTm();
  auto slots = AcquireSync(Keys(0, 3), Tier::kHbm);
  ASSERT_EQ(slots.size(), 1u);
  EXPECT_TRUE(DeviceMatches(Hbm(slots[0]), n, 0));
  ASSERT_TRUE(tm_->Unpin(slots[0]).ok());
  EXPECT_EQ(tm_->Stats()[2].checksum_failures, 1u);
  EXPECT_EQ(tm_->Lookup(cid_, Keys(0, 3)).hit_blocks, 1u);
}

// A block committed straight into HBM and then changed there (as a GPU client can through
// its read-write IPC mapping) fails its hash on the way down: dropped, counted in the HBM
// tier's checksum_failures, never in host or NVMe; its untouched neighbours go down and
// come back byte-exact. Both ways out of HBM: Flush (synchronous copies) and the watermark
// (the mover's copy batches).
// HBM slot classes in the TierManager: with tiers.slot_classes the HBM tier has the host's
// classes, so blocks of 8 layers beside a contract of 40 take HBM slots of their own
// class, not of slot_bytes (HBM's used bytes say so: the padding test; with one slot size
// five small blocks would take five large slots). HBM full of large blocks, the small
// class (no slab) takes a slab from the large one: a slab move, counted, its block demoted
// to host first. Every block is where hbm_base + slot * granule (or the host arena +
// slot * granule) says, byte for byte.
TEST_F(HbmTierManager, SlotClassesHoldEachContractInItsClass) {
  SKIP_WITHOUT_GPU();
  ScaleContract big = c_;
  big.model_id = "test/model-40";
  big.geometry.num_layers = 40;  // 720 KiB
  big.SetUnitScales();
  ASSERT_EQ(c_.block_bytes(), 144u << 10);
  o_.slot_bytes = big.slot_bytes();
  o_.slot_classes = {c_.slot_bytes(), big.slot_bytes()};
  o_.slab_bytes = big.slot_bytes();  // 1 large slot or 5 small ones a slab
  o_.hbm.capacity_bytes = 4 * o_.slab_bytes;
  o_.hbm.high_watermark = 1.0;  // eviction on demand only
  o_.hbm.low_watermark = 0.99;
  o_.host.capacity_bytes = 16 * o_.slab_bytes;
  o_.nvme.tier.capacity_bytes = 0;
  OpenTm();
  ASSERT_TRUE(tm_->RegisterContract(big).ok());
  const HostGeometry& g = tm_->hbm_geometry();
  ASSERT_EQ(g.classes.size(), 2u);
  EXPECT_EQ(g.granule, 144u << 10);
  auto hbm = [&](SlotRef r) { return tm_->hbm_base() + uint64_t{r.slot} * g.granule; };
  auto commit_hbm = [&](const ScaleContract& c, uint64_t key) {
    std::vector<SlotRef> s;
    Status st;
    for (int t = 0; t < 100; ++t) {
      s.clear();
      st = tm_->AllocSlots(c.Id(), 1, Tier::kHbm, &s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(DeviceFill(hbm(s[0]), c.block_bytes(), key));
    ASSERT_TRUE(tm_->Commit(c.Id(), s[0], K(key), Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  };
  auto acquire = [&](const ScaleContract& c, uint64_t key, Tier t) {
    const std::vector<Key128> keys{K(key)};
    std::promise<std::vector<SlotRef>> p;
    tm_->Acquire(c.Id(), keys, t, [&](Status st, std::vector<SlotRef> v) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      p.set_value(std::move(v));
    });
    return p.get_future().get();
  };
  for (uint64_t i = 0; i < 4; ++i) commit_hbm(big, 600 + i);  // every slab
  for (uint64_t i = 0; i < 5; ++i) commit_hbm(c_, 500 + i);   // takes one of them
  tm_->Drain();
  const TierStats hs = tm_->Stats()[0];
  EXPECT_EQ(hs.tier, Tier::kHbm);
  EXPECT_EQ(hs.slab_moves, 1u);
  EXPECT_EQ(hs.used_bytes, 5 * c_.slot_bytes() + 3 * big.slot_bytes()) << "a block padded in HBM";
  for (uint64_t i = 0; i < 5; ++i) {
    auto s = acquire(c_, 500 + i, Tier::kHbm);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_TRUE(DeviceMatches(hbm(s[0]), c_.block_bytes(), 500 + i)) << i;
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  const uint64_t hg = tm_->host_geometry().granule;
  for (uint64_t i = 0; i < 4; ++i) {  // three in HBM, the one of the moved slab in host
    auto s = acquire(big, 600 + i, Tier::kHost);
    ASSERT_EQ(s.size(), 1u) << i;
    EXPECT_TRUE(testing::Matches(arena_ + uint64_t{s[0].slot} * hg, big.block_bytes(), 600 + i)) << i;
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
  // Out of HBM into host, and promoted back (host -> HBM at the granule: the gather
  // kernel for these short runs).
  ASSERT_TRUE(tm_->Flush(Tier::kHost).ok());
  EXPECT_EQ(tm_->Stats()[0].blocks, 0u);
  for (uint64_t i = 0; i < 5; ++i) {
    auto s = acquire(c_, 500 + i, Tier::kHbm);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].tier, Tier::kHbm);
    EXPECT_TRUE(DeviceMatches(hbm(s[0]), c_.block_bytes(), 500 + i)) << i;
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
  }
}

// Classes made at registration (TierManagerOptions::classes_at_registration) in HBM: each
// contract's block rounded up to the HBM granule (4 KiB for a 256 MiB arena) is its class,
// made when it registers; blocks of three geometries share the arena, each where
// hbm_base + slot * granule says, byte for byte, out to host and back.
TEST_F(HbmTierManager, ClassesMadeAtRegistrationHoldThreeGeometries) {
  SKIP_WITHOUT_GPU();
  ScaleContract mid = c_, fp8 = c_;
  mid.model_id = "test/model-40";
  mid.geometry.num_layers = 40;  // 720 KiB
  mid.SetUnitScales();
  fp8.model_id = "test/model-36-fp8";
  fp8.format = KvFormat::kFp8;
  fp8.geometry = Geometry{36, 8, 128, 64};  // 4.5 MiB
  fp8.SetUnitScales();
  o_.classes_at_registration = true;
  o_.slot_bytes = 64ull << 20;
  o_.hbm.capacity_bytes = 256ull << 20;
  o_.hbm.high_watermark = 1.0;
  o_.hbm.low_watermark = 0.99;
  o_.host.capacity_bytes = 256ull << 20;
  o_.nvme.tier.capacity_bytes = 0;
  OpenTm();
  ASSERT_TRUE(tm_->RegisterContract(mid).ok());
  ASSERT_TRUE(tm_->RegisterContract(fp8).ok());
  const HostGeometry& g = tm_->hbm_geometry();
  ASSERT_EQ(g.classes.size(), 3u);
  EXPECT_EQ(g.granule, 4096u);
  EXPECT_EQ(g.slab_bytes, 64ull << 20);
  auto hbm = [&](SlotRef r) { return tm_->hbm_base() + uint64_t{r.slot} * g.granule; };
  const std::vector<const ScaleContract*> cs{&c_, &mid, &fp8};
  uint64_t slot_bytes = 0;
  for (uint64_t i = 0; i < 6; ++i) {
    const ScaleContract& c = *cs[i % 3];
    std::vector<SlotRef> s;
    ASSERT_TRUE(tm_->AllocSlots(c.Id(), 1, Tier::kHbm, &s).ok()) << i;
    ASSERT_TRUE(DeviceFill(hbm(s[0]), c.block_bytes(), 900 + i));
    ASSERT_TRUE(tm_->Commit(c.Id(), s[0], K(900 + i), Key128{}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
    slot_bytes += (c.slot_bytes() + 4095) / 4096 * 4096;
  }
  EXPECT_EQ(tm_->Stats()[0].used_bytes, slot_bytes);
  auto check = [&](Tier t) {
    for (uint64_t i = 0; i < 6; ++i) {
      const ScaleContract& c = *cs[i % 3];
      const std::vector<Key128> keys{K(900 + i)};
      std::promise<std::vector<SlotRef>> p;
      tm_->Acquire(c.Id(), keys, t, [&](Status st, std::vector<SlotRef> v) {
        EXPECT_TRUE(st.ok()) << st.ToString();
        p.set_value(std::move(v));
      });
      auto s = p.get_future().get();
      ASSERT_EQ(s.size(), 1u) << i;
      if (t == Tier::kHbm) {
        EXPECT_TRUE(DeviceMatches(hbm(s[0]), c.block_bytes(), 900 + i)) << i;
      } else {
        EXPECT_TRUE(testing::Matches(arena_ + uint64_t{s[0].slot} * tm_->host_geometry().granule, c.block_bytes(),
                                     900 + i))
            << i;
      }
      ASSERT_TRUE(tm_->Unpin(s[0]).ok());
    }
  };
  check(Tier::kHbm);
  ASSERT_TRUE(tm_->Flush(Tier::kHost).ok());
  EXPECT_EQ(tm_->Stats()[0].blocks, 0u);
  check(Tier::kHost);
  check(Tier::kHbm);  // promoted back
}

class HbmChanged : public HbmTierManager, public ::testing::WithParamInterface<bool> {};

TEST_P(HbmChanged, ChangedBlockIsDroppedOnTheWayDown) {
  SKIP_WITHOUT_GPU();
  const bool pressure = GetParam();
  OpenTm();
  const size_t n = c_.block_bytes();
  const uint64_t blocks = pressure ? 8 : 4;  // 8 > the high watermark of 6 slots
  for (uint64_t i = 0; i < blocks; ++i) {
    std::vector<SlotRef> s;
    Status st;
    for (int t = 0; t < 100; ++t) {
      s.clear();
      st = tm_->AllocSlots(cid_, 1, Tier::kHbm, &s);
      if (st.code() != StatusCode::kRetry) break;
      tm_->Drain();
    }
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(DeviceFill(Hbm(s[0]), n, 200 + i));
    ASSERT_TRUE(tm_->Commit(cid_, s[0], K(200 + i), i ? K(199 + i) : Key128{}, {77}).ok());
    ASSERT_TRUE(tm_->Unpin(s[0]).ok());
    if (i == 0) {  // changed after commit: one byte, the way a stray write would
      ASSERT_TRUE(DeviceFlip(Hbm(s[0]) + 1234));
    }
  }
  if (!pressure) {
    ASSERT_TRUE(tm_->Flush(Tier::kHost).ok());
  }
  tm_->Drain();
  auto stats = tm_->Stats();
  EXPECT_EQ(stats[0].checksum_failures, 1u);
  EXPECT_GT(stats[0].evictions_demoted, 0u);
  auto info = tm_->InspectBlock(cid_, K(200));
  if (info.ok()) {  // pressure: only if it was never pushed out (it is the coldest)
    EXPECT_LT(info->host_slot, 0) << "the changed block reached host";
    EXPECT_FALSE(info->in_nvme);
  }
  EXPECT_FALSE(info.ok()) << "the changed block is still indexed";
  ASSERT_TRUE(tm_->Flush(Tier::kNvme).ok());
  EXPECT_EQ(tm_->Lookup(cid_, Keys(200, 200 + blocks)).hit_blocks, 0u);  // the chain starts at the dropped block
  for (uint64_t i = 201; i < 200 + blocks; ++i) {
    auto slots = AcquireSync({K(i)}, Tier::kHost);
    ASSERT_EQ(slots.size(), 1u) << i;
    EXPECT_TRUE(testing::Matches(arena_ + uint64_t{slots[0].slot} * slot_, n, i)) << i;
    ASSERT_TRUE(tm_->Unpin(slots[0]).ok());
  }
  EXPECT_EQ(tm_->Stats()[0].checksum_failures, 1u);
}

// What the hash costs a commit: the median Commit of an HBM block (the hash kernel queued
// after the lock is let go) against that of a host block, measured on the same blocks.
// The bound is loose (a kernel launch is a few microseconds); the numbers are printed.
TEST_F(HbmTierManager, HbmCommitCostsAboutAKernelLaunchMore) {
  SKIP_WITHOUT_GPU();
  o_.hbm.capacity_bytes = 64 * slot_;
  o_.hbm.high_watermark = 0.95;
  o_.host.capacity_bytes = 64 * slot_;
  OpenTm();
  auto median_commit_us = [&](Tier t, uint64_t first) {
    std::vector<double> us;
    for (uint64_t i = 0; i < 48; ++i) {
      std::vector<SlotRef> s;
      EXPECT_TRUE(tm_->AllocSlots(cid_, 1, t, &s).ok());
      if (s.empty()) break;
      const auto t0 = std::chrono::steady_clock::now();
      EXPECT_TRUE(tm_->Commit(cid_, s[0], K(first + i), Key128{}).ok());
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      EXPECT_TRUE(tm_->Unpin(s[0]).ok());
      EXPECT_TRUE(tm_->Evict(cid_, K(first + i)).ok());
    }
    std::sort(us.begin(), us.end());
    return us.empty() ? 0.0 : us[us.size() / 2];
  };
  (void)median_commit_us(Tier::kHbm, 1000);  // warm: the first launch loads the module
  const double hbm = median_commit_us(Tier::kHbm, 2000);
  const double host = median_commit_us(Tier::kHost, 3000);
  std::printf("median Commit: hbm %.1f us (hash queued), host %.1f us\n", hbm, host);
  RecordProperty("hbm_commit_us", std::to_string(hbm));
  RecordProperty("host_commit_us", std::to_string(host));
  EXPECT_LT(hbm, host + 50.0);
}

INSTANTIATE_TEST_SUITE_P(HbmTierManager, HbmChanged, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Watermark" : "Flush"; });

}  // namespace
}  // namespace kvtier::tiers
