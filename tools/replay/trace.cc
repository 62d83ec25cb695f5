#include "tools/replay/trace.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

namespace kvtier::replay {

namespace {

using nlohmann::json;

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

Status LineError(size_t line, const std::string& what) {
  return Status::Invalid("line " + std::to_string(line) + ": " + what);
}

StatusOr<uint32_t> GetCount(const json& j, const char* key, size_t line, bool required) {
  if (!j.contains(key)) {
    if (required) return LineError(line, std::string("missing \"") + key + "\"");
    return uint32_t{0};
  }
  const json& v = j.at(key);
  if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0)) {
    return LineError(line, std::string("\"") + key + "\" must be a non-negative integer");
  }
  const uint64_t n = v.get<uint64_t>();
  if (n > kMaxTraceTokens) return LineError(line, std::string("\"") + key + "\" is too large");
  return static_cast<uint32_t>(n);
}

template <typename ParseLine>
StatusOr<std::vector<Request>> ReadLines(const std::string& path, ParseLine&& parse) {
  std::ifstream in(path);
  if (!in) return Status::IoError("cannot open trace " + path);
  std::vector<Request> out;
  std::string text;
  size_t line = 0;
  while (std::getline(in, text)) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return LineError(line, "not a JSON object");
    Request r;
    KVTIER_RETURN_IF_ERROR(parse(j, line, &r));
    out.push_back(std::move(r));
  }
  if (out.empty()) return Status::Invalid("trace " + path + " has no requests");
  return out;
}

}  // namespace

uint32_t MooncakeToken(uint64_t hash_id, uint32_t j) {
  return 1000u + static_cast<uint32_t>(SplitMix(hash_id * 1024 + j) & 0x1FFFF);
}

std::vector<uint32_t> SegmentTokens(const std::string& segment_id, uint32_t count) {
  const uint64_t base = Fnv1a(segment_id);
  std::vector<uint32_t> t(count);
  for (uint32_t j = 0; j < count; ++j) {
    t[j] = 1000u + static_cast<uint32_t>(SplitMix(base + j) & 0x1FFFF);
  }
  return t;
}

StatusOr<std::vector<Request>> LoadMooncakeTrace(const std::string& path) {
  return ReadLines(path, [](const json& j, size_t line, Request* r) -> Status {
    if (!j.contains("timestamp") || !j.at("timestamp").is_number()) {
      return LineError(line, "missing numeric \"timestamp\"");
    }
    const double ts = j.at("timestamp").get<double>();
    if (!std::isfinite(ts) || ts < 0) return LineError(line, "\"timestamp\" must be >= 0");
    auto in_len = GetCount(j, "input_length", line, true);
    if (!in_len.ok()) return in_len.status();
    auto out_len = GetCount(j, "output_length", line, false);
    if (!out_len.ok()) return out_len.status();
    if (!j.contains("hash_ids") || !j.at("hash_ids").is_array()) {
      return LineError(line, "missing array \"hash_ids\"");
    }
    const auto& ids = j.at("hash_ids");
    const uint64_t need = (static_cast<uint64_t>(*in_len) + kMooncakeBlockTokens - 1) / kMooncakeBlockTokens;
    if (ids.size() != need) {
      return LineError(line, "input_length " + std::to_string(*in_len) + " needs " +
                                 std::to_string(need) + " hash_ids, found " +
                                 std::to_string(ids.size()));
    }
    r->arrival_s = ts / 1000.0;
    r->output_tokens = *out_len;
    r->tokens.reserve(*in_len);
    for (size_t b = 0; b < ids.size(); ++b) {
      if (!ids[b].is_number_unsigned() && !(ids[b].is_number_integer() && ids[b].get<int64_t>() >= 0)) {
        return LineError(line, "hash_ids must be non-negative integers");
      }
      const uint64_t h = ids[b].get<uint64_t>();
      const uint32_t n = std::min<uint32_t>(kMooncakeBlockTokens, *in_len - static_cast<uint32_t>(b) * kMooncakeBlockTokens);
      for (uint32_t t = 0; t < n; ++t) r->tokens.push_back(MooncakeToken(h, t));
    }
    return Status::Ok();
  });
}

