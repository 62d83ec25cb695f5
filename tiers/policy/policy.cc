#include "tiers/policy/policy.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace kvtier::tiers {

namespace {

// The per-policy maps are abseil SwissTables (as the TierManager's block index): an
// acquire touches every block it pins, so their finds are on the request path.

// ---- LRU ---------------------------------------------------------------------------
class LruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return PolicyName(PolicyKind::kLru); }
  void Insert(const BlockId& b, const BlockId&) override {
    if (map_.count(b)) return Touch(b);
    list_.push_front(b);
    map_[b] = list_.begin();
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it != map_.end()) list_.splice(list_.begin(), list_, it->second);
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    list_.erase(it->second);
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    for (auto it = list_.rbegin(); it != list_.rend(); ++it) {
      if (ok(*it)) return *it;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  std::list<BlockId> list_;  // front = most recent
  absl::flat_hash_map<BlockId, std::list<BlockId>::iterator, BlockIdHash> map_;
};

// ---- S3-FIFO -----------------------------------------------------------------------
class S3FifoPolicy final : public EvictionPolicy {
 public:
  S3FifoPolicy(uint64_t capacity, double small_fraction) : small_fraction_(small_fraction) { SetCapacity(capacity); }
  const char* name() const override { return PolicyName(PolicyKind::kS3Fifo); }
  void SetCapacity(uint64_t c) override {
    small_target_ = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(c) * small_fraction_));
    ghost_cap_ = std::max<uint64_t>(1, c);
  }
  void Insert(const BlockId& b, const BlockId&) override {
    if (map_.count(b)) return Touch(b);
    const bool ghost = ghost_set_.erase(b) != 0;
    auto& q = ghost ? main_ : small_;
    q.push_back(b);
    map_[b] = {std::prev(q.end()), ghost, 0};
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it != map_.end() && it->second.freq < 3) ++it->second.freq;
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    (it->second.in_main ? main_ : small_).erase(it->second.pos);
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    // Each queue is walked at most a few times around (freq drops to 0 in <= 3 passes for
    // main; skipped blocks rotate), so a tier full of pinned blocks answers nullopt, not a
    // hang. Once every block of one queue has been skipped as pinned, the other queue is
    // used: blocks pinned in small (say, the prefix a request is writing) must not hide
    // evictable blocks in main.
    size_t budget = 4 * (small_.size() + main_.size()) + 4;
    size_t small_skips = 0, main_skips = 0;
    while (budget-- > 0 && !map_.empty()) {
      const bool small_open = !small_.empty() && small_skips < small_.size();
      const bool main_open = !main_.empty() && main_skips < main_.size();
      bool from_small = small_open && (small_.size() >= small_target_ || !main_open);
      if (!from_small && !main_open) break;
      auto& q = from_small ? small_ : main_;
      BlockId b = q.front();
      Entry& e = map_[b];
      if (!ok(b)) {  // pinned or busy: rotate past it, keep its frequency
        q.splice(q.end(), q, q.begin());
        ++(from_small ? small_skips : main_skips);
        continue;
      }
      if (from_small) {
        if (e.freq > 0) {  // used again while in small: earns a place in main
          main_.splice(main_.end(), small_, small_.begin());
          e.in_main = true;
          e.freq = 0;
          continue;
        }
        AddGhost(b);
        return b;
      }
      if (e.freq > 0) {  // main: lazy promotion by reinsertion
        --e.freq;
        main_.splice(main_.end(), main_, main_.begin());
        continue;
      }
      return b;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  struct Entry {
    std::list<BlockId>::iterator pos;
    bool in_main = false;
    uint8_t freq = 0;
  };
  void AddGhost(const BlockId& b) {
    if (ghost_set_.insert(b).second) ghost_.push_back(b);
    while (ghost_.size() > ghost_cap_) {
      ghost_set_.erase(ghost_.front());
      ghost_.pop_front();
    }
  }
  const double small_fraction_;
  uint64_t small_target_ = 1, ghost_cap_ = 1;
  std::list<BlockId> small_, main_, ghost_;
  absl::flat_hash_set<BlockId, BlockIdHash> ghost_set_;
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
};

