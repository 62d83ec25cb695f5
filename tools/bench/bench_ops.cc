// kvtier-bench ops: how fast `kvtierctl stats` answers with a large block index.
//
// Starts the real kvtierd (next to this binary) with tiny 4 KiB slots and a host tier
// big enough for --blocks blocks (default one million) below its eviction watermark,
// measures `kvtierctl stats --json` (the whole process: exec, attach, kStats, the
// contract listing, JSON out) on the EMPTY index first (the baseline), then fills the
// index with --blocks committed blocks (alloc + commit through the rings; the bytes are
// not written, the index is what is measured) and measures again. Also times the two
// requests behind the command (kvtier_stats, kvtier_list_contracts) from a client.
// Target: `kvtierctl stats` under 50 ms with a million blocks indexed.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// Block keys are XXH3 outputs in real use: well-mixed 128-bit values (splitmix64 here).
uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

std::string BinDir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().string();
}

// Wall time of one `kvtierctl --socket S stats --json` process (output discarded).
StatusOr<double> TimeCtlStats(const std::string& socket) {
  const std::string bin = BinDir() + "/kvtierctl";
  const auto t0 = Clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open("/dev/null", O_WRONLY);
    ::dup2(fd, 1);
    ::execl(bin.c_str(), bin.c_str(), "--socket", socket.c_str(), "stats", "--json", nullptr);
    ::_exit(98);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  const double ms = Ms(Clock::now() - t0);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) return Status::IoError("kvtierctl stats failed (exit " + std::to_string(st) + ")");
  return ms;
}

struct Sample {
  double ctl_ms = 0, stats_ms = 0, contracts_ms = 0;
};

