// The hostile soak: one hostile client repeats, in a loop, what tests/hostile/ plays one
// move at a time, while two honest clients replay the agentic workload through
// `kvtierctl bench replay --verify-full` (every acquired block checked against its key),
// a third honest client times a lookup, an acquire and a release, again and again, and a
// fourth commits fresh keys that the hostile client predicts and commits first with
// garbage (poisoning).
//
// Passes when: no wrong byte is served and no replay errs, no honest request waits more
// than 1 s, the daemon's RSS stays within 256 MiB of where it was after warm-up, and its
// log grows less than 2 MiB. KVTIER_HOSTILE_SOAK_S sets the duration (default 30 s; CI
// keeps it under a minute); the numbers are printed at the end.
//
// Poisoning and "no wrong byte": within one namespace the first committer of a key wins
// by design (tiers.on_conflict = keep-first), so what is checked is each defence:
//   - keep-first (the main soak): the honest committer is told. Every commit whose report
//     says "stored" is served back with its own bytes; every one the hostile client got
//     to first says "different bytes", and then the bytes served are not its own.
//   - drop-disputed: a disputed key is never served again (both versions go).
//   - tenants (as root): honest clients in a tenant the hostile client is not in never
//     see its bytes and are never told of a conflict.
// The replays' keys are not predicted: under keep-first a client that only looks up a key
// a client of its namespace poisoned gets the poisoned bytes (the README, "What a client
// can do").
//
// Left out of the loop: the file-system moves (planted links, a world-writable NVMe
// folder), which are refused at start and have their own tests.
#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/wire.h"
#include "tests/reliability/reliability_util.h"
#include "tests/tools/run_tool.h"