// ---- chain bookkeeping (prefix-lru, reuse) -------------------------------------------
// children_[p] counts present blocks whose parent is p, whether or not p itself is
// present, so the order of insertion does not matter. A block named as its own parent
// has no parent (a self-loop must not make it an inner block forever); a cycle of
// parents leaves every block of it inner, which the inner fallback still offers.
class ChildCounts {
 public:
  uint32_t Get(const BlockId& b) const {
    auto it = c_.find(b);
    return it == c_.end() ? 0 : it->second;
  }
  uint32_t Add(const BlockId& p) { return ++c_[p]; }
  uint32_t Drop(const BlockId& p) {
    auto it = c_.find(p);
    if (it == c_.end()) return 0;
    if (--it->second == 0) {
      c_.erase(it);
      return 0;
    }
    return it->second;
  }

 private:
  absl::flat_hash_map<BlockId, uint32_t, BlockIdHash> c_;
};

bool HasParent(const BlockId& b, const BlockId& parent) { return !parent.key.IsZero() && !(parent == b); }

// Blocks in order of last use, each with the tick of its last use (unique per policy):
// front = least recent. A touch moves a block to the back, an O(1) splice that allocates
// nothing, so the request path (an acquire touches every block it pins) costs what LRU
// costs. A block that changes lists keeps its tick: a parent that gains its first cached
// child leaves the leaves for the inner blocks, and goes back when the last one leaves.
// PlaceByTick finds its place by walking at most kPlaceSteps entries in from each end,
// which is exact in the usual cases (a parent touched just before its new child sits
// near the back of the inner list; a parent whose last child was the least recent leaf
// sits at the front of the leaves) and in any list of up to 2 x kPlaceSteps blocks.
// When both walks stop short, the block goes beside the stopping point nearer in tick:
// its order is then approximate, never lost (it is in exactly one list).
struct TickNode {
  BlockId id;
  uint64_t tick = 0;
};
using TickList = std::list<TickNode>;
using TickPos = TickList::iterator;
constexpr int kPlaceSteps = 32;

// Moves the node at `pos` (in `from`) into `to` at its tick's place (see above).
void PlaceByTick(TickList& to, TickList& from, TickPos pos) {
  const uint64_t t = pos->tick;
  TickPos lo = to.begin(), hi = to.end();  // [begin, lo) older than t; [hi, end) newer
  for (int i = 0; i < kPlaceSteps; ++i) {
    if (hi == lo) return to.splice(hi, from, pos);  // the walks met: exact
    if (std::prev(hi)->tick < t) return to.splice(hi, from, pos);
    --hi;
    if (hi == lo) return to.splice(hi, from, pos);
    if (lo->tick > t) return to.splice(lo, from, pos);
    ++lo;
  }
  // lo and hi stand inside the list, lo before hi, prev(lo) older and hi newer than t.
  const uint64_t below = t - std::prev(lo)->tick, above = hi->tick - t;
  to.splice(below <= above ? lo : hi, from, pos);
}

// ---- prefix-LRU --------------------------------------------------------------------
// Leaves (blocks with no cached child in this tier) sit in one tick list by last use;
// inner blocks sit in a second one, offered only when no leaf is evictable.
class PrefixLruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return PolicyName(PolicyKind::kPrefixLru); }
  void Insert(const BlockId& b, const BlockId& parent) override {
    if (map_.count(b)) return Touch(b);
    Entry e;
    e.parent = parent;
    e.has_parent = HasParent(b, parent);
    e.inner = children_.Get(b) != 0;
    TickList& l = e.inner ? inner_ : leaves_;
    l.push_back({b, ++clock_});
    e.pos = std::prev(l.end());
    map_[b] = e;
    if (e.has_parent && children_.Add(parent) == 1) {
      auto pit = map_.find(parent);
      if (pit != map_.end()) {
        pit->second.inner = true;
        PlaceByTick(inner_, leaves_, pit->second.pos);
      }
    }
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    Entry& e = it->second;
    TickList& l = e.inner ? inner_ : leaves_;
    e.pos->tick = ++clock_;
    l.splice(l.end(), l, e.pos);
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    const Entry e = it->second;
    (e.inner ? inner_ : leaves_).erase(e.pos);
    map_.erase(it);
    if (e.has_parent && children_.Drop(e.parent) == 0) {
      auto pit = map_.find(e.parent);
      if (pit != map_.end()) {
        pit->second.inner = false;
        PlaceByTick(leaves_, inner_, pit->second.pos);
      }
    }
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    for (const TickList* l : {&leaves_, &inner_}) {
      for (const TickNode& n : *l) {
        if (ok(n.id)) return n.id;
      }
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  struct Entry {
    BlockId parent;
    bool has_parent = false;
    bool inner = false;  // children_.Get(key) != 0: the node is in inner_, else leaves_
    TickPos pos;
  };
  uint64_t clock_ = 0;
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
  ChildCounts children_;
  TickList leaves_, inner_;
};

// ---- SIEVE -------------------------------------------------------------------------
// list_ runs from the oldest block (front) to the newest (back); the hand walks front to
// back and wraps. Victim() leaves the hand on the block it names; Remove() of that block
// moves the hand to the next one, so the next search resumes where this one stopped.
class SievePolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return PolicyName(PolicyKind::kSieve); }
  void Insert(const BlockId& b, const BlockId&) override {
    if (map_.count(b)) return Touch(b);
    list_.push_back(b);
    map_[b] = {std::prev(list_.end()), false};
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it != map_.end()) it->second.visited = true;
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    if (hand_ == it->second.pos) hand_ = std::next(hand_);
    list_.erase(it->second.pos);
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    // Two passes clear every visited bit of an evictable block, so a third finds one if
    // any exists; pinned blocks keep their bit and are stepped over.
    size_t budget = 3 * list_.size() + 1;
    while (budget-- > 0 && !list_.empty()) {
      if (hand_ == list_.end()) hand_ = list_.begin();
      Entry& e = map_.find(*hand_)->second;
      if (ok(*hand_)) {
        if (!e.visited) return *hand_;
        e.visited = false;
      }
      ++hand_;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  struct Entry {
    std::list<BlockId>::iterator pos;
    bool visited = false;
  };
  std::list<BlockId> list_;
  std::list<BlockId>::iterator hand_ = list_.end();
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
};

