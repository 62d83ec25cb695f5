// kvtier-bench client: request latency through the shared-memory rings against the same
// requests over the unix socket (the baseline, measured in the same run), and lookup
// throughput with 1, 2 and 4 client processes.
//
// It starts the real kvtierd (next to this binary) on a temporary host + NVMe config,
// stores a 1,000-block prefix through libkvtier, then measures per request:
//   nop       an empty round trip (the transport alone)
//   lookup    the 1,000-block prefix (longest cached prefix + tier of each block)
//   acquire   the 1,000 host-resident blocks (pinned under a lease; released untimed)
//   lookup again, 1 ms between requests: both ring ends have gone to sleep in between, so
//             each request pays the daemon's futex wake-up (no target; for comparison)
// Targets: ring round trip >= 10x faster than the socket round trip, and a
// 1,000-block lookup p99 <= 50 us.
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "formats/contract.h"
#include "kvtier/kvtier.h"
#include "tiers/policy/policy_options.h"
#include "tiers/tier_manager.h"
#include "tools/bench/daemon_proc.h"
#include "tools/bench/report.h"
#include "tools/cli.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Us(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())));
  return v[i];
}

// Pins `pid` (0: this thread) to one CPU, or to all of them with cpu < 0.
void Pin(pid_t pid, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
  for (long i = 0; i < n; ++i) {
    if (cpu < 0 || i == cpu) CPU_SET(static_cast<int>(i), &set);
  }
  ::sched_setaffinity(pid, sizeof set, &set);
}

kvtier_contract_desc Contract() {
  kvtier_contract_desc c{};
  c.model_id = "bench/model";
  c.num_layers = 2;
  c.num_kv_heads = 1;
  c.head_dim = 16;
  c.block_tokens = 16;
  c.tp_size = 1;
  return c;
}

kvtier_client* Connect(const std::string& sock) {
  kvtier_connect_options o{};
  o.name = "kvtier-bench";
  kvtier_client* c = nullptr;
  if (kvtier_connect(sock.c_str(), &o, &c) != KVTIER_OK) return nullptr;
  return c;
}

struct Lat {
  std::vector<double> nop, lookup, acquire;
  std::vector<double> idle_lookup;  // lookups 1 ms apart: both ring ends asleep in between
};

// Each operation in its own back-to-back loop (the first tenth warms up), so that every
// request finds the daemon's ring thread as the previous one of its kind left it.
Status Measure(kvtier_client* c, uint64_t cid, const std::vector<kvtier_key>& keys, int iters, Lat* out) {
  std::vector<uint8_t> tiers(keys.size());
  std::vector<kvtier_slot> slots(keys.size());
  const int total = iters + iters / 10;
  for (int i = 0; i < total; ++i) {
    auto t0 = Clock::now();
    if (kvtier_ping(c) != KVTIER_OK) return Status::IoError(kvtier_last_error());
    if (i >= iters / 10) out->nop.push_back(Us(Clock::now() - t0));
  }
  for (int i = 0; i < total; ++i) {
    kvtier_lookup_result r{};
    auto t0 = Clock::now();
    if (kvtier_lookup(c, cid, keys.data(), keys.size(), &r, tiers.data()) != KVTIER_OK) {
      return Status::IoError(kvtier_last_error());
    }
    if (i >= iters / 10) out->lookup.push_back(Us(Clock::now() - t0));
    if (r.hit_blocks != keys.size()) return Status::Corrupt("lookup missed stored blocks");
  }
  for (int i = 0; i < total; ++i) {
    uint64_t lease = 0;
    size_t n = 0;
    auto t0 = Clock::now();
    if (kvtier_acquire(c, cid, keys.data(), keys.size(), KVTIER_TIER_HOST, &lease, slots.data(), &n) != KVTIER_OK) {
      return Status::IoError(kvtier_last_error());
    }
    if (i >= iters / 10) out->acquire.push_back(Us(Clock::now() - t0));
    if (n != keys.size()) return Status::Corrupt("acquire returned a short prefix");
    if (kvtier_release(c, lease) != KVTIER_OK) return Status::IoError(kvtier_last_error());
  }
  // Requests spaced wider than the spin windows (50 us): what an engine that asks now and
  // then sees, a futex wake-up of the daemon's ring thread included.
  for (int i = 0; i < iters / 4 + 1; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    kvtier_lookup_result r{};
    auto t0 = Clock::now();
    if (kvtier_lookup(c, cid, keys.data(), keys.size(), &r, tiers.data()) != KVTIER_OK) {
      return Status::IoError(kvtier_last_error());
    }
    if (i > 0) out->idle_lookup.push_back(Us(Clock::now() - t0));
  }
  return Status::Ok();
}

