#include "tiers/host/host_pool.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <set>
#include <vector>

#include "tests/tiers/test_util.h"

namespace kvtier::tiers {
namespace {

TEST(HostPool, RefusesBadOptions) {
  HostPoolOptions o;
  o.slot_bytes = 4096 + 512;
  o.slots = 4;
  EXPECT_TRUE(HostPool::Create(o).status().IsInvalid());
  o.slot_bytes = 4096;
  o.slots = 0;
  EXPECT_TRUE(HostPool::Create(o).status().IsInvalid());
}

TEST(HostPool, SlotsAreAlignedAndAllocationIsExact) {
  HostPoolOptions o;
  o.slot_bytes = 1474560;
  o.slots = 8;
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HostPool& pool = **p;
  EXPECT_EQ(pool.arena_bytes(), 8ull * 1474560);
  std::set<uint32_t> got;
  for (int i = 0; i < 8; ++i) {
    auto s = pool.Alloc();
    ASSERT_TRUE(s.has_value());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(pool.slot_ptr(*s)) % 4096, 0u);
    got.insert(*s);
  }
  EXPECT_EQ(got.size(), 8u);
  EXPECT_FALSE(pool.Alloc().has_value());  // full
  EXPECT_EQ(pool.used(), 8u);
  EXPECT_TRUE(pool.Free(3).ok());
  EXPECT_TRUE(pool.Free(3).IsInvalid());  // double free refused
  EXPECT_TRUE(pool.Free(99).IsInvalid());
  EXPECT_EQ(pool.used(), 7u);
  auto again = pool.Alloc();
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(*again, 3u);
}

// The arena is shared memory: another process mapping the fd sees and makes the same bytes.
TEST(HostPool, FdMapsTheSameBytesInAnotherProcess) {
  HostPoolOptions o;
  o.slot_bytes = 8192;
  o.slots = 4;
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok());
  HostPool& pool = **p;
  testing::Fill(pool.slot_ptr(1), 8192, 11);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // The "client" maps it read-only (a writable mapping is refused: the next test).
    void* m = mmap(nullptr, pool.arena_bytes(), PROT_READ, MAP_SHARED, pool.fd(), 0);
    if (m == MAP_FAILED) _exit(2);
    auto* b = static_cast<const uint8_t*>(m);
    if (!testing::Matches(b + pool.slot_offset(1), 8192, 11)) _exit(3);
    _exit(0);
  }
  int st = 0;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT_TRUE(WIFEXITED(st));
  EXPECT_EQ(WEXITSTATUS(st), 0);
}

// Clients map the arena fd; none may resize it under the daemon and the other clients.
TEST(HostPool, ArenaSizeIsSealedAgainstClients) {
  HostPoolOptions o;
  o.slot_bytes = 8192;
  o.slots = 4;
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok());
  HostPool& pool = **p;
  testing::Fill(pool.slot_ptr(3), 8192, 5);
  const int fd = pool.fd();
  EXPECT_NE(ftruncate(fd, 4096), 0) << "a client could shrink the host arena";
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(ftruncate(fd, static_cast<off_t>(pool.arena_bytes()) * 2), 0);
  EXPECT_NE(fcntl(fd, F_ADD_SEALS, F_SEAL_WRITE), 0) << "seals must be final";
  EXPECT_TRUE(testing::Matches(pool.slot_ptr(3), 8192, 5));
}

