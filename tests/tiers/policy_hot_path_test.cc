// The request path of every eviction policy: Touch (what an acquire does to each block
// it pins) allocates nothing, as LRU's list splice does not, so that no policy costs an
// allocator round trip (or a tree rebalance) per touched block. Its own executable: it replaces the global
// operator new to count this thread's allocations while a touch runs.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>
#include <random>

#include "tests/tiers/test_util.h"
#include "tiers/policy/policy.h"

// The replacement pairs malloc with free on purpose; GCC sees the inlined pair as a
// mismatch of new and free.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
thread_local bool g_counting = false;
thread_local uint64_t g_allocs = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (g_counting) ++g_allocs;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace kvtier::tiers {
namespace {

BlockId B(uint64_t i) { return BlockId{1, testing::K(i + 1)}; }
BlockId None() { return BlockId{1, Key128{}}; }

class HotPathTest : public ::testing::TestWithParam<PolicyKind> {};

// Chains of 16 blocks (prompts that share nothing), every block touched again in random
// order, as acquires do: no allocation on any touch.
TEST_P(HotPathTest, TouchAllocatesNothing) {
  constexpr uint64_t kBlocks = 4096;
  auto p = EvictionPolicy::Create(GetParam(), kBlocks);
  for (uint64_t i = 0; i < kBlocks; ++i) p->Insert(B(i), i % 16 == 0 ? None() : B(i - 1));
  std::mt19937_64 rng(7);
  g_allocs = 0;
  g_counting = true;
  for (int i = 0; i < 20000; ++i) p->Touch(B(rng() % kBlocks));
  g_counting = false;
  EXPECT_EQ(g_allocs, 0u) << PolicyName(GetParam()) << " allocates on Touch";
}

INSTANTIATE_TEST_SUITE_P(All, HotPathTest, ::testing::ValuesIn(AllPolicies()),
                         [](const auto& info) {
                           std::string n = PolicyName(info.param);
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });

}  // namespace
}  // namespace kvtier::tiers
