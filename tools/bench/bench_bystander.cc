// kvtier-bench bystander: what one client's load costs another client. A bystander
// client times lookups of --keys keys back to back (a chain of blocks cached in host;
// default 1) while another client, in a process of its own, loads the daemon; the same
// lookups with the daemon otherwise idle are the baseline, measured in the same run.
// Loads (--loads picks some; default all three):
//   list   a client that registered 30,000 contracts lists them page by page (65,536
//          per request, up to 256 KiB a page) in a loop, pausing --pace-us between pages
//   nops   one thread of a client trickles nops over 32 sessions, one session after the
//          other, pausing 20 us after each pass over the 32
//   acquire  a client acquires 16,384 blocks cached in host in one request and releases
//          them, in a loop, pausing --pace-us between acquires (the daemon sets an acquire
//          up one step of Session::kAcquireLockChunk keys a hold of the index lock)
// Phases alternate, idle before each load (idle, list, idle, nops, ... --rounds times),
// so that whatever else runs on the machine falls on both sides; every phase lasts
// --seconds. Each load's p99 is compared with the p99 of all idle phases together, and,
// per round, with the idle phase just before it. Target: the bystander's lookup p99
// within 2x of idle under each load.
//
// kvtierd runs pinned to CPU 1 and the bystander to CPU 0 (--no-pin: neither), the load
// processes unpinned: every daemon thread, the load's ring threads included, then shares
// CPU 1 with the bystander's ring thread, and what is measured is the daemon (its index
// lock, its spin places, the listing's copies), not where the scheduler put the two ends
// of the bystander's ring.
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "kvtier/kvtier.h"
#include "tools/bench/daemon_proc.h"
#include "tools/bench/report.h"
#include "tools/cli.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kContracts = 30000;
constexpr int kSessions = 32;
constexpr size_t kAcquireKeys = 16384;
constexpr size_t kMaxLookupKeys = 1024;

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

kvtier_contract_desc Contract(const char* model) {
  kvtier_contract_desc c{};
  c.model_id = model;
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.block_tokens = 16;
  c.tp_size = 1;
  return c;
}

kvtier_client* Connect(const std::string& sock, const char* name) {
  kvtier_connect_options o{};
  o.name = name;
  o.timeout_ms = 10000;
  kvtier_client* c = nullptr;
  if (kvtier_connect(sock.c_str(), &o, &c) != KVTIER_OK) return nullptr;
  return c;
}

// Process CPU time of `pid` in clock ticks (utime + stime), or -1.
long CpuTicks(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t p = s.rfind(')');
  if (p == std::string::npos) return -1;
  std::istringstream f(s.substr(p + 2));
  std::string tok;
  long utime = 0, stime = 0;
  for (int field = 3; f >> tok; ++field) {
    if (field == 14) utime = std::atol(tok.c_str());
    if (field == 15) {
      stime = std::atol(tok.c_str());
      break;
    }
  }
  return utime + stime;
}

std::string LoadAverage() {
  double la[3] = {0, 0, 0};
  if (::getloadavg(la, 3) != 3) return "unknown";
  return Fmt("%.2f %.2f %.2f", la[0], la[1], la[2]);
}

// Shared with the load processes (an anonymous MAP_SHARED page).
struct Shared {
  std::atomic<int> ready{0};   // load processes set up (attached, contracts registered)
  std::atomic<int> active{0};  // 1: the list load runs, 2: the nops load runs, 3: the acquire load
  std::atomic<int> quit{0};
  std::atomic<uint64_t> listed{0}, nops{0}, acquired{0};
  std::atomic<int> failed{0};
  char error[256] = {};
};

void SetError(Shared* sh, const std::string& what) {
  std::snprintf(sh->error, sizeof sh->error, "%s", what.c_str());
  sh->failed.store(1);
}