// The fd clients get maps read-only only; the pool's own mapping stays writable.
TEST(HostPool, ArenaIsSealedAgainstWritesButItsOwnMapping) {
  HostPoolOptions o;
  o.slot_bytes = 8192;
  o.slots = 4;
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok());
  HostPool& pool = **p;
  const int fd = pool.fd();
  void* w = mmap(nullptr, pool.arena_bytes(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(w, MAP_FAILED) << "a client could map the host arena writable";
  if (w != MAP_FAILED) munmap(w, pool.arena_bytes());
  const char b = 1;
  EXPECT_EQ(pwrite(fd, &b, 1, 0), -1) << "a client could write(2) the host arena";
  void* r = mmap(nullptr, pool.arena_bytes(), PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(r, MAP_FAILED);
  testing::Fill(pool.slot_ptr(1), 8192, 9);  // the daemon's own writes go through
  EXPECT_TRUE(testing::Matches(static_cast<const uint8_t*>(r) + pool.slot_offset(1), 8192, 9));
  munmap(r, pool.arena_bytes());
}

// Parts (HostPoolOptions::part_shares): each owned part and the common pool are memfds of
// their own, back to back in one arena; an alloc for a part takes its slots first, then
// the common pool's, never another part's; a part's fd maps exactly its slots.
TEST(HostPool, PartsAreMemfdsOfTheirOwnAndAllocTakesThePartThenTheCommonPool) {
  HostPoolOptions o;
  o.slot_bytes = 4096;
  o.slots = 16;
  o.part_shares = {0.5, 0.25, 0.0};  // 8 slots, 4 slots, none; the common pool 4
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HostPool& pool = **p;
  ASSERT_EQ(pool.num_parts(), 3);
  EXPECT_EQ(pool.fd(), -1);  // no one arena fd
  EXPECT_EQ(pool.slots(), 16u);
  EXPECT_EQ(pool.part_offset(0), 0u);
  EXPECT_EQ(pool.part_bytes(0), 8u * 4096);
  EXPECT_EQ(pool.part_offset(1), 8u * 4096);
  EXPECT_EQ(pool.part_bytes(1), 4u * 4096);
  EXPECT_EQ(pool.part_bytes(2), 0u);
  EXPECT_EQ(pool.part_fd(2), -1);
  EXPECT_EQ(pool.part_offset(3), 12u * 4096);  // the common pool
  EXPECT_EQ(pool.part_bytes(3), 4u * 4096);
  EXPECT_NE(pool.part_fd(0), pool.part_fd(1));
  // Part 1: its 4 slots (ids 8..11), then the common pool's 4 (12..15), then nothing.
  std::vector<uint32_t> got;
  for (int i = 0; i < 8; ++i) {
    auto s = pool.Alloc(0, 1);
    ASSERT_TRUE(s.has_value()) << i;
    got.push_back(*s);
  }
  EXPECT_EQ(got, (std::vector<uint32_t>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_FALSE(pool.Alloc(0, 1).has_value());
  EXPECT_FALSE(pool.Alloc(0, 2).has_value());  // no part: the common pool, full
  EXPECT_FALSE(pool.Alloc(0, -1).has_value());
  EXPECT_EQ(pool.free_count(0, 1), 0u);
  EXPECT_EQ(pool.free_count(0, 0), 8u);
  EXPECT_EQ(pool.free_count(0), 8u);
  for (uint32_t s : {0u, 7u, 8u, 11u, 12u, 15u}) EXPECT_EQ(pool.PartOfSlot(s), s < 8 ? 0 : s < 12 ? 1 : 3) << s;
  EXPECT_TRUE(pool.Free(13).ok());
  EXPECT_EQ(pool.free_count(0, 1), 1u);
  EXPECT_EQ(*pool.Alloc(0, 0), 0u);  // part 0's own first
  // The daemon's view is one arena; part 1's fd maps part 1's bytes (slot 8 at its start).
  std::memset(pool.slot_ptr(8), 0x5a, 4096);
  std::memset(pool.slot_ptr(0), 0x33, 4096);
  void* m = ::mmap(nullptr, pool.part_bytes(1), PROT_READ, MAP_SHARED, pool.part_fd(1), 0);
  ASSERT_NE(m, MAP_FAILED);
  EXPECT_EQ(static_cast<uint8_t*>(m)[0], 0x5a);
  EXPECT_EQ(static_cast<uint8_t*>(m)[100], 0x5a);
  ::munmap(m, pool.part_bytes(1));
  // Sealed against writes like the arena: a writable mapping of a part's fd is refused.
  EXPECT_EQ(::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, pool.part_fd(0), 0), MAP_FAILED);
}

// With slot classes, parts are whole slabs; slab numbers run over the parts in order and
// a slab's move stays in its part.
TEST(HostPool, PartsOfSlabsNumberSlabsOverTheParts) {
  HostPoolOptions o;
  o.classes = {4096, 8192};
  o.slab_bytes = 64 * 1024;
  o.arena_bytes = 8 * 64 * 1024;    // 8 slabs
  o.part_shares = {0.3};            // floor(2.4) = 2 slabs; the common pool 6
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HostPool& pool = **p;
  EXPECT_EQ(pool.num_slabs(), 8u);
  EXPECT_EQ(pool.part_bytes(0), 2u * 64 * 1024);
  EXPECT_EQ(pool.most(0), 8u * 16);
  auto s = pool.Alloc(1, 0);  // class 1 in part 0: slab 0
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(pool.SlabOf(*s), 0u);
  EXPECT_EQ(pool.PartOfSlab(1), 0);
  EXPECT_EQ(pool.PartOfSlab(2), 1);  // the common pool
  auto c = pool.Alloc(0, -1);
  ASSERT_TRUE(c.has_value());
  EXPECT_EQ(pool.SlabOf(*c), 2u);  // the common pool's first slab
  EXPECT_EQ(pool.SlabClass(2), 0);
  auto taken = pool.BeginMove(2, 1);
  ASSERT_TRUE(taken.ok());
  EXPECT_EQ(*taken, std::vector<uint32_t>{*c});
  EXPECT_TRUE(pool.Free(*c).ok());
  EXPECT_EQ(pool.SlabClass(2), 1);  // moved, in the common pool still
}

// Classes made at registration: none at start, the granule from the arena's size alone
// (4 KiB up to 16 GiB), a class per block size rounded up to it, the same index in every
// part, refusals that change nothing.
TEST(HostPool, ClassesMadeAtRegistrationAreTheSameInEveryPart) {
  constexpr uint64_t MiB = 1024 * 1024;
  HostPoolOptions o;
  o.classes_at_registration = true;
  o.slot_bytes = 8 * MiB;   // the largest block
  o.slab_bytes = 16 * MiB;
  o.arena_bytes = 8 * 16 * MiB;
  o.part_shares = {0.25};   // 2 slabs; the common pool 6
  o.populate = false;
  o.cuda_register = false;
  auto p = HostPool::Create(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  HostPool& pool = **p;
  EXPECT_EQ(pool.num_classes(), 0);
  EXPECT_EQ(pool.granule(), 4096u);
  EXPECT_EQ(pool.slab_bytes(), 16 * MiB);
  EXPECT_EQ(pool.slots(), 8u * 2) << "none made yet: slots of the largest block";
  auto a = pool.AddClass(576 * 1024 + 1);  // rounded up to the granule
  auto b = pool.AddClass(5 * MiB);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status().ToString();
  EXPECT_EQ(*a, 0);
  EXPECT_EQ(*b, 1);
  EXPECT_EQ(pool.class_bytes(0), 580u * 1024);
  EXPECT_EQ(*pool.AddClass(580 * 1024), 0) << "the existing class of that size";
  EXPECT_EQ(pool.num_classes(), 2);
  EXPECT_EQ(pool.slots(), pool.most(0));
  EXPECT_TRUE(pool.AddClass(16 * MiB + 1).status().IsInvalid()) << "larger than a slab";
  EXPECT_TRUE(pool.AddClass(0).status().IsInvalid());
  EXPECT_EQ(pool.num_classes(), 2);
  // Slots of either class in the part and in the common pool; granule-aligned, inside
  // their slab, of the class's size.
  auto s0 = pool.Alloc(*b, 0), s1 = pool.Alloc(*a, -1), s2 = pool.Alloc(*b, -1);
  ASSERT_TRUE(s0 && s1 && s2);
  EXPECT_EQ(pool.PartOfSlot(*s0), 0);
  EXPECT_EQ(pool.PartOfSlot(*s1), 1);
  EXPECT_EQ(pool.slot_size(*s0), 5 * MiB);
  EXPECT_EQ(pool.slot_size(*s1), 580u * 1024);
  EXPECT_EQ(pool.slot_size(*s2), 5 * MiB);
  std::memset(pool.slot_ptr(*s2), 0x5a, 5 * MiB);
  EXPECT_EQ(pool.used_bytes(), 2 * 5 * MiB + 580 * 1024);
  // Up to kMaxArenaClasses, then a refusal that says so.
  for (uint64_t k = 1; pool.num_classes() < static_cast<int>(kMaxArenaClasses); ++k) ASSERT_TRUE(pool.AddClass(k * 4096).ok());
  auto over = pool.AddClass(7 * MiB);
  ASSERT_TRUE(over.status().IsInvalid());
  EXPECT_NE(over.status().message().find("slot classes already"), std::string::npos) << over.status().ToString();
  EXPECT_EQ(pool.num_classes(), static_cast<int>(kMaxArenaClasses));
  HostPoolOptions both = o;
  both.classes = {4096};
  EXPECT_TRUE(HostPool::Create(both).status().IsInvalid());
  HostPoolOptions big = o;
  big.slot_bytes = 32 * MiB;
  EXPECT_TRUE(HostPool::Create(big).status().IsInvalid()) << "the largest block does not fit a slab";
}

}  // namespace
}  // namespace kvtier::tiers
