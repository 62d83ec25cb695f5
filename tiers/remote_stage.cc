#include "tiers/remote_stage.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "testing/test_point.h"

namespace kvtier::tiers {

RemoteStage::RemoteStage(std::unique_ptr<remote::RemoteTier> tier, const remote::RemoteOptions* opts,
                         StagingHost* host)
    : tier_(std::move(tier)), opts_(opts), host_(host) {}

RemoteStage::~RemoteStage() { Stop(); }

void RemoteStage::Start() {
  reader_ = std::thread([this] { ReaderLoop(); });
  writer_ = std::thread([this] { WriterLoop(); });
}

void RemoteStage::Stop() {
  if (!reader_.joinable()) return;
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    cv_.notify_all();
  }
  reader_.join();
  writer_.join();
}

bool RemoteStage::OnStageThread() const {
  const auto me = std::this_thread::get_id();
  return me == reader_.get_id() || me == writer_.get_id();
}

void RemoteStage::QueueFetch(RemoteFetch job) {
  std::lock_guard<std::mutex> l(mu_);
  fetch_.push_back(std::move(job));
  cv_.notify_all();
}

void RemoteStage::QueueWrite(uint64_t contract, const Key128& key, const Key128& parent, const uint8_t* p,
                             uint64_t bytes, const std::string& ns) {
  std::lock_guard<std::mutex> l(mu_);
  if (write_bytes_ + bytes > opts_->write_queue_bytes) {
    ++write_dropped_;
    return;
  }
  write_.push_back(WriteJob{contract, key, parent, std::vector<uint8_t>(p, p + bytes), ns});
  write_bytes_ += bytes;
  cv_.notify_all();
}

void RemoteStage::WaitIdle() {
  std::unique_lock<std::mutex> l(mu_);
  idle_cv_.wait(l, [&] { return IdleLocked(); });
}

void RemoteStage::WriterLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || !write_.empty(); });
    if (write_.empty()) break;  // stopping and nothing left
    std::vector<WriteJob> batch;
    while (!write_.empty() && batch.size() < opts_->batch) {
      write_bytes_ -= write_.front().payload.size();
      batch.push_back(std::move(write_.front()));
      write_.pop_front();
    }
    ++busy_;
    l.unlock();
    std::vector<remote::PutItem> items;
    for (const auto& j : batch) items.push_back({j.contract, j.key, j.parent, j.payload, j.ns});
    const size_t ok = tier_->PutBatch(items);
    if (ok < items.size()) spdlog::debug("remote tier: {} of {} writes failed", items.size() - ok, items.size());
    l.lock();
    --busy_;
    if (IdleLocked()) idle_cv_.notify_all();
  }
}

void RemoteStage::ReaderLoop() {
  std::unique_lock<std::mutex> l(mu_);
  while (true) {
    cv_.wait(l, [&] { return stop_ || !fetch_.empty(); });
    if (fetch_.empty()) break;
    RemoteFetch job = std::move(fetch_.front());
    fetch_.pop_front();
    ++busy_;
    l.unlock();
    std::vector<Block*> held;
    const size_t fetched_from = stop_ ? job.keys.size() : Fetch(job, &held);
    KVTIER_TEST_POINT("TierManager::RemoteFetch:Staged");  // in host and held, not yet acquired
    host_->AcquireStaged(std::move(job), std::move(held), fetched_from);
    l.lock();
    --busy_;
    if (IdleLocked()) idle_cv_.notify_all();
  }
}

size_t RemoteStage::Fetch(const RemoteFetch& job, std::vector<Block*>* held) {
  uint64_t block = 0;
  size_t next = 0;
  std::string ns;  // the contract's remote namespace: the items' keys point into it
  if (!host_->LocalPrefix(job.contract, job.keys, &block, &next, &ns)) return job.keys.size();
  const size_t first = next;
  while (next < job.keys.size()) {
    const uint32_t n = static_cast<uint32_t>(std::min<size_t>(opts_->batch, job.keys.size() - next));
    std::vector<StagingHost::Slot> slots = host_->ReserveStaging(job.contract, n);
    if (slots.empty()) return first;  // host full of pinned blocks
    std::vector<remote::GetItem> items(slots.size());
    for (size_t i = 0; i < slots.size(); ++i) {
      items[i].contract_id = job.contract;
      items[i].key = job.keys[next + i];
      items[i].out = std::span<uint8_t>(slots[i].bytes, block);
      items[i].ns = ns;
    }
    tier_->GetBatch(items);
    size_t good = 0;
    while (good < items.size() && items[good].status.ok()) ++good;
    fetched_ += host_->CommitStaging(job.contract, slots, items, good, held);
    if (good < items.size()) return first;
    next += good;
  }
  return first;
}

}  // namespace kvtier::tiers
