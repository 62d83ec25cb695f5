// Every eviction policy on the same traces (parameterized), plus each policy's own rule.
#include "tiers/policy/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "tests/tiers/test_util.h"
#include "tiers/tier_manager.h"  // TierOptions

namespace kvtier::tiers {
namespace {

BlockId B(uint64_t i) { return BlockId{1, testing::K(i + 1)}; }
BlockId None() { return BlockId{1, Key128{}}; }

class PolicyTest : public ::testing::TestWithParam<PolicyKind> {
 protected:
  std::unique_ptr<EvictionPolicy> p_ = EvictionPolicy::Create(GetParam(), 64);
};

// Evicting everything returns every block once, never a pinned one.
TEST_P(PolicyTest, DrainsEveryUnpinnedBlockExactlyOnce) {
  for (uint64_t i = 0; i < 50; ++i) p_->Insert(B(i), None());
  std::mt19937 rng(5);
  for (int i = 0; i < 200; ++i) p_->Touch(B(rng() % 50));
  std::set<uint64_t> pinned = {3, 17, 42};
  std::set<uint64_t> out;
  auto evictable = [&](const BlockId& b) {
    for (uint64_t p : pinned)
      if (b == B(p)) return false;
    return true;
  };
  while (auto v = p_->Victim(evictable)) {
    for (uint64_t p : pinned) ASSERT_FALSE(*v == B(p)) << "pinned block chosen";
    uint64_t idx = 999;
    for (uint64_t i = 0; i < 50; ++i)
      if (*v == B(i)) idx = i;
    ASSERT_NE(idx, 999u);
    ASSERT_TRUE(out.insert(idx).second) << "victim returned twice";
    p_->Remove(*v);
  }
  EXPECT_EQ(out.size(), 47u);
  EXPECT_EQ(p_->size(), 3u);
  EXPECT_FALSE(p_->Victim([](const BlockId&) { return false; }).has_value());
}

TEST_P(PolicyTest, RemoveAndUnknownBlocksAreHarmless) {
  p_->Touch(B(1));
  p_->Remove(B(1));
  p_->Insert(B(1), None());
  p_->Insert(B(1), None());  // twice = touch
  EXPECT_EQ(p_->size(), 1u);
  EXPECT_TRUE(p_->Contains(B(1)));
  p_->Remove(B(1));
  EXPECT_EQ(p_->size(), 0u);
  EXPECT_FALSE(p_->Victim([](const BlockId&) { return true; }).has_value());
}

// A hot block touched on every step outlives a stream of one-time blocks.
TEST_P(PolicyTest, HotBlockSurvivesAScan) {
  p_->Insert(B(0), None());
  std::set<uint64_t> resident = {0};
  for (uint64_t i = 1; i < 500; ++i) {
    p_->Touch(B(0));
    p_->Insert(B(i), None());
    resident.insert(i);
    while (resident.size() > 32) {
      auto v = p_->Victim([](const BlockId&) { return true; });
      ASSERT_TRUE(v.has_value());
      p_->Remove(*v);
      for (auto it = resident.begin(); it != resident.end(); ++it) {
        if (B(*it) == *v) {
          resident.erase(it);
          break;
        }
      }
    }
  }
  EXPECT_TRUE(resident.count(0)) << PolicyName(GetParam()) << " evicted the hot block";
}

// Chains of blocks (prompts sharing prefixes). prefix-lru and reuse never pick a block
// that has a cached child while a leaf is evictable; the others may (that is the
// difference the test pins down).
TEST_P(PolicyTest, PrefixChainsRule) {
  // 6 chains of 8 blocks; chain c block j has parent chain c block j-1.
  auto id = [](int c, int j) { return B(static_cast<uint64_t>(c * 100 + j)); };
  std::map<std::pair<int, int>, bool> present;
  for (int c = 0; c < 6; ++c) {
    for (int j = 0; j < 8; ++j) {
      p_->Insert(id(c, j), j == 0 ? None() : id(c, j - 1));
      present[{c, j}] = true;
    }
  }
  // Reuse the chain heads (a shared system prompt is hot): plain LRU would evict tails last.
  for (int c = 0; c < 6; ++c) p_->Touch(id(c, 0));
  bool stranded = false;
  for (int n = 0; n < 40; ++n) {
    auto v = p_->Victim([](const BlockId&) { return true; });
    ASSERT_TRUE(v.has_value());
    int vc = -1, vj = -1;
    for (auto& [k, on] : present)
      if (on && id(k.first, k.second) == *v) vc = k.first, vj = k.second;
    ASSERT_GE(vc, 0);
    const bool has_child = vj + 1 < 8 && present[{vc, vj + 1}];
    if (GetParam() == PolicyKind::kPrefixLru || GetParam() == PolicyKind::kReuse) {
      ASSERT_FALSE(has_child) << PolicyName(GetParam()) << " evicted block " << vj << " of chain " << vc
                              << " while its child is cached";
    }
    stranded |= has_child;
    present[{vc, vj}] = false;
    p_->Remove(*v);
  }
  if (GetParam() == PolicyKind::kLru) {
    EXPECT_TRUE(stranded) << "trace should strand children under lru";
  }
}

// Whenever some block is evictable, Victim must name one, however many pinned blocks sit
// in front of it (a request pins the blocks it is writing; they must not hide the rest).
TEST_P(PolicyTest, PinnedBlocksNeverHideAnEvictableOne) {
  auto p = EvictionPolicy::Create(GetParam(), 100);
  // 60 old blocks, each used twice (so S3-FIFO moves them to its main queue)...
  for (uint64_t i = 0; i < 60; ++i) p->Insert(B(i), None());
  for (int round = 0; round < 2; ++round) {
    for (uint64_t i = 0; i < 60; ++i) p->Touch(B(i));
  }
  auto all = [](const BlockId&) { return true; };
  auto index = [](const BlockId& b) { return (b.key.hi & 0xFFFFFFFFull) - 1; };  // B(i) -> i
  for (int i = 0; i < 5; ++i) {  // cycle small: touched blocks move to main
    auto v = p->Victim([&](const BlockId& b) { return index(b) >= 1000; });
    (void)v;
  }
  // ...then 40 new blocks, all pinned, in one chain (as one request writes them).
  for (uint64_t i = 1000; i < 1040; ++i) p->Insert(B(i), i == 1000 ? None() : B(i - 1));
  auto pinned = [&](const BlockId& b) { return index(b) < 1000; };  // only old ones evictable
  for (int n = 0; n < 60; ++n) {
    auto v = p->Victim(pinned);
    ASSERT_TRUE(v.has_value()) << PolicyName(GetParam()) << ": " << n << " evicted, "
                               << (60 - n) << " evictable blocks remain";
    ASSERT_LT(index(*v), 1000u);
    p->Remove(*v);
  }
  EXPECT_FALSE(p->Victim(pinned).has_value());
  EXPECT_TRUE(p->Victim(all).has_value());
}

// Whatever the parent graph (self-loops, two-block and longer cycles, parents that are
// never inserted, parents inserted after their children, a forest), draining the policy
// offers every unpinned block exactly once and never a pinned one, with random touches
// and removals on the way.
TEST_P(PolicyTest, EveryUnpinnedBlockIsOfferedWhateverTheParentGraph) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    std::mt19937_64 rng(seed);
    auto p = EvictionPolicy::Create(GetParam(), 16 + rng() % 64);
    const uint64_t n = 20 + rng() % 100;
    std::set<uint64_t> present, pinned;
    for (uint64_t i = 0; i < n; ++i) {
      BlockId parent = None();
      switch (rng() % 6) {
        case 0: parent = B(i); break;                           // self-loop
        case 1: parent = B(i + 1 + rng() % 5); break;            // a later block (cycles)
        case 2: parent = B(1000 + rng() % 50); break;            // an orphan's parent
        case 3: break;                                           // a root
        default: if (i) parent = B(rng() % i); break;            // an earlier block
      }
      p->Insert(B(i), parent);
      present.insert(i);
      if (rng() % 8 == 0) pinned.insert(i);
      if (rng() % 4 == 0) p->Touch(B(rng() % (i + 1)));
      if (rng() % 10 == 0 && !present.empty()) {  // a block leaves for another reason
        const uint64_t r = rng() % (i + 1);
        if (present.erase(r)) {
          pinned.erase(r);
          p->Remove(B(r));
        }
      }
    }
    auto index = [](const BlockId& b) { return (b.key.hi & 0xFFFFFFFFull) - 1; };
    auto evictable = [&](const BlockId& b) { return pinned.count(index(b)) == 0; };
    std::set<uint64_t> offered;
    while (auto v = p->Victim(evictable)) {
      const uint64_t i = index(*v);
      ASSERT_TRUE(present.count(i)) << PolicyName(GetParam()) << " seed " << seed << ": offered absent block " << i;
      ASSERT_FALSE(pinned.count(i)) << PolicyName(GetParam()) << " seed " << seed << ": offered pinned block " << i;
      ASSERT_TRUE(offered.insert(i).second) << PolicyName(GetParam()) << " seed " << seed << ": offered " << i << " twice";
      p->Remove(*v);
    }
    EXPECT_EQ(offered.size(), present.size() - pinned.size())
        << PolicyName(GetParam()) << " seed " << seed << ": some unpinned block is never offered";
    EXPECT_EQ(p->size(), pinned.size());
  }
}

