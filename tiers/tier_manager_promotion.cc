// TierManagerImpl: promotion. Acquire and Prefetch find the cached prefix of a key chain
// and bring each block into the target tier (NVMe -> host by the mover's reads, host ->
// HBM by DMA copies), sharing one promotion per block among concurrent acquires, and pin
// what arrived. Keys past the local prefix go to the remote stage first.
#include <spdlog/spdlog.h>

#include <algorithm>

#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

bool TierManagerImpl::StartPromotionLocked(Block* b, int t, Waiter w) {
  if (b->promo[t]) {  // merge with the promotion already in flight
    b->promo[t]->waiters.push_back(std::move(w));
    return true;
  }
  if (b->slot[t] >= 0) {  // already there (e.g. a chained wait)
    w(true);
    return true;
  }
  if (t == kS) {
    if (!b->nvme && !(b->slot[kH] >= 0 && !b->busy[kH])) return false;  // no source
    auto p = std::make_shared<Promotion>();
    p->waiters.push_back(std::move(w));
    b->promo[kS] = p;
    LaunchLocked(b, kS);
    return true;
  }
  // t == kH: from host, or after a host promotion.
  auto p = std::make_shared<Promotion>();
  p->waiters.push_back(std::move(w));
  b->promo[kH] = p;
  if (b->slot[kS] >= 0 && !b->promo[kS]) {
    LaunchLocked(b, kH);
    return true;
  }
  const bool ok = StartPromotionLocked(b, kS, [this, b](bool ok) {
    if (ok) LaunchLocked(b, kH);
    else FinishPromotionLocked(b, kH, false);
  });
  if (!ok) {
    b->promo[kH].reset();
    return false;
  }
  return true;
}

// Reserves the target slot of b's promotion into t and queues the copy. Without a free
// slot it forces one eviction; when that (or an earlier one) is a demotion still in
// flight, the promotion waits for it (TierState::space_wait) instead of failing: an acquire is only
// cut short when the tier is full of pinned blocks.
void TierManagerImpl::LaunchLocked(Block* b, int t) {
  auto s = ReserveLocked(t, b);
  if (!s && T(t).demoting == 0) {
    uint32_t pending = 0;
    const int cls = T(t).num_classes() == 1 ? -1 : T(t).ClassOf(b->bytes);
    if (Block* v = VictimLocked(t, b, GroupOfBlockLocked(b), cls)) EvictOneLocked(t, v, &pending);
    s = ReserveLocked(t, b);
  }
  if (!s) {
    if (T(t).demoting > 0) {
      T(t).space_wait.push_back(b);
      KickLocked();
    } else {
      FinishPromotionLocked(b, t, false);
    }
    return;
  }
  b->promo[t]->slot = static_cast<int>(*s);
  if (t == kH) {
    if (b->slot[kS] < 0) {  // the host copy went away meanwhile
      FinishPromotionLocked(b, kH, false);
      return;
    }
    b->io_pins[kS]++;
    copies_.push_back({b, static_cast<int>(*s), true, false});
  } else if (b->nvme) {
    if (b->io_pins[kN]++ == 0) ++T(kN).pinned;
    reads_.push_back(b);
  } else if (b->slot[kH] >= 0 && !b->busy[kH]) {
    b->io_pins[kH]++;
    copies_.push_back({b, static_cast<int>(*s), false, false});
  } else {
    FinishPromotionLocked(b, kS, false);
    return;
  }
  KickLocked();
}

void TierManagerImpl::RetrySpaceWaitersLocked(int t) {
  auto waiting = std::exchange(T(t).space_wait, {});
  for (Block* b : waiting) {
    if (b->promo[t]) LaunchLocked(b, t);
  }
}

void TierManagerImpl::FinishPromotionLocked(Block* b, int t, bool ok) {
  auto p = std::move(b->promo[t]);
  b->promo[t].reset();
  if (!p) return;
  if (ok) {
    b->slot[t] = p->slot;
    T(t).slots[p->slot] = SlotInfo{SlotState::kBlock, b, 0};
    T(t).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(t).BlockWeight(b->bytes));
    T(t).c.promotions_in++;
  } else if (p->slot >= 0 && T(t).slots[p->slot].state == SlotState::kLoading) {
    T(t).Free(static_cast<uint32_t>(p->slot));
  }
  b->holds++;  // a waiter may finish a chained promotion of b, which must not erase it
  for (auto& w : p->waiters) w(ok);
  b->holds--;
  MaybeEraseLocked(b);
}

