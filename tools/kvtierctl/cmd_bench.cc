// kvtierctl bench replay: replays a trace (kvtier JSON lines or the Mooncake FAST'25
// format) or a generated agentic workload, once per KV format at the same tier budgets,
// and reports hit rate by tier, recomputed tokens, bytes promoted/demoted and the
// prefill time saved. --simulate runs kvtier's eviction policies in-process (no daemon);
// --sweep also varies the HBM budget (and --plot draws hit rate against it).
//
// kvtierctl bench policies: every eviction policy at several budgets on one trace, next
// to plain LRU, the Belady oracle and the infinite-cache bound.
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
  kvtierctl bench admission [--trace FILE | generator options] --host SIZE --nvme SIZE

workload (default: the built-in agentic generator):
  --trace FILE            kvtier JSON lines or a Mooncake FAST'25 trace
  --workload agentic|tool-loop   the generator (tool-loop takes --requests and --seed)
  --workload scan|loop|shift|flood   adversarial: --working-set N prompts (size it from
                          the cache), --prompt-tokens N (2048), --requests N (4 x working
                          set), --seed N (docs/replay.md)
  --requests N --sessions N --system-prompts N --system-tokens N
  --first-turn-tokens N --turn-tokens N --max-turns N --zipf A --seed N
  --quick                 a small generated workload (200 requests) that runs in seconds
  --save-trace FILE       write the generated workload as kvtier JSON lines
model geometry (the block size comes from it and the format):
  --layers L (32) --kv-heads H (8) --head-dim D (128) --block-tokens T (16)
tiers:
  --hbm SIZE (4GiB) --host SIZE (16GiB) --policy NAME (prefix-lru)
  --formats nvfp4,fp8,bf16
  --policies A,B,...      bench policies: the policies to compare with lru (all)
  --partial-oracles       bench policies: also the oracles of partial knowledge (LRU
                          order, blocks known dead first): reuse-bit (whether a block
                          returns) and, per --oracle-horizons K, whether it returns within
                          K x C block references (C the budget's blocks)
  --oracle-horizons K,K   the horizons of --partial-oracles (1,2,4)
  policies: {policies} (knobs as in [tiers.policy]:
  --s3fifo-small-fraction F --reuse-protected-fraction F --reuse-ghost-factor F
  --reuse-density 0|1 --reuse-adapt 0|1 --reuse-lru-guard 0|1 --tinylfu-window-fraction F)
replay:
  --sweep SIZE,SIZE,...   HBM budgets to sweep (replay) or budgets to test (policies)
  --prefill-tok-s R       prefill rate for the time-saved estimate (20000)
  --json                  one JSON document on stdout
  --plot FILE.svg         hit rate against HBM budget, one line per format (replay), per
                          policy and format (policies), with the oracle and the bound
  --append                append the table to bench/history/results.md
admission (host + NVMe, simulated; --policy for both tiers, the first of --formats):
  --nvme SIZE             the NVMe tier (bench admission: 4x --host)
  --nvme-budgets F,F,...  NVMe write budgets per window, as shares of what `always`
                          writes with no budget (0.5,0.25,0.1)
  --windows N             budget windows the trace's span is cut into, as days (4)
)";

const std::vector<std::string> kKnown = {
    "trace", "requests", "sessions", "system-prompts", "system-tokens", "first-turn-tokens",
    "turn-tokens", "max-turns", "zipf", "seed", "save-trace", "layers", "kv-heads", "head-dim",
    "block-tokens", "hbm", "host", "policy", "formats", "sweep", "prefill-tok-s", "json", "plot",
    "append", "simulate", "results", "spawn", "socket", "nvme", "verify-full", "max-requests", "quick",
    "s3fifo-small-fraction", "reuse-protected-fraction", "reuse-ghost-factor", "reuse-density",
    "reuse-adapt", "workload", "policies", "nvme-budgets", "windows", "partial-oracles",
    "oracle-horizons", "tinylfu-window-fraction", "reuse-lru-guard", "working-set", "prompt-tokens"};