// The lister: registers kContracts contracts, then lists them while active == 1.
int ListerMain(const std::string& sock, Shared* sh, int pace_us) {
  kvtier_client* c = Connect(sock, "bystander-lister");
  if (c == nullptr) {
    SetError(sh, std::string("lister connect: ") + kvtier_last_error());
    return 1;
  }
  for (int i = 0; i < kContracts; ++i) {
    const std::string model = "bench/listed-" + std::to_string(i);
    kvtier_contract_desc d = Contract(model.c_str());
    uint64_t id = 0;
    if (kvtier_register_contract(c, &d, &id) != KVTIER_OK) {
      SetError(sh, "lister register " + std::to_string(i) + ": " + kvtier_last_error());
      return 1;
    }
  }
  sh->ready.fetch_add(1);
  std::vector<uint8_t> out(256 << 10);
  while (!sh->quit.load()) {
    if (sh->active.load() != 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    uint64_t off = 0, total = 1;
    while (off < total && sh->active.load() == 1) {
      size_t bytes = 0;
      uint32_t n = 0;
      if (kvtier_list_contracts(c, off, 65536, out.data(), out.size(), &bytes, &n, &total) != KVTIER_OK) {
        SetError(sh, std::string("list contracts: ") + kvtier_last_error());
        return 1;
      }
      if (n == 0) break;
      off += n;
      sh->listed.fetch_add(n);
      if (pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pace_us));
    }
  }
  kvtier_close(c);
  return 0;
}