void TierManagerImpl::FinishAcquireLocked(const std::shared_ptr<AcquireCtx>& ctx, std::function<void()>* now) {
  size_t n = 0;
  while (n < ctx->ok.size() && ctx->ok[n]) ++n;
  const int t = IndexOf(ctx->target);
  for (size_t i = n; i < ctx->ok.size(); ++i) {  // past the first loss: not part of the answer
    if (ctx->ok[i]) {
      if (--ctx->blocks[i]->pins[t] == 0) --T(t).pinned;
      MaybeEraseLocked(ctx->blocks[i]);
    }
  }
  if (n < ctx->ok.size()) T(kN).c.misses += ctx->ok.size() - n;
  if (TraceCopies() && ctx->ok.size() >= 64) {
    spdlog::info("acquire {} blocks into {} ({} promoted): prefix found in {:.0f} us, first copies sent at {:.0f} us, "
                 "set-up done at {:.0f} us, answered after {:.0f} us",
                 ctx->ok.size(), TierName(ctx->target), ctx->promoted, ctx->found_us, ctx->first_send_us, ctx->setup_us,
                 std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count());
  }
  std::vector<SlotRef> out(ctx->slots.begin(), ctx->slots.begin() + static_cast<long>(n));
  auto done = std::move(ctx->done);
  auto answer = [done = std::move(done), out = std::move(out)]() mutable { done(Status::Ok(), std::move(out)); };
  if (now != nullptr) {
    *now = std::move(answer);
    return;
  }
  deferred_.push_back(std::move(answer));
  KickLocked();
}

bool TierManagerImpl::MaybeFetchRemote(uint64_t contract_id, std::span<const Key128> keys, Tier target,
                                       AcquireDone& done) {
  if (!remote_ || (target != Tier::kHbm && target != Tier::kHost) || !has_tier(target)) return false;
  {
    std::lock_guard<IndexMutex> l(mu_);
    if (!contracts_.count(contract_id) || LocalPrefixLocked(contract_id, keys) == keys.size()) return false;
  }
  // The remote stage fetches the rest, then runs the local acquire.
  remote_->QueueFetch(RemoteFetch{contract_id, std::vector<Key128>(keys.begin(), keys.end()), target, std::move(done)});
  return true;
}

void TierManagerImpl::Acquire(uint64_t contract_id, std::span<const Key128> keys, Tier target, AcquireDone done) {
  if (MaybeFetchRemote(contract_id, keys, target, done)) return;
  AcquireLocal(contract_id, keys, target, std::move(done));
}