TEST(PolicyNames, OneTableParsesEveryNameAndRefusesTheRest) {
  for (PolicyKind k : AllPolicies()) {
    PolicyKind back = PolicyKind::kLru;
    ASSERT_TRUE(ParsePolicy(PolicyName(k), &back)) << PolicyName(k);
    EXPECT_EQ(back, k);
    EXPECT_STREQ(EvictionPolicy::Create(k, 8)->name(), PolicyName(k));
  }
  EXPECT_EQ(AllPolicies().size(), kPolicyNames.size());
  PolicyKind k = PolicyKind::kS3Fifo;
  for (const char* bad : {"", "LRU", "fifo", "prefix_lru", "lru ", "oracle"}) {
    EXPECT_FALSE(ParsePolicy(bad, &k)) << bad;
    EXPECT_EQ(k, PolicyKind::kS3Fifo) << "a refused name changed the kind";
  }
  TierOptions t;
  t.policy = static_cast<PolicyKind>(kPolicyNames.size());
  EXPECT_FALSE(t.Validate("host").ok());
  t.policy = PolicyKind::kReuse;
  EXPECT_TRUE(t.Validate("host").ok());
  t.policy_options.reuse_protected_fraction = 1.5;
  EXPECT_FALSE(t.Validate("host").ok());
}