namespace kvtier::hostile {
namespace {

using reliability::Conn;
using testing::DaemonConfig;
using testing::DaemonProcess;
using testing::MetricValue;
using Clock = std::chrono::steady_clock;

long RssKib(pid_t pid) {
  std::istringstream in(testing::ReadText("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

uint64_t FileBytes(const std::string& path) {
  std::error_code ec;
  const auto n = std::filesystem::file_size(path, ec);
  return ec ? 0 : n;
}

int RawConnect(const std::string& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendSocketRequest(int fd, const wire::RequestEntry& e) {
  wire::ControlHeader h;
  h.type = static_cast<uint16_t>(wire::ControlType::kRequest);
  h.length = sizeof e;
  uint8_t msg[sizeof h + sizeof e];
  std::memcpy(msg, &h, sizeof h);
  std::memcpy(msg + sizeof h, &e, sizeof e);
  return ::send(fd, msg, sizeof msg, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof msg);
}

// ---- poisoning ---------------------------------------------------------------------------

// The keys an honest committer commits, in order: MakeKey(kPoisonRun, i). The hostile
// client knows the rule and commits garbage under the next ones first.
constexpr uint64_t kPoisonRun = 8800;

// What the honest committer saw. Shared with child processes (MAP_SHARED) in the
// tenants variant, so atomics only.
struct PoisonTally {
  std::atomic<uint64_t> progress{0};  // the honest committer's next key
  std::atomic<uint64_t> commits{0}, stored{0}, told{0};
  std::atomic<uint64_t> wrong{0};        // "stored", yet other bytes served under the commit's pin
  std::atomic<uint64_t> misreported{0};  // "different bytes", yet its own bytes served
  std::atomic<uint64_t> disputed_served{0};  // drop-disputed: a disputed key served
  std::atomic<uint64_t> poisoned{0};     // the hostile client's garbage commits that were stored
  std::atomic<uint64_t> slowest_us{0};
};

enum class PoisonDefence { kKeepFirst, kDropDisputed, kTenants };

// One honest commit of key i with a report, then an acquire of the key while the alloc
// lease still pins what the commit stored; the outcome goes into t. False on an error.
bool HonestCommitOnce(Conn& c, uint64_t i, PoisonDefence defence, PoisonTally* t) {
  const kvtier_key k = reliability::MakeKey(kPoisonRun, i);
  const auto t0 = Clock::now();
  uint64_t lease = 0;
  kvtier_slot slot{};
  if (kvtier_alloc_wait(c.c, c.contract, 1, KVTIER_TIER_HOST, 5000, &lease, &slot) != KVTIER_OK) return false;
  testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot)), c.block_bytes, c.contract, k);
  kvtier_commit_item it{};
  it.slot = slot;
  it.key = k;
  kvtier_commit_result r{};
  if (kvtier_commit_report(c.c, c.contract, lease, &it, 1, &r) != KVTIER_OK) return false;
  uint64_t got_lease = 0;
  kvtier_slot got{};
  size_t n = 0;
  if (kvtier_acquire(c.c, c.contract, &k, 1, KVTIER_TIER_HOST, &got_lease, &got, &n) != KVTIER_OK) return false;
  const bool own = n == 1 && testing::CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c.c, got.slot)),
                                                 c.block_bytes, c.contract, k);
  if (got_lease != 0) (void)kvtier_release(c.c, got_lease);
  (void)kvtier_release(c.c, lease);
  const auto us = static_cast<uint64_t>(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  for (uint64_t w = t->slowest_us.load(); us > w && !t->slowest_us.compare_exchange_weak(w, us);) {
  }
  ++t->commits;
  if (r.stored == 1) {
    ++t->stored;
    if (!own) ++t->wrong;
  } else if (r.different_bytes == 1) {
    ++t->told;
    if (own) ++t->misreported;
    if (defence == PoisonDefence::kDropDisputed && n > 0) ++t->disputed_served;
  } else if (r.disputed == 1) {
    ++t->told;  // disputed and still pinned: not stored, told so
    if (n > 0) ++t->disputed_served;
  } else if (!own) {
    ++t->wrong;  // "same bytes" (or unchecked) and other bytes served
  }
  return true;
}

// The hostile client's part: garbage under `ahead` of the honest committer's coming keys,
// each key once (after `*next`, which it advances), at most 64 keys ahead. It keeps 4 keys clear of the
// committer's, so that its commit has been released when the honest one comes (a
// disputed block still pinned is served no more either, and dropped at its release:
// HostileArena.OnConflictDropDisputedDropsAPinnedBlockAtItsRelease).
void PoisonAhead(Conn& c, PoisonTally* t, uint64_t* next, uint64_t ahead) {
  const uint64_t at = t->progress.load();
  const uint64_t from = std::max(*next, at + 4);
  for (uint64_t i = from; i < std::min(from + ahead, at + 4 + 64); ++i) {
    uint64_t lease = 0;
    kvtier_slot slot{};
    if (kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, &slot) != KVTIER_OK) return;
    if (auto* p = static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot))) std::memset(p, 0xA5, c.block_bytes);
    kvtier_commit_item it{};
    it.slot = slot;
    it.key = reliability::MakeKey(kPoisonRun, i);
    kvtier_commit_result r{};
    if (kvtier_commit_report(c.c, c.contract, lease, &it, 1, &r) == KVTIER_OK && r.stored == 1) ++t->poisoned;
    (void)kvtier_release(c.c, lease);
    *next = i + 1;
  }
}

std::string TallyLine(const PoisonTally& t) {
  return "commits " + std::to_string(t.commits.load()) + ", stored " + std::to_string(t.stored.load()) +
         ", told (different bytes) " + std::to_string(t.told.load()) + ", hostile garbage stored " +
         std::to_string(t.poisoned.load()) + ", wrong " + std::to_string(t.wrong.load()) + ", misreported " +
         std::to_string(t.misreported.load()) + ", disputed served " + std::to_string(t.disputed_served.load()) +
         ", slowest " + std::to_string(t.slowest_us.load() / 1000) + " ms";
}

// ---- the read-only host arena --------------------------------------------------------------