// The same lookup straight on a TierManager in this process: the index's own cost, with
// no transport at all (what the ring adds is the difference to this row).
Status DirectLookup(const std::vector<kvtier_key>& ckeys, int iters, std::vector<double>* lat) {
  char tmpl[] = "/tmp/kvtier-bench-tm-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return Status::IoError("mkdtemp failed");
  const std::string dir = tmpl;
  Status result = Status::Ok();
  {
    tiers::TierManagerOptions o;
    o.slot_bytes = 4096;
    o.host.capacity_bytes = 16u << 20;
    o.nvme.tier.capacity_bytes = 0;
    o.nvme.dir = dir + "/nvme";
    auto tm = tiers::TierManager::Open(o);
    if (!tm.ok()) return tm.status();
    ScaleContract c;
    c.model_id = "bench/model";
    c.geometry = Geometry{2, 1, 16, 16};
    c.SetUnitScales();
    KVTIER_RETURN_IF_ERROR((*tm)->RegisterContract(c));
    const uint64_t cid = c.Id();
    std::vector<Key128> keys;
    for (const auto& k : ckeys) keys.push_back(Key128{k.hi, k.lo});
    std::vector<tiers::SlotRef> slots;
    KVTIER_RETURN_IF_ERROR((*tm)->AllocSlots(cid, static_cast<uint32_t>(keys.size()), tiers::Tier::kHost, &slots));
    for (size_t i = 0; i < keys.size(); ++i) {
      KVTIER_RETURN_IF_ERROR((*tm)->Commit(cid, slots[i], keys[i], i ? keys[i - 1] : Key128{}));
      KVTIER_RETURN_IF_ERROR((*tm)->Unpin(slots[i]));
    }
    for (int i = 0; i < iters + iters / 10; ++i) {
      auto t0 = Clock::now();
      const auto r = (*tm)->Lookup(cid, keys);
      if (i >= iters / 10) lat->push_back(Us(Clock::now() - t0));
      if (r.hit_blocks != keys.size()) {
        result = Status::Corrupt("direct lookup missed");
        break;
      }
    }
  }
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  return result;
}

// Host stores of `per` fresh blocks each (alloc, write every block's bytes into the
// staging slots, commit, release), `rounds` of them; per-round microseconds into *us.
Status MeasureStores(kvtier_client* c, uint64_t cid, size_t block_bytes, int rounds, size_t per,
                     std::vector<double>* us) {
  std::vector<kvtier_slot> slots(per);
  std::vector<kvtier_commit_item> items(per);
  for (int r = 0; r < rounds; ++r) {
    const auto t0 = Clock::now();
    uint64_t lease = 0;
    if (kvtier_alloc(c, cid, per, KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) {
      return Status::IoError(std::string("store alloc: ") + kvtier_last_error());
    }
    for (size_t i = 0; i < per; ++i) {
      void* p = kvtier_host_slot_write(c, slots[i].slot);
      if (p == nullptr) return Status::IoError("store: an alloc slot is not writable");
      std::memset(p, static_cast<int>(r + i), block_bytes);
      const kvtier_key k{0x5700000000000000ull | (static_cast<uint64_t>(r) << 20) | i, 0x9E3779B97F4A7C15ull ^ i};
      items[i] = kvtier_commit_item{slots[i], k, kvtier_key{0, 0}};
    }
    if (kvtier_commit(c, cid, lease, items.data(), per, nullptr) != KVTIER_OK ||
        kvtier_release(c, lease) != KVTIER_OK) {
      return Status::IoError(std::string("store: ") + kvtier_last_error());
    }
    us->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return Status::Ok();
}

// The copy a host commit adds per block: memcpy of `bytes` between two buffers of
// `slots` blocks each (a block at a time, walking the buffers as commits walk slots, so
// that most copies miss the caches as in the daemon); microseconds per block, median of
// `reps` passes.
double CopyMicros(size_t bytes, size_t slots, int reps) {
  std::vector<uint8_t> a(bytes * slots, 1), b(bytes * slots, 2);
  std::vector<double> per;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    for (size_t s = 0; s < slots; ++s) std::memcpy(b.data() + s * bytes, a.data() + s * bytes, bytes);
    per.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / static_cast<double>(slots));
  }
  std::sort(per.begin(), per.end());
  return per[per.size() / 2] + (b[bytes] == 3 ? 1 : 0);  // b read: the copies are not optimised out
}

