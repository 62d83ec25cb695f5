// The host tier against a client that tries to change bytes it does not own: the arena
// maps read-only in every client (no writable mapping, reopen, mprotect, write(2) or
// fallocate gets write access), a host alloc lease writes only into the client's own
// staging area, and what a commit copied out of it is what every acquire serves and what
// the NVMe record certifies, also after a restart, whatever the client writes later.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tests/reliability/reliability_util.h"

namespace kvtier::hostile {
namespace {

using reliability::Conn;
using reliability::MakeKey;
using testing::CheckBlock;
using testing::DaemonProcess;
using testing::FillBlock;
using testing::MetricValue;

// Runs `f` in a forked child; true when the child died of SIGSEGV or SIGBUS (the write
// hit a read-only page) rather than returning.
template <typename F>
bool ChildFaults(F&& f) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    f();
    ::_exit(0);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
}

// Stores one block (first of its chain) for key k with the bytes the key derives; leaves
// the lease open and returns it, with its slot.
uint64_t StoreOpen(Conn& c, const kvtier_key& k, kvtier_slot* slot) {
  uint64_t lease = 0;
  EXPECT_EQ(kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, slot), KVTIER_OK) << kvtier_last_error();
  uint8_t* p = static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot->slot));
  EXPECT_NE(p, nullptr) << "an alloc slot is writable";
  if (p == nullptr) return lease;
  FillBlock(p, c.block_bytes, c.contract, k);
  kvtier_commit_item it{};
  it.slot = *slot;
  it.key = k;
  size_t n = 0;
  EXPECT_EQ(kvtier_commit(c.c, c.contract, lease, &it, 1, &n), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(n, 1u);
  return lease;
}

// Acquires k into host and checks it holds the bytes derived from k.
bool ServesRightBytes(Conn& c, const kvtier_key& k) {
  uint64_t lease = 0;
  kvtier_slot slot{};
  size_t n = 0;
  if (kvtier_acquire(c.c, c.contract, &k, 1, KVTIER_TIER_HOST, &lease, &slot, &n) != KVTIER_OK || n != 1) {
    ADD_FAILURE() << "acquire: " << kvtier_last_error() << " n=" << n;
    return false;
  }
  const bool ok = CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c.c, slot.slot)), c.block_bytes,
                             c.contract, k);
  EXPECT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
  return ok;
}

TEST(HostileArena, ClientCannotGetWriteAccessToTheArena) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const int fd = kvtier_host_arena_fd(c.c);
  ASSERT_GE(fd, 0);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  const size_t arena = static_cast<size_t>(st.st_size);
  ASSERT_GT(arena, 0u);

  // A shared writable mapping of the passed fd.
  errno = 0;
  void* w = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  EXPECT_EQ(w, MAP_FAILED) << "the arena maps writable";
  EXPECT_EQ(errno, EPERM);
  if (w != MAP_FAILED) ::munmap(w, arena);
  // A read-only mapping made writable afterwards.
  void* r = ::mmap(nullptr, arena, PROT_READ, MAP_SHARED, fd, 0);
  ASSERT_NE(r, MAP_FAILED);
  EXPECT_NE(::mprotect(r, arena, PROT_READ | PROT_WRITE), 0) << "mprotect made the arena writable";
  ::munmap(r, arena);
  // The library's own mapping of it, too.
  uint64_t window = 0;
  auto* base = static_cast<uint8_t*>(kvtier_host_arena(c.c, &window));
  ASSERT_NE(base, nullptr);
  EXPECT_NE(::mprotect(base, 4096, PROT_READ | PROT_WRITE), 0) << "mprotect made the library's mapping writable";
  // write(2) and fallocate on the fd.
  const char b = 'x';
  EXPECT_EQ(::pwrite(fd, &b, 1, 0), -1) << "write(2) reached the arena";
  EXPECT_NE(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096), 0) << "hole punched in the arena";
  // A reopen through /proc: whatever it opens, no write reaches the arena.
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  const int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  if (rw >= 0) {
    void* m = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0);
    EXPECT_EQ(m, MAP_FAILED) << "a reopened fd maps the arena writable";
    if (m != MAP_FAILED) ::munmap(m, arena);
    EXPECT_EQ(::pwrite(rw, &b, 1, 0), -1) << "write(2) through a reopened fd reached the arena";
    ::close(rw);
  }
  // The accessors say the same: an arena slot has no writable address.
  EXPECT_EQ(kvtier_host_slot_write(c.c, 0), nullptr);
  EXPECT_NE(kvtier_host_slot(c.c, 0), nullptr);
  EXPECT_TRUE(d.Alive());
}