StatusOr<std::vector<Request>> LoadKvtierTrace(const std::string& path) {
  return ReadLines(path, [](const json& j, size_t line, Request* r) -> Status {
    if (j.contains("session")) {
      if (!j.at("session").is_string()) return LineError(line, "\"session\" must be a string");
      r->session = j.at("session").get<std::string>();
    }
    auto turn = GetCount(j, "turn", line, false);
    if (!turn.ok()) return turn.status();
    r->turn = *turn;
    auto out = GetCount(j, "output_tokens", line, false);
    if (!out.ok()) return out.status();
    r->output_tokens = *out;
    if (j.contains("arrival_ms")) {
      if (!j.at("arrival_ms").is_number()) return LineError(line, "\"arrival_ms\" must be a number");
      const double ms = j.at("arrival_ms").get<double>();
      if (!std::isfinite(ms) || ms < 0) return LineError(line, "\"arrival_ms\" must be >= 0");
      r->arrival_s = ms / 1000.0;
    }
    const bool has_tokens = j.contains("tokens"), has_segments = j.contains("segments");
    if (has_tokens == has_segments) {
      return LineError(line, "give exactly one of \"tokens\" and \"segments\"");
    }
    if (has_tokens) {
      const auto& t = j.at("tokens");
      if (!t.is_array() || t.size() > kMaxTraceTokens) return LineError(line, "\"tokens\" must be an array of token ids");
      r->tokens.reserve(t.size());
      for (const auto& v : t) {
        if (!v.is_number_unsigned() || v.get<uint64_t>() > 0xFFFFFFFFull) {
          return LineError(line, "token ids must be integers in [0, 2^32)");
        }
        r->tokens.push_back(static_cast<uint32_t>(v.get<uint64_t>()));
      }
    } else {
      const auto& segs = j.at("segments");
      if (!segs.is_array()) return LineError(line, "\"segments\" must be an array");
      for (const auto& s : segs) {
        if (!s.is_object() || !s.contains("id") || !s.at("id").is_string()) {
          return LineError(line, "each segment needs a string \"id\"");
        }
        auto n = GetCount(s, "tokens", line, true);
        if (!n.ok()) return n.status();
        if (r->tokens.size() + *n > kMaxTraceTokens) return LineError(line, "request is too long");
        auto t = SegmentTokens(s.at("id").get<std::string>(), *n);
        r->tokens.insert(r->tokens.end(), t.begin(), t.end());
      }
    }
    return Status::Ok();
  });
}

StatusOr<std::vector<Request>> LoadTrace(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::IoError("cannot open trace " + path);
  std::string first;
  while (std::getline(in, first) && first.find_first_not_of(" \t\r") == std::string::npos) {
  }
  if (first.find("\"hash_ids\"") != std::string::npos) return LoadMooncakeTrace(path);
  return LoadKvtierTrace(path);
}

Status GeneratorOptions::Validate() const {
  if (requests < 1 || requests > 10'000'000) return Status::Invalid("requests must be in [1, 1e7]");
  if (sessions < 1) return Status::Invalid("sessions must be >= 1");
  if (system_prompts < 1) return Status::Invalid("system_prompts must be >= 1");
  if (max_turns < 1) return Status::Invalid("max_turns must be >= 1");
  if (!(zipf_alpha >= 0.0) || zipf_alpha > 10.0) return Status::Invalid("zipf_alpha must be in [0, 10]");
  if (!(rate_per_s > 0.0)) return Status::Invalid("rate_per_s must be > 0");
  const uint64_t longest = uint64_t{system_tokens} + first_turn_tokens + uint64_t{turn_tokens} * max_turns;
  if (longest > kMaxTraceTokens) return Status::Invalid("sessions would grow past the token limit");
  return Status::Ok();
}

std::vector<Request> GenerateAgentic(const GeneratorOptions& o) {
  std::mt19937_64 rng(o.seed);
  // Zipf over sessions: P(i) ~ 1 / (i+1)^alpha.
  std::vector<double> w(o.sessions);
  for (uint32_t i = 0; i < o.sessions; ++i) w[i] = 1.0 / std::pow(static_cast<double>(i + 1), o.zipf_alpha);
  std::discrete_distribution<uint32_t> pick(w.begin(), w.end());
  std::exponential_distribution<double> gap(o.rate_per_s);
  std::vector<uint32_t> turn(o.sessions, 0), epoch(o.sessions, 0);
  std::vector<Request> out;
  out.reserve(o.requests);
  double t = 0;
  for (uint32_t n = 0; n < o.requests; ++n) {
    t += gap(rng);
    const uint32_t s = pick(rng);
    if (turn[s] >= o.max_turns) {
      turn[s] = 0;
      ++epoch[s];
    }
    Request r;
    r.arrival_s = t;
    r.session = "s" + std::to_string(s) + "." + std::to_string(epoch[s]);
    r.turn = turn[s];
    const std::string sys = "sys-" + std::to_string(s % o.system_prompts);
    auto append = [&](const std::string& id, uint32_t count) {
      auto tok = SegmentTokens(id, count);
      r.tokens.insert(r.tokens.end(), tok.begin(), tok.end());
    };
    append(sys, o.system_tokens);
    append(r.session + "-u0", o.first_turn_tokens);
    for (uint32_t k = 1; k <= r.turn; ++k) append(r.session + "-t" + std::to_string(k), o.turn_tokens);
    r.output_tokens = 64;
    ++turn[s];
    out.push_back(std::move(r));
  }
  return out;
}

