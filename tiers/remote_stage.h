// RemoteStage: the remote tier's two threads and their queues (docs/remote.md).
//
// The reader thread serves fetches: an Acquire or Prefetch whose keys run past the local
// prefix is queued here; the reader fetches the rest from the remote tier in pipelined
// batches, each block verified straight into a host slot, and hands the acquire back to
// the engine. The writer thread serves write-back: the bytes of a block leaving host (or,
// write-through, entering it) are copied into a bounded queue and written in batches.
//
// Staging goes through the engine's internal path (StagingHost), never through its
// client-facing AllocSlots / Commit / Unpin: the fetched blocks are committed to host
// held, and stay held until the acquire that follows has pinned them, so that host
// eviction cannot take them in between (test RemoteFetchHoldsStagedBlocksUntilAcquired).
//
// Locking: the stage's own mutex guards its queues only. The stage calls the engine with
// it released; the engine calls QueueWrite with its own lock held (lock order: engine,
// then stage; never the reverse).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "tiers/remote/remote_tier.h"
#include "tiers/tier_manager.h"

namespace kvtier::tiers {

struct Block;

// An Acquire (or Prefetch) waiting for the remote tier.
struct RemoteFetch {
  uint64_t contract = 0;
  std::vector<Key128> keys;
  Tier target = Tier::kNone;
  TierManager::AcquireDone done;
};

// What the stage needs of the engine; TierManagerImpl implements it. Called from the
// reader thread, with no stage lock held.
class StagingHost {
 public:
  struct Slot {  // a host slot reserved for one fetched block
    uint32_t slot = 0;
    uint8_t* bytes = nullptr;  // the slot's memory, the contract's block size
  };
  virtual ~StagingHost() = default;
  // The contract's block size, the length of the keys' local prefix and the contract's
  // remote namespace ("" = none); false for an unknown contract.
  virtual bool LocalPrefix(uint64_t contract, std::span<const Key128> keys, uint64_t* block_bytes,
                           size_t* prefix, std::string* remote_ns) = 0;
  // Up to n host slots for fetched blocks (fewer when host is short of room; none when it
  // is full of pinned blocks).
  virtual std::vector<Slot> ReserveStaging(uint64_t contract, uint32_t n) = 0;
  // Commits slots[i] as block items[i] for i < good, each held (appended to *held), and
  // frees the others. Returns how many blocks it committed.
  virtual size_t CommitStaging(uint64_t contract, std::span<const Slot> slots,
                               std::span<const remote::GetItem> items, size_t good, std::vector<Block*>* held) = 0;
  // Runs the local acquire of `job`; releases `held` once the acquire has answered.
  // Blocks from index fetched_from on are reported as found in the remote tier.
  virtual void AcquireStaged(RemoteFetch job, std::vector<Block*> held, size_t fetched_from) = 0;
};

class RemoteStage {
 public:
  // `opts` points into the engine's options (write mode, batch and queue size follow a
  // Reconfigure).
  RemoteStage(std::unique_ptr<remote::RemoteTier> tier, const remote::RemoteOptions* opts, StagingHost* host);
  ~RemoteStage();  // Stop()

  void Start();
  // Stops both threads; queued fetches still get their acquire (without a fetch), queued
  // writes are written.
  void Stop();

  remote::RemoteTier& tier() { return *tier_; }
  const remote::RemoteTier& tier() const { return *tier_; }
  bool writes_enabled() const { return opts_->write != remote::RemoteWrite::kOff; }
  bool write_through() const { return opts_->write == remote::RemoteWrite::kWriteThrough; }

  void QueueFetch(RemoteFetch job);
  // Copies `bytes` of block (contract, key), a key of remote namespace `ns`, into the write
  // queue; dropped and counted when the queue is full.
  void QueueWrite(uint64_t contract, const Key128& key, const Key128& parent, const uint8_t* p, uint64_t bytes,
                  const std::string& ns = "");
  // Waits until both queues are empty and neither thread is working.
  void WaitIdle();
  bool OnStageThread() const;

  uint64_t fetched() const { return fetched_; }              // blocks staged into host
  uint64_t write_dropped() const { return write_dropped_; }  // writes refused by a full queue

 private:
  struct WriteJob {  // a block's bytes, copied out of its host slot
    uint64_t contract = 0;
    Key128 key, parent;
    std::vector<uint8_t> payload;
    std::string ns;  // remote namespace
  };
  void ReaderLoop();
  void WriterLoop();
  // Fetches the keys past the local prefix into host, holding each block it stages.
  // Returns the index of the first key it fetched (the local prefix when it began).
  size_t Fetch(const RemoteFetch& job, std::vector<Block*>* held);
  bool IdleLocked() const { return fetch_.empty() && write_.empty() && busy_ == 0; }

  std::unique_ptr<remote::RemoteTier> tier_;
  const remote::RemoteOptions* opts_;
  StagingHost* host_;
  std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::deque<RemoteFetch> fetch_;  // guarded by mu_
  std::deque<WriteJob> write_;     // guarded by mu_
  uint64_t write_bytes_ = 0;       // guarded by mu_
  int busy_ = 0;                   // guarded by mu_
  std::atomic<uint64_t> fetched_{0};
  std::atomic<uint64_t> write_dropped_{0};
  std::atomic<bool> stop_{false};
  std::thread reader_, writer_;
};

}  // namespace kvtier::tiers
