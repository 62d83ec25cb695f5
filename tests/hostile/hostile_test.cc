// What an attached client, or a file handed to the daemon, can try against a real
// kvtierd: each test plays one hostile or careless move and checks that it gets a clear
// error, changes nothing it must not change, and costs the daemon a bounded amount.
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/contract_store.h"
#include "formats/contract.h"
#include "formats/wire.h"
#include "tests/reliability/reliability_util.h"
#include "tests/tools/run_tool.h"
#include "tiers/nvme/nvme_store.h"
#include "tools/export_file.h"

namespace kvtier::hostile {
namespace {

using reliability::Conn;
using reliability::ScopedEnv;
using testing::DaemonConfig;
using testing::DaemonProcess;
using testing::MetricValue;

size_t CountLines(const std::string& log, const std::string& needle) {
  size_t n = 0, p = 0;
  while ((p = log.find(needle, p)) != std::string::npos) {
    ++n;
    p += needle.size();
  }
  return n;
}

// The harness's config with `lines` added to its [daemon] table, written over its file.
void SetDaemonKeys(const DaemonProcess& d, const std::string& lines) {
  std::string t = d.ConfigText();
  const size_t at = t.find("[daemon]\n");
  t.insert(at + 9, lines);
  testing::WriteText(d.config_path(), t);
}

// A raw control-socket connection (fd), or -1.
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

// True when the daemon closes fd within timeout_ms (what it sent first is skipped).
bool ClosedWithin(int fd, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    char b[4096];
    const ssize_t k = ::recv(fd, b, sizeof b, MSG_DONTWAIT);
    if (k == 0) return true;
    if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return true;
    if (k > 0) continue;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

// The daemon's resident memory in KiB (VmRSS), or -1.
long RssKib(pid_t pid) {
  std::istringstream in(testing::ReadText("/proc/" + std::to_string(pid) + "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atol(line.c_str() + 6);
  }
  return -1;
}

bool Hits(Conn& c, const kvtier_key& k) {
  kvtier_lookup_result lr{};
  if (kvtier_lookup(c.c, c.contract, &k, 1, &lr, nullptr) != KVTIER_OK) return false;
  return lr.hit_blocks == 1;
}

// ---- a block that names itself as its parent ------------------------------------------

TEST(Hostile, CommitNamingItselfAsParentIsRefused) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  uint64_t lease = 0;
  kvtier_slot slot{};
  ASSERT_EQ(kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, &slot), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = reliability::MakeKey(1, 1);
  testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot)), c.block_bytes, c.contract, k);
  kvtier_commit_item it{};
  it.slot = slot;
  it.key = k;
  it.parent = k;
  size_t n = 7;
  EXPECT_EQ(kvtier_commit(c.c, c.contract, lease, &it, 1, &n), KVTIER_INVALID);
  EXPECT_NE(std::string(kvtier_last_error()).find("names itself as its parent"), std::string::npos)
      << kvtier_last_error();
  EXPECT_EQ(n, 0u);
  ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK) << kvtier_last_error();
  EXPECT_FALSE(Hits(c, k)) << "the refused block is cached";
  // The same block with a real parent is taken.
  ASSERT_EQ(kvtier_alloc(c.c, c.contract, 1, KVTIER_TIER_HOST, &lease, &slot), KVTIER_OK) << kvtier_last_error();
  testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slot.slot)), c.block_bytes, c.contract, k);
  it.slot = slot;
  it.parent = reliability::MakeKey(1, 0);
  EXPECT_EQ(kvtier_commit(c.c, c.contract, lease, &it, 1, &n), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
  EXPECT_TRUE(Hits(c, k));
  EXPECT_TRUE(d.Alive());
}

// An NVMe index written elsewhere (an older daemon, a hand-edited folder) with an entry
// whose parent is its own key: the daemon drops it at load, says so, and keeps the rest.
TEST(Hostile, NvmeIndexEntryNamingItselfAsParentIsDroppedAtLoad) {
  DaemonProcess d;
  uint64_t contract = 0;
  kvtier_contract_desc desc = testing::SmallContract();
  ASSERT_EQ(kvtier_contract_id(&desc, &contract), KVTIER_OK);
  const kvtier_key self = reliability::MakeKey(2, 1), good = reliability::MakeKey(2, 2);
  {
    tiers::NvmeStoreOptions o;  // what the harness's config gives the daemon
    o.dir = d.dir() + "/nvme";
    o.slot_bytes = 4096;
    o.capacity_bytes = 1 << 20;
    auto s = tiers::NvmeStore::Open(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    void* buf = std::aligned_alloc(4096, 4096);
    std::memset(buf, 0x5a, 4096);
    std::vector<tiers::NvmeWrite> w(2);
    w[0].id = tiers::BlockId{contract, Key128{self.hi, self.lo}};
    w[0].parent = Key128{self.hi, self.lo};
    w[1].id = tiers::BlockId{contract, Key128{good.hi, good.lo}};
    for (auto& x : w) {
      x.payload = static_cast<const uint8_t*>(buf);
      x.len = 576;
    }
    EXPECT_TRUE((*s)->WriteBatch(w).ok());
    for (auto& x : w) EXPECT_TRUE(x.result.ok()) << x.result.ToString();
    s->reset();
    std::free(buf);
  }
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(c.contract, contract);
  EXPECT_FALSE(Hits(c, self)) << "an entry naming itself as its parent was loaded";
  EXPECT_TRUE(Hits(c, good)) << "the good entry beside it was lost";
  EXPECT_NE(d.log().find("1 naming their own block as parent"), std::string::npos) << d.log();
}

// kvtierctl import of a .kvt file holding such a record: refused before anything is stored.
TEST(Hostile, ImportOfARecordNamingItselfAsParentStoresNothing) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  ScaleContract ct;
  ct.model_id = "test/import";
  ct.geometry = {2, 1, 16, 16};
  ct.SetUnitScales();
  const std::string file = d.dir() + "/self.kvt";
  {
    auto w = ExportWriter::Create(file, ct);
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    const std::vector<uint8_t> zeros(ct.block_bytes(), 0);
    const Key128 a{1, 11}, b{2, 22};
    ASSERT_TRUE((*w)->Add(a, Key128{}, zeros).ok());
    ASSERT_TRUE((*w)->Add(b, b, zeros).ok());
    ASSERT_TRUE((*w)->Finish().ok());
  }
  auto r = testing_tools::RunTool("kvtierctl", {"--socket", d.socket(), "import", file}, d.dir());
  EXPECT_NE(r.code, 0) << r.out;
  EXPECT_NE(r.err.find("names itself as its parent"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("nothing stored"), std::string::npos) << r.err;
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_tier_blocks{tier=\"host\"}"), 0) << r.err;
}

