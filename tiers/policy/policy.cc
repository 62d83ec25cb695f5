#include "tiers/policy/policy.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>

#include <list>
#include <set>
#include <unordered_map>
#include <unordered_set>

namespace kvtier::tiers {

namespace {

// The per-policy maps are abseil SwissTables (as the TierManager's block index): an
// acquire touches every block it pins, so their finds are on the request path.

// ---- LRU ---------------------------------------------------------------------------
class LruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "lru"; }
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
  explicit S3FifoPolicy(uint64_t capacity)
      : small_target_(std::max<uint64_t>(1, capacity / 10)), ghost_cap_(std::max<uint64_t>(1, capacity)) {}
  const char* name() const override { return "s3fifo"; }
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
  const uint64_t small_target_, ghost_cap_;
  std::list<BlockId> small_, main_, ghost_;
  absl::flat_hash_set<BlockId, BlockIdHash> ghost_set_;
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
};

// ---- prefix-LRU --------------------------------------------------------------------
// Leaves (blocks with no cached child in this tier) sit in an ordered set by last use;
// inner blocks wait outside it. children_[p] counts present blocks whose parent is p,
// whether or not p itself is present, so the order of insertion does not matter.
class PrefixLruPolicy final : public EvictionPolicy {
 public:
  const char* name() const override { return "prefix-lru"; }
  void Insert(const BlockId& b, const BlockId& parent) override {
    if (map_.count(b)) return Touch(b);
    Entry e;
    e.parent = parent;
    e.has_parent = !parent.key.IsZero();
    e.tick = ++clock_;
    auto cit = children_.find(b);
    e.children = cit == children_.end() ? 0 : cit->second;
    map_[b] = e;
    if (e.children == 0) leaves_.insert({e.tick, b});
    if (e.has_parent) {
      uint32_t& c = children_[parent];
      ++c;
      auto pit = map_.find(parent);
      if (pit != map_.end() && c == 1) leaves_.erase({pit->second.tick, parent});
      if (pit != map_.end()) pit->second.children = c;
    }
  }
  void Touch(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    Entry& e = it->second;
    const bool leaf = e.children == 0;
    if (leaf) leaves_.erase({e.tick, b});
    e.tick = ++clock_;
    if (leaf) leaves_.insert({e.tick, b});
  }
  void Remove(const BlockId& b) override {
    auto it = map_.find(b);
    if (it == map_.end()) return;
    Entry e = it->second;
    if (e.children == 0) leaves_.erase({e.tick, b});
    map_.erase(it);
    if (e.has_parent) {
      auto cit = children_.find(e.parent);
      if (cit != children_.end() && --cit->second == 0) {
        children_.erase(cit);
        auto pit = map_.find(e.parent);
        if (pit != map_.end()) {
          pit->second.children = 0;
          leaves_.insert({pit->second.tick, e.parent});
        }
      } else if (cit != children_.end()) {
        auto pit = map_.find(e.parent);
        if (pit != map_.end()) pit->second.children = cit->second;
      }
    }
  }
  std::optional<BlockId> Victim(const std::function<bool(const BlockId&)>& ok) override {
    for (const auto& [tick, b] : leaves_) {
      if (ok(b)) return b;
    }
    return std::nullopt;
  }
  size_t size() const override { return map_.size(); }
  bool Contains(const BlockId& b) const override { return map_.count(b) != 0; }

 private:
  struct Entry {
    BlockId parent;
    bool has_parent = false;
    uint64_t tick = 0;
    uint32_t children = 0;
  };
  struct TickLess {
    bool operator()(const std::pair<uint64_t, BlockId>& a, const std::pair<uint64_t, BlockId>& b) const {
      return a.first < b.first;  // ticks are unique
    }
  };
  uint64_t clock_ = 0;
  absl::flat_hash_map<BlockId, Entry, BlockIdHash> map_;
  absl::flat_hash_map<BlockId, uint32_t, BlockIdHash> children_;
  std::set<std::pair<uint64_t, BlockId>, TickLess> leaves_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> EvictionPolicy::Create(PolicyKind kind, uint64_t capacity) {
  switch (kind) {
    case PolicyKind::kLru: return std::make_unique<LruPolicy>();
    case PolicyKind::kS3Fifo: return std::make_unique<S3FifoPolicy>(capacity);
    case PolicyKind::kPrefixLru: return std::make_unique<PrefixLruPolicy>();
  }
  return std::make_unique<LruPolicy>();
}

const char* PolicyName(PolicyKind k) {
  switch (k) {
    case PolicyKind::kLru: return "lru";
    case PolicyKind::kS3Fifo: return "s3fifo";
    case PolicyKind::kPrefixLru: return "prefix-lru";
  }
  return "?";
}

bool ParsePolicy(std::string_view s, PolicyKind* k) {
  if (s == "lru") *k = PolicyKind::kLru;
  else if (s == "s3fifo") *k = PolicyKind::kS3Fifo;
  else if (s == "prefix-lru") *k = PolicyKind::kPrefixLru;
  else return false;
  return true;
}

}  // namespace kvtier::tiers
