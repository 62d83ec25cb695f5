#include "tools/replay/simulate.h"

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <queue>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "formats/keys.h"
#include "tiers/nvme_admission.h"
#include "tiers/policy/policy.h"

namespace kvtier::replay {

using tiers::BlockId;
using tiers::BlockIdHash;

Status SimOptions::Validate() const {
  if (tiers.empty()) return Status::Invalid("simulation needs at least one tier");
  if (std::string why = policy_options.Check(); !why.empty()) return Status::Invalid("policy: " + why);
  if (!(admission.window_s > 0.0)) return Status::Invalid("admission: window_s must be > 0");
  if (!(horizon_lifetimes > 0.0)) return Status::Invalid("horizon_lifetimes must be > 0");
  return geometry.Validate(format);
}

const char* AdmissionModeName(SimAdmission::Mode m) {
  switch (m) {
    case SimAdmission::Mode::kAlways: return "always";
    case SimAdmission::Mode::kSecondHit: return "second-hit";
    case SimAdmission::Mode::kReuse: return "reuse";
  }
  return "?";
}

uint64_t SimResult::token_capacity(uint32_t block_tokens) const {
  uint64_t blocks_total = 0;
  for (uint64_t c : capacity_blocks) blocks_total += c;
  return blocks_total * block_tokens;
}

namespace {

// When a block is referenced next, and how deep in its chain: what the oracles rank by.
struct NextUse {
  uint64_t next = UINT64_MAX;  // request index of the next reference; never again = max
  uint32_t depth = 0;          // position in the chain
  uint64_t next_pos = UINT64_MAX;  // block references before that request; never = max
};
using NextUseMap = std::unordered_map<BlockId, NextUse, BlockIdHash>;

// Belady's rule as an EvictionPolicy: reads the simulator's NextUseMap on Insert and
// Touch (the simulator updates it before each), keeps resident blocks ordered by it.
class BeladyPolicy final : public tiers::EvictionPolicy {
 public:
  explicit BeladyPolicy(const NextUseMap* next) : next_(next) {}
  const char* name() const override { return "oracle"; }
  void Insert(const BlockId& b, const BlockId&) override { Touch(b, true); }
  void Touch(const BlockId& b) override { Touch(b, false); }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    order_.erase({it->second, b});
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    for (const auto& [nu, b] : order_) {
      if (ok(b)) return b;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  void Touch(const BlockId& b, bool insert) {
    auto it = map_.find(b);
    if (it == map_.end() && !insert) return;
    NextUse nu;
    if (auto n = next_->find(b); n != next_->end()) nu = n->second;
    if (it != map_.end()) {
      order_.erase({it->second, b});
      it->second = nu;
    } else {
      map_[b] = nu;
    }
    order_.insert({nu, b});
  }
  struct Farthest {  // farthest next use first, then the deepest, then any fixed order
    bool operator()(const std::pair<NextUse, BlockId>& a, const std::pair<NextUse, BlockId>& b) const {
      if (a.first.next != b.first.next) return a.first.next > b.first.next;
      if (a.first.depth != b.first.depth) return a.first.depth > b.first.depth;
      if (a.second.key != b.second.key) return a.second.key > b.second.key;
      return a.second.contract > b.second.contract;
    }
  };
  const NextUseMap* next_;
  std::unordered_map<BlockId, NextUse, BlockIdHash> map_;
  std::set<std::pair<NextUse, BlockId>, Farthest> order_;
};

// The partial-knowledge oracles (simulate.h): LRU order in two lists, the blocks known to
// be dead (never referenced again, or not within `horizon` block references of *now)
// first. A block's status is set when it is inserted, touched or Update()d (the
// simulator updates every cached block of a request before running it); a block beyond
// the horizon becomes live when the horizon reaches its next use (a heap of those times,
// applied before each victim choice). horizon = UINT64_MAX: the reuse-bit oracle.
class PartialOraclePolicy final : public tiers::EvictionPolicy {
 public:
  PartialOraclePolicy(const NextUseMap* next, const uint64_t* now, uint64_t horizon, const char* name)
      : next_(next), now_(now), horizon_(horizon), name_(name) {}
  const char* name() const override { return name_; }
  void Insert(const BlockId& b, const BlockId&) override { Set(b, true, true); }
  void Touch(const BlockId& b) override { Set(b, false, true); }
  // New knowledge of b's next use (the same LRU place).
  void Update(const BlockId& b) { Set(b, false, false); }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    (it->second.dead ? dead_ : live_).erase(it->second.tick);
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    while (!wake_.empty() && wake_.top().at <= *now_) {
      const Wake w = wake_.top();
      wake_.pop();
      auto it = map_.find(w.id);
      if (it == map_.end() || !it->second.dead || it->second.next_pos != w.next_pos) continue;
      dead_.erase(it->second.tick);
      it->second.dead = false;
      live_[it->second.tick] = w.id;
    }
    for (const auto* l : {&dead_, &live_}) {
      for (const auto& [tick, b] : *l) {
        if (ok(b)) return b;
      }
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  struct Entry {
    uint64_t tick = 0;
    uint64_t next_pos = UINT64_MAX;
    bool dead = false;
  };
  struct Wake {
    uint64_t at;  // *now_ from which the block is within the horizon
    uint64_t next_pos;
    BlockId id;
    bool operator>(const Wake& o) const { return at > o.at; }
  };
  void Set(const BlockId& b, bool insert, bool use) {
    auto it = map_.find(b);
    if (it == map_.end()) {
      if (!insert) return;
      it = map_.emplace(b, Entry{++clock_, UINT64_MAX, false}).first;
    } else {
      (it->second.dead ? dead_ : live_).erase(it->second.tick);
      if (use) it->second.tick = ++clock_;
    }
    Entry& e = it->second;
    auto n = next_->find(b);
    e.next_pos = n == next_->end() ? UINT64_MAX : n->second.next_pos;
    e.dead = e.next_pos == UINT64_MAX || (horizon_ != UINT64_MAX && e.next_pos - *now_ > horizon_);
    (e.dead ? dead_ : live_)[e.tick] = b;
    if (e.dead && e.next_pos != UINT64_MAX) wake_.push({e.next_pos - horizon_, e.next_pos, b});
  }
  const NextUseMap* next_;
  const uint64_t* now_;  // block references before the current request
  const uint64_t horizon_;
  const char* name_;
  uint64_t clock_ = 0;
  std::unordered_map<BlockId, Entry, BlockIdHash> map_;
  std::map<uint64_t, BlockId> dead_, live_;  // by tick of last use: least recent first
  std::priority_queue<Wake, std::vector<Wake>, std::greater<Wake>> wake_;
};

// What the simulator knows of a cached block: its parent, its depth in its chain, and
// how many requests used it since it entered the cache.
struct Meta {
  BlockId parent;
  uint32_t depth = 0;
  uint32_t uses = 0;
};

class Simulator {
 public:
  // next: per request, per block, the index of the request that references the block
  // next (UINT64_MAX: never); req_pos: per request, the block references before it. Only
  // for the oracles.
  Simulator(const SimOptions& o, const std::vector<std::vector<uint64_t>>* next, const std::vector<uint64_t>* req_pos)
      : opts_(o), next_of_(next), req_pos_(req_pos),
        knows_future_(o.oracle || o.partial_oracle != SimOptions::PartialOracle::kNone) {
    res_.slot_bytes = SlotBytes(o.format, o.geometry);
    for (const auto& t : o.tiers) {
      const uint64_t cap = t.capacity_bytes / res_.slot_bytes;
      res_.capacity_blocks.push_back(cap);
      if (o.oracle) {
        policies_.push_back(std::make_unique<BeladyPolicy>(&next_use_));
      } else if (o.partial_oracle != SimOptions::PartialOracle::kNone) {
        const bool bit = o.partial_oracle == SimOptions::PartialOracle::kReuseBit;
        const uint64_t h = bit ? UINT64_MAX
                               : static_cast<uint64_t>(std::ceil(o.horizon_lifetimes * static_cast<double>(std::max<uint64_t>(cap, 1))));
        auto p = std::make_unique<PartialOraclePolicy>(&next_use_, &now_pos_, h, bit ? "reuse-bit oracle" : "horizon oracle");
        partial_.push_back(p.get());
        policies_.push_back(std::move(p));
      } else {
        policies_.push_back(tiers::EvictionPolicy::Create(t.policy, std::max<uint64_t>(cap, 1), o.policy_options));
      }
    }
    res_.hits_by_tier.assign(o.tiers.size(), 0);
    for (size_t t = 0; t < o.tiers.size(); ++t) {
      if (o.tiers[t].name == "nvme") nvme_tier_ = static_cast<int>(t);
    }
    const auto& a = o.admission;
    if (a.mode == SimAdmission::Mode::kReuse) {
      tiers::ReuseAdmission::Options po;
      po.budget_bytes = a.budget_bytes;
      po.window_s = a.window_s;
      po.memory = std::max<uint64_t>(1024, nvme_tier_ >= 0 ? res_.capacity_blocks[nvme_tier_] : 0);
      predicted_ = std::make_unique<tiers::ReuseAdmission>(po, 0.0);
    } else {
      fixed_ = std::make_unique<tiers::NvmeAdmission>(
          a.mode == SimAdmission::Mode::kSecondHit ? tiers::Admission::kSecondHit : tiers::Admission::kAlways,
          a.budget_bytes, nvme_tier_ >= 0 ? res_.capacity_blocks[nvme_tier_] : 0, tiers::NvmeAdmission::Clock::time_point{});
    }
  }