// ---- ARC ---------------------------------------------------------------------------
// Resident lists T1 (seen once since it entered) and T2 (seen again), ghost lists B1 and
// B2 of keys evicted from them; each list's front is its least recent key. The tier
// manager, not the policy, decides when a block leaves, so ARC's REPLACE becomes the
// choice of Victim() and Remove() moves the leaving block to its ghost list.
class ArcPolicy final : public EvictionPolicy {
 public:
  explicit ArcPolicy(uint64_t capacity) : c_(capacity) {}
  const char* name() const override { return PolicyName(PolicyKind::kArc); }
  void SetCapacity(uint64_t c) override {
    c_ = std::max<uint64_t>(1, c);
    p_ = std::min(p_, static_cast<double>(c_));
    TrimGhosts();
  }
  void Insert(const BlockId& b, const BlockId&) override {
    if (auto it = map_.find(b); it != map_.end()) {
      if (it->second.list < 2) return Touch(b);
      const int g = it->second.list;  // a ghost hit: adapt p, then b enters T2
      const double b1 = static_cast<double>(lists_[2].size()), b2 = static_cast<double>(lists_[3].size());
      if (g == 2) p_ = std::min<double>(static_cast<double>(c_), p_ + std::max(1.0, b2 / std::max(b1, 1.0)));
      else p_ = std::max(0.0, p_ - std::max(1.0, b1 / std::max(b2, 1.0)));
      Move(it->second, b, 1);
      return;
    }
    lists_[0].push_back(b);
    map_[b] = {std::prev(lists_[0].end()), 0};
    TrimGhosts();
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end() || it->second.list >= 2) return;
    Move(it->second, b, 1);
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end() || it->second.list >= 2) return;
    Move(it->second, b, it->second.list + 2);
    TrimGhosts();
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    const bool t1_first = !lists_[0].empty() && (static_cast<double>(lists_[0].size()) > p_ || lists_[1].empty());
    for (int l : {t1_first ? 0 : 1, t1_first ? 1 : 0}) {
      for (const BlockId& b : lists_[l]) {
        if (ok(b)) return b;
      }
    }
    return std::nullopt;
  }
  size_t size() const override { return lists_[0].size() + lists_[1].size(); }
  bool Contains(const BlockId& b) const override {
    auto it = map_.find(b);
    return it != map_.end() && it->second.list < 2;
  }

 private:
  struct Entry {
    std::list<BlockId>::iterator pos;
    int list = 0;  // 0 T1, 1 T2, 2 B1, 3 B2
  };
  void Move(Entry& e, const BlockId& b, int to) {
    lists_[to].splice(lists_[to].end(), lists_[e.list], e.pos);
    e.list = to;
  }
  void DropGhost(int l) {
    map_.erase(lists_[l].front());
    lists_[l].pop_front();
  }
  // |T1| + |B1| <= c and |T1| + |T2| + |B1| + |B2| <= 2c, as in ARC.
  void TrimGhosts() {
    while (!lists_[2].empty() && lists_[0].size() + lists_[2].size() > c_) DropGhost(2);
    while (lists_[2].size() + lists_[3].size() > 0 && map_.size() > 2 * c_) {
      DropGhost(lists_[3].empty() ? 2 : 3);
    }
  }
  uint64_t c_;
  double p_ = 0;  // target size of T1
  std::list<BlockId> lists_[4];
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
};

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

