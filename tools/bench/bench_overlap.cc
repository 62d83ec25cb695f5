// kvtier-bench overlap: time to first token of a long prompt whose cached prefix is on
// NVMe, with the blocking acquire against kvtier_acquire_async.
//
// It starts the real kvtierd (next to this binary) with host and NVMe tiers, stores a
// prompt of --tokens tokens (16-token blocks) through libkvtier and, per iteration,
// demotes every block to NVMe (kvtier_flush) and then measures:
//   blocking  acquire (the restore), then the engine's compute of the uncached tail
//             (a sleep of --compute-ms): TTFT = restore + compute
//   async     acquire_async, the same compute while the restore runs, then the result:
//             TTFT = max(restore, compute) plus the hand-over
//   first     acquire_async alone: how soon the first --chunk blocks are usable, and how
//             long the whole restore takes in steps (against the blocking restore)
#include <algorithm>
#include <chrono>
#include <cstring>
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

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append"});
  if (!args.ok()) return cli::Fail(args.status().message(), 2);
  if (Status s = args->CheckKnown({"tokens", "compute-ms", "chunk", "iters", "results", "no-append"}); !s.ok()) {
    return cli::Fail(s.message(), 2);
  }
  auto tokens_arg = args->GetInt("tokens", 32768);
  auto compute_arg = args->GetDouble("compute-ms", 50.0);
  auto chunk_arg = args->GetInt("chunk", 16);
  auto iters_arg = args->GetInt("iters", 5);
  if (!tokens_arg.ok() || !compute_arg.ok() || !chunk_arg.ok() || !iters_arg.ok() || *tokens_arg < 32 ||
      *tokens_arg > 65536 || *compute_arg < 0 || *chunk_arg < 1 || *iters_arg < 1) {
    return cli::Fail("--tokens in [32, 65536], --compute-ms >= 0, --chunk >= 1, --iters >= 1", 2);
  }
  const size_t n = static_cast<size_t>(*tokens_arg) / 16;
  const uint32_t chunk = static_cast<uint32_t>(*chunk_arg);
  const auto compute = std::chrono::duration<double, std::milli>(*compute_arg);
  // 8 layers x 4 KV heads x head_dim 64, NVFP4: a 36 KiB block in a 64 KiB slot.
  kvtier_contract_desc desc{};
  desc.model_id = "bench/overlap";
  desc.num_layers = 8;
  desc.num_kv_heads = 4;
  desc.head_dim = 64;
  desc.block_tokens = 16;
  desc.tp_size = 1;
  const uint64_t cap_mib = (n * 64 / 1024) + 16;
  bench::DaemonProc d;
  if (Status s = bench::StartDaemon(&d,
                                    "[tiers]\nslot_bytes = \"64KiB\"\n[tiers.host]\ncapacity = \"" +
                                        std::to_string(cap_mib) + "MiB\"\n[tiers.nvme]\ncapacity = \"" +
                                        std::to_string(cap_mib * 2) + "MiB\"\ndir = \"{dir}/nvme\"",
                                    // The one client stores and restores the whole prompt: past
                                    // daemon.max_tier_share_per_client's default (0.75).
                                    "max_tier_share_per_client = 1.0\n");
      !s.ok()) {
    return cli::Fail(s.ToString());
  }
  kvtier_connect_options o{};
  o.name = "kvtier-bench overlap";
  kvtier_client* c = nullptr;
  if (kvtier_connect(d.socket.c_str(), &o, &c) != KVTIER_OK) return cli::Fail(kvtier_last_error());
  uint64_t cid = 0, block_bytes = 0;
  if (kvtier_register_contract(c, &desc, &cid) != KVTIER_OK || kvtier_contract_block_bytes(&desc, &block_bytes) != KVTIER_OK) {
    return cli::Fail(kvtier_last_error());
  }
  std::vector<uint32_t> tokens(n * 16);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i * 2654435761u);
  std::vector<kvtier_key> keys(n);
  size_t nk = 0;
  if (kvtier_key_chain(cid, tokens.data(), tokens.size(), 16, keys.data(), n, &nk) != KVTIER_OK || nk != n) {
    return cli::Fail(kvtier_last_error());
  }
  std::vector<std::vector<uint8_t>> bytes(n, std::vector<uint8_t>(block_bytes));
  std::vector<const void*> blocks(n);
  for (size_t i = 0; i < n; ++i) {
    std::memset(bytes[i].data(), static_cast<int>(i * 31 + 7), block_bytes);
    blocks[i] = bytes[i].data();
  }
  size_t stored = 0;
  if (kvtier_store_tokens(c, cid, tokens.data(), tokens.size(), blocks.data(), &stored) != KVTIER_OK || stored != n) {
    return cli::Fail(std::string("store: ") + kvtier_last_error());
  }
  bytes.clear();
  std::vector<kvtier_slot> slots(n);
  std::vector<double> b_restore, b_ttft, a_ttft, a_first, a_restore;
  auto to_nvme = [&]() -> bool {
    if (kvtier_flush(c) != KVTIER_OK) return false;
    std::vector<uint8_t> tiers(n);
    kvtier_lookup_result r{};
    if (kvtier_lookup(c, cid, keys.data(), n, &r, tiers.data()) != KVTIER_OK || r.hit_blocks != n) return false;
    return std::all_of(tiers.begin(), tiers.end(), [](uint8_t t) { return t == KVTIER_TIER_NVME; });
  };
  auto finish = [&](kvtier_acquire_op* op) -> bool {
    uint64_t lease = 0;
    size_t got = 0;
    const bool ok = kvtier_acquire_async_result(op, &lease, slots.data(), &got) == KVTIER_OK && got == n;
    kvtier_acquire_async_free(op);
    return ok && kvtier_release(c, lease) == KVTIER_OK;
  };
  for (int it = 0; it < *iters_arg; ++it) {
    if (!to_nvme()) return cli::Fail(std::string("flush to NVMe: ") + kvtier_last_error());
    {
      uint64_t lease = 0;
      size_t got = 0;
      const auto t0 = Clock::now();
      if (kvtier_acquire(c, cid, keys.data(), n, KVTIER_TIER_HOST, &lease, slots.data(), &got) != KVTIER_OK ||
          got != n) {
        return cli::Fail(std::string("acquire: ") + kvtier_last_error());
      }
      const auto t1 = Clock::now();
      std::this_thread::sleep_for(compute);
      b_restore.push_back(Ms(t1 - t0));
      b_ttft.push_back(Ms(Clock::now() - t0));
      if (kvtier_release(c, lease) != KVTIER_OK) return cli::Fail(kvtier_last_error());
    }
    if (!to_nvme()) return cli::Fail(std::string("flush to NVMe: ") + kvtier_last_error());
    {
      kvtier_acquire_op* op = nullptr;
      const auto t0 = Clock::now();
      if (kvtier_acquire_async(c, cid, keys.data(), n, KVTIER_TIER_HOST, chunk, &op) != KVTIER_OK) {
        return cli::Fail(std::string("acquire_async: ") + kvtier_last_error());
      }
      std::this_thread::sleep_for(compute);
      if (!finish(op)) return cli::Fail(std::string("acquire_async result: ") + kvtier_last_error());
      a_ttft.push_back(Ms(Clock::now() - t0));
    }
    if (!to_nvme()) return cli::Fail(std::string("flush to NVMe: ") + kvtier_last_error());
    {
      kvtier_acquire_op* op = nullptr;
      const auto t0 = Clock::now();
      if (kvtier_acquire_async(c, cid, keys.data(), n, KVTIER_TIER_HOST, chunk, &op) != KVTIER_OK) {
        return cli::Fail(std::string("acquire_async: ") + kvtier_last_error());
      }
      size_t ready = 0;
      while (ready < std::min<size_t>(chunk, n)) {
        if (kvtier_acquire_async_ready(op, nullptr, 0, &ready) != KVTIER_OK) return cli::Fail(kvtier_last_error());
        if (kvtier_acquire_async_wait(op, 0) == KVTIER_OK) break;
      }
      a_first.push_back(Ms(Clock::now() - t0));
      if (kvtier_acquire_async_wait(op, -1) != KVTIER_OK) return cli::Fail(kvtier_last_error());
      a_restore.push_back(Ms(Clock::now() - t0));
      if (!finish(op)) return cli::Fail(std::string("acquire_async result: ") + kvtier_last_error());
    }
  }
  kvtier_close(c);
  const std::string cmd = "kvtier-bench overlap --tokens " + std::to_string(n * 16) + " --compute-ms " +
                          Fmt("%g", *compute_arg) + " --chunk " + std::to_string(chunk) + " --iters " +
                          std::to_string(*iters_arg);
  Report rep("overlap: TTFT of a prompt restored from NVMe, blocking acquire vs acquire_async", cmd);
  rep.SetColumns({"measure (median of " + std::to_string(*iters_arg) + ")", "ms"});
  rep.AddRow({"blocking: restore of " + std::to_string(n) + " blocks (acquire)", Fmt("%.1f", Median(b_restore))});
  rep.AddRow({"blocking: TTFT = restore, then compute", Fmt("%.1f", Median(b_ttft))});
  rep.AddRow({"async: TTFT = compute while restoring, then result", Fmt("%.1f", Median(a_ttft))});
  rep.AddRow({"async: first " + std::to_string(chunk) + " blocks usable", Fmt("%.2f", Median(a_first))});
  rep.AddRow({"async: whole restore in steps of " + std::to_string(chunk), Fmt("%.1f", Median(a_restore))});
  rep.AddNote(Fmt("TTFT saved: %.1f ms (%.0f%% of the blocking TTFT)", Median(b_ttft) - Median(a_ttft),
                  100.0 * (Median(b_ttft) - Median(a_ttft)) / std::max(Median(b_ttft), 1e-9)));
  rep.AddNote(Fmt("block %llu bytes in a 64 KiB slot, host target; the tail's compute is a sleep of %g ms; "
                  "every measurement starts with every block on NVMe only (kvtier_flush)",
                  static_cast<unsigned long long>(block_bytes), *compute_arg));
  const std::string path = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(path); !s.ok()) return cli::Fail(s.ToString());
  return 0;
}

cli::CommandRegistrar reg("overlap", "TTFT from NVMe: blocking acquire vs acquire_async overlapped with compute", Run,
                          "[--tokens N] [--compute-ms MS] [--chunk N] [--iters N] [--results FILE | --no-append]\n"
                          "  --tokens N       prompt length, 16-token blocks, 32-65536 (default 32768)\n"
                          "  --compute-ms MS  the engine's compute of the uncached tail, a sleep (default 50)\n"
                          "  --chunk N        blocks per readiness step of acquire_async (default 16)\n"
                          "  --iters N        measurements of each kind (default 5)\n"
    + std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