  void Run(const std::vector<Key128>& keys, uint32_t prompt_tokens, double arrival_s) {
    const uint32_t T = opts_.geometry.block_tokens;
    now_s_ = arrival_s;
    now_pos_ = res_.blocks;
    if (knows_future_) {  // every block of this request: its next use is now a later one
      const auto& nx = (*next_of_)[res_.requests];
      for (size_t j = 0; j < keys.size(); ++j) {
        const BlockId b = Id(keys[j]);
        next_use_[b] = NextUse{nx[j], static_cast<uint32_t>(j), nx[j] == UINT64_MAX ? UINT64_MAX : (*req_pos_)[nx[j]]};
        if (auto it = where_.find(b); it != where_.end()) {
          if (opts_.oracle) policies_[it->second]->Touch(b);
          else partial_[it->second]->Update(b);
        }
      }
    }
    ++res_.requests;
    res_.blocks += keys.size();
    res_.prompt_tokens += prompt_tokens;
    size_t hit = 0;
    for (; hit < keys.size(); ++hit) {
      auto it = where_.find(Id(keys[hit]));
      if (it == where_.end()) break;
      ++res_.hits_by_tier[it->second];
      policies_[it->second]->Touch(Id(keys[hit]));
      ++meta_[Id(keys[hit])].uses;
    }
    res_.prefix_hits += hit;
    res_.recomputed_tokens += prompt_tokens - hit * T;
    // Pin the request's blocks while it runs; move them all to the top tier.
    pinned_.clear();
    for (const auto& k : keys) pinned_.insert(Id(k));
    Key128 parent{};
    for (size_t j = 0; j < keys.size(); ++j) {
      const BlockId b = Id(keys[j]);
      auto it = where_.find(b);
      if (it != where_.end() && it->second != 0) {
        policies_[it->second]->Remove(b);
        where_.erase(it);
        ++res_.promoted_blocks;
      }
      if (where_.count(b) == 0) {
        Meta& m = meta_[b];
        m.parent = Id(parent);
        m.depth = static_cast<uint32_t>(j);
        if (m.uses == 0) m.uses = 1;
        Place(b, 0);
      }
      parent = keys[j];
    }
  }

