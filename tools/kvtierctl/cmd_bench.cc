// kvtierctl bench replay: replays a trace (kvtier JSON lines or the Mooncake FAST'25
// format) or a generated agentic workload, once per KV format at the same tier budgets,
// and reports hit rate by tier, recomputed tokens, bytes promoted/demoted and the
// prefill time saved. --simulate runs kvtier's eviction policies in-process (no daemon);
// --sweep also varies the HBM budget (and --plot draws hit rate against it).
//
// kvtierctl bench policies: every eviction policy at several budgets on one trace, next
// to plain LRU and the infinite-cache bound.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <thread>
#include <cstdio>
#include <fstream>
#include <array>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "formats/layout.h"
#include "tiers/policy/policy.h"
#include "tools/bench/daemon_proc.h"
#include "tools/bench/report.h"
#include "tools/cli.h"
#include "tools/replay/driver.h"
#include "tools/replay/simulate.h"
#include "tools/replay/trace.h"

namespace kvtier {
namespace {

using cli::Fail;
using nlohmann::json;

constexpr const char* kUsage = R"(usage:
  kvtierctl bench replay --simulate [--trace FILE | generator options] [options]
  kvtierctl bench replay --spawn [--nvme SIZE] [...]      one kvtierd per format
  kvtierctl [--socket PATH] bench replay [...]          a running kvtierd (one format)
  kvtierctl bench policies [--trace FILE | generator options] [options]

workload (default: the built-in agentic generator):
  --trace FILE            kvtier JSON lines or a Mooncake FAST'25 trace
  --requests N --sessions N --system-prompts N --system-tokens N
  --first-turn-tokens N --turn-tokens N --max-turns N --zipf A --seed N
  --quick                 a small generated workload (200 requests) that runs in seconds
  --save-trace FILE       write the generated workload as kvtier JSON lines
model geometry (the block size comes from it and the format):
  --layers L (32) --kv-heads H (8) --head-dim D (128) --block-tokens T (16)
tiers:
  --hbm SIZE (4GiB) --host SIZE (16GiB) --policy lru|s3fifo|prefix-lru (prefix-lru)
  --formats nvfp4,fp8,bf16
replay:
  --sweep SIZE,SIZE,...   HBM budgets to sweep (replay) or budgets to test (policies)
  --prefill-tok-s R       prefill rate for the time-saved estimate (20000)
  --json                  one JSON document on stdout
  --plot FILE.svg         hit rate against HBM budget, one line per format
  --append                append the table to bench/history/results.md
)";

const std::vector<std::string> kKnown = {
    "trace", "requests", "sessions", "system-prompts", "system-tokens", "first-turn-tokens",
    "turn-tokens", "max-turns", "zipf", "seed", "save-trace", "layers", "kv-heads", "head-dim",
    "block-tokens", "hbm", "host", "policy", "formats", "sweep", "prefill-tok-s", "json", "plot",
    "append", "simulate", "results", "spawn", "socket", "nvme", "verify-full", "max-requests", "quick"};

struct Setup {
  std::vector<replay::Request> reqs;
  replay::KeyedTrace keyed;  // key chains, computed once
  std::string workload;
  Geometry geo;
  uint64_t hbm = 0, host = 0;
  tiers::PolicyKind policy = tiers::PolicyKind::kPrefixLru;
  std::vector<KvFormat> formats;
  std::vector<uint64_t> sweep;
  double prefill_tok_s = 20000;
};

StatusOr<std::vector<uint64_t>> ParseSizes(const std::string& list) {
  std::vector<uint64_t> out;
  std::stringstream ss(list);
  std::string item;
  while (std::getline(ss, item, ',')) {
    auto s = cli::ParseSize(item);
    if (!s.ok()) return s.status();
    out.push_back(*s);
  }
  if (out.empty()) return Status::Invalid("empty size list");
  return out;
}

StatusOr<Setup> ParseSetup(const cli::Args& a) {
  Setup s;
  auto u32 = [&](const char* name, int64_t def, int64_t lo, int64_t hi) -> StatusOr<uint32_t> {
    auto v = a.GetInt(name, def);
    if (!v.ok()) return v.status();
    if (*v < lo || *v > hi) {
      return Status::Invalid(std::string("--") + name + " must be in [" + std::to_string(lo) +
                             ", " + std::to_string(hi) + "]");
    }
    return static_cast<uint32_t>(*v);
  };
#define KVT_U32(var, name, def, lo, hi)        \
  {                                            \
    auto _v = u32(name, def, lo, hi);          \
    if (!_v.ok()) return _v.status();          \
    var = *_v;                                 \
  }
  KVT_U32(s.geo.num_layers, "layers", 32, 1, 1024);
  KVT_U32(s.geo.num_kv_heads, "kv-heads", 8, 1, 256);
  KVT_U32(s.geo.head_dim, "head-dim", 128, 16, 1024);
  KVT_U32(s.geo.block_tokens, "block-tokens", 16, 1, 1024);
  for (KvFormat f : {KvFormat::kNvfp4, KvFormat::kFp8, KvFormat::kBf16}) {
    KVTIER_RETURN_IF_ERROR(s.geo.Validate(f));
  }
  if (auto t = a.Get("trace")) {
    auto r = replay::LoadTrace(*t);
    if (!r.ok()) return r.status();
    s.reqs = std::move(*r);
    s.workload = "trace " + *t;
  } else {
    replay::GeneratorOptions g;
    if (a.Has("quick")) {  // a small workload that finishes in seconds (README one-liner)
      g.requests = 200;
      g.sessions = 20;
      g.system_tokens = 512;
      g.first_turn_tokens = 256;
      g.turn_tokens = 128;
      g.max_turns = 8;
    }
    KVT_U32(g.requests, "requests", g.requests, 1, 10'000'000);
    KVT_U32(g.sessions, "sessions", g.sessions, 1, 10'000'000);
    KVT_U32(g.system_prompts, "system-prompts", g.system_prompts, 1, 100000);
    KVT_U32(g.system_tokens, "system-tokens", g.system_tokens, 0, 1 << 20);
    KVT_U32(g.first_turn_tokens, "first-turn-tokens", g.first_turn_tokens, 0, 1 << 20);
    KVT_U32(g.turn_tokens, "turn-tokens", g.turn_tokens, 0, 1 << 20);
    KVT_U32(g.max_turns, "max-turns", g.max_turns, 1, 100000);
    auto z = a.GetDouble("zipf", g.zipf_alpha);
    if (!z.ok()) return z.status();
    g.zipf_alpha = *z;
    auto seed = a.GetInt("seed", 1);
    if (!seed.ok()) return seed.status();
    g.seed = static_cast<uint64_t>(*seed);
    KVTIER_RETURN_IF_ERROR(g.Validate());
    s.reqs = replay::GenerateAgentic(g);
    s.workload = "generated agentic workload (" + std::to_string(g.requests) + " requests, " +
                 std::to_string(g.sessions) + " sessions, zipf " + bench::Fmt("%.2f", g.zipf_alpha) +
                 ", seed " + std::to_string(g.seed) + ")";
    if (auto path = a.Get("save-trace")) KVTIER_RETURN_IF_ERROR(replay::WriteKvtierTrace(*path, s.reqs));
  }
#undef KVT_U32
  auto hbm = cli::ParseSize(a.Get("hbm").value_or("4GiB"));
  auto host = cli::ParseSize(a.Get("host").value_or("16GiB"));
  if (!hbm.ok()) return Status::Invalid("--hbm: " + hbm.status().message());
  if (!host.ok()) return Status::Invalid("--host: " + host.status().message());
  s.hbm = *hbm;
  s.host = *host;
  if (!tiers::ParsePolicy(a.Get("policy").value_or("prefix-lru"), &s.policy)) {
    return Status::Invalid("--policy must be lru, s3fifo or prefix-lru");
  }
  // Against one running daemon (fixed slot size) the default is the format it is sized
  // for; the simulation and --spawn compare all three.
  const bool one_daemon = !a.Has("simulate") && !a.Has("spawn");
  std::stringstream fs(a.Get("formats").value_or(one_daemon ? "nvfp4" : "nvfp4,fp8,bf16"));
  std::string f;
  while (std::getline(fs, f, ',')) {
    KvFormat k;
    if (!ParseKvFormat(f.c_str(), &k)) return Status::Invalid("--formats: unknown format '" + f + "'");
    s.formats.push_back(k);
  }
  if (s.formats.empty()) return Status::Invalid("--formats is empty");
  if (auto sw = a.Get("sweep")) {
    auto v = ParseSizes(*sw);
    if (!v.ok()) return Status::Invalid("--sweep: " + v.status().message());
    s.sweep = *v;
  }
  s.keyed = replay::KeyTrace(s.reqs, s.geo.block_tokens);
  auto rate = a.GetDouble("prefill-tok-s", 20000.0);
  if (!rate.ok()) return rate.status();
  if (*rate <= 0) return Status::Invalid("--prefill-tok-s must be > 0");
  s.prefill_tok_s = *rate;
  return s;
}

std::string GiB(uint64_t b) { return bench::Fmt("%.2f GiB", b / 1073741824.0); }

replay::SimResult Simulate1(const Setup& s, KvFormat f, uint64_t hbm, tiers::PolicyKind p) {
  replay::SimOptions o;
  o.format = f;
  o.geometry = s.geo;
  o.tiers = {{"hbm", hbm, p}, {"host", s.host, p}};
  return replay::Simulate(s.keyed, o);
}

// Runs jobs[i]() on up to hardware_concurrency threads (each simulation is independent).
void Parallel(std::vector<std::function<void()>> jobs) {
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  const size_t n = std::max(1u, std::min<unsigned>(std::thread::hardware_concurrency(), 8));
  for (size_t t = 0; t < n; ++t) {
    pool.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < jobs.size();) jobs[i]();
    });
  }
  for (auto& th : pool) th.join();
}

