#include "tools/replay/driver.h"

#include <chrono>
#include <cstring>
#include <thread>

#include "kvtier/kvtier.hpp"

namespace kvtier::replay {

namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Word i of the content of block (hi, lo).
inline uint64_t Word(uint64_t hi, uint64_t lo, uint64_t i) { return Mix(hi ^ Mix(lo + i)); }

// Which 8-byte words are written/checked: all, or the first and last 4 KiB plus one
// word every 4 KiB (enough to catch a block swapped, stale or torn at any page).
template <typename Fn>
void ForWords(size_t n, bool full, Fn&& fn) {
  const size_t words = n / 8;
  if (full || words <= 1024) {
    for (size_t i = 0; i < words; ++i) fn(i);
    return;
  }
  for (size_t i = 0; i < 512; ++i) fn(i);
  for (size_t i = 512; i + 512 < words; i += 512) fn(i);
  for (size_t i = words - 512; i < words; ++i) fn(i);
}

}  // namespace

void FillBlock(uint64_t hi, uint64_t lo, uint8_t* p, size_t n, bool full) {
  ForWords(n, full, [&](size_t i) {
    const uint64_t w = Word(hi, lo, i);
    std::memcpy(p + 8 * i, &w, 8);
  });
}

bool CheckBlock(uint64_t hi, uint64_t lo, const uint8_t* p, size_t n, bool full) {
  bool ok = true;
  ForWords(n, full, [&](size_t i) {
    uint64_t w;
    std::memcpy(&w, p + 8 * i, 8);
    ok &= (w == Word(hi, lo, i));
  });
  return ok;
}