struct Setup {
  std::vector<replay::Request> reqs;
  replay::KeyedTrace keyed;  // key chains, computed once
  std::string workload;
  Geometry geo;
  uint64_t hbm = 0, host = 0;
  tiers::PolicyKind policy = tiers::PolicyKind::kPrefixLru;
  tiers::PolicyOptions knobs;
  std::vector<tiers::PolicyKind> compare;  // bench policies: the policies to compare
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
  } else if (a.Get("workload").value_or("agentic") == "tool-loop") {
    replay::ToolLoopOptions g;
    KVT_U32(g.requests, "requests", g.requests, 1, 10'000'000);
    auto seed = a.GetInt("seed", 1);
    if (!seed.ok()) return seed.status();
    g.seed = static_cast<uint64_t>(*seed);
    KVTIER_RETURN_IF_ERROR(g.Validate());
    s.reqs = replay::GenerateToolLoops(g);
    s.workload = "generated tool-agent loops (" + std::to_string(g.requests) + " requests, " +
                 std::to_string(g.tool_prompts) + " tool prompts of " + std::to_string(g.tool_prompt_tokens) +
                 " tokens, " + std::to_string(g.burst_sessions) + " sessions a burst, seed " + std::to_string(g.seed) + ")";
    if (auto path = a.Get("save-trace")) KVTIER_RETURN_IF_ERROR(replay::WriteKvtierTrace(*path, s.reqs));
  } else if (replay::AdversarialKind kind; replay::ParseAdversarialKind(a.Get("workload").value_or(""), &kind)) {
    replay::AdversarialOptions g;
    g.kind = kind;
    KVT_U32(g.working_set, "working-set", g.working_set, 2, 10'000'000);
    KVT_U32(g.prompt_tokens, "prompt-tokens", g.prompt_tokens, 1, replay::kMaxTraceTokens);
    KVT_U32(g.requests, "requests", 0, 0, 40'000'000);
    auto seed = a.GetInt("seed", 1);
    if (!seed.ok()) return seed.status();
    g.seed = static_cast<uint64_t>(*seed);
    KVTIER_RETURN_IF_ERROR(g.Validate());
    s.reqs = replay::GenerateAdversarial(g);
    s.workload = "adversarial " + *a.Get("workload") + " (working set " + std::to_string(g.working_set) +
                 " prompts of " + std::to_string(g.prompt_tokens) + " tokens, " + std::to_string(s.reqs.size()) +
                 " requests, seed " + std::to_string(g.seed) + ")";
    if (auto path = a.Get("save-trace")) KVTIER_RETURN_IF_ERROR(replay::WriteKvtierTrace(*path, s.reqs));
  } else if (a.Get("workload").value_or("agentic") != "agentic") {
    return Status::Invalid("--workload must be agentic, tool-loop, scan, loop, shift or flood");
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
    return Status::Invalid("--policy must be one of " + tiers::PolicyNameList());
  }
  s.compare = tiers::AllPolicies();
  if (auto list = a.Get("policies")) {
    s.compare.clear();
    std::stringstream ps(*list);
    std::string n;
    while (std::getline(ps, n, ',')) {
      tiers::PolicyKind k;
      if (!tiers::ParsePolicy(n, &k)) return Status::Invalid("--policies: '" + n + "' is not one of " + tiers::PolicyNameList());
      if (k != tiers::PolicyKind::kLru) s.compare.push_back(k);
    }
    s.compare.insert(s.compare.begin(), tiers::PolicyKind::kLru);  // the baseline, always
  }
  for (auto [name, field] : {std::pair{"s3fifo-small-fraction", &s.knobs.s3fifo_small_fraction},
                             std::pair{"reuse-protected-fraction", &s.knobs.reuse_protected_fraction},
                             std::pair{"reuse-ghost-factor", &s.knobs.reuse_ghost_factor},
                             std::pair{"tinylfu-window-fraction", &s.knobs.tinylfu_window_fraction}}) {
    auto v = a.GetDouble(name, *field);
    if (!v.ok()) return v.status();
    *field = *v;
  }
  for (auto [name, field] : {std::pair{"reuse-density", &s.knobs.reuse_density},
                             std::pair{"reuse-adapt", &s.knobs.reuse_adapt},
                             std::pair{"reuse-lru-guard", &s.knobs.reuse_lru_guard}}) {
    if (auto v = a.GetInt(name, *field ? 1 : 0); !v.ok() || (*v != 0 && *v != 1)) {
      return Status::Invalid(std::string("--") + name + " must be 0 or 1");
    } else {
      *field = *v == 1;
    }
  }
  if (std::string why = s.knobs.Check(); !why.empty()) return Status::Invalid("--" + why);
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