  SimResult result() const { return res_; }

 private:
  BlockId Id(const Key128& k) const { return BlockId{opts_.contract_id, k}; }

  // Whether the NVMe tier takes b (demoted into it).
  bool Admit(const BlockId& b, const Meta& m) {
    bool ok;
    if (predicted_) {
      ok = predicted_->Admit(b, res_.slot_bytes, m.uses, now_s_);
    } else {  // the window runs on trace time: one window = 24 h of the daemon's clock
      const auto at = tiers::NvmeAdmission::Clock::time_point{} +
                      std::chrono::duration_cast<tiers::NvmeAdmission::Clock::duration>(
                          std::chrono::duration<double>(now_s_ * 86400.0 / opts_.admission.window_s));
      ok = fixed_->Admit(b, res_.slot_bytes, m.uses, false, at);
    }
    if (!ok) {
      ++res_.admission_rejects;
      return false;
    }
    ++res_.nvme_writes;
    res_.nvme_written_bytes += res_.slot_bytes;
    return true;
  }

  // Puts b (its parent and depth in meta_) into tier t (evicting if full), falling
  // through to lower tiers when every block of t is pinned. Dropped if no tier takes it.
  void Place(const BlockId& b, size_t t) {
    for (; t < policies_.size(); ++t) {
      const uint64_t cap = res_.capacity_blocks[t];
      if (cap == 0) continue;
      if (static_cast<int>(t) == nvme_tier_ && t > 0 && !Admit(b, meta_[b])) break;
      if (policies_[t]->size() >= cap) {
        auto victim = policies_[t]->Victim([&](const BlockId& v) { return pinned_.count(v) == 0; });
        if (!victim) continue;  // everything pinned: try the next tier
        const BlockId v = *victim;
        policies_[t]->Remove(v);
        where_.erase(v);
        if (t + 1 < policies_.size() && res_.capacity_blocks[t + 1] > 0) {
          ++res_.demoted_blocks;
          Place(v, t + 1);
        } else {
          ++res_.dropped_blocks;
          meta_.erase(v);
        }
      }
      policies_[t]->Insert(b, meta_[b].parent);
      where_[b] = static_cast<int>(t);
      return;
    }
    ++res_.dropped_blocks;
    meta_.erase(b);
  }