Status ToolLoopOptions::Validate() const {
  if (requests < 1 || requests > 10'000'000) return Status::Invalid("requests must be in [1, 1e7]");
  if (tool_prompts < 1) return Status::Invalid("tool_prompts must be >= 1");
  if (min_turns < 1 || max_turns < min_turns) return Status::Invalid("turns must satisfy 1 <= min_turns <= max_turns");
  if (!(one_shot_fraction >= 0.0 && one_shot_fraction <= 1.0)) return Status::Invalid("one_shot_fraction must be in [0, 1]");
  if (burst_sessions < 1) return Status::Invalid("burst_sessions must be >= 1");
  if (!(rate_per_s > 0.0)) return Status::Invalid("rate_per_s must be > 0");
  const uint64_t longest = uint64_t{tool_prompt_tokens} + task_tokens + uint64_t{tool_output_tokens} * 2 * max_turns;
  if (longest > kMaxTraceTokens) return Status::Invalid("sessions would grow past the token limit");
  return Status::Ok();
}

std::vector<Request> GenerateToolLoops(const ToolLoopOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::vector<double> w(o.tool_prompts);
  for (uint32_t i = 0; i < o.tool_prompts; ++i) w[i] = 1.0 / (i + 1);
  std::discrete_distribution<uint32_t> tool(w.begin(), w.end());
  std::uniform_int_distribution<uint32_t> turns(o.min_turns, o.max_turns);
  std::uniform_int_distribution<uint32_t> out_len(std::max<uint32_t>(1, o.tool_output_tokens / 4),
                                                  std::max<uint32_t>(1, o.tool_output_tokens * 7 / 4));
  std::uniform_real_distribution<double> u(0.0, 1.0);
  // A session: its tool prompt, its turns so far, how many it will take, the lengths of
  // the tool outputs it appended.
  struct Session {
    std::string id;
    uint32_t tool = 0, turns = 0, done = 0;
    std::vector<uint32_t> outputs;
  };
  uint64_t next_id = 0;
  auto open_session = [&] {
    Session s;
    s.id = "a" + std::to_string(next_id++);
    s.tool = tool(rng);
    s.turns = turns(rng);
    return s;
  };
  std::vector<Session> live;
  for (uint32_t i = 0; i < o.burst_sessions; ++i) live.push_back(open_session());
  // Bursts: a burst of requests arrives at 10x the mean rate, then a quiet gap keeps the
  // mean at rate_per_s.
  std::exponential_distribution<double> fast(o.rate_per_s * 10.0);
  const double quiet = o.burst_sessions * 0.9 / o.rate_per_s;
  std::vector<Request> out;
  out.reserve(o.requests);
  double t = 0;
  for (uint32_t n = 0; n < o.requests; ++n) {
    t += fast(rng);
    if (n > 0 && n % o.burst_sessions == 0) t += quiet;
    Request r;
    r.arrival_s = t;
    r.output_tokens = 64;
    auto append = [&](const std::string& id, uint32_t count) {
      auto tok = SegmentTokens(id, count);
      r.tokens.insert(r.tokens.end(), tok.begin(), tok.end());
    };
    if (u(rng) < o.one_shot_fraction) {
      const std::string id = "o" + std::to_string(next_id++);
      r.session = id;
      append("tool-" + std::to_string(tool(rng)), o.tool_prompt_tokens);
      append(id + "-task", o.task_tokens);
      out.push_back(std::move(r));
      continue;
    }
    Session& s = live[std::uniform_int_distribution<size_t>(0, live.size() - 1)(rng)];
    r.session = s.id;
    r.turn = s.done;
    append("tool-" + std::to_string(s.tool), o.tool_prompt_tokens);
    append(s.id + "-task", o.task_tokens);
    for (uint32_t k = 0; k < s.done; ++k) append(s.id + "-out" + std::to_string(k), s.outputs[k]);
    s.outputs.push_back(out_len(rng));
    ++s.done;
    out.push_back(std::move(r));
    if (s.done >= s.turns) s = open_session();  // the loop ends; a new session takes its place
  }
  return out;
}

