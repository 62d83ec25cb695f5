// Who gets a place, and what the metrics port gives away: connections judged by their
// credentials at accept (refused users hold no place, one user holds a bounded part of the
// unattached places, one tenant a bounded part of the attached ones), the metrics listener
// bounded (connections, request bytes, fd exhaustion), per-tenant series off by default,
// and contracts counted per uid across attaches, swept once their blocks are gone, and
// kept around a corrupt record of contracts.kvc. Real kvtierd processes; clients of other
// uids are forked children (root only: those tests skip otherwise).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "daemon/contract_store.h"
#include "formats/contract.h"
#include "tests/reliability/reliability_util.h"

namespace kvtier::hostile {
namespace {

using reliability::Conn;
using testing::Child;
using testing::DaemonConfig;
using testing::DaemonProcess;
using testing::MetricValue;

#define SKIP_UNLESS_ROOT()                                                               \
  do {                                                                                   \
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to run clients under other uids"; \
  } while (0)

// The socket open to every uid (the kernel lets anyone connect; the daemon decides).
const char* kOpenSocket = "[security]\nsocket_mode = \"0666\"\n";

bool BecomeUser(uint32_t uid) { return ::setgroups(0, nullptr) == 0 && ::setgid(uid) == 0 && ::setuid(uid) == 0; }

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

int TcpConnect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// True when the peer closes fd within timeout_ms (what it sent first is skipped).
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

// A line a child writes to its pipe ("" when none came within timeout_ms).
std::string ReadReport(int fd, int timeout_ms) {
  std::string s;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    char ch;
    if (::read(fd, &ch, 1) != 1) break;
    if (ch == '\n') return s;
    s += ch;
  }
  return s;
}

void Report(int fd, const std::string& line) {
  const std::string l = line + "\n";
  (void)!::write(fd, l.data(), l.size());
}

// Holds what a child opened until the test ends (~Child kills it).
[[noreturn]] void HoldForever() {
  while (true) ::pause();
}

kvtier_client* Connect(const std::string& sock, kvtier_status* st = nullptr) {
  kvtier_connect_options o{};
  o.name = "admission";
  o.timeout_ms = 10000;
  kvtier_client* c = nullptr;
  const kvtier_status s = kvtier_connect(sock.c_str(), &o, &c);
  if (st) *st = s;
  return s == KVTIER_OK ? c : nullptr;
}

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

// ---- connections judged by credentials at accept ---------------------------------------

// A uid the config refuses opens connections as fast as it likes: each is refused and
// closed at accept (it holds none of daemon.max_unattached's places), its own attach is
// answered "permission denied", and honest clients attach meanwhile.
TEST(Admission, ARefusedUidHoldsNoUnattachedPlace) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg;
  cfg.extra = kOpenSocket;
  cfg.daemon_extra = "max_unattached = 8\nattach_timeout_ms = 60000\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.dir().c_str(), 0755);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  Child flood([&] {
    ::close(p[0]);
    if (!BecomeUser(65534)) return 1;
    kvtier_status st = KVTIER_OK;
    kvtier_client* c = Connect(d.socket(), &st);
    const bool denied = c == nullptr && st == KVTIER_REJECTED &&
                        std::string(kvtier_last_error()).find("permission denied") != std::string::npos;
    std::vector<int> fds;
    for (int i = 0; i < 64; ++i) fds.push_back(RawConnect(d.socket()));
    int closed = 0;
    for (int fd : fds) closed += fd < 0 || ClosedWithin(fd, 1000) ? 1 : 0;
    Report(p[1], std::string(denied ? "denied " : "attached ") + std::to_string(closed));
    // Keeps reconnecting whatever was closed, as the attack does.
    for (int round = 0; round < 1000; ++round) {
      for (int& fd : fds) {
        if (fd < 0 || ClosedWithin(fd, 0)) {
          if (fd >= 0) ::close(fd);
          fd = RawConnect(d.socket());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    HoldForever();
  });
  ::close(p[1]);
  const std::string r = ReadReport(p[0], 30000);
  EXPECT_EQ(r, "denied 64") << "the refused uid's connections were not all closed at accept\n" << d.log();
  int ok = 0;
  for (int i = 0; i < 20; ++i) {
    Conn c;
    ok += c.Open(d.socket(), 2000) == KVTIER_OK ? 1 : 0;
  }
  EXPECT_EQ(ok, 20) << "honest attaches failed while a refused uid reconnected\n" << d.log();
  ::close(p[0]);
}

// One admitted uid holds at most daemon.max_unattached_per_uid of the unattached places:
// the others are refused at accept, and another uid attaches meanwhile.
TEST(Admission, OneUidHoldsAtMostItsShareOfTheUnattachedPlaces) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg;
  cfg.extra = std::string(kOpenSocket) + "attach_uids = [65534]\n";
  cfg.daemon_extra = "max_unattached = 8\nmax_unattached_per_uid = 2\nattach_timeout_ms = 60000\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.dir().c_str(), 0755);
  int p[2];
  ASSERT_EQ(::pipe(p), 0);
  Child idle([&] {
    ::close(p[0]);
    if (!BecomeUser(65534)) return 1;
    std::vector<int> fds;
    for (int i = 0; i < 20; ++i) fds.push_back(RawConnect(d.socket()));
    int open = 0;
    for (int fd : fds) open += fd >= 0 && !ClosedWithin(fd, 500) ? 1 : 0;
    Report(p[1], std::to_string(open));
    HoldForever();
  });
  ::close(p[1]);
  EXPECT_EQ(ReadReport(p[0], 30000), "2") << d.log();
  int ok = 0;
  for (int i = 0; i < 10; ++i) {
    Conn c;
    ok += c.Open(d.socket(), 2000) == KVTIER_OK ? 1 : 0;
  }
  EXPECT_EQ(ok, 10) << d.log();
  EXPECT_NE(d.log().find("daemon.max_unattached_per_uid (2)"), std::string::npos) << d.log();
  ::close(p[0]);
}

// A tenant of two uids attaches at most daemon.max_clients_per_tenant clients, however
// its uids share them; another tenant's client attaches.
TEST(Admission, OneTenantCannotTakeEveryClientPlace) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg;
  cfg.extra = std::string(kOpenSocket) +
              "[[tenants]]\nname = \"a\"\nuids = [64001, 64002]\n[[tenants]]\nname = \"b\"\nuids = [64003]\n";
  cfg.daemon_extra = "max_clients = 6\nmax_clients_per_uid = 3\nmax_clients_per_tenant = 4\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.dir().c_str(), 0755);
  // Each child attaches up to 3 clients as its uid, reports how many attached and the
  // last refusal, and holds them.
  auto tenant_client = [&d](uint32_t uid, int fd) {
    if (!BecomeUser(uid)) return 1;
    int attached = 0;
    std::string refusal;
    std::vector<kvtier_client*> held;
    for (int i = 0; i < 3; ++i) {
      kvtier_status st = KVTIER_OK;
      kvtier_client* c = Connect(d.socket(), &st);
      if (c) {
        held.push_back(c);
        ++attached;
      } else {
        refusal = kvtier_last_error();
      }
    }
    Report(fd, std::to_string(attached) + " " + refusal);
    HoldForever();
  };
  int pa1[2], pa2[2], pb[2];
  ASSERT_EQ(::pipe(pa1), 0);
  ASSERT_EQ(::pipe(pa2), 0);
  ASSERT_EQ(::pipe(pb), 0);
  Child a1([&] { return tenant_client(64001, pa1[1]); });
  const std::string r1 = ReadReport(pa1[0], 30000);
  EXPECT_EQ(r1.substr(0, 2), "3 ") << r1;
  Child a2([&] { return tenant_client(64002, pa2[1]); });
  const std::string r2 = ReadReport(pa2[0], 30000);
  EXPECT_EQ(r2.substr(0, 2), "1 ") << r2;
  EXPECT_NE(r2.find("daemon.max_clients_per_tenant (4) clients of tenant a"), std::string::npos) << r2;
  Child b([&] { return tenant_client(64003, pb[1]); });
  const std::string rb = ReadReport(pb[0], 30000);
  EXPECT_EQ(rb.substr(0, 2), "2 ") << "tenant b got " << rb << " of the places left\n" << d.log();
  for (int* pp : {pa1, pa2, pb}) ::close(pp[0]), ::close(pp[1]);
}

