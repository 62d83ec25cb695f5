// The reuse eviction policy (kvtier's own; policy.h describes it): probation and
// protected segments, each eaten from its chains' tails, a ghost of evicted keys, an
// adaptive protected target, optional hit density and an LRU guard.
#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <list>
#include <optional>
#include <vector>

#include "tiers/policy/policy.h"
#include "tiers/policy/policy_chains.h"

namespace kvtier::tiers {

namespace {

using namespace policy_chains;  // NOLINT: the chain helpers reuse shares with prefix-lru

// ---- reuse (kvtier's own) ----------------------------------------------------------
// Two segments (0 probation, 1 protected), each split into leaves and inner blocks, four
// tick lists by last use: a touch is an O(1) splice, a change of list a bounded walk
// (PlaceByTick). The ghost is a FIFO of evicted keys.
//
// With reuse_density, hit density (LHD's measure, Beckmann et al., NSDI'18), learned per
// segment and age: hits_[s][a] and ends_[s][a] count blocks of segment s hit, or gone, at
// age a (ticks since last use, in log buckets; counted only with reuse_density). From them, for each age, P(hit later) / expected
// remaining life. Victim() takes the least recent candidate of each segment and evicts
// the one of lower density, so the split between segments follows the workload (dead
// protected blocks lose to new ones when they stop being hit).
//
// Without density (or until the first table is built), protected gives up blocks only
// above a target size, which starts at reuse_protected_fraction of the tier and, with
// reuse_adapt, moves by ARC's rule (Megiddo and Modha, FAST'03): each ghost entry
// remembers the segment its block left, a returning key that left probation says
// probation was too small (the target drops by max(1, protected ghosts / probation
// ghosts)), one that left protected says the opposite (it rises by the inverse ratio),
// within [0, capacity].
//
// With reuse_lru_guard, protection must pay against recency, measured by two shadow
// caches of the tier's capacity in keys (no bytes) that see every Insert and Touch: plain
// LRU, and a twin of this policy without the guard (a cache of its own: it evicts its own
// victims). Each counts its prefix hits (a key counts when it is in the shadow and its
// parent was that shadow's previous hit, or it starts a chain). Every guard window
// (max(256, capacity / 2) accesses) compares the two: LRU ahead raises the recency weight
// w by a half, the twin ahead by more than noise (2 sqrt(hits)) lowers it by an eighth.
// The shadows do not depend on w, so
// the comparison is a duel of the two rules on the same requests (set dueling, as CPU
// caches choose between insertion policies), not of this cache against one. Victim()
// then decides a share w of its choices between the two segments' candidates by recency
// alone (the older one goes, as in LRU, still leaves first), the rest by the protected
// target; the choices are spread evenly (an error accumulator, no randomness). So where
// protection loses to recency the policy becomes prefix-aware LRU within a few windows,
// and where it wins it keeps its gains.
class ReusePolicy final : public EvictionPolicy {
 public:
  ReusePolicy(uint64_t capacity, const PolicyOptions& o)
      : cap_(std::max<uint64_t>(1, capacity)),
        ghost_factor_(o.reuse_ghost_factor),
        ghost_cap_(static_cast<uint64_t>(static_cast<double>(cap_) * o.reuse_ghost_factor)),
        density_on_(o.reuse_density),
        adapt_(o.reuse_adapt),
        guard_(o.reuse_lru_guard),
        period_(std::max<uint64_t>(1024, cap_ / 2)),
        target_(static_cast<double>(cap_) * o.reuse_protected_fraction) {
    if (guard_) {
      PolicyOptions t = o;
      t.reuse_lru_guard = false;
      twin_ = std::make_unique<ReusePolicy>(capacity, t);
    }
  }
  const char* name() const override { return PolicyName(PolicyKind::kReuse); }
  // The protected target keeps its share of the tier (and what adaptation made of it).
  void SetCapacity(uint64_t c) override {
    c = std::max<uint64_t>(1, c);
    target_ *= static_cast<double>(c) / static_cast<double>(cap_);
    cap_ = c;
    ghost_cap_ = static_cast<uint64_t>(static_cast<double>(c) * ghost_factor_);
    period_ = std::max<uint64_t>(1024, c / 2);
    TrimGhost();
    TrimShadow();
    if (twin_) twin_->SetCapacity(c);
  }
  void Insert(const BlockId& b, const BlockId& parent) override {
    if (map_.count(b)) return Touch(b);
    if (guard_) Shadow(b, &parent);
    Entry e;
    e.parent = parent;
    e.has_parent = HasParent(b, parent);
    e.tick = ++clock_;
    if (auto g = ghost_map_.find(b); g != ghost_map_.end()) {
      e.seg = 1;  // it came back while remembered: reused
      const uint8_t left = g->second->seg;
      if (adapt_) Adapt(left);
      --ghost_n_[left];
      ghost_.erase(g->second);
      ghost_map_.erase(g);
    }
    e.inner = children_.Get(b) != 0;
    TickList& l = Set(e.seg, e.inner);
    l.push_back({b, e.tick});
    e.pos = std::prev(l.end());
    map_[b] = e;
    ++seg_size_[e.seg];
    if (e.has_parent && children_.Add(parent) == 1) {
      auto pit = map_.find(parent);
      if (pit != map_.end()) {
        Entry& pe = pit->second;
        pe.inner = true;
        PlaceByTick(Set(pe.seg, true), Set(pe.seg, false), pe.pos);
      }
    }
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    Entry& e = it->second;
    if (guard_) Shadow(b, &e.parent);
    if (density_on_) Count(hits_[e.seg], e.tick, clock_);
    TickList& from = Set(e.seg, e.inner);
    --seg_size_[e.seg];
    e.seg = 1;
    ++seg_size_[e.seg];
    e.tick = ++clock_;
    e.pos->tick = e.tick;
    TickList& to = Set(e.seg, e.inner);
    to.splice(to.end(), from, e.pos);
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    const Entry e = it->second;
    if (density_on_) Count(ends_[e.seg], e.tick, clock_);
    Set(e.seg, e.inner).erase(e.pos);
    --seg_size_[e.seg];
    map_.erase(it);
    if (e.has_parent && children_.Drop(e.parent) == 0) {
      auto pit = map_.find(e.parent);
      if (pit != map_.end()) {
        Entry& pe = pit->second;
        pe.inner = false;
        PlaceByTick(Set(pe.seg, false), Set(pe.seg, true), pe.pos);
      }
    }
    if (ghost_cap_ > 0) {
      ghost_.push_back({b, e.seg});
      ++ghost_n_[e.seg];
      ghost_map_[b] = std::prev(ghost_.end());
    }
    TrimGhost();
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    // Leaves first (a chain is eaten from its tail), then inner blocks; within each, the
    // least recent evictable block of each segment competes.
    for (bool inner : {false, true}) {
      const TickNode* cand[2] = {nullptr, nullptr};
      for (int seg : {0, 1}) {
        for (const TickNode& n : Set(seg, inner)) {
          if (ok(n.id)) {
            cand[seg] = &n;
            break;
          }
        }
      }
      if (!cand[0] && !cand[1]) continue;
      if (!cand[0] || !cand[1]) return (cand[0] ? cand[0] : cand[1])->id;
      int evict;
      if (guard_ && (mix_ += w_) >= 1.0) {
        mix_ -= 1.0;
        evict = cand[1]->tick < cand[0]->tick ? 1 : 0;  // recency: the older one goes
      } else if (density_on_ && built_) {
        evict = density_[1][Bucket(clock_ - cand[1]->tick)] < density_[0][Bucket(clock_ - cand[0]->tick)] ? 1 : 0;
      } else {
        evict = static_cast<double>(seg_size_[1]) > target_ ? 1 : 0;
      }
      return cand[evict]->id;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  static constexpr int kBuckets = 96;  // 4 per doubling of the age: up to ~2^24 ticks
  struct Entry {
    BlockId parent;
    bool has_parent = false;
    bool inner = false;  // children_.Get(key) != 0
    uint8_t seg = 0;
    uint64_t tick = 0;
    TickPos pos;  // in Set(seg, inner)
  };
  static int Bucket(uint64_t age) {
    if (age < 4) return static_cast<int>(age);
    const int lg = 63 - __builtin_clzll(age);  // >= 2
    const int frac = static_cast<int>((age >> (lg - 2)) & 3);
    return std::min(kBuckets - 1, (lg - 1) * 4 + frac);
  }
  static double Age(int k) {  // the middle of bucket k
    if (k < 4) return k;
    const int lg = k / 4 + 1, frac = k % 4;
    return std::ldexp(4.0 + frac + 0.5, lg - 2);
  }
  void TrimGhost() {
    while (ghost_.size() > ghost_cap_) {
      ghost_map_.erase(ghost_.front().id);
      --ghost_n_[ghost_.front().seg];
      ghost_.pop_front();
    }
  }
  // The shadows see an access of b (its parent: the one it was inserted with) and count
  // their prefix hits; every window, w follows the comparison.
  void Shadow(const BlockId& b, const BlockId* parent) {
    auto it = shadow_map_.find(b);
    const bool in = it != shadow_map_.end();
    const BlockId p = parent ? *parent : (in ? it->second->parent : BlockId{});
    const bool root = p.key == Key128{};
    if (in && (root || (last_valid_ && p == last_hit_))) ++lru_hits_;
    last_valid_ = in && (root || (last_valid_ && p == last_hit_));
    if (last_valid_) last_hit_ = b;
    if (in) {
      shadow_.splice(shadow_.begin(), shadow_, it->second);
      if (parent) it->second->parent = *parent;
    } else {
      shadow_.push_front({b, p});
      shadow_map_[b] = shadow_.begin();
      TrimShadow();
    }
    // The twin: the same access on reuse without the guard, a cache of its own.
    auto tw = twin_->map_.find(b);
    const bool tin = tw != twin_->map_.end();
    const BlockId tp = parent ? *parent : (tin ? tw->second.parent : BlockId{});
    const bool troot = tp.key == Key128{};
    const bool thit = tin && (troot || (twin_valid_ && tp == twin_last_));
    if (thit) ++twin_hits_;
    twin_valid_ = thit;
    if (thit) twin_last_ = b;
    if (tin) {
      twin_->Touch(b);
    } else {
      if (twin_->size() >= cap_) {
        if (auto v = twin_->Victim([](const BlockId&) { return true; })) twin_->Remove(*v);
      }
      twin_->Insert(b, tp);
    }
    if (++window_n_ >= std::max<uint64_t>(256, cap_ / 2)) {
      // LRU ahead at all: toward recency at once. The twin ahead by more than noise (two
      // standard deviations of the difference of two counts): back toward protection,
      // slowly, so that one window after a shift of the working set does not undo it.
      const double noise = 2.0 * std::sqrt(static_cast<double>(lru_hits_ + twin_hits_) + 1.0);
      if (lru_hits_ > twin_hits_) w_ = std::min(1.0, w_ + 0.5);
      else if (static_cast<double>(twin_hits_ - lru_hits_) > noise) w_ = std::max(0.0, w_ - 0.125);
      window_n_ = lru_hits_ = twin_hits_ = 0;
    }
  }
  void TrimShadow() {
    while (shadow_.size() > cap_) {
      shadow_map_.erase(shadow_.back().id);
      shadow_.pop_back();
    }
  }
  // A key that left segment `left` came back (ARC's adaptation of the target).
  void Adapt(uint8_t left) {
    const double n0 = static_cast<double>(ghost_n_[0]), n1 = static_cast<double>(ghost_n_[1]);
    if (left == 0) target_ = std::max(0.0, target_ - std::max(1.0, n1 / std::max(n0, 1.0)));
    else target_ = std::min(static_cast<double>(cap_), target_ + std::max(1.0, n0 / std::max(n1, 1.0)));
  }
  // A block last used at `tick` is hit or leaves at `now`.
  void Count(double (&c)[kBuckets], uint64_t tick, uint64_t now) {
    c[Bucket(now - tick)] += 1.0;
    if (++events_ % period_ == 0) Rebuild();
  }
  // density_[s][k] = P(a block of s at age k is hit before it goes) / its expected
  // remaining life; then every count decays, so the tables follow the workload.
  void Rebuild() {
    for (int s = 0; s < 2; ++s) {
      double h = 0, e = 0, w = 0;
      for (int k = kBuckets - 1; k >= 0; --k) {
        h += hits_[s][k];
        e += hits_[s][k] + ends_[s][k];
        w += (hits_[s][k] + ends_[s][k]) * Age(k);
        density_[s][k] = e > 0 ? (h / e) / std::max(1.0, w / e - Age(k)) : 0.0;
      }
      for (int k = 0; k < kBuckets; ++k) {
        hits_[s][k] *= 0.9;
        ends_[s][k] *= 0.9;
      }
    }
    built_ = true;
  }
  TickList& Set(int seg, bool inner) { return sets_[seg * 2 + (inner ? 1 : 0)]; }
  uint64_t cap_;
  const double ghost_factor_;
  uint64_t ghost_cap_;
  const bool density_on_, adapt_, guard_;
  uint64_t period_;  // events (hits and departures) between table rebuilds
  double target_;          // protected blocks allowed without (or before) a density table
  uint64_t clock_ = 0, events_ = 0;
  uint64_t seg_size_[2] = {0, 0};
  bool built_ = false;
  double hits_[2][kBuckets] = {}, ends_[2][kBuckets] = {}, density_[2][kBuckets] = {};
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
  ChildCounts children_;
  TickList sets_[4];
  struct Ghost {
    BlockId id;
    uint8_t seg = 0;  // the segment the block left
  };
  std::list<Ghost> ghost_;  // oldest first
  uint64_t ghost_n_[2] = {0, 0};  // ghost entries per segment left
  absl::flat_hash_map<BlockId, std::list<Ghost>::iterator, BlockIdHash> ghost_map_;
  // reuse_lru_guard: the shadow LRU (front = most recent; keys and parents, capacity
  // entries), this window's accesses and hits of it and of this policy, the recency
  // weight and its accumulator.
  struct ShadowEntry {
    BlockId id, parent;
  };
  std::list<ShadowEntry> shadow_;
  absl::flat_hash_map<BlockId, std::list<ShadowEntry>::iterator, BlockIdHash> shadow_map_;
  BlockId last_hit_;
  bool last_valid_ = false;
  // The twin: reuse without the guard, fed the same accesses, a cache of capacity keys of
  // its own; its prefix hits are what protection would have had.
  std::unique_ptr<ReusePolicy> twin_;
  BlockId twin_last_;
  bool twin_valid_ = false;
  uint64_t window_n_ = 0, lru_hits_ = 0, twin_hits_ = 0;
  double w_ = 0.0, mix_ = 0.0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeReusePolicy(uint64_t capacity, const PolicyOptions& o) {
  return std::make_unique<ReusePolicy>(capacity, o);
}

}  // namespace kvtier::tiers