INSTANTIATE_TEST_SUITE_P(All, PolicyTest, ::testing::ValuesIn(AllPolicies()),
                         [](const auto& info) {
                           std::string n = PolicyName(info.param);
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

TEST(Lru, EvictsLeastRecentlyUsed) {
  auto p = EvictionPolicy::Create(PolicyKind::kLru, 8);
  for (uint64_t i = 0; i < 4; ++i) p->Insert(B(i), None());
  p->Touch(B(0));
  auto all = [](const BlockId&) { return true; };
  EXPECT_EQ(*p->Victim(all), B(1));
  p->Remove(B(1));
  EXPECT_EQ(*p->Victim(all), B(2));
}

// W-TinyLFU (window of 1 block at capacity 100): a new block pushed out of the window
// loses to main's least recent block, used four times (LRU would evict B(0)); a block
// that returns with a longer history (five uses) wins its place against it.
TEST(TinyLfu, TheSketchDecidesWhoEntersMain) {
  auto p = EvictionPolicy::Create(PolicyKind::kTinyLfu, 100);
  auto all = [](const BlockId&) { return true; };
  for (uint64_t i = 0; i < 50; ++i) p->Insert(B(i), None());
  for (int r = 0; r < 3; ++r) {
    for (uint64_t i = 0; i < 50; ++i) p->Touch(B(i));
  }
  p->Insert(B(100), None());
  p->Insert(B(101), None());  // pushes B(100) out of the window: a candidate
  EXPECT_EQ(*p->Victim(all), B(100)) << "a block seen once must not displace a frequent one";
  p->Remove(B(100));
  // B(0) leaves and comes back: its count survives in the sketch.
  p->Remove(B(0));
  p->Insert(B(0), None());   // B(101) becomes a candidate
  p->Insert(B(102), None());  // B(0) becomes a candidate, B(101) enters probation unopposed
  EXPECT_EQ(*p->Victim(all), B(49)) << "the returning block, used more often, wins against main's least recent";
  EXPECT_TRUE(p->Contains(B(0)));
  EXPECT_EQ(EvictionPolicy::Create(PolicyKind::kLru, 100)->name(), std::string("lru"));
  PolicyOptions bad;
  bad.tinylfu_window_fraction = 1.0;
  EXPECT_NE(bad.Check(), "");
}

TEST(S3Fifo, OneHitWondersGoFirstAndGhostsReturnToMain) {
  auto p = EvictionPolicy::Create(PolicyKind::kS3Fifo, 20);  // small queue target 2
  auto all = [](const BlockId&) { return true; };
  for (uint64_t i = 0; i < 4; ++i) p->Insert(B(i), None());
  p->Touch(B(0));  // B(0) used again: moves to main instead of being evicted
  auto v = p->Victim(all);
  EXPECT_EQ(*v, B(1));
  p->Remove(*v);
  // B(1) is now a ghost: re-inserting puts it straight into main; a new block goes small.
  p->Insert(B(1), None());
  p->Insert(B(9), None());
  std::vector<BlockId> order;
  while (auto x = p->Victim(all)) {
    order.push_back(*x);
    p->Remove(*x);
  }
  // Small keeps at least 10% of the blocks: 2 and 3 (never reused) go first, then main
  // drains in FIFO order (0, then the returning ghost 1), and the new block 9 last.
  std::vector<BlockId> want = {B(2), B(3), B(0), B(1), B(9)};
  EXPECT_EQ(order, want);
}

TEST(PrefixLru, ParentBecomesCandidateWhenLastChildLeaves) {
  auto p = EvictionPolicy::Create(PolicyKind::kPrefixLru, 8);
  auto all = [](const BlockId&) { return true; };
  p->Insert(B(1), None());   // root
  p->Insert(B(2), B(1));     // child
  p->Insert(B(3), B(1));     // second child
  p->Touch(B(2));
  p->Touch(B(3));
  EXPECT_EQ(*p->Victim(all), B(2));  // root is older but has children
  p->Remove(B(2));
  EXPECT_EQ(*p->Victim(all), B(3));
  p->Remove(B(3));
  EXPECT_EQ(*p->Victim(all), B(1));
  // Children inserted before their parent still count.
  p->Insert(B(6), B(5));
  p->Insert(B(5), None());
  p->Remove(B(1));
  EXPECT_EQ(*p->Victim(all), B(6));
  // A pinned leaf keeps its prefix in place while anything else is evictable; with
  // nothing else left, the prefix is offered (a full tier must still make room).
  EXPECT_EQ(*p->Victim([](const BlockId& b) { return !(b == B(6)); }), B(5));
  // A block named as its own parent is a leaf like any other.
  p->Insert(B(7), B(7));
  EXPECT_EQ(*p->Victim([](const BlockId& b) { return b == B(7); }), B(7));
}

// prefix-lru against a model that sorts by last use on every call: in a tier of fewer
// than 64 blocks the O(1) lists give the same victim on every step of a random parent
// graph with touches, inserts, removals and pins.
TEST(PrefixLru, SameVictimsAsASortedModel) {
  std::mt19937 rng(11);
  for (int round = 0; round < 20; ++round) {
    auto p = EvictionPolicy::Create(PolicyKind::kPrefixLru, 64);
    std::map<uint64_t, uint64_t> tick, parent;  // resident block -> last use, parent (or none)
    uint64_t clock = 0;
    auto children = [&](uint64_t b) {
      int n = 0;
      for (auto& [c, par] : parent) n += par == b && c != b;
      return n;
    };
    for (int step = 0; step < 400; ++step) {
      const uint64_t b = rng() % 48;
      const int op = static_cast<int>(rng() % 4);
      if (op == 0 && !tick.count(b)) {
        const uint64_t par = rng() % 3 == 0 ? 999 : rng() % 48;
        p->Insert(B(b), par == 999 ? None() : B(par));
        tick[b] = ++clock;
        parent[b] = par;
      } else if (op == 1 && tick.count(b)) {
        p->Touch(B(b));
        tick[b] = ++clock;
      } else if (op == 2 && tick.count(b)) {
        p->Remove(B(b));
        tick.erase(b);
        parent.erase(b);
      }
      const uint64_t pinned = rng() % 48;
      std::optional<uint64_t> want;
      for (bool inner : {false, true}) {
        uint64_t best = UINT64_MAX;
        for (auto& [blk, t] : tick) {
          if (blk == pinned || (children(blk) != 0) != inner) continue;
          if (!want || t < best) want = blk, best = t;
        }
        if (want) break;
      }
      auto got = p->Victim([&](const BlockId& x) { return !(x == B(pinned)); });
      ASSERT_EQ(got.has_value(), want.has_value()) << "round " << round << " step " << step;
      if (want) {
        ASSERT_EQ(*got, B(*want)) << "round " << round << " step " << step;
      }
    }
  }
}

TEST(Sieve, HitsSetABitAndTheHandSweepsOldestFirst) {
  auto p = EvictionPolicy::Create(PolicyKind::kSieve, 8);
  auto all = [](const BlockId&) { return true; };
  for (uint64_t i = 0; i < 4; ++i) p->Insert(B(i), None());
  p->Touch(B(0));
  p->Touch(B(2));
  EXPECT_EQ(*p->Victim(all), B(1));  // 0 visited: its bit cleared, the hand moves on
  p->Remove(B(1));
  EXPECT_EQ(*p->Victim(all), B(3));  // 2 visited, cleared; 3 is not
  p->Remove(B(3));                   // 3 was the newest: the hand wraps to the oldest
  p->Insert(B(4), None());
  EXPECT_EQ(*p->Victim(all), B(0));  // its bit was cleared by the first sweep
  p->Remove(B(0));
  p->Touch(B(4));
  EXPECT_EQ(*p->Victim(all), B(2));
  p->Remove(B(2));
  EXPECT_EQ(*p->Victim(all), B(4));  // alone and visited: cleared, then chosen
}

TEST(Arc, ASecondUseProtectsAndGhostHitsMoveTheTarget) {
  auto p = EvictionPolicy::Create(PolicyKind::kArc, 4);
  auto all = [](const BlockId&) { return true; };
  for (uint64_t i = 0; i < 4; ++i) p->Insert(B(i), None());
  p->Touch(B(0));                    // 0 -> T2
  EXPECT_EQ(*p->Victim(all), B(1));  // T1 is above its target (0): its LRU goes
  p->Remove(B(1));                   // 1 -> ghost B1
  EXPECT_FALSE(p->Contains(B(1)));
  p->Insert(B(1), None());           // a B1 hit: the target grows, 1 enters T2
  EXPECT_TRUE(p->Contains(B(1)));
  EXPECT_EQ(*p->Victim(all), B(2));  // T1 (2, 3) is above the target of 1: 2 goes
  p->Remove(B(2));
  EXPECT_EQ(*p->Victim(all), B(0));  // T1 = {3} is at the target: T2's LRU (0) goes
  EXPECT_EQ(p->size(), 3u);
}

TEST(Reuse, UsedAgainBlocksOutliveNewOnesAndReturningKeysAreProtected) {
  PolicyOptions o;
  o.reuse_density = false;
  o.reuse_adapt = false;
  auto p = EvictionPolicy::Create(PolicyKind::kReuse, 10, o);  // protected may hold 9
  auto all = [](const BlockId&) { return true; };
  for (uint64_t i = 0; i < 6; ++i) p->Insert(B(i), None());
  p->Touch(B(0));
  p->Touch(B(1));
  // Probation (2..5, least recent first) goes before protected (0, 1).
  for (uint64_t want : {2, 3}) {
    auto v = p->Victim(all);
    ASSERT_EQ(*v, B(want));
    p->Remove(*v);
  }
  p->Insert(B(2), None());  // remembered: returns straight to protected
  p->Insert(B(7), None());  // new: probation
  std::vector<BlockId> order;
  while (auto x = p->Victim(all)) {
    order.push_back(*x);
    p->Remove(*x);
  }
  std::vector<BlockId> want = {B(4), B(5), B(7), B(0), B(1), B(2)};
  EXPECT_EQ(order, want);
  // With no ghost, a returning key is new again.
  o.reuse_ghost_factor = 0;
  auto q = EvictionPolicy::Create(PolicyKind::kReuse, 10, o);
  q->Insert(B(0), None());
  q->Insert(B(1), None());
  q->Touch(B(1));
  q->Remove(B(0));
  q->Insert(B(0), None());
  EXPECT_EQ(*q->Victim(all), B(0));
}

// ARC's rule on the protected target (4 blocks, target 2 to start): a key back from
// probation's ghost shrinks it to 1, so protected gives up a second block where the fixed
// target keeps it; a key back from protected's ghost grows it to 2 again, so probation
// gives up the next block. Off, the target stays at 2.
TEST(Reuse, GhostHitsMoveTheProtectedTarget) {
  auto victims = [](bool adapt) {
    PolicyOptions o;
    o.reuse_protected_fraction = 0.5;
    o.reuse_adapt = adapt;
    auto p = EvictionPolicy::Create(PolicyKind::kReuse, 4, o);
    auto all = [](const BlockId&) { return true; };
    std::vector<BlockId> out;
    auto evict = [&] {
      auto v = p->Victim(all);
      if (!v) return;
      out.push_back(*v);
      p->Remove(*v);
    };
    for (uint64_t i = 0; i < 4; ++i) p->Insert(B(i), None());
    p->Touch(B(0));
    p->Touch(B(1));           // protected 0, 1; probation 2, 3
    evict();                  // 2 (protected is at its target)
    p->Insert(B(2), None());  // back from probation's ghost: protected 0, 1, 2
    p->Insert(B(4), None());  // probation 3, 4
    evict();                  // 0 (protected above its target either way)
    evict();                  // adapt: 1 (target 1); fixed: 3 (target 2)
    p->Insert(B(0), None());  // back from protected's ghost
    evict();                  // adapt: 3 (target 2 again, protected 2, 0); fixed: 1
    return out;
  };
  EXPECT_EQ(victims(true), (std::vector<BlockId>{B(2), B(0), B(1), B(3)}));
  EXPECT_EQ(victims(false), (std::vector<BlockId>{B(2), B(0), B(3), B(1)}));
}

}  // namespace
}  // namespace kvtier::tiers