TEST(HostileArena, CommittedAndReleasedSlotsCannotBeWritten) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = MakeKey(26, 1);
  kvtier_slot staged{};
  const uint64_t alloc = StoreOpen(c, k, &staged);
  ASSERT_EQ(kvtier_release(c.c, alloc), KVTIER_OK);
  // The committed block, acquired: its arena slot faults on a write.
  uint64_t lease = 0;
  kvtier_slot slot{};
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(c.c, c.contract, &k, 1, KVTIER_TIER_HOST, &lease, &slot, &n), KVTIER_OK);
  ASSERT_EQ(n, 1u);
  EXPECT_NE(slot.slot, staged.slot) << "the acquire served the client's staging slot";
  // The read-only view, cast to write through it.
  volatile uint8_t* p = const_cast<uint8_t*>(static_cast<const uint8_t*>(kvtier_host_slot(c.c, slot.slot)));
  ASSERT_NE(p, nullptr);
  EXPECT_TRUE(ChildFaults([p] { p[0] = static_cast<uint8_t>(p[0] ^ 0xff); })) << "an acquired slot took a write";
  ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
  // Released: still read-only (the arena is, whatever a slot holds).
  EXPECT_TRUE(ChildFaults([p] { p[1] = static_cast<uint8_t>(p[1] ^ 0xff); })) << "a released slot took a write";
  EXPECT_TRUE(ServesRightBytes(c, k));
  EXPECT_TRUE(d.Alive());
}

// The hole this closes: a client that keeps writing the slot it committed from.
TEST(HostileArena, WritesToTheStagingSlotAfterCommitChangeNothingServedOrPersisted) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  std::vector<kvtier_key> keys;
  {
    Conn c;
    ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    for (uint64_t i = 0; i < 4; ++i) {
      keys.push_back(MakeKey(27, i));
      kvtier_slot slot{};
      const uint64_t lease = StoreOpen(c, keys.back(), &slot);
      uint8_t* p = static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot));
      ASSERT_NE(p, nullptr);
      std::memset(p, 0xEE, c.block_bytes);  // after commit, lease still held
      ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
      std::memset(p, 0xDD, c.block_bytes);  // after release
    }
    Conn other;
    ASSERT_EQ(other.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    for (const auto& k : keys) EXPECT_TRUE(ServesRightBytes(other, k)) << "served bytes changed after commit";
    // Down to NVMe (the checksum is taken from the arena), then a restart.
    ASSERT_EQ(kvtier_flush(c.c), KVTIER_OK) << kvtier_last_error();
    for (const auto& k : keys) {
      kvtier_slot slot{};
      uint64_t lease = 0;
      ASSERT_EQ(kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, &slot), KVTIER_OK);
      std::memset(kvtier_host_slot_write(c.c, slot.slot), 0xCC, c.block_bytes);
      ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
      (void)k;
    }
  }
  ASSERT_EQ(d.Stop(), 0) << d.log();
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  for (const auto& k : keys) EXPECT_TRUE(ServesRightBytes(c, k)) << "restored bytes are not the committed ones";
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_tier_checksum_failures_total{tier=\"nvme\"}"), 0);
}