// ---- W-TinyLFU ---------------------------------------------------------------------
// Einziger, Friedman and Manes, "TinyLFU: A Highly Efficient Cache Admission Policy"
// (ACM ToS 2017), laid out as Caffeine runs it: a window LRU (tinylfu_window_fraction of
// the tier) in front of a segmented LRU main (probation, and protected up to 80% of the
// rest). Every insert and touch counts the block in a count-min sketch (4 rows of 4-bit
// counters, width the next power of two >= max(1024, capacity)) behind a doorkeeper (a
// bit set that the first sighting sets instead of the counters); after 10 x capacity
// counts every counter halves and the doorkeeper clears, so the counts follow the
// workload. A block pushed out of the window is a *candidate* for main; when a block must
// leave, the oldest candidate competes with main's least recent block (probation first):
// it enters main only if its estimated frequency is higher, and the loser leaves. The
// tier manager decides when a block leaves (its watermarks), so the candidates wait in
// their own list; past window-size candidates, the oldest enters probation unopposed (a
// tier filling up). Memory: the entries plus 3 bytes per sketch column (2 of counters, 1
// of doorkeeper bits).
class TinyLfuPolicy final : public EvictionPolicy {
 public:
  TinyLfuPolicy(uint64_t capacity, double window_fraction) : window_fraction_(window_fraction) {
    SetCapacity(capacity);
    uint64_t w = 1024;
    while (w < capacity) w <<= 1;
    mask_ = w - 1;
    for (auto& row : rows_) row.assign(w / 2, 0);  // two 4-bit counters a byte
    door_.assign(w, 0);                            // 8 x w doorkeeper bits
    door_mask_ = 8 * w - 1;
  }
  const char* name() const override { return PolicyName(PolicyKind::kTinyLfu); }
  // The sketch keeps its width (sized at creation); its sample and the segments follow.
  void SetCapacity(uint64_t c) override {
    window_target_ = std::max<uint64_t>(1, static_cast<uint64_t>(static_cast<double>(c) * window_fraction_));
    protected_target_ = std::max<uint64_t>(1, (c - std::min(c, window_target_)) * 4 / 5);
    sample_ = std::max<uint64_t>(10, 10 * c);
  }
  void Insert(const BlockId& b, const BlockId&) override {
    if (map_.count(b)) return Touch(b);
    Count(b);
    lists_[kWindow].push_back(b);
    map_[b] = {std::prev(lists_[kWindow].end()), kWindow};
    while (lists_[kWindow].size() > window_target_) {
      Move(map_.find(lists_[kWindow].front())->second, kCandidate);
    }
    while (lists_[kCandidate].size() > window_target_) {
      Move(map_.find(lists_[kCandidate].front())->second, kProbation);
    }
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    Count(b);
    Entry& e = it->second;
    if (e.list == kProbation || e.list == kCandidate) {  // used again out of the window: protected
      Move(e, kProtected);
      if (lists_[kProtected].size() > protected_target_) {
        Move(map_.find(lists_[kProtected].front())->second, kProbation);
      }
    } else {
      lists_[e.list].splice(lists_[e.list].end(), lists_[e.list], e.pos);
    }
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    lists_[it->second.list].erase(it->second.pos);
    map_.erase(it);
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    const BlockId* cand = First(kCandidate, ok);
    const BlockId* victim = First(kProbation, ok);
    if (!victim) victim = First(kProtected, ok);
    if (cand && victim) {
      if (Estimate(*cand) <= Estimate(*victim)) return *cand;
      const BlockId v = *victim;
      Move(map_.find(*cand)->second, kProbation);  // the candidate wins a place in main
      return v;
    }
    if (cand) return *cand;
    if (victim) return *victim;
    if (const BlockId* w = First(kWindow, ok)) return *w;  // main empty or pinned
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  enum List : uint8_t { kWindow = 0, kCandidate = 1, kProbation = 2, kProtected = 3 };
  struct Entry {
    std::list<BlockId>::iterator pos;
    List list = kWindow;
  };
  // The least recent block of list l that ok() accepts.
  const BlockId* First(List l, const std::function<bool(const BlockId&)>& ok) const {
    for (const BlockId& b : lists_[l]) {
      if (ok(b)) return &b;
    }
    return nullptr;
  }
  void Move(Entry& e, List to) {
    lists_[to].splice(lists_[to].end(), lists_[e.list], e.pos);
    e.list = to;
  }
  static uint64_t Mix(uint64_t x) {  // splitmix64's finalizer
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    return x ^ (x >> 31);
  }
  uint64_t Column(uint64_t h, int row) const { return Mix(h + 0x9E3779B97F4A7C15ull * (row + 1)) & mask_; }
  uint8_t Get(int row, uint64_t c) const { return (rows_[row][c >> 1] >> ((c & 1) * 4)) & 0xF; }
  uint64_t DoorBit(uint64_t h) const { return Mix(h ^ 0xD6E8FEB86659FD93ull) & door_mask_; }
  // The sketch's estimate: the least of the block's counters, plus its doorkeeper bit.
  uint32_t Estimate(const BlockId& b) const {
    const uint64_t h = BlockIdHash()(b);
    uint32_t m = 15;
    for (int r = 0; r < kRows; ++r) m = std::min<uint32_t>(m, Get(r, Column(h, r)));
    const uint64_t d = DoorBit(h);
    return m + ((door_[d >> 3] >> (d & 7)) & 1);
  }
  void Count(const BlockId& b) {
    const uint64_t h = BlockIdHash()(b);
    const uint64_t d = DoorBit(h);
    if (!((door_[d >> 3] >> (d & 7)) & 1)) {
      door_[d >> 3] |= static_cast<uint8_t>(1u << (d & 7));  // first sighting since the last halving
    } else {
      for (int r = 0; r < kRows; ++r) {
        const uint64_t c = Column(h, r);
        if (Get(r, c) < 15) rows_[r][c >> 1] += static_cast<uint8_t>(1u << ((c & 1) * 4));
      }
    }
    if (++counted_ >= sample_) {  // age: halve every counter, clear the doorkeeper
      counted_ = 0;
      for (auto& row : rows_) {
        for (uint8_t& byte : row) byte = static_cast<uint8_t>((byte >> 1) & 0x77);
      }
      std::fill(door_.begin(), door_.end(), 0);
    }
  }
  static constexpr int kRows = 4;
  const double window_fraction_;
  uint64_t window_target_ = 1, protected_target_ = 1, sample_ = 10;
  uint64_t mask_ = 0, door_mask_ = 0, counted_ = 0;
  std::vector<uint8_t> rows_[kRows];
  std::vector<uint8_t> door_;
  std::list<BlockId> lists_[4];  // each: front = least recent (candidates: oldest)
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
};

}  // namespace