// ---- the metrics port ---------------------------------------------------------------------

// Any local uid reads the port: no per-tenant series unless the operator turns them on.
TEST(MetricsPort, PerTenantSeriesAreOffByDefault) {
  for (const bool on : {false, true}) {
    DaemonConfig cfg;
    cfg.extra = "[[tenants]]\nname = \"alpha\"\nuids = [64001]\n";
    if (on) cfg.daemon_extra = "metrics_tenants = true\n";
    DaemonProcess d(cfg);
    ASSERT_TRUE(d.Start()) << d.log();
    Conn c;  // the daemon's uid: the implicit tenant's client, with a lookup hit
    ASSERT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    size_t done = 0;
    ASSERT_EQ(c.Store({reliability::MakeKey(7, 1)}, [](const kvtier_key&) {}, &done), KVTIER_OK);
    const std::string m = d.Metrics();
    ASSERT_NE(m.find("kvtier_build_info"), std::string::npos) << m;
    if (on) {
      EXPECT_NE(m.find("kvtier_tenant_blocks{tenant=\"alpha\""), std::string::npos) << m;
      EXPECT_NE(m.find("kvtier_tenant_lookup_hits_total{tenant=\"default\"}"), std::string::npos) << m;
    } else {
      EXPECT_EQ(m.find("kvtier_tenant_"), std::string::npos) << "per-tenant series on the open port:\n" << m;
    }
  }
}