void TierManagerImpl::AcquireLocal(uint64_t contract_id, std::span<const Key128> keys, Tier target,
                                   AcquireDone done) {
  std::unique_lock<IndexMutex> l(mu_);
  if ((target != Tier::kHbm && target != Tier::kHost) || !has_tier(target)) {
    deferred_.push_back([done = std::move(done), target] {
      done(Status::Unsupported(std::string("Acquire into ") + TierName(target) + ": no such tier here"), {});
    });
    KickLocked();
    return;
  }
  auto ctx = std::make_shared<AcquireCtx>();
  if (TraceCopies()) ctx->t0 = std::chrono::steady_clock::now();
  ctx->done = std::move(done);
  ctx->target = target;
  const int t = IndexOf(target);
  if (contracts_.count(contract_id)) {
    for (const Key128& k : keys) {
      Block* b = FindLocked({contract_id, k});
      if (!b || !b->Servable()) break;
      ctx->blocks.push_back(b);
    }
  }
  const size_t n = ctx->blocks.size();
  if (TraceCopies()) ctx->found_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
  // Making room for one block's promotion must not evict or erase another of this prefix.
  // A block named twice (keys may repeat) is held twice.
  for (Block* b : ctx->blocks) b->holds++;
  ctx->slots.resize(n);
  ctx->ok.assign(n, false);
  ctx->pending = n + 1;  // +1 released below, so that instant completions cannot finish early
  // Settles block i of the acquire, under mu_: pinned in the target tier, or lost. Called
  // directly for a block already there, and as the waiter of a promotion.
  auto settle = [this, t](const std::shared_ptr<AcquireCtx>& c, size_t i, bool ok) {
    Block* b = c->blocks[i];
    // A block pinned as often as the counter holds is not pinned again: it ends the prefix.
    if (ok && b->slot[t] >= 0 && b->pins[t] < kMaxPins) {
      if (b->pins[t]++ == 0) ++T(t).pinned;
      T(t).policy->Touch(b->id);
      c->slots[i].tier = c->target;
      c->slots[i].slot = static_cast<uint32_t>(b->slot[t]);
      c->ok[i] = true;
    }
    if (--c->pending == 0) FinishAcquireLocked(c);
  };
  std::vector<uint32_t> todo;  // indices of the blocks to promote
  bool from_host = true;       // every one of them has a host copy to copy from
  for (size_t i = 0; i < n; ++i) {
    Block* b = ctx->blocks[i];
    b->uses++;
    const Tier found = b->Fastest();
    T(IndexOf(found)).c.hits++;
    ctx->slots[i].from = found;
    if (b->slot[t] >= 0) {
      settle(ctx, i, true);
    } else {
      todo.push_back(static_cast<uint32_t>(i));
      from_host = from_host && b->slot[kS] >= 0 && !b->promo[kH];
    }
  }
  ctx->promoted = todo.size();
  // A host -> HBM restore with room for all of it starts its promotions in host-slot order:
  // the HBM slots are reserved in that order, RunCopies hands them out sorted, and blocks
  // whose host slots are neighbours (a prefix demoted together) land in neighbouring HBM
  // slots, so each group of copies coalesces into a few long DMA copies (0.97 of one big
  // cudaMemcpy) instead of one copy per 144 KiB block. Without room for all, key order:
  // the blocks that miss out are then at the end of the prefix, not inside it.
  if (t == kH && from_host && todo.size() > 1 && T(kH).free() >= todo.size()) {
    std::stable_sort(todo.begin(), todo.end(),
                     [&](uint32_t a, uint32_t b) { return ctx->blocks[a]->slot[kS] < ctx->blocks[b]->slot[kS]; });
  }
  // A long restore: this thread sends the copies queued so far itself, first after
  // kInlineFirst blocks, then every kInlineCopies, instead of queueing all of them for the
  // mover after the whole set-up (2,048 blocks: ~0.7 ms under the lock before the first
  // byte moved). The blocks are held and ctx->pending cannot reach zero before the loop
  // ends, so the lock may be let go in between.
  size_t next_send = kInlineFirst;
  for (size_t k = 0; k < todo.size(); ++k) {
    Block* b = ctx->blocks[todo[k]];
    const size_t i = todo[k];
    if (b->slot[t] >= 0) {  // arrived while the lock was let go
      settle(ctx, i, true);
    } else if (!StartPromotionLocked(b, t, [settle, ctx, i](bool ok) { settle(ctx, i, ok); })) {
      settle(ctx, i, false);
    }
    if (k + 1 >= next_send && copies_.size() >= kInlineFirst) {
      if (TraceCopies() && ctx->first_send_us < 0) {
        ctx->first_send_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
      }
      SendCopiesInlineLocked(l);
      next_send = k + 1 + kInlineCopies;
    }
  }
  T(kN).c.misses += keys.size() - n;
  if (TraceCopies()) {
    ctx->setup_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - ctx->t0).count();
  }
  // Every block already in `target` (or a miss at once): the answer is complete here, and
  // the caller gets it on its own thread instead of after a round trip through the mover
  // (a wake-up and a context switch: most of a 1,000-block host acquire's 120 us).
  std::function<void()> now;
  if (--ctx->pending == 0) FinishAcquireLocked(ctx, &now);
  ReleaseHoldsLocked(ctx->blocks);
  if (ctx->promoted >= kInlineFirst && !copies_.empty()) SendCopiesInlineLocked(l);
  l.unlock();
  if (now) now();
}

void TierManagerImpl::Prefetch(uint64_t contract_id, std::span<const Key128> keys, Tier target) {
  if ((target != Tier::kHbm && target != Tier::kHost) || !has_tier(target)) return;
  // Past the local prefix: an acquire through the remote stage, unpinned when done.
  AcquireDone unpin = [this](Status, std::vector<SlotRef> slots) {
    for (const SlotRef& s : slots) (void)Unpin(s);
  };
  if (MaybeFetchRemote(contract_id, keys, target, unpin)) return;
  std::lock_guard<IndexMutex> l(mu_);
  if (!contracts_.count(contract_id)) return;
  const int t = IndexOf(target);
  std::vector<Block*> prefix;
  for (const Key128& k : keys) {
    Block* b = FindLocked({contract_id, k});
    if (!b || !b->Servable()) break;
    b->holds++;
    prefix.push_back(b);
  }
  for (Block* b : prefix) {
    if (b->slot[t] < 0) (void)StartPromotionLocked(b, t, [](bool) {});
  }
  ReleaseHoldsLocked(prefix);
}

}  // namespace kvtier::tiers