// Every NVMe write fails while a client keeps storing: host evictions lose their blocks.
// Each loss is counted, and the log says so once per interval, not once per block.
TEST(Hostile, BlocksLostOnTheWayDownAreCountedAndLoggedRateLimited) {
#if !KVTIER_TEST_POINTS
  GTEST_SKIP() << "built without KVTIER_TEST_POINTS: KVTIER_TEST_FAULTS is compiled out";
#endif
  DaemonConfig cfg;
  cfg.binary = "kvtierd-test";
  DaemonProcess d(cfg);
  bool started;
  {
    ScopedEnv f("KVTIER_TEST_FAULTS", "write_error=1,seed=1");
    started = d.Start();
  }
  ASSERT_TRUE(started) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  uint64_t stored = 0;
  for (uint64_t i = 0; i < 400; i += 4) {
    std::vector<kvtier_key> keys;
    for (uint64_t j = 0; j < 4; ++j) keys.push_back(reliability::MakeKey(3, i + j));
    size_t done = 0;
    kvtier_status s = KVTIER_RETRY;
    for (int t = 0; t < 500 && s == KVTIER_RETRY; ++t) {
      if (t > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s = c.Store(keys, [](const kvtier_key&) {}, &done);
    }
    ASSERT_EQ(s, KVTIER_OK) << kvtier_last_error();
    stored += done;
  }
  const std::string m = d.Metrics();
  const double dropped = MetricValue(m, "kvtier_tier_evictions_total{tier=\"host\",reason=\"dropped\"}");
  EXPECT_GE(dropped, 200) << m;  // 400 stored, 64 host slots, nothing reaches NVMe
  const std::string log = d.log();
  const size_t lines = CountLines(log, "dropped on the way down to nvme");
  EXPECT_GE(lines, 1u) << log;
  EXPECT_LE(lines, 2u) << log;
  EXPECT_TRUE(d.Alive());
}


// ---- files a local user could plant ------------------------------------------------------

// A symlink planted where the daemon keeps an NVMe data file: the daemon must not
// preallocate or write its target. It refuses to start and says why.
TEST(Hostile, PlantedNvmeDataFileLinkIsRefused) {
  DaemonProcess d;
  const std::string victim = d.dir() + "/victim";
  testing::WriteText(victim, "precious");
  std::filesystem::create_directories(d.dir() + "/nvme/data");
  ASSERT_EQ(::symlink(victim.c_str(), (d.dir() + "/nvme/data/kvtier-0000.dat").c_str()), 0);
  EXPECT_FALSE(d.Start()) << "kvtierd started with a planted data file link";
  EXPECT_NE(d.log().find("is a symbolic link: refused"), std::string::npos) << d.log();
  EXPECT_EQ(std::filesystem::file_size(victim), 8u) << "the link's target was preallocated";
  EXPECT_TRUE(testing::ReadText(victim) == "precious") << "the link's target was written";
}

// An NVMe folder other users can write: anyone could plant files there. Refused at start.
TEST(Hostile, NvmeDirWritableByOthersIsRefused) {
  DaemonProcess d;
  const std::string dir = d.dir() + "/nvme";
  std::filesystem::create_directories(dir);
  ASSERT_EQ(::chmod(dir.c_str(), 0777), 0);
  EXPECT_FALSE(d.Start()) << "kvtierd started on a world-writable NVMe folder";
  EXPECT_NE(d.log().find("is writable by other users"), std::string::npos) << d.log();
  EXPECT_FALSE(std::filesystem::exists(dir + "/data/kvtier-0000.dat"));
}

// kvtierctl export beside a planted FILE.tmp link: the export lands under its own name,
// the link's target is untouched.
TEST(Hostile, ExportDoesNotFollowAPlantedTempLink) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  size_t done = 0;
  ASSERT_EQ(c.Store({reliability::MakeKey(4, 1)}, [](const kvtier_key&) {}, &done), KVTIER_OK) << kvtier_last_error();
  const std::string out = d.dir() + "/out.kvt", victim = d.dir() + "/victim";
  testing::WriteText(victim, "precious");
  ASSERT_EQ(::symlink(victim.c_str(), (out + ".tmp").c_str()), 0);
  auto r = testing_tools::RunTool(
      "kvtierctl", {"--socket", d.socket(), "export", "--contract", ContractIdHex(c.contract), "--out", out}, d.dir());
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(testing::ReadText(victim) == "precious") << "the planted link's target was written";
  EXPECT_TRUE(std::filesystem::is_regular_file(std::filesystem::symlink_status(out)));
  auto rd = ExportReader::Open(out);
  ASSERT_TRUE(rd.ok()) << rd.status().ToString();
  uint64_t n = 0;
  EXPECT_TRUE((*rd)->VerifyAll(nullptr, &n).ok());
  EXPECT_EQ(n, 1u);
}

// kvtierctl's files take the umask's mode as open(2) would give it; an export (the
// prompts of its contract in another form) is 0600 at most, whatever the umask allows.
TEST(Hostile, KvtierctlFilesFollowTheUmaskAndExportsArePrivate) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  size_t done = 0;
  ASSERT_EQ(c.Store({reliability::MakeKey(5, 1)}, [](const kvtier_key&) {}, &done), KVTIER_OK) << kvtier_last_error();
  auto mode_of = [](const std::string& p) {
    struct stat st {};
    return ::stat(p.c_str(), &st) == 0 ? static_cast<int>(st.st_mode & 07777) : -1;
  };
  for (const mode_t mask : {mode_t{022}, mode_t{077}}) {
    const mode_t was = ::umask(mask);
    const std::string tag = std::to_string(mask);
    const std::string exp = d.dir() + "/export-" + tag + ".kvt", kv = d.dir() + "/synth-" + tag + ".safetensors";
    auto r = testing_tools::RunTool(
        "kvtierctl", {"--socket", d.socket(), "export", "--contract", ContractIdHex(c.contract), "--out", exp}, d.dir());
    auto r2 = testing_tools::RunTool("kvtierctl", {"synth", "--out", kv, "--layers", "1", "--tokens", "16"}, d.dir());
    ::umask(was);
    ASSERT_EQ(r.code, 0) << r.err;
    ASSERT_EQ(r2.code, 0) << r2.err;
    EXPECT_EQ(mode_of(exp), 0600) << "export under umask 0" << std::oct << mask;
    EXPECT_EQ(mode_of(kv), static_cast<int>(0666 & ~mask)) << "synth output under umask 0" << std::oct << mask;
  }
}

// A SIGINT or SIGTERM while an export is being written removes its temp file.
TEST(Hostile, AnInterruptedExportLeavesNoTempFile) {
  DaemonConfig cfg;
  cfg.host_capacity = "16MiB";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_key> keys;
  for (uint64_t i = 1; i <= 2000; ++i) keys.push_back(reliability::MakeKey(6, i));
  for (size_t at = 0; at < keys.size(); at += 250) {
    size_t done = 0;
    std::vector<kvtier_key> part(keys.begin() + static_cast<ptrdiff_t>(at), keys.begin() + static_cast<ptrdiff_t>(at + 250));
    ASSERT_EQ(c.Store(part, [](const kvtier_key&) {}, &done), KVTIER_OK) << kvtier_last_error();
  }
  for (const int sig : {SIGINT, SIGTERM}) {
    const std::string dir = d.dir() + "/out-" + std::to_string(sig);
    std::filesystem::create_directories(dir);
    const int in = ::inotify_init1(IN_CLOEXEC);
    ASSERT_GE(in, 0);
    ASSERT_GE(::inotify_add_watch(in, dir.c_str(), IN_CREATE), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      const std::string bin = std::string(KVTIER_BIN_DIR) + "/kvtierctl";
      const std::string cid = ContractIdHex(c.contract), out = dir + "/big.kvt", sock = d.socket();
      ::execl(bin.c_str(), bin.c_str(), "--socket", sock.c_str(), "export", "--contract", cid.c_str(), "--level", "19",
              "--out", out.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    // The temp file's creation, then the signal at once.
    alignas(inotify_event) char buf[4096];
    pollfd p{in, POLLIN, 0};
    ASSERT_GT(::poll(&p, 1, 20000), 0) << "kvtierctl export created nothing";
    ASSERT_GT(::read(in, buf, sizeof buf), 0);
    ::kill(pid, sig);
    int st = 0;
    ASSERT_EQ(::waitpid(pid, &st, 0), pid);
    ::close(in);
    EXPECT_TRUE(WIFSIGNALED(st) && WTERMSIG(st) == sig) << "the export ended before the signal (status " << st << ")";
    std::vector<std::string> left;
    for (const auto& e : std::filesystem::directory_iterator(dir)) left.push_back(e.path().filename().string());
    EXPECT_TRUE(left.empty()) << "left behind after signal " << sig << ": " << (left.empty() ? "" : left[0]);
  }
}

// ---- before attach ---------------------------------------------------------------------

// Attach headers that declare 16 MiB: each is refused at once, before its payload would be
// read, and the daemon's memory does not grow with them.
TEST(Hostile, OversizedAttachIsRefusedBeforeAnythingIsAllocated) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  const long rss0 = RssKib(d.pid());
  ASSERT_GT(rss0, 0);
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) {
    const int fd = RawConnect(d.socket());
    ASSERT_GE(fd, 0);
    fds.push_back(fd);
    wire::ControlHeader h;
    h.type = static_cast<uint16_t>(wire::ControlType::kAttach);
    h.length = wire::kMaxControlPayload;
    ASSERT_EQ(::write(fd, &h, sizeof h), static_cast<ssize_t>(sizeof h));
    uint8_t buf[sizeof(wire::ControlHeader) + sizeof(wire::AttachReply)];
    pollfd p{fd, POLLIN, 0};
    ASSERT_EQ(::poll(&p, 1, 3000), 1) << "no attach reply to a 16 MiB attach header within 3 s (connection " << i << ")";
    ASSERT_EQ(::recv(fd, buf, sizeof buf, MSG_WAITALL), static_cast<ssize_t>(sizeof buf));
    wire::AttachReply rep;
    std::memcpy(&rep, buf + sizeof(wire::ControlHeader), sizeof rep);
    EXPECT_NE(rep.status, 0);
    EXPECT_NE(std::string(rep.message).find("attach payload is 16777216 bytes"), std::string::npos) << rep.message;
    EXPECT_TRUE(ClosedWithin(fd, 3000));
  }
  const long grown = RssKib(d.pid()) - rss0;
  EXPECT_LT(grown, 32 * 1024) << "daemon RSS grew by " << grown << " KiB over 40 refused attaches";
  for (int fd : fds) ::close(fd);
  Conn c;
  EXPECT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
}

