// Workload traces for the replayer: one Request per prompt, with its token ids.
//
// Two file formats are read, and a generator makes agentic multi-turn workloads:
//
// 1. kvtier JSON lines (one object per line):
//      {"session": "s1", "turn": 0, "arrival_ms": 12.5, "tokens": [1, 2, 3, ...],
//       "output_tokens": 128}
//    or, instead of "tokens", "segments": [{"id": "sys-a", "tokens": 2048},
//    {"id": "s1-t0", "tokens": 311}] -- each segment's token ids derive from its id
//    (SegmentTokens), so equal segment ids give equal tokens and shared prefixes.
//    "session", "turn" and "output_tokens" are optional.
// 2. The Mooncake FAST'25 trace format: {"timestamp": ms, "input_length": n,
//    "output_length": m, "hash_ids": [...]}. Each hash id names 512 tokens; equal ids
//    mean equal content. Token j of id h is MooncakeToken(h, j); the last id covers
//    the remainder of input_length. With T dividing 512, a shared id maps to 512/T
//    shared kvtier blocks.
//
// Every malformed line is refused with its line number; nothing is half-loaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "formats/status.h"

namespace kvtier::replay {

struct Request {
  double arrival_s = 0.0;      // seconds from the trace start
  std::string session;         // "" when the trace has none
  uint32_t turn = 0;
  std::vector<uint32_t> tokens;
  uint32_t output_tokens = 0;
};

inline constexpr uint32_t kMooncakeBlockTokens = 512;
inline constexpr size_t kMaxTraceTokens = 4u << 20;  // per request: refuse absurd lengths

// Deterministic token ids (in [1000, 1000 + 2^17)), stable across runs and machines.
uint32_t MooncakeToken(uint64_t hash_id, uint32_t j);
std::vector<uint32_t> SegmentTokens(const std::string& segment_id, uint32_t count);

StatusOr<std::vector<Request>> LoadKvtierTrace(const std::string& path);
StatusOr<std::vector<Request>> LoadMooncakeTrace(const std::string& path);
// Picks the format from the first line ("hash_ids" -> Mooncake).
StatusOr<std::vector<Request>> LoadTrace(const std::string& path);

// Agentic multi-turn sessions: shared system prompts, tool-call turns that append to
// the context, Zipf popularity over sessions.
struct GeneratorOptions {
  uint32_t requests = 2000;          // total requests. Default: 2000
  uint32_t sessions = 200;           // distinct sessions. Default: 200
  uint32_t system_prompts = 4;       // shared system prompts. Default: 4
  uint32_t system_tokens = 2048;     // tokens per system prompt. Default: 2048
  uint32_t first_turn_tokens = 1024; // user/context tokens of a session's first turn. Default: 1024
  uint32_t turn_tokens = 384;        // tokens a turn appends (tool output + reply). Default: 384
  uint32_t max_turns = 24;           // a session restarts from turn 0 after this. Default: 24
  double zipf_alpha = 1.0;           // popularity skew over sessions. Default: 1.0
  double rate_per_s = 20.0;          // Poisson arrival rate. Default: 20
  uint64_t seed = 1;                 // Default: 1

  Status Validate() const;
};
std::vector<Request> GenerateAgentic(const GeneratorOptions& opts);

// Tool-agent loops: a few long tool-definition prompts shared by everything, short
// sessions (a task, then call -> tool output -> call turns that append to the context)
// interleaved a burst at a time, and one-shot requests that share only the tool prompt.
// Reuse is a long shared head, a short-lived session tail, and one-hit tasks.
struct ToolLoopOptions {
  uint32_t requests = 3000;            // total requests. Default: 3000
  uint32_t tool_prompts = 8;           // shared tool-definition prompts (Zipf 1). Default: 8
  uint32_t tool_prompt_tokens = 6144;  // tokens per tool prompt. Default: 6144
  uint32_t task_tokens = 512;          // a session's or one-shot's own task. Default: 512
  uint32_t min_turns = 2;              // turns per session, uniform in [min, max]. Default: 2
  uint32_t max_turns = 8;              // Default: 8
  uint32_t tool_output_tokens = 768;   // mean tokens a turn appends (uniform in [1/4, 7/4] of it). Default: 768
  double one_shot_fraction = 0.3;      // requests that are one-shot tasks, in [0, 1]. Default: 0.3
  uint32_t burst_sessions = 32;        // sessions open at once; a burst replaces them. Default: 32
  double rate_per_s = 20.0;            // mean arrival rate (arrivals come in bursts). Default: 20
  uint64_t seed = 1;                   // Default: 1

  Status Validate() const;
};
std::vector<Request> GenerateToolLoops(const ToolLoopOptions& opts);

// Adversarial workloads for eviction policies, sized by `working_set` prompts (set it from
// the cache: a loop of 1.1 x the prompts a budget holds is "just larger than the cache").
// Every prompt is prompt_tokens of its own (no shared prefix), so each is one chain.
//   scan   a hot set of working_set / 2 prompts (uniform), every other request the next
//          prompt of a scan that never repeats (one-time blocks, far more than the cache)
//   loop   prompts 0, 1, ..., working_set - 1, again and again (LRU's worst case)
//   shift  phases of 2 x working_set requests, each uniform over working_set prompts that
//          start working_set / 2 later than the last phase's (the hot set moves)
//   flood  a hot set of working_set prompts (Zipf 0.8), 2 x working_set requests of it,
//          then working_set one-hit prompts in a row, and again
enum class AdversarialKind { kScan, kLoop, kShift, kFlood };
struct AdversarialOptions {
  AdversarialKind kind = AdversarialKind::kLoop;
  uint32_t working_set = 1000;   // prompts (see above). Default: 1000
  uint32_t prompt_tokens = 2048; // tokens per prompt. Default: 2048
  uint32_t requests = 0;         // 0: 4 x working_set. Default: 0
  uint64_t seed = 1;             // Default: 1

  Status Validate() const;
};
// "scan", "loop", "shift", "flood" -> kind; false on anything else.
bool ParseAdversarialKind(const std::string& s, AdversarialKind* k);
std::vector<Request> GenerateAdversarial(const AdversarialOptions& opts);

// Writes requests in kvtier's JSON-lines format (explicit tokens).
Status WriteKvtierTrace(const std::string& path, const std::vector<Request>& reqs);

}  // namespace kvtier::replay