// Every way a client could try to write a cached host block through the arena fd or the
// library's mapping of it; returns how many got through (0 expected). Every `fault_every`
// call it also forks a child that stores into an acquired slot, which must die of SIGSEGV.
int ArenaWritesThatWorked(Conn& c, uint64_t round, const kvtier_key& cached) {
  int worked = 0;
  const int fd = kvtier_host_arena_fd(c.c);
  if (fd < 0) return 1;  // a client without the arena: nothing to try here is a failure
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return 1;
  const size_t arena = static_cast<size_t>(st.st_size);
  if (void* w = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0); w != MAP_FAILED) {
    ++worked;
    ::munmap(w, arena);
  }
  if (void* r = ::mmap(nullptr, arena, PROT_READ, MAP_SHARED, fd, 0); r != MAP_FAILED) {
    if (::mprotect(r, arena, PROT_READ | PROT_WRITE) == 0) ++worked;
    ::munmap(r, arena);
  }
  uint64_t window = 0;
  auto* base = static_cast<uint8_t*>(kvtier_host_arena(c.c, &window));
  if (base != nullptr && ::mprotect(base, 4096, PROT_READ | PROT_WRITE) == 0) ++worked;
  const char b = static_cast<char>(round);
  if (::pwrite(fd, &b, 1, 0) != -1) ++worked;
  if (::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096) == 0) ++worked;
  const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (const int rw = ::open(path.c_str(), O_RDWR | O_CLOEXEC); rw >= 0) {
    if (void* m = ::mmap(nullptr, arena, PROT_READ | PROT_WRITE, MAP_SHARED, rw, 0); m != MAP_FAILED) {
      ++worked;
      ::munmap(m, arena);
    }
    if (::pwrite(rw, &b, 1, 0) != -1) ++worked;
    ::close(rw);
  }
  if (round % 10 == 0) {
    // A store into an acquired slot's page, in a child: the page is read-only.
    uint64_t lease = 0;
    kvtier_slot slot{};
    size_t n = 0;
    if (kvtier_acquire(c.c, c.contract, &cached, 1, KVTIER_TIER_HOST, &lease, &slot, &n) == KVTIER_OK && n == 1) {
      auto* p = const_cast<volatile uint8_t*>(static_cast<const volatile uint8_t*>(kvtier_host_slot(c.c, slot.slot)));
      const pid_t pid = ::fork();
      if (pid == 0) {
        p[0] = static_cast<uint8_t>(p[0] + 1);
        ::_exit(0);
      }
      int ws = 0;
      ::waitpid(pid, &ws, 0);
      if (!(WIFSIGNALED(ws) && (WTERMSIG(ws) == SIGSEGV || WTERMSIG(ws) == SIGBUS))) ++worked;
      (void)kvtier_release(c.c, lease);
    }
  }
  return worked;
}