Status Measure(const std::string& socket, kvtier_client* c, int reps, Sample* out) {
  std::vector<double> ctl, st, ct;
  std::vector<uint8_t> buf(1 << 16);
  for (int i = 0; i < reps; ++i) {
    auto ms = TimeCtlStats(socket);
    if (!ms.ok()) return ms.status();
    ctl.push_back(*ms);
    kvtier_tier_stats ts[8];
    size_t n = 0;
    auto t0 = Clock::now();
    if (kvtier_stats(c, ts, 8, &n) != KVTIER_OK) return Status::IoError(kvtier_last_error());
    st.push_back(Ms(Clock::now() - t0));
    size_t bytes = 0;
    uint32_t cn = 0;
    uint64_t total = 0;
    t0 = Clock::now();
    if (kvtier_list_contracts(c, 0, 1024, buf.data(), buf.size(), &bytes, &cn, &total) != KVTIER_OK) {
      return Status::IoError(kvtier_last_error());
    }
    ct.push_back(Ms(Clock::now() - t0));
  }
  out->ctl_ms = Median(ctl);
  out->stats_ms = Median(st);
  out->contracts_ms = Median(ct);
  return Status::Ok();
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append"});
  if (!args.ok()) return cli::Fail("ops: " + args.status().message(), 2);
  if (auto s = args->CheckKnown({"blocks", "reps", "no-append", "results"}); !s.ok()) return cli::Fail("ops: " + s.message(), 2);
  auto blocks = args->GetInt("blocks", 1000000);
  auto reps = args->GetInt("reps", 7);
  if (!blocks.ok() || *blocks < 4096 || *blocks > 4000000) return cli::Fail("ops: --blocks must be in [4096, 4e6]", 2);
  if (!reps.ok() || *reps < 1 || *reps > 100) return cli::Fail("ops: --reps must be in [1, 100]", 2);
  const uint64_t n = static_cast<uint64_t>(*blocks);
  // Host tier: n blocks fill it to ~90%, under the 95% high watermark (nothing evicted).
  const uint64_t host_bytes = (n * 10 / 9 + 64) * 4096;
  bench::DaemonProc d;
  if (Status s = bench::StartDaemon(&d,
                                    "[tiers]\nslot_bytes = \"4KiB\"\n[tiers.host]\ncapacity = \"" +
                                        std::to_string(host_bytes) +
                                        "\"\n[tiers.nvme]\ncapacity = \"16MiB\"\ndir = \"{dir}/nvme\"",
                                    "ring_data_bytes = \"1MiB\"", -1, 30.0);
      !s.ok()) {
    return cli::Fail(s.ToString());
  }
  kvtier_client* c = nullptr;
  kvtier_connect_options o{};
  o.name = "bench-ops";
  if (kvtier_connect(d.socket.c_str(), &o, &c) != KVTIER_OK) return cli::Fail(kvtier_last_error());
  kvtier_contract_desc desc{};
  desc.model_id = "bench/ops";
  desc.num_layers = 1;
  desc.num_kv_heads = 1;
  desc.head_dim = 64;
  desc.block_tokens = 16;
  uint64_t cid = 0;
  if (kvtier_register_contract(c, &desc, &cid) != KVTIER_OK) return cli::Fail(kvtier_last_error());

  Sample empty, full;
  if (Status s = Measure(d.socket, c, static_cast<int>(*reps), &empty); !s.ok()) return cli::Fail(s.ToString());

  const auto f0 = Clock::now();
  constexpr uint32_t kBatch = 4096;
  std::vector<kvtier_slot> slots(kBatch);
  std::vector<kvtier_commit_item> items(kBatch);
  kvtier_key parent{0, 0};  // chains of 64 blocks, as sessions make them
  for (uint64_t done = 0; done < n;) {
    const uint32_t b = static_cast<uint32_t>(std::min<uint64_t>(kBatch, n - done));
    uint64_t lease = 0;
    if (kvtier_alloc(c, cid, b, KVTIER_TIER_HOST, &lease, slots.data()) != KVTIER_OK) return cli::Fail(kvtier_last_error());
    for (uint32_t i = 0; i < b; ++i) {
      items[i].slot = slots[i];
      items[i].key = {Mix(2 * (done + i) + 1), Mix(2 * (done + i) + 2)};
      items[i].parent = (done + i) % 64 == 0 ? kvtier_key{0, 0} : parent;
      parent = items[i].key;
    }
    if (kvtier_commit(c, cid, lease, items.data(), b, nullptr) != KVTIER_OK) return cli::Fail(kvtier_last_error());
    if (kvtier_release(c, lease) != KVTIER_OK) return cli::Fail(kvtier_last_error());
    done += b;
  }
  const double fill_s = Ms(Clock::now() - f0) / 1000.0;
  kvtier_tier_stats ts[8];
  size_t tn = 0;
  if (kvtier_stats(c, ts, 8, &tn) != KVTIER_OK) return cli::Fail(kvtier_last_error());
  uint64_t indexed = 0;
  for (size_t i = 0; i < tn; ++i) indexed += ts[i].blocks;
  if (indexed != n) return cli::Fail("ops: " + std::to_string(indexed) + " blocks indexed, wanted " + std::to_string(n));
  if (Status s = Measure(d.socket, c, static_cast<int>(*reps), &full); !s.ok()) return cli::Fail(s.ToString());
  kvtier_close(c);

  Report rep("ops: kvtierctl stats with a large block index",
             "kvtier-bench ops --blocks " + std::to_string(n) + " --reps " + std::to_string(*reps));
  rep.SetColumns({"measure (median of " + std::to_string(*reps) + ")", "empty index (baseline)",
                  Fmt("%llu blocks indexed", static_cast<unsigned long long>(n)), "ratio"});
  auto row = [&](const char* name, double a, double b) {
    rep.AddRow({name, Fmt("%.2f ms", a), Fmt("%.2f ms", b), Fmt("%.2fx", b / a)});
  };
  row("`kvtierctl stats --json` (whole process)", empty.ctl_ms, full.ctl_ms);
  row("kvtier_stats request (client, rings)", empty.stats_ms, full.stats_ms);
  row("kvtier_list_contracts request (client, rings)", empty.contracts_ms, full.contracts_ms);
  rep.AddNote(Fmt("target: kvtierctl stats under 50 ms with %llu blocks indexed: %.1f ms -> %s",
                  static_cast<unsigned long long>(n), full.ctl_ms, full.ctl_ms < 50 ? "met" : "MISSED"));
  rep.AddNote(Fmt("index filled through the rings in %.1f s (alloc + commit of 4096-block batches; 4 KiB slots, "
                  "host tier only, bytes not written)", fill_s));
  double la[3] = {0, 0, 0};
  if (::getloadavg(la, 3) == 3) {
    rep.AddNote(Fmt("load average at the end: %.1f %.1f %.1f on %ld cores (shared machine)", la[0], la[1], la[2],
                    ::sysconf(_SC_NPROCESSORS_ONLN)));
  }
  const std::string path = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(path); !s.ok()) return cli::Fail(s.ToString());
  return 0;
}

cli::CommandRegistrar reg("ops", "kvtierctl stats latency with a million-block index (vs empty)", Run,
                          "[--blocks N] [--reps N] [--results FILE | --no-append]\n"
                          "  --blocks N       blocks in the host tier's index, 4096-4000000 (default 1000000)\n"
                          "  --reps N         samples of each call; the median is reported, 1-100 (default 7)\n"
    + std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