// oracle: Belady in both tiers instead of p.
replay::SimResult Simulate1(const Setup& s, KvFormat f, uint64_t hbm, tiers::PolicyKind p, bool oracle = false) {
  replay::SimOptions o;
  o.format = f;
  o.geometry = s.geo;
  o.tiers = {{"hbm", hbm, p}, {"host", s.host, p}};
  o.policy_options = s.knobs;
  o.oracle = oracle;
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

// One line of a plot: a name, a colour, dashed or not, one hit rate per budget.
struct Series {
  std::string name;
  std::string color;
  bool dashed = false;
  std::vector<double> y;
};

// Hit rate against budget (log scale), one polyline per series, the bound as a dashed
// horizontal line, a legend in the right margin.
Status WritePlot(const std::string& path, const std::string& title, const std::vector<uint64_t>& budgets,
                 const std::vector<Series>& series, double bound) {
  const double W = 760, H = 420, L = 60, R = 160, Tp = 30, B = 50;
  const double xmax = static_cast<double>(budgets.back()), xmin = static_cast<double>(budgets.front());
  auto X = [&](double v) {
    const double lo = std::log2(xmin), hi = std::log2(xmax);
    return L + (hi > lo ? (std::log2(v) - lo) / (hi - lo) : 0.5) * (W - L - R);
  };
  auto Y = [&](double h) { return Tp + (1.0 - h) * (H - Tp - B); };
  std::ostringstream o;
  o << "<svg xmlns='http://www.w3.org/2000/svg' width='" << W << "' height='" << H
    << "' font-family='sans-serif' font-size='12'>\n<rect width='100%' height='100%' fill='white'/>\n";
  o << "<text x='" << L << "' y='18'>" << title << "</text>\n";
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
  int li = 0;
  for (const Series& c : series) {
    o << "<polyline fill='none' stroke-width='2' stroke='" << c.color << "'"
      << (c.dashed ? " stroke-dasharray='6 3'" : "") << " points='";
    for (size_t i = 0; i < budgets.size(); ++i) o << X(budgets[i]) << "," << Y(c.y[i]) << " ";
    o << "'/>\n<line x1='" << W - R + 10 << "' x2='" << W - R + 30 << "' y1='" << Tp + 16 * li << "' y2='"
      << Tp + 16 * li << "' stroke-width='2' stroke='" << c.color << "'" << (c.dashed ? " stroke-dasharray='6 3'" : "")
      << "/><text x='" << W - R + 35 << "' y='" << Tp + 16 * li + 4 << "'>" << c.name << "</text>\n";
    ++li;
  }
  o << "<text x='" << (W - R) / 2 << "' y='" << H - 12 << "'>budget</text>\n</svg>\n";
  const std::string svg = o.str();
  return cli::WriteFileAtomic(path, svg.data(), svg.size());
}

const char* FormatColor(KvFormat f) {
  return f == KvFormat::kNvfp4 ? "#1b7837" : f == KvFormat::kFp8 ? "#2166ac" : "#b2182b";
}

const char* PolicyColor(size_t i) {
  static const char* const kColors[] = {"#000000", "#e41a1c", "#377eb8", "#4daf4a", "#984ea3", "#ff7f00", "#a65628"};
  return kColors[i % (sizeof(kColors) / sizeof(kColors[0]))];
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
  rep.SetColumns({"format", "block bytes", "tokens held", "vs fp8", "hit rate", "oracle", "bound", "hbm hits",
                  "host hits", "recomputed tokens", "promoted", "demoted", "prefill saved (s)"});
  uint64_t fp8_tokens = 0;
  std::map<KvFormat, replay::SimResult> results;
  std::map<KvFormat, double> oracle;
  {
    const size_t n = s->formats.size();
    std::vector<replay::SimResult> out(2 * n);
    std::vector<std::function<void()>> jobs;
    for (size_t i = 0; i < 2 * n; ++i) {
      jobs.push_back([&, i] { out[i] = Simulate1(*s, s->formats[i % n], s->hbm, s->policy, i >= n); });
    }
    Parallel(std::move(jobs));
    for (size_t i = 0; i < n; ++i) {
      results[s->formats[i]] = out[i];
      oracle[s->formats[i]] = out[n + i].hit_rate();
    }
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
    j["oracle_hit_rate"] = oracle[f];
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
                bench::Fmt("%.4f", r.hit_rate()), bench::Fmt("%.4f", oracle[f]), bench::Fmt("%.4f", bound),
                std::to_string(r.hits_by_tier[0]),
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
    std::map<KvFormat, std::vector<double>> curves, oracles;
    std::vector<std::function<void()>> jobs;
    for (KvFormat f : s->formats) {
      curves[f].assign(budgets.size(), 0.0);
      oracles[f].assign(budgets.size(), 0.0);
      for (size_t i = 0; i < budgets.size(); ++i) {
        jobs.push_back([&, f, i] { curves[f][i] = Simulate1(*s, f, budgets[i], s->policy).hit_rate(); });
        jobs.push_back([&, f, i] { oracles[f][i] = Simulate1(*s, f, budgets[i], s->policy, true).hit_rate(); });
      }
    }
    Parallel(std::move(jobs));
    std::string line = "HBM sweep (hit rate, oracle in brackets; bound " + bench::Fmt("%.3f", bound) + "):";
    for (size_t i = 0; i < budgets.size(); ++i) {
      json pt;
      pt["hbm_bytes"] = budgets[i];
      line += " " + GiB(budgets[i]) + ":";
      for (KvFormat f : s->formats) {
        pt[KvFormatName(f)] = curves[f][i];
        pt[std::string(KvFormatName(f)) + "_oracle"] = oracles[f][i];
        line += std::string(" ") + KvFormatName(f) + "=" + bench::Fmt("%.3f", curves[f][i]) + " (" +
                bench::Fmt("%.3f", oracles[f][i]) + ")";
      }
      pt["bound"] = bound;
      doc["sweep"].push_back(pt);
      line += ";";
    }
    rep.AddNote(line);
    if (auto p = a.Get("plot")) {
      std::vector<Series> lines;
      for (KvFormat f : s->formats) {
        lines.push_back({std::string(KvFormatName(f)) + " " + tiers::PolicyName(s->policy), FormatColor(f), false, curves[f]});
        lines.push_back({std::string(KvFormatName(f)) + " oracle", FormatColor(f), true, oracles[f]});
      }
      if (auto st = WritePlot(*p, "prefix hit rate vs HBM budget (host budget fixed)", budgets, lines, bound); !st.ok()) {
        return Fail("bench replay: " + st.message());
      }
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

// cmdline: the command as typed, for the report (it must reproduce the table).
int Policies(const cli::Args& a, const std::string& cmdline) {
  auto s = ParseSetup(a);
  if (!s.ok()) return Fail("bench policies: " + s.status().message(), 2);
  std::vector<uint64_t> budgets = s->sweep;
  if (budgets.empty()) budgets = {s->hbm / 4, s->hbm / 2, s->hbm, s->hbm * 2, s->hbm * 4};
  std::sort(budgets.begin(), budgets.end());
  // The oracles of partial knowledge: 0 the reuse bit, K > 0 a horizon of K x C.
  std::vector<double> partial;
  if (a.Has("partial-oracles")) {
    partial.push_back(0.0);
    std::stringstream hs(a.Get("oracle-horizons").value_or("1,2,4"));
    std::string h;
    while (std::getline(hs, h, ',')) {
      char* end = nullptr;
      const double k = std::strtod(h.c_str(), &end);
      if (h.empty() || *end != '\0' || !(k > 0.0) || !std::isfinite(k)) {
        return Fail("bench policies: --oracle-horizons: '" + h + "' is not a number > 0", 2);
      }
      partial.push_back(k);
    }
  } else if (a.Has("oracle-horizons")) {
    return Fail("bench policies: --oracle-horizons needs --partial-oracles", 2);
  }
  auto partial_name = [](double k) {
    return k == 0.0 ? std::string("oracle: reuse bit") : "oracle: within " + bench::Fmt("%g", k) + " x C";
  };
  const double bound = replay::InfiniteBoundHitRate(s->keyed);
  const auto& kinds = s->compare;  // lru first
  const size_t np = kinds.size() + partial.size() + 1;  // policies, partial oracles, Belady last
  std::string formats;
  for (KvFormat f : s->formats) formats += std::string(formats.empty() ? "" : ", ") + KvFormatName(f);
  bench::Report rep("policies: block-weighted prefix hit rate by eviction policy (single tier, " + formats + ")",
                    cmdline);
  std::vector<std::string> cols = {"format", "budget", "blocks"};
  for (auto k : kinds) cols.push_back(std::string(tiers::PolicyName(k)) + (k == tiers::PolicyKind::kLru ? " (baseline)" : ""));
  cols.insert(cols.end(), {"best", "best - lru (points)"});
  // The default policy's distance to lru: the bound it holds (docs/replay.md).
  const auto reuse_at = std::find(kinds.begin(), kinds.end(), tiers::PolicyKind::kReuse);
  const bool has_reuse = reuse_at != kinds.end();
  const size_t reuse_pi = static_cast<size_t>(reuse_at - kinds.begin());
  if (has_reuse) cols.push_back("reuse - lru (points)");
  for (double k : partial) cols.push_back(partial_name(k));
  cols.insert(cols.end(), {"oracle", "infinite bound"});
  rep.SetColumns(cols);
  json doc;
  doc["workload"] = s->workload;
  doc["infinite_bound_hit_rate"] = bound;
  // rates[format][budget][slot]: the policies, then the partial oracles, then Belady.
  std::vector<std::vector<std::vector<double>>> rates(
      s->formats.size(), std::vector<std::vector<double>>(budgets.size(), std::vector<double>(np, 0.0)));
  std::vector<std::function<void()>> jobs;
  for (size_t fi = 0; fi < s->formats.size(); ++fi) {
    for (size_t bi = 0; bi < budgets.size(); ++bi) {
      for (size_t pi = 0; pi < np; ++pi) {
        jobs.push_back([&, fi, bi, pi] {
          replay::SimOptions o;
          o.format = s->formats[fi];
          o.geometry = s->geo;
          o.policy_options = s->knobs;
          o.oracle = pi + 1 == np;
          if (pi >= kinds.size() && pi + 1 < np) {
            const double k = partial[pi - kinds.size()];
            o.partial_oracle = k == 0.0 ? replay::SimOptions::PartialOracle::kReuseBit
                                        : replay::SimOptions::PartialOracle::kHorizon;
            o.horizon_lifetimes = k == 0.0 ? 1.0 : k;
          }
          o.tiers = {{"cache", budgets[bi], pi < kinds.size() ? kinds[pi] : tiers::PolicyKind::kLru}};
          rates[fi][bi][pi] = replay::Simulate(s->keyed, o).hit_rate();
        });
      }
    }
  }
  Parallel(std::move(jobs));
  std::vector<Series> lines;
  for (size_t fi = 0; fi < s->formats.size(); ++fi) {
    const KvFormat f = s->formats[fi];
    for (size_t bi = 0; bi < budgets.size(); ++bi) {
      const uint64_t b = budgets[bi];
      const auto& hr = rates[fi][bi];
      const uint64_t cap = b / SlotBytes(f, s->geo);
      size_t best = 0;
      for (size_t pi = 1; pi < kinds.size(); ++pi) {
        if (hr[pi] > hr[best]) best = pi;
      }
      std::vector<std::string> row = {KvFormatName(f), GiB(b), std::to_string(cap)};
      json j = {{"format", KvFormatName(f)}, {"bytes", b}, {"blocks", cap}};
      for (size_t pi = 0; pi < kinds.size(); ++pi) {
        row.push_back(bench::Fmt("%.4f", hr[pi]));
        j[tiers::PolicyName(kinds[pi])] = hr[pi];
      }
      row.insert(row.end(), {tiers::PolicyName(kinds[best]), bench::Fmt("%+.2f", 100.0 * (hr[best] - hr[0]))});
      if (has_reuse) {
        row.push_back(bench::Fmt("%+.2f", 100.0 * (hr[reuse_pi] - hr[0])));
        j["reuse_minus_lru_points"] = 100.0 * (hr[reuse_pi] - hr[0]);
      }
      for (size_t i = 0; i < partial.size(); ++i) {
        row.push_back(bench::Fmt("%.4f", hr[kinds.size() + i]));
        j[partial_name(partial[i])] = hr[kinds.size() + i];
      }
      row.insert(row.end(), {bench::Fmt("%.4f", hr[np - 1]), bench::Fmt("%.4f", bound)});
      j["oracle"] = hr[np - 1];
      j["best"] = tiers::PolicyName(kinds[best]);
      rep.AddRow(row);
      doc["budgets"].push_back(j);
    }
    for (size_t pi = 0; pi < np; ++pi) {
      if (pi >= kinds.size() && pi + 1 < np) continue;  // the partial oracles: in the table only
      Series ln{std::string(KvFormatName(f)) + " " + (pi + 1 == np ? "oracle" : tiers::PolicyName(kinds[pi])),
                pi + 1 == np ? "#000000" : PolicyColor(pi + 1), pi + 1 == np || fi > 0, {}};
      for (size_t bi = 0; bi < budgets.size(); ++bi) ln.y.push_back(rates[fi][bi][pi]);
      lines.push_back(std::move(ln));
    }
  }
  rep.AddNote("Workload: " + s->workload + ". Block size " + std::to_string(SlotBytes(s->formats.front(), s->geo)) +
              " bytes for " + KvFormatName(s->formats.front()) + " (T=" + std::to_string(s->geo.block_tokens) +
              "). Oracle: Belady (farthest next use first) over the same requests; bound: every repeated block a hit." +
              (partial.empty() ? std::string()
                               : std::string(" Partial oracles (LRU order, blocks known dead evicted first; measures, not "
                                             "policies): reuse bit = whether a block is referenced again; within K x C = "
                                             "whether within K x (the budget's blocks) block references.")));
  if (auto p = a.Get("plot")) {
    if (auto st = WritePlot(*p, "prefix hit rate vs budget by policy (single tier)", budgets, lines, bound); !st.ok()) {
      return Fail("bench policies: " + st.message());
    }
  }
  if (a.Has("json")) {
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  const std::string path = a.Has("append") ? a.Get("results").value_or(bench::Report::DefaultResultsPath()) : "";
  if (auto st = rep.Emit(path); !st.ok()) return Fail("bench policies: " + st.message());
  return 0;
}

// NVMe admission on a host + NVMe stack: always, second-hit and reuse at several write
// budgets (shares of what always writes without one), hit rate and bytes written.
int AdmissionBench(const cli::Args& a, const std::string& cmdline) {
  auto s = ParseSetup(a);
  if (!s.ok()) return Fail("bench admission: " + s.status().message(), 2);
  uint64_t nvme = 4 * s->host;
  if (auto v = a.Get("nvme")) {
    auto n = cli::ParseSize(*v);
    if (!n.ok()) return Fail("bench admission: --nvme: " + n.status().message(), 2);
    nvme = *n;
  }
  std::vector<double> shares;
  {
    std::stringstream ss(a.Get("nvme-budgets").value_or("0.5,0.25,0.1"));
    std::string item;
    while (std::getline(ss, item, ',')) {
      char* end = nullptr;
      const double v = std::strtod(item.c_str(), &end);
      if (item.empty() || *end != '\0' || !(v > 0.0 && v <= 1.0)) {
        return Fail("bench admission: --nvme-budgets: '" + item + "' is not a share in (0, 1]", 2);
      }
      shares.push_back(v);
    }
  }
  auto windows = a.GetInt("windows", 4);
  if (!windows.ok() || *windows < 1 || *windows > 100000) return Fail("bench admission: --windows must be in [1, 100000]", 2);
  const KvFormat f = s->formats.front();
  const double span = s->reqs.empty() ? 0.0 : s->reqs.back().arrival_s;
  const double window_s = std::max(span, 1e-3) / static_cast<double>(*windows) * (1.0 + 1e-9);
  using Mode = replay::SimAdmission::Mode;
  auto sim = [&](Mode m, uint64_t budget, bool with_nvme = true, bool oracle = false) {
    replay::SimOptions o;
    o.format = f;
    o.geometry = s->geo;
    o.policy_options = s->knobs;
    o.oracle = oracle;
    o.tiers = {{"host", s->host, s->policy}};
    if (with_nvme) o.tiers.push_back({"nvme", nvme, s->policy});
    o.admission.mode = m;
    o.admission.budget_bytes = budget;
    o.admission.window_s = window_s;
    return replay::Simulate(s->keyed, o);
  };
  // The references: host only, always with no budget, and the oracle on both tiers.
  replay::SimResult host_only, free_always, oracle;
  Parallel({[&] { host_only = sim(Mode::kAlways, 0, false); }, [&] { free_always = sim(Mode::kAlways, 0); },
            [&] { oracle = sim(Mode::kAlways, 0, true, true); }});
  const uint64_t per_window = static_cast<uint64_t>(static_cast<double>(free_always.nvme_written_bytes) /
                                                    static_cast<double>(*windows));
  struct Run {
    double share;  // 0: no budget
    Mode mode;
    replay::SimResult r;
  };
  std::vector<Run> runs;
  for (Mode m : {Mode::kSecondHit, Mode::kReuse}) runs.push_back({0.0, m, {}});
  for (double sh : shares) {
    for (Mode m : {Mode::kAlways, Mode::kSecondHit, Mode::kReuse}) runs.push_back({sh, m, {}});
  }
  std::vector<std::function<void()>> jobs;
  for (auto& r : runs) {
    jobs.push_back([&] { r.r = sim(r.mode, static_cast<uint64_t>(r.share * static_cast<double>(per_window))); });
  }
  Parallel(std::move(jobs));
  runs.insert(runs.begin(), Run{0.0, Mode::kAlways, free_always});
  bench::Report rep("admission: NVMe admission under a write budget (simulated, host " + GiB(s->host) + " + NVMe " +
                        GiB(nvme) + ", " + tiers::PolicyName(s->policy) + ", " + KvFormatName(f) + ")",
                    cmdline);
  rep.SetColumns({"budget per window", "admission", "hit rate", "- always (points)", "nvme hits", "written",
                  "written / always", "rejects"});
  json doc;
  doc["workload"] = s->workload;
  for (const auto& r : runs) {
    const Run* base = &runs[0];
    for (const auto& b : runs) {
      if (b.share == r.share && b.mode == Mode::kAlways) base = &b;
    }
    const std::string budget = r.share == 0.0 ? "none" : bench::Fmt("%.0f%% (", 100 * r.share) +
                                                              GiB(static_cast<uint64_t>(r.share * per_window)) + ")";
    rep.AddRow({budget, replay::AdmissionModeName(r.mode), bench::Fmt("%.4f", r.r.hit_rate()),
                bench::Fmt("%+.2f", 100.0 * (r.r.hit_rate() - base->r.hit_rate())),
                std::to_string(r.r.hits_by_tier.size() > 1 ? r.r.hits_by_tier[1] : 0), GiB(r.r.nvme_written_bytes),
                bench::Fmt("%.3f", free_always.nvme_written_bytes
                                       ? static_cast<double>(r.r.nvme_written_bytes) / free_always.nvme_written_bytes
                                       : 0.0),
                std::to_string(r.r.admission_rejects)});
    doc["runs"].push_back({{"budget_share", r.share}, {"admission", replay::AdmissionModeName(r.mode)},
                           {"hit_rate", r.r.hit_rate()}, {"nvme_written_bytes", r.r.nvme_written_bytes},
                           {"admission_rejects", r.r.admission_rejects}});
  }
  rep.AddNote("Workload: " + s->workload + ". " + std::to_string(*windows) + " budget windows of " +
              bench::Fmt("%.1f", window_s) + " s of trace time; a budget is a share of what always writes per window with none (" +
              GiB(per_window) + "). Host only (no NVMe): " + bench::Fmt("%.4f", host_only.hit_rate()) +
              "; oracle on both tiers (always, no budget): " + bench::Fmt("%.4f", oracle.hit_rate()) +
              "; infinite bound: " + bench::Fmt("%.4f", replay::InfiniteBoundHitRate(s->keyed)) + ".");
  if (a.Has("json")) {
    std::printf("%s\n", doc.dump(2).c_str());
    return 0;
  }
  const std::string path = a.Has("append") ? a.Get("results").value_or(bench::Report::DefaultResultsPath()) : "";
  if (auto st = rep.Emit(path); !st.ok()) return Fail("bench admission: " + st.message());
  return 0;
}

// The usage text with the policy names filled in from their one table.
std::string Usage() {
  std::string u = kUsage;
  const std::string mark = "{policies}";
  u.replace(u.find(mark), mark.size(), tiers::PolicyNameList());
  return u;
}

int Run(const std::vector<std::string>& argv) {
  if (argv.empty() || argv[0] == "--help") {
    std::fputs(Usage().c_str(), argv.empty() ? stderr : stdout);
    return argv.empty() ? 2 : 0;
  }
  auto a = cli::Args::Parse(std::vector<std::string>(argv.begin() + 1, argv.end()), {"json", "append", "simulate", "spawn", "verify-full", "quick", "partial-oracles"});
  if (!a.ok()) return Fail("bench: " + a.status().message(), 2);
  if (auto st = a->CheckKnown(kKnown); !st.ok()) return Fail("bench " + argv[0] + ": " + st.message(), 2);
  if (!a->positional().empty()) return Fail("bench " + argv[0] + ": unexpected argument '" + a->positional()[0] + "'", 2);
  if (argv[0] == "replay") return Replay(*a);
  if (argv[0] == "policies" || argv[0] == "admission") {
    std::string cmdline = "build/bin/kvtierctl bench";
    for (const auto& w : argv) {
      if (w != "--append") cmdline += " " + w;
    }
    return argv[0] == "policies" ? Policies(*a, cmdline) : AdmissionBench(*a, cmdline);
  }
  return Fail("bench: unknown benchmark '" + argv[0] + "' (replay, policies, admission)", 2);
}

cli::CommandRegistrar reg("bench", "replay a workload per KV format; compare eviction policies and NVMe admission",
                          Run, "", {"replay", "policies", "admission"});

}  // namespace
}  // namespace kvtier