// A connection that never sends its attach is closed after daemon.attach_timeout_ms.
TEST(Hostile, SilentConnectionIsClosedAfterTheAttachTimeout) {
  DaemonProcess d;
  SetDaemonKeys(d, "attach_timeout_ms = 300\n");
  ASSERT_TRUE(d.Start()) << d.log();
  const int fd = RawConnect(d.socket());
  ASSERT_GE(fd, 0);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_TRUE(ClosedWithin(fd, 5000)) << "a silent connection stayed open 5 s";
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GE(s, 0.25);
  ::close(fd);
  EXPECT_NE(d.log().find("no attach within daemon.attach_timeout_ms"), std::string::npos) << d.log();
}

// Past daemon.max_unattached idle connections a new one is closed at accept; once they
// go, clients attach again.
TEST(Hostile, UnattachedConnectionsAreCapped) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_unattached = 4\nattach_timeout_ms = 60000\n");
  ASSERT_TRUE(d.Start()) << d.log();
  // The harness's start probe is an unattached connection too: let it go.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) {
    idle.push_back(RawConnect(d.socket()));
    ASSERT_GE(idle.back(), 0);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  for (int fd : idle) EXPECT_FALSE(ClosedWithin(fd, 100)) << "an idle connection under the cap was closed";
  const int extra = RawConnect(d.socket());
  ASSERT_GE(extra, 0);
  EXPECT_TRUE(ClosedWithin(extra, 3000)) << "a connection over daemon.max_unattached stayed open";
  ::close(extra);
  for (int fd : idle) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  Conn c;
  EXPECT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  EXPECT_NE(d.log().find("daemon.max_unattached (4)"), std::string::npos) << d.log();
}

// ---- file descriptors --------------------------------------------------------------------

// kvtierd takes every fd its hard limit allows.
TEST(Hostile, SoftFdLimitIsRaisedToTheHardLimit) {
  rlimit was{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &was), 0);
  if (was.rlim_max < 1024) GTEST_SKIP() << "hard RLIMIT_NOFILE " << was.rlim_max << " leaves nothing to raise";
  DaemonProcess d;
  bool started;
  {
    rlimit low = was;
    low.rlim_cur = 512;  // inherited by the daemon
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
    started = d.Start();
    ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &was), 0);
  }
  ASSERT_TRUE(started) << d.log();
  rlimit now{};
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, nullptr, &now), 0);
  EXPECT_EQ(now.rlim_cur, was.rlim_max) << "soft RLIMIT_NOFILE stays " << now.rlim_cur;
}

// The daemon's CPU time (user + system) in clock ticks.
long CpuTicks(pid_t pid) {
  const std::string st = testing::ReadText("/proc/" + std::to_string(pid) + "/stat");
  std::istringstream in(st.substr(st.rfind(')') + 2));
  std::string f;
  long ut = 0, stm = 0;
  for (int i = 3; i <= 15 && in >> f; ++i) {
    if (i == 14) ut = std::atol(f.c_str());
    if (i == 15) stm = std::atol(f.c_str());
  }
  return ut + stm;
}

// Idle connections until the daemon runs out of fds: the accept loop backs off (no
// spinning core, one log line per interval), new connections are closed rather than left
// hanging, and once the idle ones go a client attaches again.
TEST(Hostile, FdExhaustionBacksOffInsteadOfSpinning) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_unattached = 4096\nattach_timeout_ms = 600000\n");
  ASSERT_TRUE(d.Start()) << d.log();
  size_t open_fds = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid()) + "/fd")) {
    (void)e;
    ++open_fds;
  }
  rlimit tight{open_fds + 16, open_fds + 16};
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, &tight, nullptr), 0) << std::strerror(errno);
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    const int fd = RawConnect(d.socket());
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const long t0 = CpuTicks(d.pid());
  const size_t log0 = d.log().size();
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const long ticks = CpuTicks(d.pid()) - t0;
  const size_t logged = d.log().size() - log0;
  const long hz = ::sysconf(_SC_CLK_TCK);
  EXPECT_LT(ticks, hz / 2) << "the daemon used " << ticks << " ticks of CPU in 2 s while out of fds";
  EXPECT_LT(logged, 4096u) << "the daemon logged " << logged << " bytes in 2 s while out of fds";
  // A connection made now is closed (or refused), not left waiting.
  const int late = RawConnect(d.socket());
  if (late >= 0) {
    EXPECT_TRUE(ClosedWithin(late, 3000)) << "a connection made while out of fds was left hanging";
    ::close(late);
  }
  for (int fd : idle) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  Conn c;
  EXPECT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  EXPECT_TRUE(d.Alive());
}

// A peer that takes the connection and never answers: kvtier_connect gives up after
// timeout_ms with KVTIER_TIMEOUT instead of hanging in the attach.
TEST(Hostile, ConnectHonoursTimeoutForTheWholeAttach) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/mute.sock";
  const int lfd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  ASSERT_EQ(::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(lfd, 8), 0);  // never accepted: the attach waits in the backlog
  testing::Child child([&] {
    kvtier_connect_options o{};
    o.name = "impatient";
    o.timeout_ms = 300;
    kvtier_client* c = nullptr;
    const auto t0 = std::chrono::steady_clock::now();
    const kvtier_status s = kvtier_connect(path.c_str(), &o, &c);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHILD_CHECK(s == KVTIER_TIMEOUT);
    CHILD_CHECK(secs < 2.0);
    CHILD_CHECK(std::string(kvtier_last_error()).find("timeout_ms") != std::string::npos);
    return 0;
  });
  int rc = -1;
  for (int i = 0; i < 500; ++i) {
    siginfo_t si{};
    if (::waitid(P_PID, static_cast<id_t>(child.pid()), &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        si.si_pid == child.pid()) {
      rc = child.Wait();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::close(lfd);
  EXPECT_EQ(rc, 0) << (rc == -1 ? "kvtier_connect(timeout_ms = 300) still waiting after 5 s" : "child check failed");
}

// ---- the socket path ---------------------------------------------------------------------

// One socket-path request (header + entry, no input); false when the socket is gone.
bool SendSocketRequest(int fd, const wire::RequestEntry& e) {
  wire::ControlHeader h;
  h.type = static_cast<uint16_t>(wire::ControlType::kRequest);
  h.length = sizeof e;
  uint8_t msg[sizeof h + sizeof e];
  std::memcpy(msg, &h, sizeof h);
  std::memcpy(msg + sizeof h, &e, sizeof e);
  return ::send(fd, msg, sizeof msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof msg);
}

// Nops that declare 16 MiB of output, from a client that never reads: the daemon sizes
// each reply to what a nop writes, so its memory stays flat.
TEST(Hostile, SocketRepliesAreSizedToWhatTheOpWrites) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  testing::RawClient r;
  wire::AttachReply rep;
  ASSERT_TRUE(r.Attach(d.socket(), &rep));
  ASSERT_EQ(rep.status, 0) << rep.message;
  // First fill the socket with replies it does not read, so that later replies queue.
  for (int i = 0; i < 3000; ++i) {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kStats);
    e.tag = 10000 + i;
    e.count = 8;
    e.out_len = 8 * sizeof(wire::WireTierStats);
    ASSERT_TRUE(SendSocketRequest(r.sock(), e));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long rss0 = RssKib(d.pid());
  for (int i = 0; i < 40; ++i) {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kNop);
    e.tag = 100 + i;
    e.out_len = wire::kMaxControlPayload - sizeof(wire::CompletionEntry);
    ASSERT_TRUE(SendSocketRequest(r.sock(), e));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  const long grown = RssKib(d.pid()) - rss0;
  EXPECT_LT(grown, 32 * 1024) << "daemon RSS grew by " << grown << " KiB for 40 queued nop replies";
  EXPECT_TRUE(d.Alive());
}

// A client that sends requests and never reads the replies: once its queued replies
// pass daemon.max_socket_queue_bytes it is disconnected, with the reason in the log.
TEST(Hostile, UnreadSocketRepliesAreBoundedByDisconnecting) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_socket_queue_bytes = \"64KiB\"\n");
  ASSERT_TRUE(d.Start()) << d.log();
  testing::RawClient r;
  wire::AttachReply rep;
  ASSERT_TRUE(r.Attach(d.socket(), &rep));
  ASSERT_EQ(rep.status, 0) << rep.message;
  int sent = 0;
  for (int i = 0; i < 20000; ++i) {
    wire::RequestEntry e;
    e.op = static_cast<uint16_t>(wire::Op::kStats);
    e.tag = 1000 + i;
    e.count = 8;
    e.out_len = 8 * sizeof(wire::WireTierStats);
    if (!SendSocketRequest(r.sock(), e)) break;
    ++sent;
  }
  EXPECT_LT(sent, 20000) << "20000 unread stats replies and the daemon still takes requests";
  EXPECT_TRUE(ClosedWithin(r.sock(), 5000)) << "the client that does not read was not disconnected";
  EXPECT_NE(d.log().find("over daemon.max_socket_queue_bytes"), std::string::npos) << d.log().substr(0, 4000);
  Conn c;
  EXPECT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
}

