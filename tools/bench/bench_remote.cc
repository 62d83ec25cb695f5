// kvtier-bench remote: the remote tier (a Redis Cluster) against raw pipelined GETs of
// values of the same size, measured in the same run on the same cluster.
//
//   baseline  hiredis directly, redis-benchmark style: one connection per master, each
//             batch of --batch keys pipelined (all GETs written to every master before any
//             reply is read), values of the block's size stored under plain keys.
//   remote    RemoteTier::GetBatch: the same batches through the cluster client, every
//             value verified (envelope, record header, contract, key, XXH3 of the payload)
//             and copied out.
//   restore   TierManager Acquire into host of blocks that live only in the remote tier:
//             the above plus host slot allocation, commit, pin. Target: >= 80% of raw.
//   writes    RemoteTier::PutBatch (record encoding, zstd attempt, SET) vs raw pipelined SETs.
//   TLS       the same tier writes, reads and restores against a second cluster started in
//             the script's --secure mode (TLS only, client certificates, ACL user kvtier),
//             in the same repetitions, reported as ratios to the plain cluster's rows.
//
// Without --nodes it starts its own 6-node cluster (scripts/redis-cluster.sh) on
// --port..--port+5 and the secure one on --port+10..+15 under /tmp, and stops them at
// the end. With --nodes (or --no-tls) the TLS rows are left out.
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "formats/contract.h"
#include "tiers/remote/cluster_client.h"
#include "tiers/remote/remote_tier.h"
#include "tiers/tier_manager.h"
#include "tools/bench/report.h"
#include "tools/cli.h"

namespace kvtier::bench {
namespace {

using Clock = std::chrono::steady_clock;
using namespace kvtier::tiers;

double Secs(Clock::time_point a) { return SecondsSince(a); }

// Raw pipelined GET/SET over one hiredis connection per master.
class RawCluster {
 public:
  ~RawCluster() {
    for (auto& [n, c] : conns_) redisFree(c);
  }
  Status Connect(remote::ClusterClient& cc, const std::vector<std::string>& keys) {
    for (const auto& k : keys) {
      const std::string node = cc.NodeForSlot(remote::KeySlot(k));
      if (node.empty()) return Status::IoError("no owner for " + k);
      node_of_.push_back(node);
      if (conns_.count(node)) continue;
      std::string host;
      uint16_t port = 0;
      KVTIER_RETURN_IF_ERROR(remote::ParseHostPort(node, &host, &port));
      redisContext* c = redisConnect(host.c_str(), port);
      if (!c || c->err) return Status::IoError("connect " + node);
      c->reader->maxbuf = 0;
      conns_[node] = c;
    }
    keys_ = keys;
    return Status::Ok();
  }
  // GETs (value == nullptr) or SETs of keys[lo, hi); returns bytes moved.
  StatusOr<uint64_t> Batch(size_t lo, size_t hi, const std::string* value) {
    std::map<std::string, size_t> sent;
    for (size_t i = lo; i < hi; ++i) {
      redisContext* c = conns_[node_of_[i]];
      if (value) {
        redisAppendCommand(c, "SET %b %b", keys_[i].data(), keys_[i].size(), value->data(), value->size());
      } else {
        redisAppendCommand(c, "GET %b", keys_[i].data(), keys_[i].size());
      }
      ++sent[node_of_[i]];
    }
    for (auto& [n, k] : sent) {  // flush every master first, so they work in parallel
      int done = 0;
      while (!done) {
        if (redisBufferWrite(conns_[n], &done) != REDIS_OK) return Status::IoError("write " + n);
      }
    }
    uint64_t bytes = 0;
    for (auto& [n, k] : sent) {
      for (size_t j = 0; j < k; ++j) {
        void* r = nullptr;
        if (redisGetReply(conns_[n], &r) != REDIS_OK || !r) return Status::IoError("read " + n);
        auto* rep = static_cast<redisReply*>(r);
        if (rep->type == REDIS_REPLY_STRING) bytes += rep->len;
        const bool bad = rep->type == REDIS_REPLY_ERROR || (!value && rep->type != REDIS_REPLY_STRING);
        freeReplyObject(rep);
        if (bad) return Status::IoError("unexpected reply from " + n);
      }
    }
    return value ? uint64_t{(hi - lo) * value->size()} : bytes;
  }