bool ParseAdversarialKind(const std::string& s, AdversarialKind* k) {
  static const std::pair<const char*, AdversarialKind> kNames[] = {{"scan", AdversarialKind::kScan},
                                                                  {"loop", AdversarialKind::kLoop},
                                                                  {"shift", AdversarialKind::kShift},
                                                                  {"flood", AdversarialKind::kFlood}};
  for (const auto& [name, kind] : kNames) {
    if (s == name) {
      *k = kind;
      return true;
    }
  }
  return false;
}

Status AdversarialOptions::Validate() const {
  if (working_set < 2 || working_set > 10'000'000) return Status::Invalid("working_set must be in [2, 1e7]");
  if (prompt_tokens < 1 || prompt_tokens > kMaxTraceTokens) return Status::Invalid("prompt_tokens out of range");
  if (requests > 40'000'000) return Status::Invalid("requests must be <= 4e7");
  if (uint64_t{requests ? requests : 4ull * working_set} * prompt_tokens > (1ull << 31)) {
    return Status::Invalid("the workload would exceed 2^31 tokens: fewer requests, a smaller working set or prompts");
  }
  return Status::Ok();
}

std::vector<Request> GenerateAdversarial(const AdversarialOptions& o) {
  std::mt19937_64 rng(o.seed);
  const uint64_t n = o.requests ? o.requests : 4ull * o.working_set;
  const uint64_t ws = o.working_set;
  std::vector<double> zw(ws);
  for (uint64_t i = 0; i < ws; ++i) zw[i] = 1.0 / std::pow(static_cast<double>(i + 1), 0.8);
  std::discrete_distribution<uint64_t> zipf(zw.begin(), zw.end());
  const char* tag = o.kind == AdversarialKind::kScan    ? "scan"
                    : o.kind == AdversarialKind::kLoop  ? "loop"
                    : o.kind == AdversarialKind::kShift ? "shift"
                                                        : "flood";
  std::vector<Request> out;
  out.reserve(n);
  uint64_t once = 0;  // the next one-time prompt (scan, flood)
  for (uint64_t i = 0; i < n; ++i) {
    // The prompt: a class ("hot", "once", "p") and a number. (Built by append: GCC 12's
    // -Wrestrict misfires on literal + std::to_string.)
    const char* cls = "p";
    uint64_t num = 0;
    switch (o.kind) {
      case AdversarialKind::kScan:
        cls = i % 2 ? "once" : "hot";
        num = i % 2 ? once++ : std::uniform_int_distribution<uint64_t>(0, ws / 2 - 1)(rng);
        break;
      case AdversarialKind::kLoop: num = i % ws; break;
      case AdversarialKind::kShift:
        num = (i / (2 * ws)) * (ws / 2) + std::uniform_int_distribution<uint64_t>(0, ws - 1)(rng);
        break;
      case AdversarialKind::kFlood: {
        const bool hot = i % (3 * ws) < 2 * ws;
        cls = hot ? "hot" : "once";
        num = hot ? zipf(rng) : once++;
        break;
      }
    }
    std::string id(cls);
    id += '-';
    id += std::to_string(num);
    std::string seg(tag);
    seg += '-';
    seg += id;
    Request r;
    r.arrival_s = static_cast<double>(i) * 0.05;
    r.session = id;
    r.tokens = SegmentTokens(seg, o.prompt_tokens);
    r.output_tokens = 1;
    out.push_back(std::move(r));
  }
  return out;
}

Status WriteKvtierTrace(const std::string& path, const std::vector<Request>& reqs) {
  std::ofstream out(path + ".tmp");
  if (!out) return Status::IoError("cannot create " + path + ".tmp");
  for (const auto& r : reqs) {
    json j;
    j["session"] = r.session;
    j["turn"] = r.turn;
    j["arrival_ms"] = r.arrival_s * 1000.0;
    j["output_tokens"] = r.output_tokens;
    j["tokens"] = r.tokens;
    out << j.dump() << "\n";
  }
  out.close();
  if (!out) return Status::IoError("cannot write " + path + ".tmp");
  if (std::rename((path + ".tmp").c_str(), path.c_str()) != 0) return Status::IoError("cannot rename to " + path);
  return Status::Ok();
}

}  // namespace kvtier::replay