// ---- no freeze ------------------------------------------------------------------------------

// Pushes an admin config reload on r's ring; its reply is never read.
bool PushReload(testing::RawClient& r, uint64_t tag) {
  wire::AdminRequest a;
  a.action = static_cast<uint16_t>(wire::AdminAction::kReloadConfig);
  std::memcpy(r.data(), &a, sizeof a);
  wire::RequestEntry e;
  e.op = static_cast<uint16_t>(wire::Op::kAdmin);
  e.tag = tag;
  e.in_off = 0;
  e.in_len = sizeof a;
  e.out_off = 4096;
  e.out_len = 4096;
  return r.Push(e);
}

// How long a fresh client takes to attach (and register), in ms; -1 when it fails.
long AttachMs(const std::string& socket, uint32_t timeout_ms) {
  const auto t0 = std::chrono::steady_clock::now();
  Conn c;
  if (c.Open(socket, timeout_ms) != KVTIER_OK) return -1;
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - t0).count());
}

// A client closes its socket while a reload it pushed on its ring is under way (held
// open 300 ms by a test point), three times in a row: the daemon goes on attaching
// clients, serving /metrics and stopping on SIGTERM at once, not after a timeout per
// session.
TEST(Hostile, CloseDuringARingReloadFreezesNothing) {
  DaemonConfig cfg;
  cfg.binary = "kvtierd-test";
  ScopedEnv delay("KVTIER_TEST_DELAY_POINT", "Session::Admin:Reload=300");
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    testing::RawClient r;
    wire::AttachReply rep;
    ASSERT_TRUE(r.Attach(d.socket(), &rep));
    ASSERT_EQ(rep.status, 0) << rep.message;
    ASSERT_TRUE(PushReload(r, 1 + i));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the ring thread is in the reload
    r.Close();
  }
  const long ms = AttachMs(d.socket(), 3000);
  EXPECT_GE(ms, 0) << "no attach within 3 s after the close/reload races: " << kvtier_last_error();
  EXPECT_LT(ms, 2000) << "attach took " << ms << " ms";
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_LT(took.count(), 5000) << "three close/reload races and an attach took " << took.count() << " ms";
  EXPECT_NE(d.Metrics().find("kvtier_clients"), std::string::npos) << "/metrics did not answer";
  EXPECT_EQ(d.WaitMetric("kvtier_config_reloads_total{result=\"ok\"}", 3), 3) << d.log().substr(0, 4000);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(d.Stop(10), 0) << d.log().substr(0, 4000);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << "SIGTERM took over 5 s";
}

// The same race without the test point's help, many times over (KVTIER_HOSTILE_RACES,
// default 1000; scripts/sanitize.sh runs it under TSan): a client pushes a reload and
// closes at once. Every 100 races a fresh client must attach within 2 s.
TEST(Hostile, CloseRacingARingReloadManyTimes) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  int races = 1000;
  if (const char* v = std::getenv("KVTIER_HOSTILE_RACES"); v && *v) races = std::atoi(v);
  for (int i = 0; i < races; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    testing::RawClient r;
    wire::AttachReply rep;
    ASSERT_TRUE(r.Attach(d.socket(), &rep)) << "race " << i;
    const auto attach_ms =
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_LT(attach_ms, 2000) << "race " << i << ": attach took " << attach_ms << " ms";
    ASSERT_EQ(rep.status, 0) << rep.message;
    ASSERT_TRUE(PushReload(r, 1));
    if (i % 2 == 1) std::this_thread::sleep_for(std::chrono::microseconds(50 * (i % 7)));
    r.Close();
    if (i % 100 == 99) {
      const long ms = AttachMs(d.socket(), 3000);
      ASSERT_GE(ms, 0) << "race " << i << ": no attach within 3 s: " << kvtier_last_error();
      ASSERT_LT(ms, 2000) << "race " << i << ": attach took " << ms << " ms";
    }
  }
  EXPECT_TRUE(d.Alive());
  EXPECT_EQ(d.Stop(20), 0) << d.log().substr(0, 4000);
}

// ---- per-client budgets -------------------------------------------------------------------

// One acquire that names the same block 1000 times: the block is pinned once, the lease
// holds one slot, and every position of the reply points at it.
TEST(Hostile, DuplicateKeysInOneAcquireArePinnedOnce) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const kvtier_key k = reliability::MakeKey(3, 1);
  size_t committed = 0;
  ASSERT_EQ(c.Store({k}, [](const kvtier_key&) {}, &committed), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(committed, 1u);
  const std::vector<kvtier_key> keys(1000, k);
  std::vector<kvtier_slot> slots(keys.size());
  uint64_t lease = 0;
  size_t n = 0;
  ASSERT_EQ(kvtier_acquire(c.c, c.contract, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n),
            KVTIER_OK)
      << kvtier_last_error();
  ASSERT_EQ(n, keys.size());
  for (size_t i = 1; i < n; ++i) ASSERT_EQ(slots[i].slot, slots[0].slot) << "position " << i;
  EXPECT_TRUE(testing::CheckBlock(static_cast<const uint8_t*>(kvtier_host_slot(c.c, slots[0].slot)), c.block_bytes, c.contract, k));
  EXPECT_EQ(d.WaitMetric("kvtier_leased_slots", 1), 1) << "a lease naming one block 1000 times holds more than one slot";
  kvtier_block_info info{};
  ASSERT_EQ(kvtier_inspect(c.c, c.contract, k, &info), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(info.pins_host, 1u);
  ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(kvtier_inspect(c.c, c.contract, k, &info), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(info.pins_host, 0u) << "the block stays pinned after its lease is released";
  EXPECT_EQ(d.WaitMetric("kvtier_leased_slots", 0), 0);
}

// By default (daemon.max_tier_share_per_client 0.75) one client cannot allocate the
// whole host tier.
TEST(Hostile, OneClientCannotAllocateAWholeTierByDefault) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn a;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_slot> slots(64);
  uint64_t lease = 0;
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 64, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_REJECTED)
      << "one client allocated the whole host tier";
  EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_tier_share_per_client lets one client hold 48"),
            std::string::npos)
      << kvtier_last_error();
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 48, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
}