// A request body past the limit is answered 413 without being read; idle connections past
// daemon.metrics_max_connections are closed at accept; a scrape works after.
TEST(MetricsPort, RequestBytesAndConnectionsAreBounded) {
  DaemonConfig cfg;
  cfg.daemon_extra = "metrics_max_connections = 8\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  {
    const int fd = TcpConnect(d.metrics_port());
    ASSERT_GE(fd, 0);
    const std::string head = "GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n";
    ASSERT_EQ(::send(fd, head.data(), head.size(), MSG_NOSIGNAL), static_cast<ssize_t>(head.size()));
    const std::string body(64 << 10, 'x');
    (void)::send(fd, body.data(), body.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    std::string resp;
    char buf[4096];
    pollfd p{fd, POLLIN, 0};
    while (::poll(&p, 1, 3000) > 0) {
      const ssize_t k = ::recv(fd, buf, sizeof buf, 0);
      if (k <= 0) break;
      resp.append(buf, static_cast<size_t>(k));
    }
    ::close(fd);
    EXPECT_EQ(resp.substr(0, 12), "HTTP/1.1 413") << "a 1 MiB request body was read: " << resp.substr(0, 200);
  }
  std::vector<int> fds;
  for (int i = 0; i < 40; ++i) fds.push_back(TcpConnect(d.metrics_port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int closed = 0;
  for (int fd : fds) closed += fd < 0 || ClosedWithin(fd, 100) ? 1 : 0;
  EXPECT_GE(closed, 32) << "idle metrics connections over daemon.metrics_max_connections (8) stayed open";
  for (int fd : fds) {
    if (fd >= 0) ::close(fd);
  }
  std::string m;
  for (int i = 0; i < 100 && (m = d.Metrics()).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(m.find("kvtier_build_info"), std::string::npos) << "no scrape after the idle ones went";
}

// Out of fds, the metrics listener backs off as the control socket does: no spinning core.
TEST(MetricsPort, FdExhaustionBacksOffInsteadOfSpinning) {
  DaemonProcess d;
  ASSERT_TRUE(d.Start()) << d.log();
  size_t open_fds = 0;
  for (auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(d.pid()) + "/fd")) {
    (void)e;
    ++open_fds;
  }
  rlimit tight{open_fds + 4, open_fds + 4};
  ASSERT_EQ(::prlimit(d.pid(), RLIMIT_NOFILE, &tight, nullptr), 0) << std::strerror(errno);
  std::vector<int> idle;
  for (int i = 0; i < 64; ++i) {
    const int fd = TcpConnect(d.metrics_port());
    if (fd >= 0) idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const long t0 = CpuTicks(d.pid());
  std::this_thread::sleep_for(std::chrono::seconds(2));
  const long ticks = CpuTicks(d.pid()) - t0;
  const long hz = ::sysconf(_SC_CLK_TCK);
  // Backing off, it wakes 20 times in 2 s; spinning, it takes what CPU the machine leaves
  // it (a whole core when idle; 0.46 s of the 2 s on a 2-core machine at load 15).
  EXPECT_LT(ticks, hz / 10) << "the daemon used " << ticks << " ticks of CPU in 2 s with the metrics port out of fds";
  for (int fd : idle) ::close(fd);
  rlimit wide{65536, 65536};
  (void)::prlimit(d.pid(), RLIMIT_NOFILE, &wide, nullptr);
  std::string m;
  for (int i = 0; i < 200 && (m = d.Metrics()).empty(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_NE(m.find("kvtier_build_info"), std::string::npos);
  Conn c;
  EXPECT_EQ(c.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
}

// ---- contracts ------------------------------------------------------------------------------

uint64_t ContractCount(const std::string& socket) {
  kvtier_client* c = Connect(socket);
  if (c == nullptr) return ~0ull;
  std::vector<uint8_t> out(1 << 16);
  size_t bytes = 0;
  uint32_t n = 0;
  uint64_t total = ~0ull;
  (void)kvtier_list_contracts(c, 0, 1, out.data(), out.size(), &bytes, &n, &total);
  kvtier_close(c);
  return total;
}

// daemon.max_contracts_per_client counts what a uid keeps registered across its
// attaches: contracts with a block cached stay counted after the detach, so attaching
// again does not renew the limit; once their blocks are gone the sweep forgets them
// (registered nowhere, removed from contracts.kvc) and the uid registers again.
TEST(Contracts, TheLimitCountsWhatAUidKeepsAcrossAttachesAndTheSweepForgets) {
  DaemonConfig cfg;
  cfg.daemon_extra = "max_contracts_per_client = 8\ncontract_sweep_ms = 200\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  const uint64_t before = ContractCount(d.socket());
  std::vector<std::string> models;
  for (int i = 0; i < 9; ++i) models.push_back("hostile/kept-" + std::to_string(i));
  std::vector<uint64_t> ids;
  {
    Conn h;
    ASSERT_EQ(h.Open(d.socket()), KVTIER_OK) << kvtier_last_error();  // SmallContract: 1 of 8
    for (int i = 0; i < 7; ++i) {
      kvtier_contract_desc desc = testing::SmallContract(models[i].c_str());
      ASSERT_EQ(kvtier_register_contract(h.c, &desc, &h.contract), KVTIER_OK) << kvtier_last_error();
      ids.push_back(h.contract);
      size_t done = 0;
      ASSERT_EQ(h.Store({reliability::MakeKey(40 + i, 1)}, [](const kvtier_key&) {}, &done), KVTIER_OK)
          << kvtier_last_error();
    }
  }
  // Detached: its seven contracts hold a block each and stay registered (SmallContract,
  // with none, is forgotten at the detach).
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // sweeps run meanwhile
  EXPECT_EQ(ContractCount(d.socket()), before + 7);
  {
    Conn again;
    ASSERT_EQ(again.Open(d.socket()), KVTIER_OK) << kvtier_last_error();
    kvtier_contract_desc ninth = testing::SmallContract(models[8].c_str());
    uint64_t id = 0;
    EXPECT_EQ(kvtier_register_contract(again.c, &ninth, &id), KVTIER_REJECTED)
        << "attaching again renewed the uid's contract limit";
    EXPECT_NE(std::string(kvtier_last_error()).find("daemon.max_contracts_per_client"), std::string::npos)
        << kvtier_last_error();
    // The operator evicts their blocks; the sweep forgets them.
    for (uint64_t cid : ids) {
      uint64_t ev = 0, sk = 0;
      ASSERT_EQ(kvtier_evict_contract(again.c, cid, &ev, &sk), KVTIER_OK) << kvtier_last_error();
    }
    uint64_t now = ContractCount(d.socket());
    for (int i = 0; i < 200 && now != before + 1; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      now = ContractCount(d.socket());
    }
    EXPECT_EQ(now, before + 1) << "contracts whose blocks are gone were never forgotten\n" << d.log();
    EXPECT_EQ(kvtier_register_contract(again.c, &ninth, &id), KVTIER_OK) << kvtier_last_error();
  }
  ASSERT_EQ(d.Stop(), 0) << d.log();
  std::vector<daemon::StoredContract> stored;
  const std::string t = testing::ReadText(d.dir() + "/nvme/contracts.kvc");
  auto parsed = daemon::ParseContractRecords(std::vector<uint8_t>(t.begin(), t.end()), "contracts.kvc", &stored);
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  for (const auto& sc : stored) {
    for (uint64_t cid : ids) EXPECT_NE(sc.contract.Id(), cid) << "a swept contract stayed in contracts.kvc";
  }
}

// One uid at its contract limit does not hold another's: a client of another uid
// registers its own meanwhile.
TEST(Contracts, AnotherUidRegistersWhileOneIsAtItsLimit) {
  SKIP_UNLESS_ROOT();
  DaemonConfig cfg;
  cfg.extra = std::string(kOpenSocket) + "attach_uids = [65534]\n";
  cfg.daemon_extra = "max_contracts_per_client = 2\n";
  DaemonProcess d(cfg);
  ASSERT_TRUE(d.Start()) << d.log();
  ::chmod(d.dir().c_str(), 0755);
  Conn mine;
  ASSERT_EQ(mine.Open(d.socket()), KVTIER_OK) << kvtier_last_error();  // SmallContract: 1 of 2
  kvtier_contract_desc second = testing::SmallContract("hostile/mine-2");
  kvtier_contract_desc third = testing::SmallContract("hostile/mine-3");
  uint64_t id = 0;
  ASSERT_EQ(kvtier_register_contract(mine.c, &second, &id), KVTIER_OK) << kvtier_last_error();
  EXPECT_EQ(kvtier_register_contract(mine.c, &third, &id), KVTIER_REJECTED);
  Child nobody([&] {
    if (!BecomeUser(65534)) return 1;
    Conn c;
    if (c.Open(d.socket()) != KVTIER_OK) return 2;
    kvtier_contract_desc own = testing::SmallContract("hostile/nobodys");
    uint64_t oid = 0;
    return kvtier_register_contract(c.c, &own, &oid) == KVTIER_OK ? 0 : 3;
  });
  EXPECT_EQ(nobody.Wait(), 0) << "another uid could not register while one uid was at its limit\n" << d.log();
}

// One flipped bit in a record in the middle of contracts.kvc: the daemon skips that record
// (logged and counted as corruption) and registers every record after it again.
TEST(Contracts, ACorruptRecordInTheMiddleCostsThatRecordOnly) {
  DaemonProcess d;
  const std::string dir = d.dir() + "/nvme";
  std::filesystem::create_directories(dir);
  ::chmod(dir.c_str(), 0700);
  const std::string path = dir + "/contracts.kvc";
  std::vector<size_t> ends;
  {
    std::vector<daemon::StoredContract> none;
    auto s = daemon::ContractStore::Open(path, &none);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    for (int i = 0; i < 100; ++i) {
      const std::string model = "hostile/stored-" + std::to_string(i);
      kvtier_contract_desc desc = testing::SmallContract(model.c_str());
      ScaleContract c;
      c.model_id = model;
      c.model_revision = desc.model_revision;
      c.tokenizer_revision = desc.tokenizer_revision;
      c.geometry.num_layers = desc.num_layers;
      c.geometry.num_kv_heads = desc.num_kv_heads;
      c.geometry.head_dim = desc.head_dim;
      c.geometry.block_tokens = desc.block_tokens;
      c.SetUnitScales();
      ASSERT_TRUE(c.Validate().ok()) << c.Validate().ToString();
      ASSERT_TRUE((*s)->Add(c).ok());
      ends.push_back(std::filesystem::file_size(path));
    }
  }
  {
    std::string b = testing::ReadText(path);
    b[ends[49] + 40] ^= 0x04;  // in record 50's payload
    testing::WriteText(path, b);
  }
  ASSERT_TRUE(d.Start()) << d.log();
  EXPECT_EQ(ContractCount(d.socket()), 99u) << d.log();
  EXPECT_NE(d.log().find("corruption: skipped 1 corrupt records"), std::string::npos) << d.log();
  EXPECT_EQ(MetricValue(d.Metrics(), "kvtier_contract_file_corrupt_records_total"), 1) << d.Metrics();
}

}  // namespace
}  // namespace kvtier::hostile