Status WritePlot(const std::string& path, const std::vector<uint64_t>& budgets,
                 const std::map<KvFormat, std::vector<double>>& curves, double bound) {
  const double W = 640, H = 400, L = 60, R = 20, Tp = 30, B = 50;
  const double xmax = static_cast<double>(budgets.back()), xmin = static_cast<double>(budgets.front());
  auto X = [&](double v) {
    const double lo = std::log2(xmin), hi = std::log2(xmax);
    return L + (hi > lo ? (std::log2(v) - lo) / (hi - lo) : 0.5) * (W - L - R);
  };
  auto Y = [&](double h) { return Tp + (1.0 - h) * (H - Tp - B); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << L << "' y='18'>prefix hit rate vs HBM budget (host budget fixed)</text>\n";
  for (int i = 0; i <= 5; ++i) {
    const double h = i / 5.0;
    o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(h) << "' y2='" << Y(h)
      << "' stroke='#ddd'/><text x='" << L - 35 << "' y='" << Y(h) + 4 << "'>" << bench::Fmt("%.1f", h) << "</text>\n";
  }
  for (uint64_t b : budgets) {
    o << "<text x='" << X(b) - 20 << "' y='" << H - B + 18 << "'>" << bench::Fmt("%.1fG", b / 1073741824.0) << "</text>\n";
  }
  o << "<line x1='" << L << "' x2='" << W - R << "' y1='" << Y(bound) << "' y2='" << Y(bound)
    << "' stroke='black' stroke-dasharray='4 3'/><text x='" << W - R - 110 << "' y='" << Y(bound) - 4
    << "'>infinite cache</text>\n";
  const std::map<KvFormat, const char*> color = {{KvFormat::kNvfp4, "#1b7837"}, {KvFormat::kFp8, "#2166ac"}, {KvFormat::kBf16, "#b2182b"}};
  int li = 0;
  for (const auto& [f, c] : curves) {
    o << "<polyline fill='none' stroke-width='2' stroke='" << color.at(f) << "' points='";
    for (size_t i = 0; i < budgets.size(); ++i) o << X(budgets[i]) << "," << Y(c[i]) << " ";
    o << "'/>\n<text x='" << L + 10 + 90 * li << "' y='" << H - 12 << "' fill='" << color.at(f) << "'>" << KvFormatName(f) << "</text>\n";
    ++li;
  }
  o << "<text x='" << W - R - 80 << "' y='" << H - 12 << "'>HBM budget</text>\n</svg>\n";
  const std::string svg = o.str();
  return cli::WriteFileAtomic(path, svg.data(), svg.size());
}

// Tiers of a kvtierd spawned for one format: slots of that format's block size, the
// same host and NVMe budgets for every format, no HBM.
std::string SpawnTiers(KvFormat f, const Geometry& g, uint64_t host, uint64_t nvme) {
  const uint64_t slot = SlotBytes(f, g);
  return "[tiers]\nslot_bytes = \"" + std::to_string(slot) + "B\"\n[tiers.host]\ncapacity = \"" +
         std::to_string(host / slot * slot) + "B\"\n[tiers.nvme]\ncapacity = \"" +
         std::to_string(nvme / slot * slot) + "B\"\ndir = \"{dir}/nvme\"";
}

int ReplayDaemon(const cli::Args& a, const Setup& s) {
  const bool spawn = a.Has("spawn");
  uint64_t nvme = 0;
  if (auto v = a.Get("nvme")) {
    auto n = cli::ParseSize(*v);
    if (!n.ok()) return Fail("bench replay: --nvme: " + n.status().message(), 2);
    nvme = *n;
  }
  std::vector<replay::Request> reqs = s.reqs;
  if (auto m = a.GetInt("max-requests", 0); m.ok() && *m > 0 && static_cast<size_t>(*m) < reqs.size()) reqs.resize(*m);
  const std::string socket = a.Get("socket").value_or(cli::SocketPath());
  bench::Report rep(std::string("replay through kvtierd: KV formats at the same budgets") +
                        (spawn ? " (one daemon per format)" : ""),
                    "build/bin/kvtierctl bench replay " + std::string(spawn ? "--spawn" : "--socket " + socket) +
                        " --host " + GiB(s.host) + (nvme ? " --nvme " + GiB(nvme) : ""));
  rep.SetColumns({"format", "slot bytes", "tokens held", "vs fp8", "hit rate", "hbm/host/nvme hits",
                  "recomputed tokens", "promoted", "demoted", "stores declined", "wrong blocks", "errors", "req/s"});
  json doc;
  std::map<KvFormat, replay::DriveResult> res;
  for (KvFormat f : s.formats) {
    bench::DaemonProc sp;
    replay::DriveOptions o;
    o.format = f;
    o.geometry = s.geo;
    o.verify_full = a.Has("verify-full");
    o.socket = socket;
    if (spawn) {
      if (Status st = bench::StartDaemon(&sp, SpawnTiers(f, s.geo, s.host, nvme)); !st.ok()) {
        return Fail("bench replay: " + st.message());
      }
      o.socket = sp.socket;
    }
    std::fprintf(stderr, "replaying %zu requests as %s through %s ...\n", reqs.size(), KvFormatName(f), o.socket.c_str());
    auto r = replay::Drive(reqs, o);
    if (!r.ok()) return Fail("bench replay: " + std::string(KvFormatName(f)) + ": " + r.status().message());
    res[f] = *r;
  }
  const uint64_t fp8_blocks = res.count(KvFormat::kFp8) ? res[KvFormat::kFp8].total_capacity_blocks : 0;
  int rc = 0;
  for (KvFormat f : s.formats) {
    const auto& r = res[f];
    const uint64_t tokens = r.total_capacity_blocks * s.geo.block_tokens;
    json j;
    j["format"] = KvFormatName(f);
    j["slot_bytes"] = r.slot_bytes;
    j["tokens_held"] = tokens;
    j["hit_rate"] = r.hit_rate();
    j["hits_by_tier"] = {{"hbm", r.hits_by_tier[0]}, {"host", r.hits_by_tier[1]}, {"nvme", r.hits_by_tier[2]}};
    j["recomputed_tokens"] = r.recomputed_tokens;
    j["prefill_seconds_saved"] = (r.prompt_tokens - r.recomputed_tokens) / s.prefill_tok_s;
    j["promoted_bytes"] = r.promoted_bytes;
    j["demoted_bytes"] = r.demoted_bytes;
    j["wrong_blocks"] = r.wrong_blocks;
    j["stores_declined"] = r.stores_declined;
    j["errors"] = r.errors;
    if (!r.first_error.empty()) j["first_error"] = r.first_error;
    doc["formats"].push_back(j);
    rep.AddRow({KvFormatName(f), std::to_string(r.slot_bytes), std::to_string(tokens),
                fp8_blocks ? bench::Fmt("%.3fx", static_cast<double>(r.total_capacity_blocks) / fp8_blocks) : "-",
                bench::Fmt("%.4f", r.hit_rate()),
                std::to_string(r.hits_by_tier[0]) + "/" + std::to_string(r.hits_by_tier[1]) + "/" + std::to_string(r.hits_by_tier[2]),
                std::to_string(r.recomputed_tokens), GiB(r.promoted_bytes), GiB(r.demoted_bytes),
                std::to_string(r.stores_declined), std::to_string(r.wrong_blocks), std::to_string(r.errors), bench::Fmt("%.0f", r.requests / r.seconds)});
    if (r.wrong_blocks || r.errors) rc = 1;
    if (!r.first_error.empty()) rep.AddNote(std::string(KvFormatName(f)) + " first error: " + r.first_error);
  }
  rep.AddNote("Workload: " + s.workload + " (" + std::to_string(reqs.size()) + " requests). Every acquired block is checked against the content derived from its key.");
  if (a.Has("json")) {
    std::printf("%s\n", doc.dump(2).c_str());
  } else {
    const std::string path = a.Has("append") ? a.Get("results").value_or(bench::Report::DefaultResultsPath()) : "";
    if (auto st = rep.Emit(path); !st.ok()) return Fail("bench replay: " + st.message());
  }
  if (rc) std::fprintf(stderr, "kvtierctl: bench replay: wrong blocks or errors (see table)\n");
  return rc;
}

int Replay(const cli::Args& a) {
  auto s = ParseSetup(a);
  if (!s.ok()) return Fail("bench replay: " + s.status().message(), 2);
  if (!a.Has("simulate")) return ReplayDaemon(a, *s);
  if (!s.ok()) return Fail("bench replay: " + s.status().message(), 2);
  const bool as_json = a.Has("json");
  json doc;
  doc["workload"] = s->workload;
  doc["requests"] = s->reqs.size();
  doc["hbm_bytes"] = s->hbm;
  doc["host_bytes"] = s->host;
  doc["policy"] = tiers::PolicyName(s->policy);
  const double bound = replay::InfiniteBoundHitRate(s->keyed);
  doc["infinite_bound_hit_rate"] = bound;
  bench::Report rep("replay: KV formats at the same tier budgets (simulated, " +
                        std::string(tiers::PolicyName(s->policy)) + ")",
                    "build/bin/kvtierctl bench replay --simulate --hbm " + GiB(s->hbm) + " --host " + GiB(s->host));
  rep.SetColumns({"format", "block bytes", "tokens held", "vs fp8", "hit rate", "hbm hits",
                  "host hits", "recomputed tokens", "promoted", "demoted", "prefill saved (s)"});
  uint64_t fp8_tokens = 0;
  std::map<KvFormat, replay::SimResult> results;
  {
    std::vector<replay::SimResult> out(s->formats.size());
    std::vector<std::function<void()>> jobs;
    for (size_t i = 0; i < s->formats.size(); ++i) {
      jobs.push_back([&, i] { out[i] = Simulate1(*s, s->formats[i], s->hbm, s->policy); });
    }
    Parallel(std::move(jobs));
    for (size_t i = 0; i < s->formats.size(); ++i) results[s->formats[i]] = out[i];
  }
  if (results.count(KvFormat::kFp8)) fp8_tokens = results[KvFormat::kFp8].token_capacity(s->geo.block_tokens);
  for (KvFormat f : s->formats) {
    const auto& r = results[f];
    const uint64_t tokens = r.token_capacity(s->geo.block_tokens);
    const double saved = (r.prompt_tokens - r.recomputed_tokens) / s->prefill_tok_s;
    json j;
    j["format"] = KvFormatName(f);
    j["slot_bytes"] = r.slot_bytes;
    j["tokens_held"] = tokens;
    j["hit_rate"] = r.hit_rate();
    j["hits_by_tier"] = {{"hbm", r.hits_by_tier[0]}, {"host", r.hits_by_tier[1]}};
    j["blocks"] = r.blocks;
    j["recomputed_tokens"] = r.recomputed_tokens;
    j["prompt_tokens"] = r.prompt_tokens;
    j["promoted_bytes"] = r.promoted_blocks * r.slot_bytes;
    j["demoted_bytes"] = r.demoted_blocks * r.slot_bytes;
    j["prefill_seconds_saved"] = saved;
    doc["formats"].push_back(j);
    rep.AddRow({KvFormatName(f), std::to_string(r.slot_bytes), std::to_string(tokens),
                fp8_tokens ? bench::Fmt("%.3fx", static_cast<double>(tokens) / fp8_tokens) : "-",
                bench::Fmt("%.4f", r.hit_rate()), std::to_string(r.hits_by_tier[0]),
                std::to_string(r.hits_by_tier[1]), std::to_string(r.recomputed_tokens),
                GiB(r.promoted_blocks * r.slot_bytes), GiB(r.demoted_blocks * r.slot_bytes),
                bench::Fmt("%.1f", saved)});
  }
  rep.AddNote("Workload: " + s->workload + ". Infinite-cache bound: " + bench::Fmt("%.4f", bound) +
              ". Geometry L=" + std::to_string(s->geo.num_layers) + " H=" + std::to_string(s->geo.num_kv_heads) +
              " D=" + std::to_string(s->geo.head_dim) + " T=" + std::to_string(s->geo.block_tokens) +
              "; prefill rate " + bench::Fmt("%.0f", s->prefill_tok_s) + " tok/s.");
  if (!s->sweep.empty()) {
    std::vector<uint64_t> budgets = s->sweep;
    std::sort(budgets.begin(), budgets.end());
    std::map<KvFormat, std::vector<double>> curves;
    std::vector<std::function<void()>> jobs;
    for (KvFormat f : s->formats) {
      curves[f].assign(budgets.size(), 0.0);
      for (size_t i = 0; i < budgets.size(); ++i) {
        jobs.push_back([&, f, i] { curves[f][i] = Simulate1(*s, f, budgets[i], s->policy).hit_rate(); });
      }
    }
    Parallel(std::move(jobs));
    std::string line = "HBM sweep (hit rate):";
    for (size_t i = 0; i < budgets.size(); ++i) {
      json pt;
      pt["hbm_bytes"] = budgets[i];
      line += " " + GiB(budgets[i]) + ":";
      for (KvFormat f : s->formats) {
        pt[KvFormatName(f)] = curves[f][i];
        line += std::string(" ") + KvFormatName(f) + "=" + bench::Fmt("%.3f", curves[f][i]);
      }
      doc["sweep"].push_back(pt);
      line += ";";
    }
    rep.AddNote(line);
    if (auto p = a.Get("plot")) {
      if (auto st = WritePlot(*p, budgets, curves, bound); !st.ok()) return Fail("bench replay: " + st.message());
    }
  } else if (a.Has("plot")) {
    return Fail("bench replay: --plot needs --sweep (the HBM budgets to draw)", 2);
  }
  if (as_json) {
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  const std::string path = a.Has("append") ? a.Get("results").value_or(bench::Report::DefaultResultsPath()) : "";
  if (auto st = rep.Emit(path); !st.ok()) return Fail("bench replay: " + st.message());
  return 0;
}

int Policies(const cli::Args& a) {
  auto s = ParseSetup(a);
  if (!s.ok()) return Fail("bench policies: " + s.status().message(), 2);
  std::vector<uint64_t> budgets = s->sweep;
  if (budgets.empty()) budgets = {s->hbm / 4, s->hbm / 2, s->hbm, s->hbm * 2, s->hbm * 4};
  std::sort(budgets.begin(), budgets.end());
  const double bound = replay::InfiniteBoundHitRate(s->keyed);
  const KvFormat f = s->formats.front();
  bench::Report rep("policies: block-weighted prefix hit rate by eviction policy (single tier, " +
                        std::string(KvFormatName(f)) + ")",
                    "build/bin/kvtierctl bench policies" + std::string(a.Has("trace") ? " --trace " + *a.Get("trace") : ""));
  rep.SetColumns({"budget", "blocks", "lru (baseline)", "s3fifo", "prefix-lru", "best / lru", "infinite bound"});
  json doc;
  doc["workload"] = s->workload;
  doc["infinite_bound_hit_rate"] = bound;
  const tiers::PolicyKind kinds[3] = {tiers::PolicyKind::kLru, tiers::PolicyKind::kS3Fifo,
                                       tiers::PolicyKind::kPrefixLru};
  std::vector<std::array<double, 3>> rates(budgets.size());
  std::vector<std::function<void()>> jobs;
  for (size_t bi = 0; bi < budgets.size(); ++bi) {
    for (int pi = 0; pi < 3; ++pi) {
      jobs.push_back([&, bi, pi] {
        replay::SimOptions o;
        o.format = f;
        o.geometry = s->geo;
        o.tiers = {{"cache", budgets[bi], kinds[pi]}};
        rates[bi][pi] = replay::Simulate(s->keyed, o).hit_rate();
      });
    }
  }
  Parallel(std::move(jobs));
  for (size_t bi = 0; bi < budgets.size(); ++bi) {
    const uint64_t b = budgets[bi];
    const double* hr = rates[bi].data();
    const uint64_t cap = b / SlotBytes(f, s->geo);
    const double best = std::max(hr[1], hr[2]);
    rep.AddRow({GiB(b), std::to_string(cap), bench::Fmt("%.4f", hr[0]), bench::Fmt("%.4f", hr[1]),
                bench::Fmt("%.4f", hr[2]), hr[0] > 0 ? bench::Fmt("%.2fx", best / hr[0]) : "-",
                bench::Fmt("%.4f", bound)});
    doc["budgets"].push_back({{"bytes", b}, {"blocks", cap}, {"lru", hr[0]}, {"s3fifo", hr[1]}, {"prefix-lru", hr[2]}});
  }
  rep.AddNote("Workload: " + s->workload + ". Block size " + std::to_string(SlotBytes(f, s->geo)) +
              " bytes (T=" + std::to_string(s->geo.block_tokens) + ").");
  if (a.Has("json")) {
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  const std::string path = a.Has("append") ? a.Get("results").value_or(bench::Report::DefaultResultsPath()) : "";
  if (auto st = rep.Emit(path); !st.ok()) return Fail("bench policies: " + st.message());
  return 0;
}

int Run(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help") {
    std::fputs(kUsage, argv.empty() ? stderr : stdout);
    return argv.empty() ? 2 : 0;
  }
  auto a = cli::Args::Parse(std::vector<std::string>(argv.begin() + 1, argv.end()), {"json", "append", "simulate", "spawn", "verify-full", "quick"});
  if (!a.ok()) return Fail("bench: " + a.status().message(), 2);
  if (auto st = a->CheckKnown(kKnown); !st.ok()) return Fail("bench " + argv[0] + ": " + st.message(), 2);
  if (!a->positional().empty()) return Fail("bench " + argv[0] + ": unexpected argument '" + a->positional()[0] + "'", 2);
  if (argv[0] == "replay") return Replay(*a);
  if (argv[0] == "policies") return Policies(*a);
  return Fail("bench: unknown benchmark '" + argv[0] + "' (replay, policies)", 2);
}

cli::CommandRegistrar reg("bench", "replay a workload per KV format; compare eviction policies", Run, "",
                          {"replay", "policies"});

}  // namespace
}  // namespace kvtier