 private:
  std::map<std::string, redisContext*> conns_;
  std::vector<std::string> keys_, node_of_;
};

std::vector<SlotRef> AcquireSync(TierManager& tm, uint64_t cid, const std::vector<Key128>& keys) {
  std::promise<std::vector<SlotRef>> p;
  tm.Acquire(cid, keys, Tier::kHost, [&](Status, std::vector<SlotRef> v) { p.set_value(std::move(v)); });
  return p.get_future().get();
}

int Run(const std::vector<std::string>& argv) {
  auto args = cli::Args::Parse(argv, {"no-append", "no-tls"});
  if (!args.ok()) return cli::Fail("remote: " + args.status().message(), 2);
  if (Status s = args->CheckKnown({"nodes", "port", "blocks", "layers", "batch", "reps", "no-append", "no-tls", "results"});
      !s.ok()) {
    return cli::Fail("bench remote: " + s.message(), 2);
  }
  auto blocks_a = args->GetInt("blocks", 64);
  auto layers_a = args->GetInt("layers", 80);
  auto batch_a = args->GetInt("batch", 16);
  auto reps_a = args->GetInt("reps", 5);
  auto port_a = args->GetInt("port", 7450);
  if (!blocks_a.ok() || !layers_a.ok() || !batch_a.ok() || !reps_a.ok() || !port_a.ok() || *blocks_a < 4 ||
      *blocks_a > 4096 || *layers_a < 1 || *layers_a > 1024 || *batch_a < 1 || *batch_a > 1024 || *reps_a < 1 ||
      *reps_a > 100 || *port_a < 1024 || *port_a > 55000) {
    return cli::Fail("bench remote: --blocks in [4, 4096], --layers in [1, 1024], --batch in [1, 1024], --reps in [1, 100], --port in [1024, 55000]", 2);
  }
  const size_t nblocks = static_cast<size_t>(*blocks_a);
  const size_t batch = static_cast<size_t>(*batch_a);
  const int reps = static_cast<int>(*reps_a);

  // The cluster: given, or our own.
  std::vector<std::string> nodes;
  std::string own_dir;
  if (auto n = args->Get("nodes")) {
    std::stringstream ss(*n);
    std::string item;
    while (std::getline(ss, item, ',')) nodes.push_back(item);
  } else {
    own_dir = "/tmp/kvtier-bench-redis-" + std::to_string(getpid());
    const std::string cmd = std::string(KVTIER_SOURCE_DIR) + "/scripts/redis-cluster.sh start " + own_dir + " " +
                            std::to_string(*port_a) + " >/dev/null";
    if (std::system(cmd.c_str()) != 0) return cli::Fail("bench remote: could not start a Redis Cluster (" + cmd + ")");
    for (int i = 0; i < 6; ++i) nodes.push_back("127.0.0.1:" + std::to_string(*port_a + i));
  }
  struct Cleanup {
    std::string d;
    ~Cleanup() {
      if (!d.empty()) (void)!std::system((std::string(KVTIER_SOURCE_DIR) + "/scripts/redis-cluster.sh stop " + d).c_str());
    }
  } cleanup{own_dir};
  // The secure cluster, for the TLS rows.
  const bool with_tls = !own_dir.empty() && !args->Has("no-tls");
  std::vector<std::string> tls_nodes;
  std::string tls_dir;
  if (with_tls) {
    tls_dir = own_dir + "-tls";
    const std::string cmd = std::string(KVTIER_SOURCE_DIR) + "/scripts/redis-cluster.sh start " + tls_dir + " " +
                            std::to_string(*port_a + 10) + " --secure >/dev/null";
    if (std::system(cmd.c_str()) != 0) {
      return cli::Fail("bench remote: could not start the secure Redis Cluster (" + cmd + ")");
    }
    for (int i = 0; i < 6; ++i) tls_nodes.push_back("127.0.0.1:" + std::to_string(*port_a + 10 + i));
  }
  Cleanup tls_cleanup{tls_dir};

  ScaleContract c;
  c.model_id = "bench/remote";
  c.geometry = Geometry{static_cast<uint32_t>(*layers_a), 8, 128, 16};
  c.SetUnitScales();
  if (Status s = c.Validate(); !s.ok()) return cli::Fail("bench remote: " + s.ToString());
  const uint64_t block = c.block_bytes(), slot = c.slot_bytes();
  const uint64_t cid = c.Id();
  const double gb = static_cast<double>(nblocks * block) / 1e9;
  std::printf("remote bench: %zu blocks of %llu bytes (%.2f GB) in batches of %zu, cluster via %s\n", nblocks,
              static_cast<unsigned long long>(block), gb, batch, nodes[0].c_str());

  // Blocks: random bytes (NVFP4 codes look like that; zstd does not pay, so they are stored).
  std::mt19937_64 rng(42);
  std::vector<std::vector<uint8_t>> data(nblocks, std::vector<uint8_t>(block));
  std::vector<Key128> keys(nblocks);
  for (size_t i = 0; i < nblocks; ++i) {
    for (size_t j = 0; j + 8 <= block; j += 8) {
      const uint64_t x = rng();
      std::memcpy(&data[i][j], &x, 8);
    }
    keys[i] = Key128{rng(), rng()};
  }
  remote::RemoteOptions ro;
  ro.nodes = nodes;
  ro.batch = static_cast<uint32_t>(batch);
  ro.write = remote::RemoteWrite::kOff;
  ro.command_timeout_ms = 5000;
  auto rt = remote::RemoteTier::Open(ro);
  if (!rt.ok()) return cli::Fail("bench remote: " + rt.status().ToString());
  remote::RemoteTier& remote = **rt;
  std::vector<std::string> raw_keys(nblocks);
  for (size_t i = 0; i < nblocks; ++i) raw_keys[i] = "rawbench:" + std::to_string(i);
  RawCluster raw;
  if (Status s = raw.Connect(remote.client(), raw_keys); !s.ok()) return cli::Fail("bench remote: " + s.ToString());
  const std::string raw_value(block, 'x');

  TierManagerOptions to;
  to.slot_bytes = slot;
  to.host.capacity_bytes = (nblocks + 8) * slot;
  to.host.high_watermark = 1.0;
  to.host.low_watermark = 0.99;
  to.remote = ro;
  auto tmo = TierManager::Open(to);
  if (!tmo.ok()) return cli::Fail(tmo.status().ToString());
  TierManager& tm = **tmo;
  if (Status st = tm.RegisterContract(c); !st.ok()) return cli::Fail(st.ToString());

  // The same tier and engine over TLS as the ACL user.
  std::unique_ptr<remote::RemoteTier> tls_tier;
  std::unique_ptr<TierManager> tls_tm;
  if (with_tls) {
    remote::RemoteOptions so = ro;
    so.nodes = tls_nodes;
    so.user = "kvtier";
    so.password_file = tls_dir + "/kvtier.password";
    so.tls.enabled = true;
    so.tls.ca_file = tls_dir + "/tls/ca.crt";
    so.tls.cert_file = tls_dir + "/tls/client.crt";
    so.tls.key_file = tls_dir + "/tls/client.key";
    auto st = remote::RemoteTier::Open(so);
    if (!st.ok()) return cli::Fail("bench remote: TLS: " + st.status().ToString());
    tls_tier = std::move(st.value());
    TierManagerOptions sto = to;
    sto.remote = so;
    auto sm = TierManager::Open(sto);
    if (!sm.ok()) return cli::Fail("bench remote: TLS: " + sm.status().ToString());
    tls_tm = std::move(sm.value());
    if (Status st2 = tls_tm->RegisterContract(c); !st2.ok()) return cli::Fail(st2.ToString());
  }

  std::vector<double> raw_set, put, raw_get, get, restore;  // GB/s per repetition
  std::vector<double> q_put, q_get, q_restore;
  std::vector<double> tls_put, tls_get, tls_restore, q_tls_put, q_tls_get, q_tls_restore;  // TLS / plain
  std::vector<std::vector<uint8_t>> out(nblocks, std::vector<uint8_t>(block));
  // PutBatch, GetBatch (checked) and restore of every block through one tier and engine:
  // GB/s of each, or a failure message.
  auto tier_pass = [&](remote::RemoteTier& t, TierManager& m, double* put_gbps, double* get_gbps,
                       double* restore_gbps) -> std::string {
    auto a = Clock::now();
    for (size_t i = 0; i < nblocks; i += batch) {
      std::vector<remote::PutItem> items;
      for (size_t j = i; j < std::min(nblocks, i + batch); ++j) {
        items.push_back({cid, keys[j], j ? keys[j - 1] : Key128{}, data[j]});
      }
      if (t.PutBatch(items) != items.size()) return "a PutBatch failed";
    }
    *put_gbps = gb / Secs(a);
    a = Clock::now();
    for (size_t i = 0; i < nblocks; i += batch) {
      std::vector<remote::GetItem> items;
      for (size_t j = i; j < std::min(nblocks, i + batch); ++j) items.push_back({cid, keys[j], out[j], Status(), Key128{}});
      t.GetBatch(items);
      for (const auto& it : items) {
        if (!it.status.ok()) return "GetBatch: " + it.status.ToString();
      }
    }
    *get_gbps = gb / Secs(a);
    for (size_t j = 0; j < nblocks; ++j) {
      if (out[j] != data[j]) return "block " + std::to_string(j) + " differs";
    }
    a = Clock::now();
    auto got = AcquireSync(m, cid, keys);
    *restore_gbps = gb / Secs(a);
    if (got.size() != nblocks) return "restore returned " + std::to_string(got.size()) + " blocks";
    for (auto s : got) (void)m.Unpin(s);
    for (const Key128& k : keys) (void)m.Evict(cid, k);  // remote only again
    return "";
  };
  for (int r = 0; r < reps; ++r) {
    // Writes.
    auto a = Clock::now();
    for (size_t i = 0; i < nblocks; i += batch) {
      auto s = raw.Batch(i, std::min(nblocks, i + batch), &raw_value);
      if (!s.ok()) return cli::Fail("raw SET: " + s.status().ToString());
    }
    raw_set.push_back(gb / Secs(a));
    // Reads: raw, then RemoteTier and TierManager restore (after the tier's writes).
    a = Clock::now();
    uint64_t bytes = 0;
    for (size_t i = 0; i < nblocks; i += batch) {
      auto s = raw.Batch(i, std::min(nblocks, i + batch), nullptr);
      if (!s.ok()) return cli::Fail("raw GET: " + s.status().ToString());
      bytes += *s;
    }
    raw_get.push_back(gb / Secs(a));
    if (bytes != nblocks * block) return cli::Fail("raw GET returned short values");
    double p = 0, g = 0, rs = 0;
    if (std::string e = tier_pass(remote, tm, &p, &g, &rs); !e.empty()) return cli::Fail("bench remote: " + e);
    put.push_back(p);
    get.push_back(g);
    restore.push_back(rs);
    q_put.push_back(put.back() / raw_set.back());
    q_get.push_back(get.back() / raw_get.back());
    q_restore.push_back(restore.back() / raw_get.back());
    if (tls_tier) {
      if (std::string e = tier_pass(*tls_tier, *tls_tm, &p, &g, &rs); !e.empty()) {
        return cli::Fail("bench remote: TLS: " + e);
      }
      tls_put.push_back(p);
      tls_get.push_back(g);
      tls_restore.push_back(rs);
      q_tls_put.push_back(p / put.back());
      q_tls_get.push_back(g / get.back());
      q_tls_restore.push_back(rs / restore.back());
    }
  }
  const auto st = remote.stats();
  if (st.corrupt != 0 || (tls_tier && tls_tier->stats().corrupt != 0)) {
    return cli::Fail("bench remote: corrupt values counted");
  }

  Report rep("remote: Redis Cluster tier vs raw pipelined GET/SET",
             "build/bin/kvtier-bench remote --blocks " + std::to_string(nblocks) + " --layers " +
                 std::to_string(*layers_a) + " --batch " + std::to_string(batch) + " --reps " + std::to_string(reps));
  rep.SetColumns({"path", "GB/s (payload)", "ratio to baseline", "target"});
  auto row = [&](const std::string& name, double gbps, double ratio, const char* target) {
    rep.AddRow({name, Fmt("%.3f", gbps), Fmt("%.3f", ratio), target});
  };
  row("raw pipelined GET, hiredis, one connection per master (baseline)", Median(raw_get), 1.0, "");
  row("RemoteTier::GetBatch (cluster routing + record verification)", Median(get), Median(q_get), "");
  row("TierManager Acquire, remote -> host (restore)", Median(restore), Median(q_restore), ">= 0.80");
  row("raw pipelined SET (baseline)", Median(raw_set), 1.0, "");
  row("RemoteTier::PutBatch (record encoding, zstd attempt, SET)", Median(put), Median(q_put), "");
  if (tls_tier) {
    row("TLS + ACL: RemoteTier::GetBatch (ratio to the plain GetBatch)", Median(tls_get), Median(q_tls_get), "");
    row("TLS + ACL: TierManager Acquire, remote -> host (ratio to the plain restore)", Median(tls_restore),
        Median(q_tls_restore), "");
    row("TLS + ACL: RemoteTier::PutBatch (ratio to the plain PutBatch)", Median(tls_put), Median(q_tls_put), "");
    std::printf("remote bench: restore over TLS + ACL is %.3f of the plain cluster's (%.3f vs %.3f GB/s)\n",
                Median(q_tls_restore), Median(tls_restore), Median(restore));
  }
  rep.AddNote(Fmt("%zu blocks of %llu bytes (random bytes: zstd does not pay, values stored), batches of %zu; "
                  "median of %d repetitions (ratios per repetition, then the median). Cluster: 3 masters + 3 "
                  "replicas on loopback (%s), the bench and all six redis-server processes on the same machine.",
                  nblocks, static_cast<unsigned long long>(block), batch, reps,
                  own_dir.empty() ? "given by --nodes" : "started by the bench"));
  if (tls_tier) {
    rep.AddNote(Fmt("TLS rows: a second cluster in redis-cluster.sh --secure mode (TLS only, 1.3 as negotiated, client "
                    "certificates, ACL user kvtier; ports %lld..%lld), measured in the same repetitions right "
                    "after the plain rows; ratio = TLS / plain of the same path per repetition, then the median.",
                    static_cast<long long>(*port_a + 10), static_cast<long long>(*port_a + 15)));
  }
  const std::string results = args->Has("no-append") ? "" : args->Get("results").value_or(Report::DefaultResultsPath());
  if (Status s = rep.Emit(results); !s.ok()) return cli::Fail(s.message());
  return 0;
}

const cli::CommandRegistrar kReg(
    "remote", "remote tier (Redis Cluster) restore and writes vs raw pipelined GET/SET", Run,
    "[--nodes H:P,...] [--port P] [--blocks N] [--layers N] [--batch N] [--reps N] [--no-tls] [--results FILE | --no-append]\n"
    "  --nodes H:P,...  an existing Redis Cluster (default: start 3 masters + 3 replicas on --port..+5)\n"
    "  --port P         first port of the cluster it starts, 1024-55000 (default 7450)\n"
    "  --blocks N       blocks restored and written, 4-4096 (default 64)\n"
    "  --layers N       layers per block, 1-1024 (default 80)\n"
    "  --batch N        blocks per pipelined batch, 1-1024 (default 16)\n"
    "  --reps N         repetitions; the median is reported, 1-100 (default 5)\n"
    "  --no-tls         leave out the TLS rows (the secure cluster on --port+10..+15)\n"
    + std::string(kvtier::bench::kResultsUsage));

}  // namespace
}  // namespace kvtier::bench