// The host tier has 64 slots; with daemon.max_tier_share_per_client = 0.5 one client
// holds at most 32 of them under its leases, by alloc or by acquire, and a second client
// still allocates and commits.
TEST(Hostile, OneClientCannotHoldMoreThanItsShareOfATier) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_tier_share_per_client = 0.5\n");
  ASSERT_TRUE(d.Start()) << d.log();
  Conn a, b;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(b.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_slot> slots(64);
  uint64_t lease = 0;
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 33, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_REJECTED)
      << "one client allocated over half the host tier";
  EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_tier_share_per_client"), std::string::npos)
      << kvtier_last_error();
  ASSERT_EQ(kvtier_alloc(a.c, a.contract, 32, KVTIER_TIER_HOST, &lease, slots.data()), KVTIER_OK) << kvtier_last_error();
  uint64_t more = 0;
  EXPECT_EQ(kvtier_alloc(a.c, a.contract, 1, KVTIER_TIER_HOST, &more, slots.data() + 32), KVTIER_REJECTED);
  // The second client is not held up by the first one's leases.
  std::vector<kvtier_key> bk;
  for (uint64_t i = 0; i < 8; ++i) bk.push_back(reliability::MakeKey(9, i + 1));
  size_t committed = 0;
  EXPECT_EQ(b.Store(bk, [](const kvtier_key&) {}, &committed), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(committed, bk.size());
  ASSERT_EQ(kvtier_release(a.c, lease), KVTIER_OK);
  // By acquire: 40 cached blocks, acquired at once, are past the share as well.
  std::vector<kvtier_key> ak;
  for (uint64_t i = 0; i < 40; ++i) ak.push_back(reliability::MakeKey(4, i + 1));
  ASSERT_EQ(a.Store(std::vector<kvtier_key>(ak.begin(), ak.begin() + 20), [](const kvtier_key&) {}, &committed), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(a.Store(std::vector<kvtier_key>(ak.begin() + 20, ak.end()), [](const kvtier_key&) {}, &committed), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_slot> got(ak.size());
  size_t n = 0;
  EXPECT_EQ(kvtier_acquire(a.c, a.contract, ak.data(), ak.size(), KVTIER_TIER_HOST, &lease, got.data(), &n),
            KVTIER_REJECTED)
      << "one client pinned " << n << " of the host tier's 64 slots";
  EXPECT_EQ(kvtier_acquire(a.c, a.contract, ak.data(), 30, KVTIER_TIER_HOST, &lease, got.data(), &n), KVTIER_OK)
      << kvtier_last_error();
  EXPECT_EQ(n, 30u);
  EXPECT_EQ(kvtier_release(a.c, lease), KVTIER_OK);
  EXPECT_TRUE(d.Alive());
}

// Stores keys (run, from .. from + n) through c, four per commit, waiting out RETRY.
bool StoreRun(Conn& c, uint64_t run, uint64_t from, uint64_t n) {
  for (uint64_t i = from; i < from + n; i += 4) {
    std::vector<kvtier_key> keys;
    for (uint64_t j = 0; j < 4; ++j) keys.push_back(reliability::MakeKey(run, i + j));
    size_t done = 0;
    kvtier_status s = KVTIER_RETRY;
    for (int t = 0; t < 500 && s == KVTIER_RETRY; ++t) {
      if (t > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      s = c.Store(keys, [](const kvtier_key&) {}, &done);
    }
    if (s != KVTIER_OK) return false;
  }
  return true;
}

// A daily NVMe write budget of 1 MiB (128 writes of 8 KiB: a 576-byte block in a 4 KiB
// slot, plus the record's header), a quarter of it per user.
DaemonConfig NvmeBudgetConfig() {
  DaemonConfig cfg;
  cfg.nvme_capacity = "4MiB";
  cfg.extra = "daily_write_budget = \"1MiB\"\ndaily_write_budget_per_client = 0.25\n";  // in [tiers.nvme]
  return cfg;
}

// Until the mover has demoted every block of keys, or dropped one; true when all are on NVMe.
bool AllReachNvme(Conn& c, const std::vector<kvtier_key>& keys, kvtier_lookup_result* lr) {
  std::vector<uint8_t> where(keys.size());
  for (int t = 0; t < 200; ++t) {
    if (kvtier_lookup(c.c, c.contract, keys.data(), keys.size(), lr, where.data()) != KVTIER_OK) return false;
    if (lr->hit_blocks < keys.size()) return false;  // dropped: never back
    if (std::all_of(where.begin(), where.end(), [](uint8_t w) { return w == KVTIER_TIER_NVME; })) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return false;
}

// One client (root) stores far more blocks than host holds, so that its demotions would
// spend the whole budget, and is held to its 32 writes. A client of another user (nobody,
// in a child process), whose blocks the first client's push out of host after that,
// still reaches NVMe. The refusals are counted and logged once.
TEST(Hostile, OneClientCannotSpendTheWholeNvmeWriteBudget) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to attach as another user";
  DaemonConfig cfg = NvmeBudgetConfig();
  cfg.extra += "[security]\nattach_uids = [65534]\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.socket().c_str(), 0666);
  ::chmod(d.dir().c_str(), 0755);
  Conn a;
  ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_TRUE(StoreRun(a, 61, 0, 400)) << kvtier_last_error();
  testing::Child nobody([&d] {
    CHILD_CHECK(::setgid(65534) == 0 && ::setuid(65534) == 0);
    Conn b;
    CHILD_CHECK(b.Open(d.socket()) == KVTIER_OK);
    CHILD_CHECK(StoreRun(b, 62, 0, 16));
    return 0;
  });
  ASSERT_EQ(nobody.Wait(), 0) << "the other user's client could not store";
  ASSERT_TRUE(StoreRun(a, 61, 400, 200)) << kvtier_last_error();  // pushes b's blocks out of host
  std::vector<kvtier_key> bk;
  for (uint64_t i = 0; i < 16; ++i) bk.push_back(reliability::MakeKey(62, i));
  kvtier_lookup_result lr{};
  const bool down = AllReachNvme(a, bk, &lr);
  const std::string m = d.Metrics();
  EXPECT_TRUE(down) << "the other user's blocks did not all reach NVMe (" << lr.hit_blocks << " of " << bk.size()
                    << " still cached)\n"
                    << m;
  EXPECT_GT(MetricValue(m, "kvtier_nvme_client_budget_rejects_total"), 0) << m;
  // The first user's writes stay within its part (32), the second's are 16.
  EXPECT_LE(MetricValue(m, "kvtier_tier_blocks{tier=\"nvme\"}"), 32 + 16) << m;
  EXPECT_LE(MetricValue(m, "kvtier_tier_bytes_written_total{tier=\"nvme\"}"), (32 + 16) * 8192) << m;
  const size_t lines = CountLines(d.log(), "spent its part of the daily NVMe write budget");
  EXPECT_GE(lines, 1u) << d.log();
  EXPECT_LE(lines, 2u) << d.log();
}

// The part is the user's, not the attach's: a client that spent it, detaches and
// attaches again (or a second client of the same user) writes nothing more to NVMe.
TEST(Hostile, AttachingAgainDoesNotRenewTheNvmeWriteBudget) {
  DaemonProcess d(NvmeBudgetConfig());
  ASSERT_TRUE(d.Start()) << d.log();
  {
    Conn a;
    ASSERT_EQ(a.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    ASSERT_TRUE(StoreRun(a, 63, 0, 400)) << kvtier_last_error();
  }
  Conn again, second;
  ASSERT_EQ(again.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_TRUE(StoreRun(again, 64, 0, 400)) << kvtier_last_error();
  ASSERT_EQ(second.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  ASSERT_TRUE(StoreRun(second, 65, 0, 400)) << kvtier_last_error();
  // Let the mover finish what it demotes of the last stores.
  std::string m;
  for (int t = 0; t < 40; ++t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    m = d.Metrics();
  }
  EXPECT_GT(MetricValue(m, "kvtier_nvme_client_budget_rejects_total"), 0) << m;
  EXPECT_LE(MetricValue(m, "kvtier_tier_blocks{tier=\"nvme\"}"), 32) << "three attaches of one user wrote more "
                                                                            "than its part\n"
                                                                         << m;
  EXPECT_LE(MetricValue(m, "kvtier_tier_bytes_written_total{tier=\"nvme\"}"), 32 * 8192) << m;
}

// daemon.max_contracts_per_client = 8, counted per uid: a ninth contract is refused (a
// repeat of one of its own is not), to another client of the same uid too; the contracts
// of a client that detached, with no block cached, are forgotten, and then the uid
// registers again. (Another uid registering meanwhile: hostile_admission_test.)
TEST(Hostile, ContractsPerClientAreCappedAndUnusedOnesForgotten) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_contracts_per_client = 8\n");
  ASSERT_TRUE(d.Start()) << d.log();
  Conn other;
  ASSERT_EQ(other.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  auto count = [&other]() -> uint64_t {
    std::vector<uint8_t> out(1 << 16);
    size_t bytes = 0;
    uint32_t n = 0;
    uint64_t total = 0;
    if (kvtier_list_contracts(other.c, 0, 1, out.data(), out.size(), &bytes, &n, &total) != KVTIER_OK) return ~0ull;
    return total;
  };
  const uint64_t before = count();
  std::vector<std::string> models;
  for (int i = 0; i < 9; ++i) models.push_back("hostile/model-" + std::to_string(i));
  kvtier_contract_desc ninth = testing::SmallContract(models[8].c_str());
  uint64_t id = 0;
  {
    Conn h;
    ASSERT_EQ(h.Open(d.socket()), KVTIER_OK) << kvtier_last_error();  // registers SmallContract: 1 of 8
    for (int i = 0; i < 7; ++i) {
      kvtier_contract_desc desc = testing::SmallContract(models[i].c_str());
      ASSERT_EQ(kvtier_register_contract(h.c, &desc, &id), KVTIER_OK) << kvtier_last_error();
      ASSERT_EQ(kvtier_register_contract(h.c, &desc, &id), KVTIER_OK) << "a repeat is refused: " << kvtier_last_error();
    }
    EXPECT_EQ(kvtier_register_contract(h.c, &ninth, &id), KVTIER_REJECTED) << "a ninth contract was taken";
    EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_contracts_per_client"), std::string::npos)
        << kvtier_last_error();
    EXPECT_EQ(kvtier_register_contract(other.c, &ninth, &id), KVTIER_REJECTED)
        << "another client of the same uid took a ninth contract";
    EXPECT_EQ(count(), before + 7);
  }
  // h detached: its seven contracts of its own held no block and are forgotten; the one
  // it shares with `other` (SmallContract) stays.
  uint64_t now = count();
  for (int i = 0; i < 100 && now != before; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = count();
  }
  EXPECT_EQ(now, before) << "contracts of a detached client, unused, are still registered";
  EXPECT_EQ(kvtier_register_contract(other.c, &ninth, &id), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(count(), before + 1);
}

// Contracts registered and left unused are forgotten in contracts.kvc too: after a
// restart only the contracts still registered (one with a cached block, one a client
// still holds) come back, and the file holds nothing else.
TEST(Hostile, ForgottenContractsDoNotComeBackAfterARestart) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  auto ids = [&d]() {  // the registered contracts, seen by a client that registers none
    std::vector<uint64_t> out;
    kvtier_connect_options o{};
    o.name = "lister";
    o.timeout_ms = 5000;
    kvtier_client* op = nullptr;
    if (kvtier_connect(d.socket().c_str(), &o, &op) != KVTIER_OK) return out;
    std::vector<uint8_t> buf(1 << 16);
    size_t bytes = 0;
    uint32_t n = 0;
    uint64_t total = 0;
    const kvtier_status s = kvtier_list_contracts(op, 0, 64, buf.data(), buf.size(), &bytes, &n, &total);
    kvtier_close(op);
    if (s != KVTIER_OK) return out;
    size_t pos = 0;
    for (uint32_t i = 0; i < n; ++i) {
      kvtier_contract_info ci;
      std::memcpy(&ci, buf.data() + pos, sizeof ci);
      out.push_back(ci.contract_id);
      pos += sizeof ci + (ci.contract_bytes + 7) / 8 * 8;
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  auto id_of = [](const char* model) {
    kvtier_contract_desc desc = testing::SmallContract(model);
    uint64_t id = 0;
    (void)kvtier_contract_id(&desc, &id);
    return id;
  };
  Conn holder;  // stays attached with its contract (SmallContract): kept
  ASSERT_EQ(holder.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  {
    Conn h;
    ASSERT_EQ(h.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    for (const char* m : {"hostile/unused-1", "hostile/unused-2", "hostile/with-a-block"}) {
      kvtier_contract_desc desc = testing::SmallContract(m);
      uint64_t id = 0;
      ASSERT_EQ(kvtier_register_contract(h.c, &desc, &id), KVTIER_OK) << kvtier_last_error();
    }
    Conn withblock;  // the same process, another client: stores one block under "with-a-block"
    ASSERT_EQ(withblock.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    kvtier_contract_desc desc = testing::SmallContract("hostile/with-a-block");
    ASSERT_EQ(kvtier_register_contract(withblock.c, &desc, &withblock.contract), KVTIER_OK) << kvtier_last_error();
    size_t done = 0;
    ASSERT_EQ(withblock.Store({reliability::MakeKey(81, 1)}, [](const kvtier_key&) {}, &done), KVTIER_OK)
        << kvtier_last_error();
    ASSERT_EQ(kvtier_flush(withblock.c), KVTIER_OK) << kvtier_last_error();  // to NVMe, which outlives the restart
  }
  std::vector<uint64_t> want = {holder.contract, id_of("hostile/with-a-block")};
  std::sort(want.begin(), want.end());
  std::vector<uint64_t> now = ids();
  for (int i = 0; i < 100 && now != want; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    now = ids();
  }
  ASSERT_EQ(now, want) << "the unused contracts of a detached client are still registered";
  holder.Close();
  want = {id_of("hostile/with-a-block")};
  for (int i = 0; i < 100 && (now = ids()) != want; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(now, want) << "the last registrant of an unused contract detached and it is still registered";
  ASSERT_EQ(d.Stop(), 0) << d.log();
  std::vector<ScaleContract> stored;
  auto parsed = daemon::ParseContractFile(
      [&] {
        const std::string t = testing::ReadText(d.dir() + "/nvme/contracts.kvc");
        return std::vector<uint8_t>(t.begin(), t.end());
      }(),
      "contracts.kvc", &stored);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  std::vector<uint64_t> in_file;
  for (const auto& c : stored) in_file.push_back(c.Id());
  std::sort(in_file.begin(), in_file.end());
  // holder's contract: its last registrant detached with no block of it cached.
  EXPECT_EQ(in_file, std::vector<uint64_t>{id_of("hostile/with-a-block")});
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_EQ(ids(), std::vector<uint64_t>{id_of("hostile/with-a-block")}) << d.log();
}

// Clients per process: daemon.max_clients_per_pid = 4. A fifth attach from this process
// is refused; another process attaches.
TEST(Hostile, ClientsPerProcessAreCapped) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_clients_per_pid = 4\n");
  ASSERT_TRUE(d.Start()) << d.log();
  std::vector<std::unique_ptr<Conn>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<Conn>());
    ASSERT_EQ(held.back()->Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  }
  Conn fifth;
  EXPECT_EQ(fifth.Open(d.socket()), KVTIER_REJECTED) << "a fifth client of one process attached";
  EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_clients_per_pid"), std::string::npos)
      << kvtier_last_error();
  testing::Child child([&d] {
    Conn c;
    CHILD_CHECK(c.Open(d.socket()) == KVTIER_OK);
    return 0;
  });
  EXPECT_EQ(child.Wait(), 0) << "another process could not attach";
}

// Clients per user: daemon.max_clients_per_uid = 3. A fourth attach by this uid is
// refused; a client of another uid attaches (needs root to run it as nobody).
TEST(Hostile, ClientsPerUidAreCapped) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to attach as another user";
  testing::DaemonConfig cfg;
  cfg.extra = "[security]\nattach_uids = [65534]\n";  // nobody may attach (docs/security.md)
  DaemonProcess d(cfg);
  SetDaemonKeys(d, "max_clients_per_uid = 3\n");
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.socket().c_str(), 0666);
  ::chmod(d.dir().c_str(), 0755);
  std::vector<std::unique_ptr<Conn>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_unique<Conn>());
    ASSERT_EQ(held.back()->Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  }
  testing::Child same([&d] {
    Conn c;
    CHILD_CHECK(c.Open(d.socket()) == KVTIER_REJECTED);
    CHILD_CHECK(std::string(kvtier_last_error()).find("daemon.max_clients_per_uid") != std::string::npos);
    return 0;
  });
  EXPECT_EQ(same.Wait(), 0) << "a fourth client of one uid attached";
  testing::Child nobody([&d] {
    CHILD_CHECK(::setgid(65534) == 0 && ::setuid(65534) == 0);
    Conn c;
    CHILD_CHECK(c.Open(d.socket()) == KVTIER_OK);
    return 0;
  });
  EXPECT_EQ(nobody.Wait(), 0) << "a client of another uid could not attach";
}

// Attaching and detaching, broken control frames and config reloads, each in a loop of
// hundreds: every kind of line a client can cause goes to the log once per interval
// (with the count held back), not once per event.
TEST(Hostile, ClientCausedLogLinesAreRateLimited) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) {
    testing::RawClient r;
    wire::AttachReply rep;
    ASSERT_TRUE(r.Attach(d.socket(), &rep));
    ASSERT_EQ(rep.status, 0) << rep.message;
    if (i < 100) {
      wire::CompletionEntry cmp;
      ASSERT_TRUE(PushReload(r, 1));
      ASSERT_TRUE(r.WaitCompletion(&cmp, 5000)) << "reload " << i;
    }
  }
  for (int i = 0; i < 200; ++i) {
    const int fd = RawConnect(d.socket());
    ASSERT_GE(fd, 0);
    const char junk[sizeof(wire::ControlHeader)] = "not a header";
    ASSERT_EQ(::send(fd, junk, sizeof junk, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof junk));
    EXPECT_TRUE(ClosedWithin(fd, 2000));
    ::close(fd);
  }
  // One attach after the interval: its line carries the count of those held back.
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  {
    testing::RawClient r;
    wire::AttachReply rep;
    ASSERT_TRUE(r.Attach(d.socket(), &rep));
    ASSERT_EQ(rep.status, 0) << rep.message;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the last detaches
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const size_t bound = static_cast<size_t>(secs) + 3;  // one per second, at most, plus the first
  const std::string log = d.log();
  EXPECT_LE(CountLines(log, ") attached to kvtierd"), bound) << "300 attaches in " << secs << " s";
  EXPECT_LE(CountLines(log, ") detached"), bound);
  EXPECT_LE(CountLines(log, "reloaded eviction/admission settings"), bound) << "100 reloads";
  EXPECT_LE(CountLines(log, "control connection"), bound / 2 + 3) << "200 broken frames";
  EXPECT_NE(log.find("more attach lines held back"), std::string::npos) << log.substr(0, 2000);
}

// ---- listings ------------------------------------------------------------------------------

// Latency in microseconds of 1-key lookups on c for `ms` milliseconds: p99 (and, in
// *max_us, the slowest one).
double LookupP99Us(Conn& c, int ms, double* max_us = nullptr) {
  std::vector<double> us;
  const kvtier_key k = reliability::MakeKey(77, 1);
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    kvtier_lookup_result lr{};
    const auto t0 = std::chrono::steady_clock::now();
    if (kvtier_lookup(c.c, c.contract, &k, 1, &lr, nullptr) != KVTIER_OK) return -1;
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  if (us.empty()) return -1;
  std::sort(us.begin(), us.end());
  if (max_us) *max_us = us.back();
  return us[std::min(us.size() - 1, us.size() * 99 / 100)];
}

// 30,000 registered contracts, listed page after page in a loop by one client (pausing
// 2 ms between pages of up to 256 KiB): each page costs its own length, not the whole
// registry's (pages come from an id snapshot, the index lock is held for 64 entries at a
// time), so the lister gets through many listings, and another client's 1-key lookups
// keep their latency. Prints the p99s and the slowest lookup; the latency bound is loose
// (2 ms, or 4x idle) because the test machine's cores may be shared.
TEST(Hostile, ListingThirtyThousandContractsLeavesLookupsAlone) {
  DaemonConfig cfg;
  cfg.nvme_capacity = "0";  // no contract store: 30,000 registrations without 30,000 fsyncs
  DaemonProcess d(cfg);
  SetDaemonKeys(d, "max_contracts_per_client = 40000\n");
  ASSERT_TRUE(d.Start()) << d.log();
  Conn reg;
  ASSERT_EQ(reg.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::vector<std::string> names(30000);
  for (size_t i = 0; i < names.size(); ++i) {
    names[i] = "hostile/listed-" + std::to_string(i);
    kvtier_contract_desc desc = testing::SmallContract(names[i].c_str());
    uint64_t id = 0;
    ASSERT_EQ(kvtier_register_contract(reg.c, &desc, &id), KVTIER_OK) << i << ": " << kvtier_last_error();
  }
  Conn by;
  ASSERT_EQ(by.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const double idle = LookupP99Us(by, 1500);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> listed{0};
  std::string list_error;
  std::thread lister([&] {
    std::vector<uint8_t> out(256 << 10);
    while (!stop.load()) {
      uint64_t off = 0, total = 1;
      while (off < total && !stop.load()) {
        size_t bytes = 0;
        uint32_t n = 0;
        if (kvtier_list_contracts(reg.c, off, 65536, out.data(), out.size(), &bytes, &n, &total) != KVTIER_OK) {
          list_error = kvtier_last_error();
          return;
        }
        if (n == 0) break;
        off += n;
        listed += n;
        // Paced, so that the lister's CPU does not crowd the lookups out of this
        // machine's cores: what is measured is the index lock.
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
    }
  });
  double busy_max = 0;
  const double busy = LookupP99Us(by, 3000, &busy_max);
  stop = true;
  lister.join();
  std::printf("[ listing  ] lookup p99 idle %.1f us, while listing %.1f us (%.2fx), slowest %.0f us; %llu contracts "
              "listed\n", idle, busy, busy / idle, busy_max, static_cast<unsigned long long>(listed.load()));
  EXPECT_GT(listed.load(), 100000u) << "fewer than 4 listings of 30,000 contracts in 3 s: " << list_error;
  EXPECT_GT(idle, 0);
  EXPECT_LT(busy, std::max(2000.0, 4 * idle)) << "idle p99 " << idle << " us";
}

// 240,000 cached blocks (1 GiB of host slots), listed page after page (2,048 blocks a page,
// pausing 1 ms between pages) in a loop by one client, which also inspects 8 keys in any
// contract per page: pages come from a snapshot of the index's ids (copied a few hundred
// at a time) and read only their own entries, 64 per hold of the index lock, so the lister
// gets through many listings (a page that walked the whole index under the lock managed
// under 1.5 in 3 s here), and another client's 1-key lookups keep their latency. Prints
// the p99s and the slowest lookup; the latency bound is loose (0.5 ms, or 4x idle) because
// the test machine's cores may be shared (the walk under the lock took the p99 from 13 us
// to 0.8 ms in one run of two on a loaded 2-core machine).
TEST(Hostile, ListingAQuarterMillionBlocksLeavesLookupsAlone) {
  DaemonConfig cfg;
  cfg.host_capacity = "1GiB";  // 262,144 slots of 4 KiB
  cfg.nvme_capacity = "0";
  DaemonProcess d(cfg);
  SetDaemonKeys(d, "max_tier_share_per_client = 1.0\n");
  ASSERT_TRUE(d.Start()) << d.log();
  Conn reg;
  ASSERT_EQ(reg.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  constexpr uint64_t kBlocks = 240000;
  for (uint64_t i = 0; i < kBlocks; i += 250) {
    std::vector<kvtier_key> keys;
    for (uint64_t j = 0; j < 250; ++j) keys.push_back(reliability::MakeKey(71, i + j));
    size_t done = 0;
    ASSERT_EQ(reg.Store(keys, [](const kvtier_key&) {}, &done), KVTIER_OK) << i << ": " << kvtier_last_error();
    ASSERT_EQ(done, keys.size());
  }
  uint32_t n0 = 0;
  uint64_t total0 = 0;
  kvtier_block_info one{};
  ASSERT_EQ(kvtier_list_blocks(reg.c, 0, KVTIER_TIER_NONE, 0, 1, &one, &n0, &total0), KVTIER_OK) << kvtier_last_error();
  ASSERT_EQ(total0, kBlocks) << "blocks were evicted before the listing";
  Conn by;
  ASSERT_EQ(by.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const double idle = LookupP99Us(by, 1500);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> listed{0}, inspected{0};
  std::string list_error;
  std::thread lister([&] {
    std::vector<kvtier_block_info> out(2048);
    uint64_t k = 0;
    while (!stop.load()) {
      uint64_t off = 0, total = 1;
      while (off < total && !stop.load()) {
        uint32_t n = 0;
        if (kvtier_list_blocks(reg.c, 0, KVTIER_TIER_NONE, off, static_cast<uint32_t>(out.size()), out.data(), &n,
                               &total) != KVTIER_OK) {
          list_error = kvtier_last_error();
          return;
        }
        if (n == 0) break;
        off += n;
        listed += n;
        for (int i = 0; i < 8; ++i) {
          kvtier_block_info info{};
          if (kvtier_inspect(reg.c, 0, reliability::MakeKey(71, k++ % kBlocks), &info) != KVTIER_OK) {
            list_error = kvtier_last_error();
            return;
          }
          ++inspected;
        }
        // Paced, so that the lister's CPU does not crowd the lookups out of this
        // machine's cores: what is measured is the index lock.
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  });
  double busy_max = 0;
  const double busy = LookupP99Us(by, 3000, &busy_max);
  stop = true;
  lister.join();
  std::printf("[ listing  ] lookup p99 idle %.1f us, while listing %.1f us (%.2fx), slowest %.0f us; %llu blocks "
              "listed, %llu inspected\n",
              idle, busy, busy / idle, busy_max, static_cast<unsigned long long>(listed.load()),
              static_cast<unsigned long long>(inspected.load()));
  EXPECT_TRUE(list_error.empty()) << list_error;
  EXPECT_GT(listed.load(), 2 * kBlocks) << "fewer than 2 listings of 240,000 blocks in 3 s";
  EXPECT_GT(idle, 0);
  EXPECT_LT(busy, std::max(500.0, 4 * idle)) << "idle p99 " << idle << " us";
}

// ---- spin ------------------------------------------------------------------------------------

// One thread trickles nops over 32 sessions (each ring thread woken, then idle again):
// with one spin place for the whole daemon (daemon.max_spinning_rings = 1) the daemon's
// CPU stays near one core, and another client's lookups keep their latency. Prints the
// numbers; the bounds are loose (this machine's cores are shared; the finding was 156%
// CPU and a 65x p99).
TEST(Hostile, NopsTrickledOverManySessionsBuyOneSpinningCore) {
  DaemonProcess d;
  SetDaemonKeys(d, "max_clients_per_pid = 64\n");
  ASSERT_TRUE(d.Start()) << d.log();
  Conn by;
  ASSERT_EQ(by.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  const double idle = LookupP99Us(by, 1500);
  std::vector<std::unique_ptr<testing::RawClient>> rings;
  for (int i = 0; i < 32; ++i) {
    rings.push_back(std::make_unique<testing::RawClient>());
    wire::AttachReply rep;
    ASSERT_TRUE(rings.back()->Attach(d.socket(), &rep));
    ASSERT_EQ(rep.status, 0) << rep.message;
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    uint64_t tag = 1;
    while (!stop.load()) {
      for (auto& r : rings) {
        wire::RequestEntry e;
        e.op = static_cast<uint16_t>(wire::Op::kNop);
        e.tag = tag++;
        (void)r->Push(e);
      }
      for (auto& r : rings) {
        wire::CompletionEntry cmp;
        (void)r->WaitCompletion(&cmp, 1000);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long cpu0 = CpuTicks(d.pid());
  const auto t0 = std::chrono::steady_clock::now();
  const double busy = LookupP99Us(by, 3000);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const double cpu = (CpuTicks(d.pid()) - cpu0) / static_cast<double>(::sysconf(_SC_CLK_TCK)) / secs;
  stop = true;
  trickle.join();
  std::printf("[ spin     ] lookup p99 idle %.1f us, while nops trickle over 32 sessions %.1f us (%.2fx); "
              "daemon CPU %.0f%%\n", idle, busy, busy / idle, cpu * 100);
  EXPECT_LT(cpu, 1.15) << "the daemon used " << cpu * 100 << "% CPU for trickled nops";
  EXPECT_LT(busy, std::max(2000.0, 4 * idle)) << "idle p99 " << idle << " us";
}

// ---- a full NVMe tier ------------------------------------------------------------------------

// Far more blocks than host (64 slots) and NVMe (1 MiB) hold together, stored as prefix
// chains of 16: once NVMe is full, each demotion first evicts NVMe records by the tier's
// policy. No demotion is refused ("nvme store full") or lost on the way down, and the
// newest chains are served.
TEST(Hostile, AFullNvmeTierEvictsByItsPolicy) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  std::vector<kvtier_key> last;
  for (uint64_t chain = 0; chain < 50; ++chain) {
    std::vector<kvtier_key> keys;
    for (uint64_t i = 0; i < 16; ++i) keys.push_back(reliability::MakeKey(500 + chain, i + 1));
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(keys.size());
    kvtier_status s = KVTIER_RETRY;
    for (int tries = 0; tries < 250 && s == KVTIER_RETRY; ++tries) {
      s = kvtier_alloc(c.c, c.contract, keys.size(), KVTIER_TIER_HOST, &lease, slots.data());
      if (s == KVTIER_RETRY) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_EQ(s, KVTIER_OK) << "chain " << chain << ": " << kvtier_last_error();
    std::vector<kvtier_commit_item> items(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      testing::FillBlock(static_cast<uint8_t*>(kvtier_host_slot_write(c.c, slots[i].slot)), c.block_bytes, c.contract, keys[i]);
      items[i].slot = slots[i];
      items[i].key = keys[i];
      items[i].parent = i == 0 ? kvtier_key{0, 0} : keys[i - 1];
    }
    size_t n = 0;
    ASSERT_EQ(kvtier_commit(c.c, c.contract, lease, items.data(), items.size(), &n), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(kvtier_release(c.c, lease), KVTIER_OK);
    last = keys;
  }
  ASSERT_EQ(kvtier_flush(c.c), KVTIER_OK) << kvtier_last_error();
  const std::string m = d.Metrics();
  EXPECT_EQ(MetricValue(m, "kvtier_tier_evictions_total{tier=\"host\",reason=\"dropped\"}"), 0)
      << "blocks lost on the way down to a full NVMe tier";
  EXPECT_GT(MetricValue(m, "kvtier_tier_evictions_total{tier=\"nvme\",reason=\"dropped\"}"), 0)
      << "800 blocks and NVMe evicted nothing";
  EXPECT_EQ(d.log().find("nvme store full"), std::string::npos) << d.log().substr(0, 4000);
  kvtier_lookup_result lr{};
  ASSERT_EQ(kvtier_lookup(c.c, c.contract, last.data(), last.size(), &lr, nullptr), KVTIER_OK);
  EXPECT_EQ(lr.hit_blocks, last.size()) << "the newest chain is not served";
}

// ---- the log ------------------------------------------------------------------------------

// Registering the same contract thousands of times costs the log one line per interval.
TEST(Hostile, RepeatedRegistrationsAreLoggedRateLimited) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  Conn c;
  ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
  kvtier_contract_desc desc = testing::SmallContract();
  for (int i = 0; i < 2000; ++i) {
    uint64_t id = 0;
    ASSERT_EQ(kvtier_register_contract(c.c, &desc, &id), KVTIER_OK) << kvtier_last_error();
    ASSERT_EQ(id, c.contract);
  }
  const size_t lines = CountLines(d.log(), ") registered");
  EXPECT_GE(lines, 1u);
  EXPECT_LE(lines, 3u) << lines << " registration lines for 2001 registrations";
}

}  // namespace
}  // namespace kvtier::hostile