// Each client writes only its own staging area, of tiers.host.staging_slots_per_client
// slots: past it an alloc is REJECTED with the numbers, and a second client still gets
// slots while the first holds all of its own.
TEST(HostileArena, StagingSlotsArePerClientAndCapped) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.host.staging_slots_per_client=4"})) << d.log();
  Conn a, b;
  ASSERT_EQ(a.Open(d.socket(), 5000, "a"), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(b.Open(d.socket(), 5000, "b"), KVTIER_OK) << kvtier_last_error();
  uint64_t la = 0, lb = 0, lx = 0;
  kvtier_slot sa[4], sb[4], sx[1];
  ASSERT_EQ(kvtier_alloc(a.c, a.contract, 4, KVTIER_TIER_HOST, &la, sa), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 1, KVTIER_TIER_HOST, &lx, sx), KVTIER_REJECTED);
  EXPECT_NE(std::string(kvtier_last_error()).find("staging_slots_per_client"), std::string::npos)
      << kvtier_last_error();
  ASSERT_EQ(kvtier_alloc(b.c, b.contract, 4, KVTIER_TIER_HOST, &lb, sb), KVTIER_OK) << kvtier_last_error();
  // Both see the same ids (each its own area), and writing one leaves the other as it was.
  uint64_t wa = 0, wb = 0;
  uint8_t* base_a = static_cast<uint8_t*>(kvtier_host_arena(a.c, &wa));
  uint8_t* base_b = static_cast<uint8_t*>(kvtier_host_arena(b.c, &wb));
  ASSERT_EQ(wa, wb);
  std::memset(base_a + wa - 4 * a.slot_bytes, 0xAA, 4 * a.slot_bytes);
  std::memset(base_b + wb - 4 * b.slot_bytes, 0xBB, 4 * b.slot_bytes);
  EXPECT_EQ(base_a[wa - 1], 0xAA) << "another client's writes reached this client's staging area";
  ASSERT_EQ(kvtier_release(a.c, la), KVTIER_OK);
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 1, KVTIER_TIER_HOST, &lx, sx), KVTIER_OK) << kvtier_last_error();
  EXPECT_TRUE(d.Alive());
}

// ---- commits of a key already cached ---------------------------------------------------

// Commits k with bytes filled by `fill` (the key's own bytes, or garbage); the lease is
// released unless keep_lease. *r gets the report.
kvtier_status CommitWith(Conn& c, const kvtier_key& k, bool garbage, kvtier_commit_result* r) {
  uint64_t lease = 0;
  kvtier_slot slot{};
  kvtier_status s = kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, &slot);
  if (s != KVTIER_OK) return s;
  auto* p = static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot));
  if (garbage) std::memset(p, 0x66, c.block_bytes);
  else FillBlock(p, c.block_bytes, c.contract, k);
  kvtier_commit_item it{};
  it.slot = slot;
  it.key = k;
  s = kvtier_commit_report(c.c, c.contract, lease, &it, 1, r);
  const kvtier_status rs = kvtier_release(c.c, lease);
  return s != KVTIER_OK ? s : rs;
}

// What an acquire of k serves: 1 = the key's own bytes, 0 = other bytes, -1 = a miss.
int Served(Conn& c, const kvtier_key& k) {
  uint64_t lease = 0;
  kvtier_slot slot{};
  size_t n = 0;
  if (kvtier_acquire(c.c, c.contract, &k, 1, KVTIER_TIER_HOST, &lease, &slot, &n) != KVTIER_OK) return -2;
  if (n == 0) return -1;
  const bool ok = CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c.c, slot.slot)), c.block_bytes,
                             c.contract, k);
  (void)kvtier_release(c.c, lease);
  return ok ? 1 : 0;
}

