// kvtier.hpp used as an engine would, compiled once per C++ standard (17 and 20; see
// tests/client/CMakeLists.txt): ScopedLease releases on destruction and on move-assign,
// KeyChain tells an error from a prompt shorter than a block, Span takes the usual
// containers. Returns "" when every check held, else what failed.
#include <array>
#include <cstring>
#include <string>
#include <vector>

#include "kvtier/kvtier.hpp"

#ifndef KVTIER_SCENARIO_NAME
#error "KVTIER_SCENARIO_NAME names the function (one per C++ standard)"
#endif

namespace kvtier::testing {

std::string KVTIER_SCENARIO_NAME(const char* socket) {
  using namespace kvtier::client;  // NOLINT
#define KVTIER_EXPECT(cond)                                                   \
  do {                                                                        \
    if (!(cond)) return std::string("line ") + std::to_string(__LINE__) + ": " #cond; \
  } while (0)
  // KeyChain: a short prompt is an empty success, a bad argument an error.
  std::vector<uint32_t> tokens(16 * 3);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint32_t>(i + 1);
  std::vector<kvtier_key> keys;
  std::array<uint32_t, 5> short_prompt{1, 2, 3, 4, 5};
  KVTIER_EXPECT(KeyChain(9, short_prompt, 16, &keys).ok() && keys.empty());
  const Error bad = KeyChain(9, tokens, 0, &keys);
  KVTIER_EXPECT(bad.status == KVTIER_INVALID && !bad.message.empty());
  KVTIER_EXPECT(KeyChain(9, Span<const uint32_t>(nullptr, 16), 16, &keys).status == KVTIER_INVALID);

  Client c;
  KVTIER_EXPECT(c.Connect(socket).ok());
  kvtier_contract_desc d{};
  d.model_id = "cpp/scenario";
  d.num_layers = 2;
  d.num_kv_heads = 1;
  d.head_dim = 16;
  d.block_tokens = 16;
  uint64_t cid = 0;
  KVTIER_EXPECT(c.RegisterContract(d, &cid).ok());
  KVTIER_EXPECT(KeyChain(cid, tokens, 16, &keys).ok() && keys.size() == 3);
  auto host_blocks = [&] {
    std::vector<kvtier_tier_stats> st;
    if (!c.Stats(&st)) return ~0ull;
    for (const auto& s : st) {
      if (s.tier == KVTIER_TIER_HOST) return static_cast<unsigned long long>(s.pinned);  // blocks pinned by acquires
    }
    return ~0ull;
  };
  uint64_t alloc_id = 0;
  {
    ScopedLease l;
    KVTIER_EXPECT(c.Alloc(cid, 3, KVTIER_TIER_HOST, &l).ok() && l && l.size() == 3);
    std::vector<kvtier_commit_item> items;
    for (size_t i = 0; i < 3; ++i) {
      std::memset(c.host_slot_write(l.slots()[i].slot), static_cast<int>(i + 1), 64);
      items.push_back({l.slots()[i], keys[i], i ? keys[i - 1] : kvtier_key{0, 0}});
    }
    size_t done = 0;
    KVTIER_EXPECT(c.Commit(cid, l.id(), items, &done).ok() && done == 3);
    alloc_id = l.id();
  }  // released here: the id is no longer held
  KVTIER_EXPECT(alloc_id != 0 && c.Release(alloc_id).status == KVTIER_NOT_FOUND);
  KVTIER_EXPECT(host_blocks() == 0);
  ScopedLease a;
  KVTIER_EXPECT(c.Acquire(cid, keys, KVTIER_TIER_HOST, &a).ok() && a.size() == 3);
  KVTIER_EXPECT(c.host_slot(a.slots()[2].slot)[0] == 3);
  ScopedLease moved = std::move(a);  // the lease moves; the source is empty
  KVTIER_EXPECT(!a && moved && host_blocks() == 3);
  ScopedLease miss;
  const kvtier_key absent[1] = {{12345, 678}};
  KVTIER_EXPECT(c.Acquire(cid, absent, KVTIER_TIER_HOST, &miss).ok() && miss.empty());
  moved = std::move(miss);  // move-assign releases what `moved` held
  KVTIER_EXPECT(host_blocks() == 0);
  ScopedLease b;
  KVTIER_EXPECT(c.Acquire(cid, keys, KVTIER_TIER_HOST, &b).ok() && b.size() == 3);
  const uint64_t id = b.Detach();  // the caller owns it now
  KVTIER_EXPECT(b.empty() && host_blocks() == 3);
  KVTIER_EXPECT(c.Release(id).ok() && host_blocks() == 0);
  KVTIER_EXPECT(c.Release(0).ok());  // a miss's lease
  LookupResult r;
  KVTIER_EXPECT(c.Lookup(cid, Span<const kvtier_key>(), &r).ok() && r.hit_blocks == 0);
  KVTIER_EXPECT(c.Lookup(cid, keys, &r).ok() && r.hit_blocks == 3);
  return {};
#undef KVTIER_EXPECT
}

}  // namespace kvtier::testing
