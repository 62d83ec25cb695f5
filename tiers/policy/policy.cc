// The eviction policies (policy.h): LRU, S3-FIFO, prefix-LRU, SIEVE, ARC and W-TinyLFU
// here, reuse in reuse_policy.cc; the chain bookkeeping prefix-LRU and reuse share is in
// policy_chains.h.
#include "tiers/policy/policy.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <algorithm>
#include <cmath>
#include <list>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "tiers/policy/policy_chains.h"

namespace kvtier::tiers {

namespace {

using namespace policy_chains;  // NOLINT: the chain helpers prefix-lru shares with reuse

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
    case PolicyKind::kReuse: return MakeReusePolicy(capacity, o);
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