// One round of every move, each through its own connection(s). Failures of the moves
// themselves are expected (refusals); only the daemon's answers to the honest clients
// are checked.
void HostileRound(const std::string& socket, int metrics_port, uint64_t round, PoisonTally* poison,
                  uint64_t* poison_next, std::atomic<uint64_t>* arena_writes) {
  // A reload pushed on the ring, the socket closed at once.
  {
    testing::RawClient r;
    wire::AttachReply rep;
    if (r.Attach(socket, &rep) && rep.status == 0) {
      wire::AdminRequest a;
      a.action = static_cast<uint16_t>(wire::AdminAction::kReloadConfig);
      std::memcpy(r.data(), &a, sizeof a);
      wire::RequestEntry e;
      e.op = static_cast<uint16_t>(wire::Op::kAdmin);
      e.tag = round;
      e.in_len = sizeof a;
      e.out_off = 4096;
      e.out_len = 4096;
      (void)r.Push(e);
    }
  }
  // The metrics port: idle connections past its cap, and a request declaring a 1 MiB body.
  {
    std::vector<int> fds;
    for (int i = 0; i < 24; ++i) {
      const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(static_cast<uint16_t>(metrics_port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) fds.push_back(fd);
      else ::close(fd);
    }
    const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
    if (!fds.empty()) (void)::send(fds[0], head.data(), head.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    for (int fd : fds) ::close(fd);
  }
  // An attach header declaring 16 MiB, and idle connections that never attach (past
  // daemon.max_unattached_per_uid).
  {
    std::vector<int> fds;
    for (int i = 0; i < 16; ++i) fds.push_back(RawConnect(socket));
    wire::ControlHeader h;
    h.type = static_cast<uint16_t>(wire::ControlType::kAttach);
    h.length = 16u << 20;
    if (fds[0] >= 0) (void)::send(fds[0], &h, sizeof h, MSG_NOSIGNAL);
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
  }
  // Socket-path nops that declare 16 MiB of output, never read; then corrupt ring entries.
  {
    testing::RawClient r;
    wire::AttachReply rep;
    if (r.Attach(socket, &rep) && rep.status == 0) {
      for (int i = 0; i < 40; ++i) {
        wire::RequestEntry e;
        e.op = static_cast<uint16_t>(wire::Op::kNop);
        e.tag = i;
        e.out_len = wire::kMaxControlPayload - sizeof(wire::CompletionEntry);
        (void)SendSocketRequest(r.sock(), e);
      }
      for (int i = 0; i < 20; ++i) {
        wire::RequestEntry e;
        e.op = static_cast<uint16_t>(wire::Op::kLookup);
        e.tag = 1000 + i;
        e.count = 4;
        e.in_off = 3;  // misaligned: a broken frame, a strike
        e.in_len = 64;
        (void)r.Push(e);
      }
    }
  }
  // Through the library: the whole tier at once, one key 1000 times, a block that names
  // itself as its parent, contracts up to the limit, listings.
  Conn c;
  if (c.Open(socket, 2000, "hostile") != KVTIER_OK) return;
  std::vector<kvtier_slot> slots(1024);
  uint64_t lease = 0;
  (void)kvtier_alloc(c.c, c.contract, 1024, KVTIER_TIER_HOST, &lease, slots.data());
  (void)kvtier_release(c.c, lease);
  if (kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, slots.data()) == KVTIER_OK) {
    const kvtier_key k = reliability::MakeKey(900000 + round, 1);
    testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slots[0].slot)), c.block_bytes, c.contract, k);
    kvtier_commit_item it{};
    it.slot = slots[0];
    it.key = k;
    it.parent = k;
    size_t n = 0;
    (void)kvtier_commit(c.c, c.contract, lease, &it, 1, &n);
    it.parent = kvtier_key{0, 0};
    (void)kvtier_commit(c.c, c.contract, lease, &it, 1, &n);
    // Its staging slot written after the commit: changes nothing cached.
    if (auto* p = static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slots[0].slot))) std::memset(p, 0x5A, c.block_bytes);
    (void)kvtier_release(c.c, lease);
    *arena_writes += static_cast<uint64_t>(ArenaWritesThatWorked(c, round, k));
    const std::vector<kvtier_key> dup(1000, k);
    std::vector<kvtier_slot> got(dup.size());
    size_t hits = 0;
    if (kvtier_acquire(c.c, c.contract, dup.data(), dup.size(), KVTIER_TIER_HOST, &lease, got.data(), &hits) ==
        KVTIER_OK) {
      (void)kvtier_release(c.c, lease);
    }
  }
  PoisonAhead(c, poison, poison_next, 16);
  for (int i = 0; i < 40; ++i) {
    const std::string model = "hostile/" + std::to_string(round) + "-" + std::to_string(i);
    kvtier_contract_desc d = testing::SmallContract(model.c_str());
    uint64_t id = 0;
    (void)kvtier_register_contract(c.c, &d, &id);
  }
  std::vector<uint8_t> out(64 << 10);
  size_t bytes = 0;
  uint32_t n = 0;
  uint64_t total = 0;
  for (uint64_t off = 0; off < 200; off += n) {
    if (kvtier_list_contracts(c.c, off, 50, out.data(), out.size(), &bytes, &n, &total) != KVTIER_OK || n == 0) break;
  }
}

