// TierManagerImpl: the mover thread and the work it runs without the lock: NVMe read
// batches (promotions into host), NVMe write batches (demotions out of host), host <-> HBM
// copy batches, and the operator's flush. The copies of a long restore may also be sent by
// the acquiring thread itself (SendCopiesInlineLocked).
#include <spdlog/spdlog.h>

#include <algorithm>

#include "testing/test_point.h"
#include "tiers/hbm/block_hash.h"
#include "tiers/tier_manager_impl.h"

namespace kvtier::tiers {

void TierManagerImpl::MoverLoop() {
  std::unique_lock<IndexMutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || HasWorkLocked(); });
    if (stop_ && !HasWorkLocked()) break;
    busy_step_ = true;
    work_ = false;
    for (const auto& m : std::exchange(copy_done_, {})) ApplyCopyDone(m);
    MaintainLocked();
    std::promise<Status>* fr = std::exchange(flush_req_, nullptr);
    auto copies = std::exchange(copies_, {});
    auto writes = std::exchange(writes_, {});
    std::vector<Block*> reads;
    const size_t per_batch = std::max<size_t>(opts_.mover_batch, (size_t{32} << 20) / std::max<uint64_t>(1, slot_bytes_));
    const size_t nr = std::min<size_t>(reads_.size(), per_batch);
    reads.assign(reads_.begin(), reads_.begin() + static_cast<long>(nr));
    reads_.erase(reads_.begin(), reads_.begin() + static_cast<long>(nr));
    if (!reads_.empty()) work_ = true;
    auto deferred = std::exchange(deferred_, {});
    l.unlock();
    for (auto& f : deferred) f();
    if (!copies.empty()) RunCopies(std::move(copies));
    if (!writes.empty()) RunWrites(std::move(writes));
    if (!reads.empty()) RunReads(std::move(reads));
    if (fr) fr->set_value(DoFlush(flush_to_));
    l.lock();
    busy_step_ = false;
    if (!HasWorkLocked() && copies_in_flight_ == 0) idle_cv_.notify_all();
  }
}

void TierManagerImpl::Drain() {
  // Remote work, then the mover, then remote work again (the mover's demotions queue
  // remote writes; remote fetches end in local acquires).
  if (remote_ && !remote_->OnStageThread() && std::this_thread::get_id() != mover_.get_id()) {
    remote_->WaitIdle();
    DrainMover();
    remote_->WaitIdle();
  }
  DrainMover();
}

void TierManagerImpl::DrainMover() {
  std::unique_lock<IndexMutex> l(mu_);
  if (std::this_thread::get_id() == mover_.get_id()) return;
  idle_cv_.wait(l, [&] { return !HasWorkLocked() && copies_in_flight_ == 0 && !busy_step_ && inline_copies_ == 0; });
}