static_assert(kPolicyNames.size() == static_cast<size_t>(PolicyKind::kTinyLfu) + 1,
              "kPolicyNames and PolicyKind must list the same policies in the same order");

std::unique_ptr<EvictionPolicy> EvictionPolicy::Create(PolicyKind kind, uint64_t capacity, const PolicyOptions& o) {
  capacity = std::max<uint64_t>(capacity, 1);
  switch (kind) {
    case PolicyKind::kLru: return std::make_unique<LruPolicy>();
    case PolicyKind::kS3Fifo: return std::make_unique<S3FifoPolicy>(capacity, o.s3fifo_small_fraction);
    case PolicyKind::kPrefixLru: return std::make_unique<PrefixLruPolicy>();
    case PolicyKind::kSieve: return std::make_unique<SievePolicy>();
    case PolicyKind::kArc: return std::make_unique<ArcPolicy>(capacity);
    case PolicyKind::kReuse: return std::make_unique<ReusePolicy>(capacity, o);
    case PolicyKind::kTinyLfu: return std::make_unique<TinyLfuPolicy>(capacity, o.tinylfu_window_fraction);
  }
  return nullptr;  // TierOptions::Validate refuses a kind outside the table
}

const char* PolicyName(PolicyKind k) {
  const size_t i = static_cast<size_t>(k);
  return i < kPolicyNames.size() ? kPolicyNames[i].data() : "?";
}

bool ParsePolicy(std::string_view s, PolicyKind* k) {
  const int i = PolicyIndex(s);
  if (i < 0) return false;
  *k = static_cast<PolicyKind>(i);
  return true;
}

std::vector<PolicyKind> AllPolicies() {
  std::vector<PolicyKind> v;
  for (size_t i = 0; i < kPolicyNames.size(); ++i) v.push_back(static_cast<PolicyKind>(i));
  return v;
}

}  // namespace kvtier::tiers