StatusOr<DriveResult> Drive(const std::vector<Request>& reqs, const DriveOptions& o) {
  KVTIER_RETURN_IF_ERROR(o.geometry.Validate(o.format));
  client::Client c;
  kvtier_connect_options copts{};
  copts.name = "kvtierctl-replay";
  if (auto e = c.Connect(o.socket, &copts); !e) {
    return Status::IoError("cannot attach to kvtierd at " + o.socket + ": " + e.message);
  }
  kvtier_contract_desc d{};
  d.model_id = "kvtier/replay";
  d.num_layers = o.geometry.num_layers;
  d.num_kv_heads = o.geometry.num_kv_heads;
  d.head_dim = o.geometry.head_dim;
  d.block_tokens = o.geometry.block_tokens;
  d.kv_format = static_cast<uint8_t>(o.format);
  uint64_t cid = 0;
  if (kvtier_register_contract(c.get(), &d, &cid) != KVTIER_OK) {
    return Status::Rejected(std::string("contract refused by the daemon: ") + kvtier_last_error());
  }
  DriveResult r;
  r.slot_bytes = c.slot_bytes();
  r.block_bytes = BlockBytes(o.format, o.geometry);
  auto stats = [&](std::vector<kvtier_tier_stats>* out) {
    out->assign(8, kvtier_tier_stats{});
    size_t n = 0;
    if (kvtier_stats(c.get(), out->data(), out->size(), &n) != KVTIER_OK) n = 0;
    out->resize(n);
  };
  std::vector<kvtier_tier_stats> before, after;
  stats(&before);
  for (const auto& t : before) {
    if (!t.present) continue;
    r.total_capacity_blocks += t.slots_total;
    if (t.tier == KVTIER_TIER_HOST) r.host_capacity_blocks = t.slots_total;
  }
  const uint32_t T = o.geometry.block_tokens;
  auto fail = [&](const std::string& what) {
    ++r.errors;
    if (r.first_error.empty()) r.first_error = what + ": " + kvtier_last_error();
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<kvtier_key> keys;
  std::vector<uint8_t> tiers;
  std::vector<kvtier_slot> slots;
  std::vector<kvtier_commit_item> items;
  for (const auto& req : reqs) {
    size_t nkeys = std::min<size_t>(req.tokens.size() / T, o.max_blocks_per_request);
    keys.resize(nkeys);
    size_t got = 0;
    if (kvtier_key_chain(cid, req.tokens.data(), nkeys * T, T, keys.data(), keys.size(), &got) != KVTIER_OK) {
      fail("key chain");
      continue;
    }
    ++r.requests;
    r.blocks += nkeys;
    r.prompt_tokens += req.tokens.size();
    tiers.assign(nkeys, KVTIER_TIER_NONE);
    kvtier_lookup_result lr{};
    if (nkeys && kvtier_lookup(c.get(), cid, keys.data(), nkeys, &lr, tiers.data()) != KVTIER_OK) {
      fail("lookup");
      continue;
    }
    // Acquire the cached prefix into host memory and check every block's bytes.
    uint64_t lease_a = 0;
    size_t have = 0;
    slots.resize(nkeys);
    if (lr.hit_blocks > 0) {
      if (kvtier_acquire(c.get(), cid, keys.data(), lr.hit_blocks, KVTIER_TIER_HOST, &lease_a,
                         slots.data(), &have) != KVTIER_OK) {
        fail("acquire");
        have = 0;
      }
      r.lost_on_acquire += lr.hit_blocks - have;
      for (size_t i = 0; i < have; ++i) {
        const uint8_t* p = c.host_slot(slots[i].slot);
        if (p == nullptr || !CheckBlock(keys[i].hi, keys[i].lo, p, r.block_bytes, o.verify_full)) {
          ++r.wrong_blocks;
        }
      }
    }
    for (size_t i = 0; i < have; ++i) {
      if (tiers[i] < 4) ++r.hits_by_tier[tiers[i]];
    }
    r.prefix_hits += have;
    r.recomputed_tokens += req.tokens.size() - have * T;
    // "Recompute" the rest: alloc, write, commit. A request longer than half the host
    // tier stores only the front of its missing blocks (in chain order, so every stored
    // block's parent is stored or cached), as an engine with a bounded staging area would.
    size_t miss = nkeys - have;
    const size_t cap = std::max<uint64_t>(1, r.host_capacity_blocks / 2);
    if (miss > cap) {
      r.stores_declined += miss - cap;
      miss = cap;
    }
    if (miss > 0) {
      uint64_t lease_b = 0;
      std::vector<kvtier_slot> fresh(miss);
      // A full tier (everything pinned or on its way down) answers RETRY: back off while
      // the mover demotes, as an engine would; if it stays full, or the tier answers
      // REJECTED (this client's own leases fill it), the engine just does not store this
      // time (a cache may decline a block).
      kvtier_status st = KVTIER_RETRY;
      for (int attempt = 0; attempt < 100 && st == KVTIER_RETRY; ++attempt) {
        st = kvtier_alloc(c.get(), cid, miss, KVTIER_TIER_HOST, &lease_b, fresh.data());
        if (st == KVTIER_RETRY) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      if (st == KVTIER_RETRY || st == KVTIER_REJECTED) {
        r.stores_declined += miss;
      } else if (st != KVTIER_OK) {
        fail("alloc");
      } else {
        items.resize(miss);
        for (size_t j = 0; j < miss; ++j) {
          const size_t i = have + j;
          uint8_t* p = c.host_slot_write(fresh[j].slot);
          if (p) FillBlock(keys[i].hi, keys[i].lo, p, r.block_bytes, o.verify_full);
          items[j].slot = fresh[j];
          items[j].key = keys[i];
          items[j].parent = i ? keys[i - 1] : kvtier_key{0, 0};
        }
        size_t done = 0;
        if (kvtier_commit(c.get(), cid, lease_b, items.data(), miss, &done) != KVTIER_OK) fail("commit");
        r.committed += done;
        if (kvtier_release(c.get(), lease_b) != KVTIER_OK) fail("release");
      }
    }
    if (lease_a && kvtier_release(c.get(), lease_a) != KVTIER_OK) fail("release");
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stats(&after);
  for (size_t i = 0; i < after.size() && i < before.size(); ++i) {
    r.promoted_bytes += (after[i].promotions_in - before[i].promotions_in) * r.slot_bytes;
    r.demoted_bytes += (after[i].demotions_out - before[i].demotions_out) * r.slot_bytes;
  }
  return r;
}

}  // namespace kvtier::replay