void TierManagerImpl::RunReads(std::vector<Block*> batch) {
  std::vector<NvmeRead> rd(batch.size());
  {
    std::lock_guard<IndexMutex> l(mu_);
    for (size_t i = 0; i < batch.size(); ++i) {
      const int s = batch[i]->promo[kS]->slot;
      rd[i].id = batch[i]->id;
      rd[i].dst = host_->slot_ptr(static_cast<uint32_t>(s));
      rd[i].dst_capacity = host_->slot_size(static_cast<uint32_t>(s));
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  // Each block is finished as soon as it is read and verified, while the rest of the batch
  // is still in flight: its waiters are pinned, and the host -> HBM copies it unblocks go
  // out in groups of kReadCopyGroup (NVMe -> host -> HBM pipelines per few blocks, not per
  // batch; a copy launch per block would cost the mover more than the copy).
  constexpr size_t kReadCopyGroup = 8;
  std::vector<CopyJob> pending_copies;
  (void)nvme_->ReadBatch(rd, [&](size_t i) {
    {
      std::lock_guard<IndexMutex> l(mu_);
      Block* b = batch[i];
      if (--b->io_pins[kN] == 0) --T(kN).pinned;
      const bool ok = rd[i].result.ok();
      if (ok) {
        bytes += RoundUp4K(rd[i].len);
      } else if (rd[i].result.IsCorrupt() || rd[i].result.IsNotFound()) {
        // The store drops the record (and counts it): the block is gone from NVMe.
        T(kN).policy->Remove(b->id);
        b->nvme = false;
      }
      FinishPromotionLocked(b, kS, ok);
      for (auto& c : std::exchange(copies_, {})) pending_copies.push_back(c);
    }
    if (pending_copies.size() >= kReadCopyGroup) RunCopies(std::exchange(pending_copies, {}));
  });
  if (!pending_copies.empty()) RunCopies(std::move(pending_copies));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<IndexMutex> l(mu_);
  T(kN).c.bytes_read += bytes;
  if (secs > 0 && bytes > (16u << 20)) T(kN).c.read_gbps = bytes / secs / 1e9;
  KickLocked();
}

void TierManagerImpl::RunWrites(std::vector<std::pair<Block*, bool>> batch) {
  std::vector<NvmeWrite> wr;
  {
    std::lock_guard<IndexMutex> l(mu_);
    // Make room on NVMe first, per record class: a slab of another class moves to a
    // starved one (the host tier's rule, TakeSlabLocked), else the class's coldest
    // unpinned records go.
    TierState& n = T(kN);
    uint32_t need[kMaxArenaClasses] = {};
    const Block* first[kMaxArenaClasses] = {};
    for (const auto& w : batch) {
      const int c = n.ClassOf(w.first->bytes);
      if (c < 0) continue;  // no record class holds it: its write is refused
      if (need[c]++ == 0) first[c] = w.first;
    }
    for (int c = 0; c < n.num_classes(); ++c) {
      const int64_t group = GroupOfBlockLocked(first[c]);
      while (need[c] > 0 && n.free(c) < need[c]) {
        if (TakeSlabLocked(kN, c, group, need[c] - n.free(c))) continue;
        Block* v = VictimLocked(kN, nullptr, group, c);
        if (!v) break;
        EvictOneLocked(kN, v, nullptr);
      }
    }
    wr.resize(batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      Block* b = batch[i].first;
      wr[i].id = b->id;
      wr[i].parent = b->parent;
      wr[i].payload = host_->slot_ptr(static_cast<uint32_t>(b->slot[kS]));
      wr[i].len = b->bytes;
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  (void)nvme_->WriteBatch(wr);
  KVTIER_TEST_POINT("TierManager::Demote:AfterNvmeWrite");  // durable, host copy not yet dropped
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard<IndexMutex> l(mu_);
  uint64_t bytes = 0, lost = 0;
  std::string why;
  for (size_t i = 0; i < batch.size(); ++i) {
    Block* b = batch[i].first;
    b->busy[kS] = false;
    // An eviction whose write failed loses the block unless it is still on NVMe.
    if (!wr[i].result.ok() && batch[i].second && !b->nvme && b->pins[kS] == 0 && b->io_pins[kS] == 0 &&
        b->slot[kS] >= 0) {
      ++lost;
      if (why.empty()) why = wr[i].result.message();
    }
    if (batch[i].second) --T(kS).demoting;
    if (wr[i].result.ok()) {
      bytes += RoundUp4K(b->bytes) + kIoAlign;
      if (b->disputed && MayGo(*b, kN)) {
        // Disputed while it was written: its record is not kept (nor an older one).
        if (b->nvme) DropCopyLocked(kN, b, false);
        else (void)nvme_->Remove(b->id);
      } else if (!b->nvme) {
        b->nvme = true;
        T(kN).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(kN).BlockWeight(b->bytes));
      }
      T(kS).c.demotions_out++;
    } else {
      admission_->Refund(RoundUp4K(b->bytes) + kIoAlign);
      client_budget_->Refund(b->writer, RoundUp4K(b->bytes) + kIoAlign);
    }
    // An eviction frees the host copy now (kept while a client pinned it meanwhile).
    if (batch[i].second && b->pins[kS] == 0 && b->io_pins[kS] == 0 && b->slot[kS] >= 0) {
      DropCopyLocked(kS, b, b->nvme);
    } else if (b->slot[kS] >= 0 && !T(kS).policy->Contains(b->id)) {
      // pinned meanwhile: stays
      T(kS).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(kS).BlockWeight(b->bytes));
    }
    MaybeEraseLocked(b);
  }
  T(kN).c.bytes_written += bytes;
  if (secs > 0 && bytes > (16u << 20)) T(kN).c.write_gbps = bytes / secs / 1e9;
  uint64_t held = 0;
  if (lost > 0 && drop_log_.Allow(&held)) {
    spdlog::warn("tiers: {} blocks dropped on the way down to nvme ({}); {} more such lines held back",
                 lost, why, held);
  }
  RetrySpaceWaitersLocked(kS);
  KickLocked();
}

void TierManagerImpl::RunCopies(std::vector<CopyJob> batch) {
  // One HBM copy batch per direction, one completion each (HbmPool::CopyBatch says why).
  std::vector<CopyJob> jobs[2];  // [0] host -> HBM, [1] HBM -> host
  std::vector<HbmPool::CopyItem> items[2];
  {
    std::lock_guard<IndexMutex> l(mu_);
    // Promotions into HBM: hand the batch's reserved HBM slots out again in the order of
    // the blocks' host slots, so that neighbouring host slots land in neighbouring HBM
    // slots and HbmPool coalesces their copies (the slots were reserved in key order, from
    // a free list that eviction order has shuffled). Nothing but the promotion knows a
    // reserved slot yet: its SlotInfo and promo[kH]->slot are rewritten together.
    std::vector<CopyJob*> up;
    bool plain = true;  // every promotion as LaunchLocked left it (else leave the batch as is)
    for (CopyJob& j : batch) {
      if (!j.to_hbm) continue;
      up.push_back(&j);
      const SlotInfo& si = T(kH).slots[static_cast<size_t>(j.dst_slot)];
      plain = plain && j.b->promo[kH] && j.b->promo[kH]->slot == j.dst_slot && j.b->slot[kS] >= 0 &&
              si.state == SlotState::kLoading && si.block == j.b;
    }
    if (plain && up.size() > 1) {
      std::vector<int> dst;
      for (CopyJob* j : up) dst.push_back(j->dst_slot);
      std::sort(dst.begin(), dst.end());
      std::sort(up.begin(), up.end(), [](const CopyJob* a, const CopyJob* b) { return a->b->slot[kS] < b->b->slot[kS]; });
      for (size_t k = 0; k < up.size(); ++k) {
        up[k]->dst_slot = dst[k];
        up[k]->b->promo[kH]->slot = dst[k];
        T(kH).slots[static_cast<size_t>(dst[k])] = SlotInfo{SlotState::kLoading, up[k]->b, 0};
      }
    }
    for (const CopyJob& j : batch) {
      const int d = j.to_hbm ? 0 : 1;
      const auto hs = static_cast<uint32_t>(j.to_hbm ? j.b->slot[kS] : j.dst_slot);
      const auto ds = static_cast<uint32_t>(j.to_hbm ? j.dst_slot : j.b->slot[kH]);
      jobs[d].push_back(j);
      items[d].push_back({ds, host_->slot_ptr(hs), j.b->bytes});
      ++copies_in_flight_;
    }
  }
  // Copies go out in groups of kCopyGroup blocks, each with its own completion: the mover
  // finishes the promotions of one group (slot tables, policy, waiters) while the next
  // groups are still on the wire, instead of after the whole batch.
  constexpr size_t kCopyGroup = 128;
  for (int d = 0; d < 2; ++d) {
    // In HBM slot order, so that a group holds neighbouring slots and its copies coalesce
    // (HbmPool::CoalesceCopies works within one CopyBatch).
    std::vector<size_t> ord(jobs[d].size());
    for (size_t i = 0; i < ord.size(); ++i) ord[i] = i;
    std::sort(ord.begin(), ord.end(), [&](size_t a, size_t b) { return items[d][a].slot < items[d][b].slot; });
    std::vector<CopyJob> js;
    std::vector<HbmPool::CopyItem> is;
    for (size_t i : ord) {
      js.push_back(jobs[d][i]);
      is.push_back(items[d][i]);
    }
    jobs[d] = std::move(js);
    items[d] = std::move(is);
  }
  for (int d = 0; d < 2; ++d) {
    for (size_t g = 0; g < jobs[d].size(); g += kCopyGroup) {
      const size_t e = std::min(jobs[d].size(), g + kCopyGroup);
      auto group = std::make_shared<std::vector<CopyJob>>(jobs[d].begin() + static_cast<long>(g),
                                                          jobs[d].begin() + static_cast<long>(e));
      std::vector<HbmPool::CopyItem> part(items[d].begin() + static_cast<long>(g),
                                          items[d].begin() + static_cast<long>(e));
      // A copy out of HBM is checked here, on the CUDA callback thread and without the
      // lock: the host copy must hash to the value taken when the block entered HBM
      // (CheckLeftHbm), so that what goes down is exactly what was committed.
      std::vector<HbmPool::CopyItem> down;
      if (d == 1) down = part;
      auto cb = [this, group, down = std::move(down)](Status s) {
        std::vector<Status> each(group->size(), s);
        if (s.ok()) {
          for (size_t k = 0; k < down.size(); ++k) each[k] = CheckLeftHbm(down[k].slot, down[k].host, down[k].bytes);
        }
        std::lock_guard<IndexMutex> l(mu_);
        for (size_t k = 0; k < group->size(); ++k) {
          const CopyJob& j = (*group)[k];
          copy_done_.push_back({j.b, j.dst_slot, j.to_hbm, j.demote, each[k]});
          --copies_in_flight_;
        }
        KickLocked();
      };
      Status st = hbm_->CopyBatch(part, d == 0, cb);
      if (!st.ok()) cb(st);
    }
  }
}

Status TierManagerImpl::CheckLeftHbm(uint32_t hbm_slot, const void* host, uint64_t bytes) const {
  const std::optional<uint64_t> want = hbm_->SlotHash(hbm_slot);
  if (!want) return Status::Corrupt("no hash was taken when it entered HBM");
  if (BlockHash(host, bytes, hbm_->hash_seed()) != *want) {
    return Status::Corrupt("its bytes changed in HBM after they were hashed");
  }
  return Status::Ok();
}

void TierManagerImpl::ReportChangedLocked(const Block* b, uint32_t hbm_slot, const Status& why) {
  ++T(kH).c.checksum_failures;
  uint64_t held = 0;
  if (!changed_log_.Allow(&held)) return;
  const uint64_t client = hbm_slot < hbm_client_.size() ? hbm_client_[hbm_slot] : 0;
  spdlog::warn("tiers: block {}/{} in HBM slot {} ({}) failed its check on the way out of HBM: {}; dropped, "
               "not copied down ({} more such lines held back)",
               ContractIdHex(b->id.contract), b->id.key.ToHex(), hbm_slot,
               client ? "committed by client " + std::to_string(client) : std::string("promoted into HBM"),
               why.message(), held);
}

void TierManagerImpl::ApplyCopyDone(const CopyDoneMsg& m) {
  Block* b = m.b;
  const bool ok = m.st.ok();
  const bool changed = m.st.IsCorrupt();  // CheckLeftHbm: the copy is not the committed bytes
  if (changed) {
    ReportChangedLocked(b, static_cast<uint32_t>(b->slot[kH]), m.st);
  } else if (!ok) {
    spdlog::warn("tiers: host<->HBM copy failed: {}", m.st.ToString());
  }
  if (m.to_hbm) {
    b->io_pins[kS]--;
    if (ok) {
      T(kH).c.bytes_written += b->bytes;
      hbm_client_[static_cast<size_t>(m.dst_slot)] = 0;
    }
    FinishPromotionLocked(b, kH, ok);
    return;
  }
  b->io_pins[kH]--;
  if (m.demote) {
    b->busy[kH] = false;
    --T(kH).demoting;
    if (ok) {
      b->slot[kS] = m.dst_slot;
      T(kS).slots[m.dst_slot] = SlotInfo{SlotState::kBlock, b, 0};
      T(kS).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(kS).BlockWeight(b->bytes));
      T(kH).c.demotions_out++;
      if (remote_ && remote_->write_through()) QueueRemoteWriteLocked(b);
    } else {
      T(kS).Free(static_cast<uint32_t>(m.dst_slot));
    }
    if (b->pins[kH] == 0 && b->slot[kH] >= 0) {
      DropCopyLocked(kH, b, ok);
    } else if (b->slot[kH] >= 0 && !T(kH).policy->Contains(b->id)) {
      // pinned meanwhile: stays
      T(kH).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(kH).BlockWeight(b->bytes));
    }
    MaybeEraseLocked(b);
    RetrySpaceWaitersLocked(kH);
  } else {
    FinishPromotionLocked(b, kS, ok);  // HBM -> host promotion (host-only client)
    if (changed && b->slot[kH] >= 0 && MayGo(*b, kH)) {  // the changed copy goes too
      DropCopyLocked(kH, b, false);
      MaybeEraseLocked(b);
    }
  }
}