  SimOptions opts_;
  const std::vector<std::vector<uint64_t>>* next_of_;
  const std::vector<uint64_t>* req_pos_;
  const bool knows_future_;
  uint64_t now_pos_ = 0;  // block references before the current request
  std::vector<PartialOraclePolicy*> partial_;  // per tier, the partial oracles
  NextUseMap next_use_;
  SimResult res_;
  std::vector<std::unique_ptr<tiers::EvictionPolicy>> policies_;
  std::unordered_map<BlockId, int, BlockIdHash> where_;
  std::unordered_map<BlockId, Meta, BlockIdHash> meta_;  // cached blocks
  int nvme_tier_ = -1;
  double now_s_ = 0.0;
  std::unique_ptr<tiers::NvmeAdmission> fixed_;
  std::unique_ptr<tiers::ReuseAdmission> predicted_;
  std::unordered_set<BlockId, BlockIdHash> pinned_;
};

}  // namespace

KeyedTrace KeyTrace(const std::vector<Request>& reqs, uint32_t block_tokens, uint64_t contract_id) {
  KeyedTrace t;
  t.block_tokens = block_tokens;
  t.keys.reserve(reqs.size());
  for (const auto& r : reqs) {
    t.keys.push_back(KeyChain(contract_id, r.tokens, block_tokens));
    t.prompt_tokens.push_back(static_cast<uint32_t>(r.tokens.size()));
    t.arrival_s.push_back(r.arrival_s);
  }
  return t;
}

SimResult Simulate(const KeyedTrace& trace, const SimOptions& opts) {
  std::vector<std::vector<uint64_t>> next;
  std::vector<uint64_t> req_pos(trace.keys.size() + 1, 0);
  for (size_t i = 0; i < trace.keys.size(); ++i) req_pos[i + 1] = req_pos[i] + trace.keys[i].size();
  if (opts.oracle || opts.partial_oracle != SimOptions::PartialOracle::kNone) {
    // one backward pass: the next request that references each block
    next.resize(trace.keys.size());
    std::unordered_map<Key128, uint64_t, Key128Hash> later;
    for (size_t i = trace.keys.size(); i-- > 0;) {
      const auto& keys = trace.keys[i];
      next[i].resize(keys.size());
      for (size_t j = 0; j < keys.size(); ++j) {
        auto it = later.find(keys[j]);
        next[i][j] = it == later.end() ? UINT64_MAX : it->second;
      }
      for (const auto& k : keys) later[k] = i;
    }
  }
  Simulator s(opts, &next, &req_pos);
  for (size_t i = 0; i < trace.keys.size(); ++i) {
    s.Run(trace.keys[i], trace.prompt_tokens[i], i < trace.arrival_s.size() ? trace.arrival_s[i] : 0.0);
  }
  return s.result();
}

SimResult Simulate(const std::vector<Request>& reqs, const SimOptions& opts) {
  return Simulate(KeyTrace(reqs, opts.geometry.block_tokens, opts.contract_id), opts);
}

double InfiniteBoundHitRate(const KeyedTrace& trace) {
  std::unordered_set<Key128, Key128Hash> seen;
  uint64_t blocks = 0, hits = 0;
  for (const auto& keys : trace.keys) {
    for (const auto& k : keys) {
      ++blocks;
      hits += !seen.insert(k).second;
    }
  }
  return blocks ? static_cast<double>(hits) / blocks : 0.0;
}

double InfiniteBoundHitRate(const std::vector<Request>& reqs, uint32_t block_tokens) {
  return InfiniteBoundHitRate(KeyTrace(reqs, block_tokens));
}

}  // namespace kvtier::replay