// Lookups/s summed over `clients` processes, each looking up the prefix for `seconds`.
double Throughput(const std::string& sock, uint64_t cid, const std::vector<kvtier_key>& keys, int clients,
                  kvtier_transport transport, double seconds) {
  std::vector<std::pair<pid_t, int>> kids;
  for (int k = 0; k < clients; ++k) {
    int p[2];
    if (::pipe(p) != 0) return 0;
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(p[0]);
      uint64_t count = 0;
      kvtier_client* c = Connect(sock);
      if (c != nullptr && kvtier_set_transport(c, transport) == KVTIER_OK) {
        kvtier_lookup_result r{};
        const auto end = Clock::now() + std::chrono::duration<double>(seconds);
        while (Clock::now() < end) {
          if (kvtier_lookup(c, cid, keys.data(), keys.size(), &r, nullptr) != KVTIER_OK) break;
          ++count;
        }
        kvtier_close(c);
      }
      (void)!::write(p[1], &count, sizeof count);
      ::_exit(0);
    }
    ::close(p[1]);
    kids.emplace_back(pid, p[0]);
  }
  uint64_t total = 0;
  for (auto& [pid, fd] : kids) {
    uint64_t n = 0;
    if (::read(fd, &n, sizeof n) == sizeof n) total += n;
    ::close(fd);
    int st;
    ::waitpid(pid, &st, 0);
  }
  return static_cast<double>(total) / seconds;
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append", "no-pin", "tenants"});
  if (!args.ok()) return cli::Fail(args.status().message(), 2);
  if (Status s = args->CheckKnown({"blocks", "iters", "seconds", "results", "no-append", "no-pin", "policy", "tenants"});
      !s.ok()) {
    return cli::Fail(s.message(), 2);
  }
  // The host and NVMe tiers' eviction policy (the hot path touches it on every hit).
  const std::string policy = args->Get("policy").value_or("lru");
  if (tiers::PolicyIndex(policy) < 0) {
    return cli::Fail("--policy: \"" + policy + "\" is not one of " + tiers::PolicyNameList(), 2);
  }
  auto blocks = args->GetInt("blocks", 1000);
  auto iters = args->GetInt("iters", 2000);
  auto seconds = args->GetDouble("seconds", 1.0);
  if (!blocks.ok() || !iters.ok() || !seconds.ok() || *blocks < 1 || *blocks > 3000 || *iters < 10) {
    return cli::Fail("--blocks in [1, 3000], --iters >= 10, --seconds > 0", 2);
  }
  // Latency runs pin kvtierd to CPU 1 and this process to CPU 0: the two busy-polling ends
  // of a ring must not be time-sliced on one core (on a 2-core machine the scheduler
  // otherwise often puts them together). --no-pin measures without.
  const bool pin = !args->Has("no-pin") && ::sysconf(_SC_NPROCESSORS_ONLN) >= 2;
  // --tenants: this process's uid is tenant "bench" (with host and NVMe shares), beside a
  // second tenant: every request goes through the namespace translation and the quotas,
  // and the host tier is cut into the tenants' parts and the common pool.
  const bool tenants = args->Has("tenants");
  const std::string tenant_toml =
      tenants ? "\n[[tenants]]\nname = \"bench\"\nuids = [" + std::to_string(::getuid()) +
                    "]\nhost_share = 0.5\nnvme_share = 0.5\n[[tenants]]\nname = \"other\"\nuids = [" +
                    std::to_string(::getuid() + 1) + "]\nhost_share = 0.25\n"
              : "";
  bench::DaemonProc d;
  if (Status s = bench::StartDaemon(&d,
                                    "[tiers]\nslot_bytes = \"4KiB\"\n[tiers.host]\ncapacity = \"16MiB\"\npolicy = \"" +
                                        policy + "\"\n[tiers.nvme]\ncapacity = \"16MiB\"\npolicy = \"" + policy +
                                        "\"\ndir = \"{dir}/nvme\"" + tenant_toml,
                                    "ring_data_bytes = \"1MiB\"", pin ? 1 : -1, 10.0);
      !s.ok()) {
    return cli::Fail(s.ToString());
  }
  if (pin) Pin(0, 0);
  kvtier_client* c = Connect(d.socket);
  if (c == nullptr) return cli::Fail(std::string("connect: ") + kvtier_last_error());
  const auto desc = Contract();
  uint64_t cid = 0;
  if (kvtier_register_contract(c, &desc, &cid) != KVTIER_OK) return cli::Fail(kvtier_last_error());
  // Store the prefix: alloc host slots, write, commit.
  const size_t n = static_cast<size_t>(*blocks);
  std::vector<uint32_t> tokens(n * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<kvtier_key> keys(n);
  size_t nk = 0;
  if (kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), n, &nk) != KVTIER_OK) {
    return cli::Fail(kvtier_last_error());
  }
  {
    uint64_t lease = 0;
    std::vector<kvtier_slot> slots(n);
    if (kvtier_alloc(c, cid, n, KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) {
      return cli::Fail(kvtier_last_error());
    }
    std::vector<kvtier_commit_item> items(n);
    for (size_t i = 0; i < n; ++i) {
      void* p = kvtier_host_slot_write(c, slots[i].slot);
      if (p == nullptr) return cli::Fail("alloc gave a slot outside this client's staging area");
      std::memset(p, static_cast<int>(i), 576);
      items[i] = kvtier_commit_item{slots[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}};
    }
    if (kvtier_commit(c, cid, lease, items.data(), n, nullptr) != KVTIER_OK ||
        kvtier_release(c, lease) != KVTIER_OK) {
      return cli::Fail(kvtier_last_error());
    }
  }
  Lat ring, sock;
  if (Status s = Measure(c, cid, keys, static_cast<int>(*iters), &ring); !s.ok()) return cli::Fail(s.ToString());
  // Host stores through the rings: 100 rounds of 16 fresh blocks (1,600 blocks: the host
  // tier, 4,096 slots, holds them beside the prefix without evicting).
  std::vector<double> stores;
  uint64_t contract_block = 0;
  (void)kvtier_contract_block_bytes(&desc, &contract_block);
  if (Status s = MeasureStores(c, cid, contract_block, 100, 16, &stores); !s.ok()) return cli::Fail(s.ToString());
  if (kvtier_set_transport(c, KVTIER_TRANSPORT_SOCKET) != KVTIER_OK) return cli::Fail(kvtier_last_error());
  if (Status s = Measure(c, cid, keys, static_cast<int>(*iters), &sock); !s.ok()) return cli::Fail(s.ToString());
  kvtier_close(c);
  if (pin) {  // throughput: every process and new ring thread may run anywhere
    Pin(0, -1);
    Pin(d.pid, -1);
  }

  Report rep("client: ring vs unix-socket round trips through kvtierd",
             "kvtier-bench client --blocks " + std::to_string(n) + " --iters " + std::to_string(*iters) +
                 " --seconds " + Fmt("%g", *seconds) + (pin ? "" : " --no-pin") + " --policy " + policy +
                 (tenants ? " --tenants" : ""));
  rep.SetColumns({"measure", "ring", "socket (baseline)", "socket / ring"});
  auto row = [&](const char* name, const std::vector<double>& r, const std::vector<double>& s, double p) {
    const double a = Pct(r, p), b = Pct(s, p);
    rep.AddRow({Fmt("%s p%.0f (us)", name, p * 100), Fmt("%.2f", a), Fmt("%.2f", b), Fmt("%.1fx", b / a)});
  };
  row("nop round trip", ring.nop, sock.nop, 0.50);
  row("nop round trip", ring.nop, sock.nop, 0.99);
  const std::string lk = std::to_string(n) + "-block lookup";
  const std::string aq = std::to_string(n) + "-block acquire (host)";
  row(lk.c_str(), ring.lookup, sock.lookup, 0.50);
  row(lk.c_str(), ring.lookup, sock.lookup, 0.99);
  {
    std::vector<double> direct;
    if (Status s = DirectLookup(keys, static_cast<int>(*iters), &direct); !s.ok()) return cli::Fail(s.ToString());
    rep.AddRow({Fmt("same lookup on a TierManager in-process, p50 / p99 (us)"),
                Fmt("%.2f / %.2f", Pct(direct, 0.5), Pct(direct, 0.99)), "-", "-"});
  }
  row(aq.c_str(), ring.acquire, sock.acquire, 0.50);
  row(aq.c_str(), ring.acquire, sock.acquire, 0.99);
  {
    double sum = 0;
    for (double u : stores) sum += u;
    rep.AddRow({Fmt("host store of 16 blocks (alloc, write, commit, release) p50 / p99 (us)"),
                Fmt("%.2f / %.2f", Pct(stores, 0.5), Pct(stores, 0.99)), "-", "-"});
    rep.AddRow({Fmt("host commit throughput, 16-block stores (blocks/s)"), Fmt("%.0f", 16.0 * 1e6 * stores.size() / sum),
                "-", "-"});
    const double copy = CopyMicros(1474560, 64, 5);
    rep.AddRow({"staging -> arena copy a commit adds per 1474560-byte block, in-process memcpy (us)",
                Fmt("%.1f (%.1f GB/s)", copy, 1474560.0 / copy / 1e3), "-", "-"});
  }
  const std::string il = lk + ", 1 ms between requests (ends asleep)";
  row(il.c_str(), ring.idle_lookup, sock.idle_lookup, 0.50);
  row(il.c_str(), ring.idle_lookup, sock.idle_lookup, 0.99);
  for (int clients : {1, 2, 4}) {
    const double r = Throughput(d.socket, cid, keys, clients, KVTIER_TRANSPORT_RING, *seconds);
    const double s = Throughput(d.socket, cid, keys, clients, KVTIER_TRANSPORT_SOCKET, *seconds);
    rep.AddRow({Fmt("%d-client %zu-block lookups/s", clients, n), Fmt("%.0f", r), Fmt("%.0f", s),
                Fmt("%.2fx (ring/socket)", r / s)});
  }
  const double rt_ratio = Pct(sock.nop, 0.5) / Pct(ring.nop, 0.5);
  const double lk_p99 = Pct(ring.lookup, 0.99);
  rep.AddNote(Fmt("target: ring round trip >= 10x faster than socket (p50 nop): %.1fx -> %s", rt_ratio,
                  rt_ratio >= 10 ? "met" : "MISSED"));
  rep.AddNote(Fmt("target: %zu-block lookup p99 <= 50 us through the rings (back-to-back requests): %.1f us "
                  "-> %s", n, lk_p99, lk_p99 <= 50 ? "met" : "MISSED"));
  {
    double la[3] = {0, 0, 0};
    if (::getloadavg(la, 3) == 3) {
      rep.AddNote(Fmt("load average at the end of the run: %.1f %.1f %.1f on %ld cores (the machine "
                      "is shared; spinning ring endpoints suffer most when cores are oversubscribed)",
                      la[0], la[1], la[2], ::sysconf(_SC_NPROCESSORS_ONLN)));
    }
  }
  rep.AddNote(pin ? "latency rows: kvtierd pinned to CPU 1, the measuring client to CPU 0 (its TierManager "
                    "threads share CPU 1 with the ring thread); throughput rows: unpinned"
                  : "nothing pinned (--no-pin)");
  if (tenants) {
    rep.AddNote("tenants on: two [[tenants]] tables, this uid in tenant \"bench\" (host and NVMe shares 0.5): "
                "each request's contract id is translated to the tenant's namespace, quotas on; the prefix lies "
                "in the tenant's part of the host tier (tiers.host.tenant_parts), which this client maps: its "
                "host acquires read in place");
  }
  rep.AddNote("kvtierd and the client processes share the machine's cores; host tier only "
              "(no GPU), 4 KiB slots, daemon spin 50 us, client spin 50 us before futex sleep "
              "(a spinner yields only when its peer last ran on its CPU).");
  const std::string path = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(path); !s.ok()) return cli::Fail(s.ToString());
  return 0;
}

cli::CommandRegistrar reg("client", "ring vs socket latency and multi-client throughput through kvtierd", Run,
                          "[--blocks N] [--iters N] [--seconds S] [--no-pin] [--tenants] [--results FILE | --no-append]\n"
                          "  --blocks N       blocks in the stored prefix that lookup and acquire cover, 1-3000 (default 1000)\n"
                          "  --iters N        timed calls per latency series, >= 10 (default 2000)\n"
                          "  --seconds S      length of each throughput run (default 1.0)\n"
                          "  --no-pin         do not pin kvtierd and this process to CPUs 1 and 0\n"
                          "  --tenants        run with two [[tenants]] tables, this uid in one of them\n"
    + std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