void TierManagerImpl::SendCopiesInlineLocked(std::unique_lock<IndexMutex>& l) {
  auto batch = std::exchange(copies_, {});
  ++inline_copies_;  // DrainMover waits for it: the batch is neither queued nor in flight yet
  l.unlock();
  RunCopies(std::move(batch));
  l.lock();
  if (--inline_copies_ == 0 && !HasWorkLocked() && copies_in_flight_ == 0) idle_cv_.notify_all();
}

// ---- flush: demotion on an operator's demand ----------------------------------------------

Status TierManagerImpl::Flush(Tier to) {
  if (std::this_thread::get_id() == mover_.get_id()) {
    return Status::Invalid("Flush from a TierManager callback would deadlock");
  }
  if (to != Tier::kHost && to != Tier::kNvme) return Status::Invalid("flush: target must be host or nvme");
  std::promise<Status> p;
  auto f = p.get_future();
  {
    std::lock_guard<IndexMutex> l(mu_);
    while (flush_req_ != nullptr) {  // one flush at a time
      mu_.unlock();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      mu_.lock();
    }
    flush_req_ = &p;
    flush_to_ = to;
    KickLocked();
  }
  Status s = f.get();
  Drain();
  return s;
}

Status TierManagerImpl::DoFlush(Tier to) {
  Status first;
  // HBM: blocks without a copy below go to host first (synchronous copies: operator path).
  if (hbm_) {
    std::vector<std::pair<Block*, uint32_t>> todo;
    {
      std::lock_guard<IndexMutex> l(mu_);
      // Collected first: making room in host (below) may erase other blocks from the map.
      std::vector<Block*> in_hbm;
      for (const auto& up : blocks_) {
        if (MayGo(*up, kH)) in_hbm.push_back(up.get());
      }
      for (Block* b : in_hbm) {
        if (b->slot[kH] < 0 || !MayGo(*b, kH)) continue;
        if (b->slot[kS] >= 0 || b->promo[kS]) {
          DropCopyLocked(kH, b, true);
          continue;
        }
        auto s = ReserveLocked(kS, b);
        if (!s) {
          if (first.ok()) first = Status::Rejected("flush: host tier full");
          continue;
        }
        b->busy[kH] = true;
        todo.emplace_back(b, *s);
      }
    }
    for (auto& [b, s] : todo) {
      const auto hs = static_cast<uint32_t>(b->slot[kH]);
      Status cs = hbm_->CopyToHostSync(hs, host_->slot_ptr(s), b->bytes);
      if (cs.ok()) cs = CheckLeftHbm(hs, host_->slot_ptr(s), b->bytes);
      std::lock_guard<IndexMutex> l(mu_);
      b->busy[kH] = false;
      if (cs.IsCorrupt()) {  // changed in HBM: neither copy stays
        ReportChangedLocked(b, hs, cs);
        T(kS).Free(s);
        if (b->pins[kH] == 0) DropCopyLocked(kH, b, false);
        MaybeEraseLocked(b);
      } else if (cs.ok()) {
        b->slot[kS] = static_cast<int32_t>(s);
        T(kS).slots[s] = SlotInfo{SlotState::kBlock, b, 0};
        T(kS).policy->Insert(b->id, BlockId{b->id.contract, b->parent}, T(kS).BlockWeight(b->bytes));
        if (b->pins[kH] == 0) DropCopyLocked(kH, b, true);
      } else {
        T(kS).Free(s);
        if (first.ok()) first = cs;
      }
    }
  }
  if (to == Tier::kHost) return first;
  if (!nvme_) return first.ok() ? Status::Unsupported("flush: no NVMe tier") : first;
  std::vector<std::pair<Block*, bool>> writes;
  {
    std::lock_guard<IndexMutex> l(mu_);
    for (const auto& up : blocks_) {
      Block* b = up.get();
      if (!MayGo(*b, kS) || b->disputed) continue;  // a disputed block is never written out
      QueueRemoteWriteLocked(b);
      if (b->nvme) {
        DropCopyLocked(kS, b, true);
        continue;
      }
      if (std::string why; !AdmitLocked(b, /*force=*/true, &why)) {
        if (first.ok()) first = Status::Rejected("flush: " + why);
        continue;
      }
      T(kS).policy->Remove(b->id);
      ++T(kS).demoting;
      b->busy[kS] = true;
      writes.emplace_back(b, true);
    }
  }
  for (size_t i = 0; i < writes.size(); i += 256) {
    std::vector<std::pair<Block*, bool>> chunk(writes.begin() + static_cast<long>(i),
                                              writes.begin() + static_cast<long>(std::min(writes.size(), i + 256)));
    RunWrites(std::move(chunk));
  }
  {
    std::lock_guard<IndexMutex> l(mu_);
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      Block* b = (it++)->get();
      MaybeEraseLocked(b);
    }
  }
  return first;
}

}  // namespace kvtier::tiers
