#include "tiers/host/host_pool.h"

#include <gtest/gtest.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

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

}  // namespace
}  // namespace kvtier::tiers