TEST(HostileSoak, HonestClientsAreServedRightAndOnTime) {
  int seconds = 30;
  if (const char* v = std::getenv("KVTIER_HOSTILE_SOAK_S"); v && *v) seconds = std::max(5, std::atoi(v));
  DaemonConfig cfg;
  cfg.slot_bytes = "64KiB";  // an NVFP4 block of the replay's 2-layer geometry
  cfg.host_capacity = "64MiB";
  cfg.nvme_capacity = "256MiB";
  cfg.daemon_extra = "max_clients_per_pid = 32\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const std::string log_path = d.dir() + "/kvtierd.log";

  const auto end = Clock::now() + std::chrono::seconds(seconds);
  // Warm-up: one replay, so that the tiers hold blocks before RSS is taken.
  const std::vector<std::string> replay = {"--socket", d.socket(), "bench", "replay", "--quick", "--formats", "nvfp4",
                                           "--layers", "2", "--verify-full", "--json"};
  {
    std::filesystem::create_directories(d.dir() + "/warm");
    const auto r = testing_tools::RunTool("kvtierctl", replay, d.dir() + "/warm");
    ASSERT_EQ(r.code, 0) << r.out << r.err;
  }
  const long rss0 = RssKib(d.pid());
  const uint64_t log0 = FileBytes(log_path);

  std::atomic<bool> stop{false};
  std::atomic<long> rss_max{rss0};
  std::atomic<uint64_t> rounds{0}, replays{0}, probes{0};
  std::vector<std::string> replay_failures(2);
  std::vector<std::thread> honest;
  for (int h = 0; h < 2; ++h) {
    honest.emplace_back([&, h] {
      const std::string dir = d.dir() + "/honest" + std::to_string(h);
      std::filesystem::create_directories(dir);
      while (Clock::now() < end && replay_failures[h].empty()) {
        const auto r = testing_tools::RunTool("kvtierctl", replay, dir);
        if (r.code != 0 || r.out.find("\"wrong_blocks\": 0") == std::string::npos ||
            r.out.find("\"errors\": 0") == std::string::npos) {
          replay_failures[h] = "exit " + std::to_string(r.code) + ": " + r.out + r.err;
        }
        ++replays;
      }
    });
  }
  // The prober: lookup, acquire and release of blocks it stored, each timed.
  double worst_ms = 0;
  std::string probe_failure;
  std::thread prober([&] {
    Conn p;
    if (p.Open(d.socket(), 5000, "prober") != KVTIER_OK) {
      probe_failure = std::string("prober attach: ") + kvtier_last_error();
      return;
    }
    std::vector<kvtier_key> keys;
    for (uint64_t i = 0; i < 4; ++i) keys.push_back(reliability::MakeKey(7777, i + 1));
    uint64_t round = 0;
    while (!stop.load()) {
      if (round++ % 50 == 0) {
        size_t committed = 0;
        const auto t0 = Clock::now();
        (void)p.Store(keys, [](const kvtier_key&) {}, &committed);
        worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      const auto t0 = Clock::now();
      kvtier_lookup_result lr{};
      if (kvtier_lookup(p.c, p.contract, keys.data(), keys.size(), &lr, nullptr) != KVTIER_OK) {
        probe_failure = std::string("lookup: ") + kvtier_last_error();
        return;
      }
      std::vector<kvtier_slot> slots(keys.size());
      uint64_t lease = 0;
      size_t n = 0;
      const kvtier_status s =
          kvtier_acquire(p.c, p.contract, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n);
      if (s != KVTIER_OK) {
        probe_failure = std::string("acquire: ") + kvtier_last_error();
        return;
      }
      for (size_t i = 0; i < n; ++i) {
        if (!testing::CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(p.c, slots[i].slot)), p.block_bytes, p.contract, keys[i])) {
          probe_failure = "wrong bytes served for probe block " + std::to_string(i);
        }
      }
      (void)kvtier_release(p.c, lease);
      worst_ms = std::max(worst_ms, std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      ++probes;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  // The honest committer of the keys the hostile client predicts (keep-first: it is told).
  PoisonTally poison;
  std::string commit_failure;
  std::thread committer([&] {
    Conn h;
    if (h.Open(d.socket(), 5000, "committer") != KVTIER_OK) {
      commit_failure = std::string("committer attach: ") + kvtier_last_error();
      return;
    }
    for (uint64_t i = 0; !stop.load(); ++i) {
      poison.progress = i;
      if (!HonestCommitOnce(h, i, PoisonDefence::kKeepFirst, &poison)) {
        commit_failure = std::string("honest commit: ") + kvtier_last_error();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  std::atomic<uint64_t> arena_writes{0};
  std::thread hostile([&] {
    uint64_t poison_next = 0;
    while (Clock::now() < end) {
      HostileRound(d.socket(), d.metrics_port(), rounds.load(), &poison, &poison_next, &arena_writes);
      ++rounds;
      rss_max = std::max(rss_max.load(), RssKib(d.pid()));
    }
  });
  hostile.join();
  for (auto& t : honest) t.join();
  stop = true;
  prober.join();
  committer.join();
  const long rss1 = RssKib(d.pid());
  const uint64_t log1 = FileBytes(log_path);
  std::printf("[ soak     ] %d s: %llu hostile rounds, %llu verified replays, %llu probes; slowest honest "
              "request %.1f ms; RSS %ld -> max %ld -> %ld KiB; log +%llu bytes\n",
              seconds, static_cast<unsigned long long>(rounds.load()), static_cast<unsigned long long>(replays.load()),
              static_cast<unsigned long long>(probes.load()), worst_ms, rss0, rss_max.load(), rss1,
              static_cast<unsigned long long>(log1 - log0));
  std::printf("[ soak     ] arena writes that got through: %llu; poisoning under keep-first: %s\n",
              static_cast<unsigned long long>(arena_writes.load()), TallyLine(poison).c_str());
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(arena_writes.load(), 0u) << "a write reached the read-only host arena";
  EXPECT_TRUE(commit_failure.empty()) << commit_failure;
  EXPECT_EQ(poison.wrong.load(), 0u) << TallyLine(poison);
  EXPECT_EQ(poison.misreported.load(), 0u) << TallyLine(poison);
  EXPECT_GT(poison.told.load(), 0u) << "the hostile client never committed a key first: " << TallyLine(poison);
  EXPECT_LT(poison.slowest_us.load(), 1000000u) << TallyLine(poison);
  for (const auto& f : replay_failures) EXPECT_TRUE(f.empty()) << f.substr(0, 4000);
  EXPECT_TRUE(probe_failure.empty()) << probe_failure;
  EXPECT_GT(rounds.load(), 0u);
  EXPECT_GT(probes.load(), 0u);
  EXPECT_LT(worst_ms, 1000.0) << "an honest request waited over 1 s";
  EXPECT_LT(rss_max.load() - rss0, 256L * 1024) << "daemon RSS grew by " << (rss_max.load() - rss0) << " KiB";
  EXPECT_LT(log1 - log0, 2u << 20) << "the log grew by " << (log1 - log0) << " bytes";
}

int PoisonSeconds() {
  int seconds = 30;
  if (const char* v = std::getenv("KVTIER_HOSTILE_SOAK_S"); v && *v) seconds = std::max(5, std::atoi(v));
  return std::max(5, seconds / 3);
}

// tiers.on_conflict = drop-disputed: a hostile client commits garbage under the next keys
// of an honest committer, in a loop. Every key the honest commit finds disputed is gone
// at once (never served to it, nor to anyone after); every key it stored is its own.
TEST(HostileSoak, DropDisputedNeverServesADisputedKey) {
  const int seconds = PoisonSeconds();
  DaemonConfig cfg;
  cfg.host_capacity = "64MiB";  // no block leaves host meanwhile (one being demoted is not dropped either)
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start({"--set", "tiers.on_conflict=drop-disputed"})) << d.log();
  PoisonTally t;
  std::atomic<bool> stop{false};
  std::string failure;
  std::thread hostile([&] {
    Conn c;
    if (c.Open(d.socket(), 5000, "poisoner") != KVTIER_OK) return;
    uint64_t next = 0;
    while (!stop.load()) {
      PoisonAhead(c, &t, &next, 8);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });
  Conn h;
  ASSERT_EQ(h.Open(d.socket(), 5000, "honest"), KVTIER_OK) << kvtier_last_error();
  const auto end = Clock::now() + std::chrono::seconds(seconds);
  std::vector<uint64_t> disputed;
  for (uint64_t i = 0; Clock::now() < end; ++i) {
    t.progress = i;
    const uint64_t told = t.told.load();
    if (!HonestCommitOnce(h, i, PoisonDefence::kDropDisputed, &t)) {
      failure = std::string("honest commit: ") + kvtier_last_error();
      break;
    }
    if (t.told.load() > told) disputed.push_back(i);
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  stop = true;
  hostile.join();
  // Nor later: no disputed key is cached (the hostile client commits each key once).
  uint64_t still = 0;
  for (uint64_t i : disputed) {
    const kvtier_key k = reliability::MakeKey(kPoisonRun, i);
    kvtier_lookup_result lr{};
    ASSERT_EQ(kvtier_lookup(h.c, h.contract, &k, 1, &lr, nullptr), KVTIER_OK) << kvtier_last_error();
    still += lr.hit_blocks;
  }
  std::printf("[ poison   ] drop-disputed, %d s: %s; disputed keys still cached %llu\n", seconds, TallyLine(t).c_str(),
              static_cast<unsigned long long>(still));
  EXPECT_TRUE(failure.empty()) << failure;
  EXPECT_EQ(t.wrong.load(), 0u) << TallyLine(t);
  EXPECT_EQ(t.disputed_served.load(), 0u) << TallyLine(t);
  EXPECT_EQ(t.misreported.load(), 0u) << TallyLine(t);
  EXPECT_EQ(still, 0u) << "disputed keys are still cached";
  EXPECT_GT(t.told.load(), 0u) << "no key was disputed: " << TallyLine(t);
  EXPECT_GT(t.stored.load(), 0u) << TallyLine(t);
  EXPECT_GE(MetricValue(d.Metrics(), "kvtier_commit_conflicts_total"), static_cast<double>(t.told.load()));
}

// Tenants: the honest committer (tenant "honest", uid 64021) and the poisoner (tenant
// "mallory", uid 64022) run as processes of their own under their uids and use the same
// contract and key rule. The poisoner's garbage is stored, in its own namespace; the
// honest client is never told of a conflict and is always served its own bytes.
TEST(HostileSoak, TenantsKeepAPoisonerOutOfTheirBlocks) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients under other uids";
  const int seconds = PoisonSeconds();
  DaemonConfig cfg;
  cfg.host_capacity = "64MiB";
  cfg.extra = "[security]\nsocket_mode = \"0666\"\n[[tenants]]\nname = \"honest\"\nuids = [64021]\n"
              "[[tenants]]\nname = \"mallory\"\nuids = [64022]\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.dir().c_str(), 0755);
  struct Shared {
    PoisonTally tally;
    std::atomic<int> stop{0};
  };
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  auto* shared = new (mem) Shared();
  PoisonTally* t = &shared->tally;
  std::atomic<int>* stop = &shared->stop;
  const auto until = Clock::now() + std::chrono::seconds(seconds);
  testing::Child mallory([&] {
    CHILD_CHECK(::setgroups(0, nullptr) == 0 && ::setgid(64022) == 0 && ::setuid(64022) == 0);
    Conn c;
    CHILD_CHECK(c.Open(d.socket(), 5000, "mallory") == KVTIER_OK);
    uint64_t next = 0;
    while (stop->load() == 0) {
      PoisonAhead(c, t, &next, 8);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return 0;
  });
  testing::Child honest([&] {
    CHILD_CHECK(::setgroups(0, nullptr) == 0 && ::setgid(64021) == 0 && ::setuid(64021) == 0);
    Conn c;
    CHILD_CHECK(c.Open(d.socket(), 5000, "honest") == KVTIER_OK);
    for (uint64_t i = 0; Clock::now() < until; ++i) {
      t->progress = i;
      CHILD_CHECK(HonestCommitOnce(c, i, PoisonDefence::kTenants, t));
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return 0;
  });
  EXPECT_EQ(honest.Wait(), 0) << d.log();
  stop->store(1);
  EXPECT_EQ(mallory.Wait(), 0) << d.log();
  std::printf("[ poison   ] tenants, %d s: %s\n", seconds, TallyLine(*t).c_str());
  EXPECT_GT(t->commits.load(), 0u);
  EXPECT_GT(t->poisoned.load(), 0u) << "the poisoner stored nothing: " << TallyLine(*t);
  EXPECT_EQ(t->told.load(), 0u) << "an honest commit met the poisoner's bytes: " << TallyLine(*t);
  EXPECT_EQ(t->wrong.load(), 0u) << TallyLine(*t);
  EXPECT_EQ(t->stored.load(), t->commits.load()) << TallyLine(*t);
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_commit_conflicts_total"), 0);
  ::munmap(mem, sizeof(Shared));
}

}  // namespace
}  // namespace kvtier::hostile