// A client that predicted a prompt's key and committed garbage first: the honest commit
// hears that its bytes were not stored, the daemon counts and logs it, and keep-first
// (the default) serves the first bytes. An equal re-commit is told apart from a conflict,
// for a block in host and for one only on NVMe (its record's checksum).
TEST(HostileArena, CommitOfACachedKeyWithOtherBytesIsReportedKeepFirst) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn poisoner, honest;
  ASSERT_EQ(poisoner.Open(d.socket(), 5000, "poisoner"), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(honest.Open(d.socket(), 5000, "honest-engine"), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = MakeKey(28, 1);
  kvtier_commit_result r{};
  ASSERT_EQ(CommitWith(poisoner, k, /*garbage=*/true, &r), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(r.committed, 1u);
  EXPECT_EQ(r.stored, 1u);
  ASSERT_EQ(CommitWith(honest, k, /*garbage=*/false, &r), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(r.committed, 1u);
  EXPECT_EQ(r.stored, 0u) << "the honest commit is told it stored its bytes";
  EXPECT_EQ(r.different_bytes, 1u);
  EXPECT_EQ(Served(honest, k), 0) << "keep-first serves the first bytes";
  EXPECT_EQ(d.WaitMetric("kvtier_commit_conflicts_total", 1), 1);
  EXPECT_NE(d.log().find("(honest-engine, pid"), std::string::npos) << d.log();
  EXPECT_NE(d.log().find("already cached with different bytes"), std::string::npos) << d.log();
  // The first writer's bytes again: equal, no conflict.
  ASSERT_EQ(CommitWith(poisoner, k, /*garbage=*/true, &r), KVTIER_OK);
  EXPECT_EQ(r.same_bytes, 1u);
  EXPECT_EQ(r.different_bytes, 0u);
  // Only on NVMe: compared with the record's payload checksum.
  const kvtier_key k2 = MakeKey(28, 2);
  ASSERT_EQ(CommitWith(honest, k2, false, &r), KVTIER_OK);
  ASSERT_EQ(kvtier_flush(honest.c), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(CommitWith(honest, k2, false, &r), KVTIER_OK);
  EXPECT_EQ(r.same_bytes, 1u) << "an equal commit of a block on NVMe";
  ASSERT_EQ(kvtier_flush(honest.c), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(CommitWith(poisoner, k2, true, &r), KVTIER_OK);
  EXPECT_EQ(r.different_bytes, 1u) << "a conflicting commit of a block on NVMe";
  EXPECT_EQ(Served(honest, k2), 1);
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_commit_conflicts_total"), 2);
}

TEST(HostileArena, OnConflictReplaceTakesTheNewBytesUnlessPinned) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=replace"})) << d.log();
  Conn a, b;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(b.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = MakeKey(29, 1);
  kvtier_commit_result r{};
  ASSERT_EQ(CommitWith(a, k, true, &r), KVTIER_OK);
  // Pinned by an acquire lease: the cached block stays.
  uint64_t pin = 0;
  kvtier_slot ps{};
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(a.c, a.contract, &k, 1, KVTIER_TIER_HOST, &pin, &ps, &n), KVTIER_OK);
  ASSERT_EQ(CommitWith(b, k, false, &r), KVTIER_OK);
  EXPECT_EQ(r.different_bytes, 1u);
  EXPECT_EQ(Served(b, k), 0) << "a pinned block was replaced under its lease";
  ASSERT_EQ(kvtier_release(a.c, pin), KVTIER_OK);
  // Unpinned: replaced.
  ASSERT_EQ(CommitWith(b, k, false, &r), KVTIER_OK);
  EXPECT_EQ(r.different_bytes, 1u);
  EXPECT_EQ(Served(a, k), 1) << "replace kept the first bytes";
}

TEST(HostileArena, OnConflictDropDisputedDropsBoth) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=drop-disputed"})) << d.log();
  Conn a, b;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(b.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = MakeKey(30, 1);
  kvtier_commit_result r{};
  ASSERT_EQ(CommitWith(a, k, true, &r), KVTIER_OK);
  ASSERT_EQ(CommitWith(b, k, false, &r), KVTIER_OK);
  EXPECT_EQ(r.different_bytes, 1u);
  EXPECT_EQ(Served(b, k), -1) << "a disputed block is still served";
  // Equal bytes are no dispute.
  ASSERT_EQ(CommitWith(b, k, false, &r), KVTIER_OK);
  EXPECT_EQ(r.stored, 1u);
  ASSERT_EQ(CommitWith(a, k, false, &r), KVTIER_OK);
  EXPECT_EQ(r.same_bytes, 1u);
  EXPECT_EQ(Served(a, k), 1);
}

// drop-disputed against a first writer that keeps its block pinned (an acquire lease
// held open): the disputed block is served to no one from the conflict on, the pinning
// lease keeps reading its slot, and the release drops the block, so that the key can be
// committed afresh and is stored.
TEST(HostileArena, OnConflictDropDisputedDropsAPinnedBlockAtItsRelease) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=drop-disputed"})) << d.log();
  Conn a, b;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(b.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = MakeKey(31, 1);
  kvtier_commit_result r{};
  ASSERT_EQ(CommitWith(a, k, /*garbage=*/true, &r), KVTIER_OK) << kvtier_last_error();
  uint64_t pin = 0;
  kvtier_slot ps{};
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(a.c, a.contract, &k, 1, KVTIER_TIER_HOST, &pin, &ps, &n), KVTIER_OK);
  ASSERT_EQ(n, 1u);
  ASSERT_EQ(CommitWith(b, k, /*garbage=*/false, &r), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(r.different_bytes, 1u);
  EXPECT_EQ(Served(b, k), -1) << "a disputed block is served while its first writer pins it";
  EXPECT_EQ(Served(a, k), -1) << "a disputed block is served to its first writer";
  kvtier_lookup_result lr{};
  lr.hit_blocks = 9;
  ASSERT_EQ(kvtier_lookup(b.c, b.contract, &k, 1, &lr, nullptr), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(lr.hit_blocks, 0u) << "a lookup counts a disputed block";
  const auto* held = static_cast<const uint8_t*>(kvtier_host_slot(a.c, ps.slot));
  ASSERT_NE(held, nullptr);
  EXPECT_EQ(held[0], 0x66) << "the pinning lease lost its bytes";
  ASSERT_EQ(kvtier_release(a.c, pin), KVTIER_OK) << kvtier_last_error();
  // Dropped at the release: the honest bytes are stored now, and served.
  ASSERT_EQ(CommitWith(b, k, /*garbage=*/false, &r), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(r.stored, 1u) << "the disputed block outlived its last pin";
  EXPECT_EQ(Served(a, k), 1);
}

// drop-disputed against a block that also has an NVMe record: the record goes at the
// conflict, so a daemon killed while the first writer still pins the block does not serve
// the disputed bytes after its restart.
TEST(HostileArena, OnConflictDropDisputedRemovesTheNvmeRecordAtTheConflict) {
  DaemonProcess d;
  const std::vector<std::string> args{"--set", "tiers.on_conflict=drop-disputed"};
  ASSERT_TRUE(d.Start(args)) << d.log();
  const kvtier_key k = MakeKey(32, 1);
  {
    Conn a, b;
    ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(b.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    kvtier_commit_result r{};
    ASSERT_EQ(CommitWith(a, k, /*garbage=*/true, &r), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(kvtier_flush(a.c), KVTIER_OK) << kvtier_last_error();  // the record is on NVMe
    uint64_t pin = 0;
    kvtier_slot ps{};
    size_t n = 0;
    ASSERT_EQ(kvtier_acquire(a.c, a.contract, &k, 1, KVTIER_TIER_HOST, &pin, &ps, &n), KVTIER_OK);
    ASSERT_EQ(n, 1u);
    ASSERT_EQ(CommitWith(b, k, /*garbage=*/false, &r), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(r.different_bytes, 1u);
    EXPECT_EQ(Served(b, k), -1);
    d.Kill();  // the pin is never released
  }
  ASSERT_TRUE(d.Start(args)) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(Served(c, k), -1) << "the disputed bytes came back from NVMe after a restart";
}

TEST(HostileArena, OnConflictOutsideItsSetIsAStartError) {
  DaemonProcess d;
  EXPECT_FALSE(d.Start({"--set", "tiers.on_conflict=last-wins"}));
  EXPECT_NE(d.log().find("tiers.on_conflict"), std::string::npos) << d.log();
}

}  // namespace
}  // namespace kvtier::hostile
