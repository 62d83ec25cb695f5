// Every eviction policy on the same traces (parameterized), plus each policy's own rule.
#include "tiers/policy/policy.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "tests/tiers/test_util.h"

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

// Chains of blocks (prompts sharing prefixes). prefix-lru never picks a block that has a
// cached child; the others may (that is the difference the test pins down).
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
    if (GetParam() == PolicyKind::kPrefixLru) {
      ASSERT_FALSE(has_child) << "prefix-lru evicted block " << vj << " of chain " << vc
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

INSTANTIATE_TEST_SUITE_P(All, PolicyTest,
                         ::testing::Values(PolicyKind::kLru, PolicyKind::kS3Fifo, PolicyKind::kPrefixLru),
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
  // A pinned leaf keeps its whole prefix in place.
  EXPECT_FALSE(p->Victim([](const BlockId& b) { return !(b == B(6)); }).has_value());
}

}  // namespace
}  // namespace kvtier::tiers