// The trickler: kSessions sessions, one nop on each in turn while active == 2.
int TricklerMain(const std::string& sock, Shared* sh) {
  std::vector<kvtier_client*> cs;
  for (int i = 0; i < kSessions; ++i) {
    kvtier_client* c = Connect(sock, "bystander-nops");
    if (c == nullptr) {
      SetError(sh, "trickler connect " + std::to_string(i) + ": " + kvtier_last_error());
      return 1;
    }
    cs.push_back(c);
  }
  sh->ready.fetch_add(1);
  while (!sh->quit.load()) {
    if (sh->active.load() != 2) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    for (kvtier_client* c : cs) {
      if (kvtier_ping(c) != KVTIER_OK) {
        SetError(sh, std::string("nop: ") + kvtier_last_error());
        return 1;
      }
    }
    sh->nops.fetch_add(cs.size());
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
  for (kvtier_client* c : cs) kvtier_close(c);
  return 0;
}

// The acquirer: stores kAcquireKeys blocks in host, then acquires all of them in one
// request and releases them while active == 3.
int AcquirerMain(const std::string& sock, Shared* sh, int pace_us) {
  kvtier_client* c = Connect(sock, "bystander-acquirer");
  if (c == nullptr) {
    SetError(sh, std::string("acquirer connect: ") + kvtier_last_error());
    return 1;
  }
  const kvtier_contract_desc desc = Contract("bench/acquired");
  uint64_t cid = 0;
  if (kvtier_register_contract(c, &desc, &cid) != KVTIER_OK) {
    SetError(sh, std::string("acquirer register: ") + kvtier_last_error());
    return 1;
  }
  std::vector<kvtier_key> keys(kAcquireKeys);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = {0x6163717569726500ull + i, 0x9E3779B97F4A7C15ull * (i + 1)};
  constexpr size_t kBatch = 1024;
  std::vector<kvtier_slot> slots(kAcquireKeys);
  std::vector<kvtier_commit_item> items(kBatch);
  for (size_t at = 0; at < keys.size(); at += kBatch) {
    uint64_t lease = 0;
    if (kvtier_alloc(c, cid, kBatch, KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) {
      SetError(sh, std::string("acquirer alloc: ") + kvtier_last_error());
      return 1;
    }
    for (size_t i = 0; i < kBatch; ++i) {
      if (void* p = kvtier_host_slot_write(c, slots[i].slot)) std::memset(p, static_cast<int>(i & 0xff), 576);
      items[i] = kvtier_commit_item{};
      items[i].slot = slots[i];
      items[i].key = keys[at + i];
    }
    if (kvtier_commit(c, cid, lease, items.data(), kBatch, nullptr) != KVTIER_OK || kvtier_release(c, lease) != KVTIER_OK) {
      SetError(sh, std::string("acquirer commit: ") + kvtier_last_error());
      return 1;
    }
  }
  sh->ready.fetch_add(1);
  while (!sh->quit.load()) {
    if (sh->active.load() != 3) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    uint64_t lease = 0;
    size_t n = 0;
    if (kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) != KVTIER_OK ||
        kvtier_release(c, lease) != KVTIER_OK) {
      SetError(sh, std::string("acquire: ") + kvtier_last_error());
      return 1;
    }
    if (n != keys.size()) {
      SetError(sh, "acquire: " + std::to_string(n) + " of " + std::to_string(keys.size()) + " blocks");
      return 1;
    }
    sh->acquired.fetch_add(n);
    if (pace_us > 0) std::this_thread::sleep_for(std::chrono::microseconds(pace_us));
  }
  kvtier_close(c);
  return 0;
}

struct Phase {
  int load = 0;  // 0 idle, 1 list, 2 nops, 3 acquire
  std::vector<double> us;
  double daemon_cpu = 0;  // cores
  uint64_t work = 0;      // contracts listed / nops answered
};

const char* LoadFlag(int load) { return load == 1 ? "list" : load == 2 ? "nops" : "acquire"; }
const char* LoadName(int load) {
  return load == 0 ? "idle" : load == 1 ? "list 30,000 contracts" : load == 2 ? "nops over 32 sessions" : "acquire 16,384 keys";
}
uint64_t Work(const Shared* sh, int load) {
  return load == 1 ? sh->listed.load() : load == 2 ? sh->nops.load() : load == 3 ? sh->acquired.load() : 0;
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append", "no-pin"});
  if (!args.ok()) return cli::Fail(args.status().message(), 2);
  if (Status s = args->CheckKnown({"seconds", "rounds", "pace-us", "keys", "loads", "no-pin", "bulk-nice", "results",
                                  "no-append"});
      !s.ok()) {
    return cli::Fail(s.message(), 2);
  }
  auto seconds = args->GetDouble("seconds", 2.0);
  auto rounds = args->GetInt("rounds", 3);
  auto pace = args->GetInt("pace-us", 2000);
  auto nkeys = args->GetInt("keys", 1);
  auto bulk_nice = args->GetInt("bulk-nice", 10);  // checked only when given
  if (!seconds.ok() || !rounds.ok() || !pace.ok() || !nkeys.ok() || !bulk_nice.ok() || !(*seconds > 0) ||
      *rounds < 1 || *rounds > 100 || *pace < 0 || *pace > 1000000 || *nkeys < 1 ||
      *nkeys > static_cast<int64_t>(kMaxLookupKeys) || (args->Has("bulk-nice") && (*bulk_nice < 0 || *bulk_nice > 19))) {
    return cli::Fail("--seconds > 0, --rounds in [1, 100], --pace-us in [0, 1000000], --keys in [1, 1024], "
                     "--bulk-nice in [0, 19]",
                     2);
  }
  std::vector<int> loads;  // 1 list, 2 nops, 3 acquire, in the order given
  {
    std::stringstream names(args->Get("loads").value_or("list,nops,acquire"));
    for (std::string n; std::getline(names, n, ',');) {
      const int load = n == "list" ? 1 : n == "nops" ? 2 : n == "acquire" ? 3 : 0;
      if (load == 0 || std::find(loads.begin(), loads.end(), load) != loads.end()) {
        return cli::Fail("--loads: a comma-separated list of list, nops and acquire, each once (got \"" + n + "\")",
                         2);
      }
      loads.push_back(load);
    }
    if (loads.empty()) return cli::Fail("--loads: at least one of list, nops and acquire", 2);
  }
  const size_t lookup_keys = static_cast<size_t>(*nkeys);
  // kvtierd (every thread of it, the load's ring threads too) on CPU 1 and the bystander
  // on CPU 0, the load processes anywhere: the two ends of the bystander's ring never
  // share a core. With --no-pin the scheduler sometimes puts them together, and then
  // every round trip pays two context switches (p50 about 6 us instead of 1 us on the
  // 2-core VM), which swamps what the daemon does.
  const bool pin = !args->Has("no-pin") && ::sysconf(_SC_NPROCESSORS_ONLN) >= 2;
  const std::string la_start = LoadAverage();
  bench::DaemonProc d;
  if (Status s = bench::StartDaemon(&d,
                                    "[tiers]\nslot_bytes = \"4KiB\"\n[tiers.host]\ncapacity = \"80MiB\"\n"
                                    "high_watermark = 1.0\n[tiers.nvme]\ncapacity = \"0\"\ndir = \"{dir}/nvme\"",
                                    "max_contracts_per_client = 40000\nmax_clients_per_pid = 64\n"
                                    "max_tier_share_per_client = 1.0\n" +
                                        (args->Has("bulk-nice") ? "bulk_nice = " + std::to_string(*bulk_nice) + "\n" : ""),
                                    pin ? 1 : -1, 10.0);
      !s.ok()) {
    return cli::Fail(s.ToString());
  }
  void* mem = ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return cli::Fail("mmap failed");
  Shared* sh = new (mem) Shared();
  std::vector<pid_t> kids;
  for (const int load : loads) {
    const pid_t pid = ::fork();
    if (pid < 0) return cli::Fail("fork failed");
    if (pid == 0) {
      ::_exit(load == 1   ? ListerMain(d.socket, sh, static_cast<int>(*pace))
              : load == 2 ? TricklerMain(d.socket, sh)
                          : AcquirerMain(d.socket, sh, static_cast<int>(*pace)));
    }
    kids.push_back(pid);
  }
  const int want_ready = static_cast<int>(loads.size());
  auto stop_kids = [&] {
    sh->quit.store(1);
    for (pid_t p : kids) {
      int st;
      ::waitpid(p, &st, 0);
    }
    kids.clear();
  };
  const auto setup_end = Clock::now() + std::chrono::seconds(120);
  while (sh->ready.load() < want_ready && !sh->failed.load() && Clock::now() < setup_end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (sh->ready.load() < want_ready) {
    const std::string why = sh->failed.load() ? std::string(sh->error) : "load processes not ready after 120 s";
    stop_kids();
    return cli::Fail(why);
  }
  if (pin) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(0, &set);
    ::sched_setaffinity(0, sizeof set, &set);
  }
  // The bystander: a chain of lookup_keys cached blocks, looked up by their keys.
  kvtier_client* c = Connect(d.socket, "bystander");
  if (c == nullptr) {
    stop_kids();
    return cli::Fail(std::string("bystander connect: ") + kvtier_last_error());
  }
  const kvtier_contract_desc desc = Contract("bench/bystander");
  uint64_t cid = 0;
  std::vector<kvtier_key> keys(lookup_keys);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = {0x6279737461000001ull + i, 0x9E3779B97F4A7C15ull};
  {
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(lookup_keys);
    std::vector<kvtier_commit_item> items(lookup_keys);
    if (kvtier_register_contract(c, &desc, &cid) != KVTIER_OK ||
        kvtier_alloc(c, cid, lookup_keys, KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) {
      stop_kids();
      return cli::Fail(std::string("bystander store: ") + kvtier_last_error());
    }
    for (size_t i = 0; i < lookup_keys; ++i) {
      if (void* p = kvtier_host_slot_write(c, slots[i].slot)) std::memset(p, 7, 576);
      items[i].slot = slots[i];
      items[i].key = keys[i];
      if (i > 0) items[i].parent = keys[i - 1];
    }
    if (kvtier_commit(c, cid, lease, items.data(), lookup_keys, nullptr) != KVTIER_OK ||
        kvtier_release(c, lease) != KVTIER_OK) {
      stop_kids();
      return cli::Fail(std::string("bystander commit: ") + kvtier_last_error());
    }
  }
  // Lookups back to back for `secs`; the first 50 ms are not kept (the load settles).
  auto measure = [&](int load, Phase* ph) -> Status {
    ph->load = load;
    const uint64_t w0 = Work(sh, load);
    sh->active.store(load);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const long cpu0 = CpuTicks(d.pid);
    const auto t0 = Clock::now();
    const auto end = t0 + std::chrono::duration<double>(*seconds);
    while (Clock::now() < end) {
      kvtier_lookup_result r{};
      const auto a = Clock::now();
      if (kvtier_lookup(c, cid, keys.data(), keys.size(), &r, nullptr) != KVTIER_OK) {
        return Status::IoError(kvtier_last_error());
      }
      ph->us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
      if (r.hit_blocks != keys.size()) return Status::Corrupt("the bystander's blocks were not found");
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    ph->daemon_cpu = static_cast<double>(CpuTicks(d.pid) - cpu0) / static_cast<double>(::sysconf(_SC_CLK_TCK)) / secs;
    sh->active.store(0);
    ph->work = Work(sh, load) - w0;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the load's last request ends
    if (sh->failed.load()) return Status::IoError(sh->error);
    return Status::Ok();
  };
  std::vector<Phase> phases;
  for (int r = 0; r < *rounds; ++r) {
    for (int load : loads) {
      for (int which : {0, load}) {
        phases.emplace_back();
        if (Status s = measure(which, &phases.back()); !s.ok()) {
          stop_kids();
          return cli::Fail(s.ToString());
        }
      }
    }
  }
  kvtier_close(c);
  stop_kids();
  const std::string la_end = LoadAverage();

  std::string load_names;
  for (const int load : loads) load_names += std::string(load_names.empty() ? "" : ",") + LoadFlag(load);
  Report rep("bystander: one client's " + std::to_string(lookup_keys) +
                 "-key lookup latency while another client loads kvtierd, against idle",
             "kvtier-bench bystander --seconds " + Fmt("%g", *seconds) + " --rounds " + std::to_string(*rounds) +
                 " --pace-us " + std::to_string(*pace) + " --keys " + std::to_string(lookup_keys) + " --loads " +
                 load_names + (pin ? "" : " --no-pin") +
                 (args->Has("bulk-nice") ? " --bulk-nice " + std::to_string(*bulk_nice) : ""));
  rep.SetColumns({"phase", "lookups", "p50 (us)", "p99 (us)", "max (us)", "p99 / idle p99", "daemon CPU",
                  "load's work"});
  std::vector<double> idle_all;
  for (const Phase& p : phases) {
    if (p.load == 0) idle_all.insert(idle_all.end(), p.us.begin(), p.us.end());
  }
  const double idle_p99 = Pct(idle_all, 0.99);
  // Per round, in order: each loaded phase against the idle phase just before it.
  for (size_t i = 0; i < phases.size(); ++i) {
    const Phase& p = phases[i];
    const double p99 = Pct(p.us, 0.99);
    std::string ratio = "-", work = "-";
    if (p.load != 0) {
      ratio = Fmt("%.2fx (%.2fx of the idle phase before)", p99 / idle_p99, p99 / Pct(phases[i - 1].us, 0.99));
      work = p.load == 1   ? Fmt("%.0f contracts/s", static_cast<double>(p.work) / *seconds)
             : p.load == 2 ? Fmt("%.0f nops/s", static_cast<double>(p.work) / *seconds)
                           : Fmt("%.0f blocks acquired/s", static_cast<double>(p.work) / *seconds);
    }
    rep.AddRow({Fmt("round %zu: %s", i / (2 * loads.size()) + 1, LoadName(p.load)), std::to_string(p.us.size()), Fmt("%.2f", Pct(p.us, 0.5)),
                Fmt("%.2f", p99), Fmt("%.0f", p.us.empty() ? 0 : *std::max_element(p.us.begin(), p.us.end())), ratio,
                Fmt("%.0f%%", p.daemon_cpu * 100), work});
  }
  for (int load : loads) {
    std::vector<double> all;
    for (const Phase& p : phases) {
      if (p.load == load) all.insert(all.end(), p.us.begin(), p.us.end());
    }
    const double p99 = Pct(all, 0.99);
    rep.AddRow({Fmt("all rounds: %s", LoadName(load)), std::to_string(all.size()), Fmt("%.2f", Pct(all, 0.5)),
                Fmt("%.2f", p99), "-", Fmt("%.2fx", p99 / idle_p99), "-", "-"});
    rep.AddNote(Fmt("target: bystander lookup p99 within 2x of idle while a client %s: %.2f us against %.2f us "
                    "idle, %.2fx -> %s",
                    load == 1   ? "lists 30,000 contracts in a loop"
                    : load == 2 ? "trickles nops over 32 sessions"
                                : "acquires 16,384 keys in a loop",
                    p99, idle_p99,
                    p99 / idle_p99, p99 <= 2 * idle_p99 ? "met" : "MISSED"));
  }
  rep.AddRow({"all rounds: idle", std::to_string(idle_all.size()), Fmt("%.2f", Pct(idle_all, 0.5)),
              Fmt("%.2f", idle_p99), "-", "1.00x", "-", "-"});
  rep.AddNote("load average at the start: " + la_start + ", at the end: " + la_end + " on " +
              std::to_string(::sysconf(_SC_NPROCESSORS_ONLN)) +
              " cores. The bystander and its ring thread each busy-poll a core between requests, so on a "
              "2-core machine every other runnable thread (the load's, another process's) takes CPU from one "
              "of them: rerun on a quiet machine before reading the ratios.");
  rep.AddNote(Fmt("phases of %g s, idle before each load, %d rounds; lookups back to back from one thread; %s; "
                  "the lister pauses %d us between pages and the acquirer between acquires; host tier only, NVMe off",
                  *seconds, static_cast<int>(*rounds),
                  pin ? "kvtierd pinned to CPU 1, the bystander to CPU 0, the load processes unpinned"
                      : "nothing pinned (--no-pin; a p50 near 1 us: the bystander and its ring thread ran on two cores; "
                        "near 6 us: on one, each round trip two context switches)",
                  static_cast<int>(*pace)));
  const std::string path = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(path); !s.ok()) return cli::Fail(s.ToString());
  return 0;
}

cli::CommandRegistrar reg("bystander",
                          "a bystander's lookup p99 while another client lists contracts, trickles nops or "
                          "acquires 16,384 keys, against idle",
                          Run,
                          "[--seconds S] [--rounds N] [--pace-us US] [--keys N] [--loads LIST] [--no-pin]\n"
                          "       [--bulk-nice N]\n"
                          "       [--results FILE | --no-append]\n"
                          "  --seconds S      length of each phase (default 2)\n"
                          "  --rounds N       rounds of idle, list, idle, nops, idle, acquire, 1-100 (default 3)\n"
                          "  --keys N         keys of each bystander lookup (a chain of cached blocks), 1-1024 "
                          "(default 1)\n"
                          "  --loads LIST     the loads, comma-separated, in order: list, nops, acquire "
                          "(default all three)\n"
                          "  --pace-us US     the lister's pause between pages, the acquirer's between acquires "
                          "(default 2000)\n"
                          "  --no-pin         do not pin kvtierd and the bystander to CPUs 1 and 0\n"
                          "  --bulk-nice N    kvtierd's daemon.bulk_nice, 0-19 (default: the daemon's, 10); 0 runs "
                          "big requests\n"
                          "                   on the client's ring thread at the daemon's priority\n" +
                              std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
