// NvmeStore: the NVMe tier. Fixed-size records in preallocated O_DIRECT files, one
// io_uring (UringDevice) with a deep queue, and a RocksDB index.
//
// Placement. The folder holds data/kvtier-NNNN.dat (equal-size files) and index/ (RocksDB).
// Every record takes one *record slot* of record_bytes = 4096 + slot_bytes:
//   [ 4 KiB: formats/record.h header (96 bytes) + zero padding ][ payload, padded to 4 KiB ]
// so the payload starts 4 KiB aligned and is read by O_DIRECT straight into a host slot.
// Record slot r lives in file r / records_per_file at (r % records_per_file) * record_bytes.
// Slots are allocated O(1) (SlotAllocator); eviction is the caller's (TierManager's) job.
//
// Index schema (RocksDB, one column family):
//   "meta"                               -> u32 version | u64 slot_bytes | u32 records_per_file
//                                           | u32 num_files   (a folder made with another
//                                           geometry is refused, not reinterpreted)
//   'b' | contract_id (8, BE) | key (16) -> u8 version=1 | u32 record | u64 payload_len
//                                           | u64 payload_xxh3 | u64 header_xxh3
//                                           | parent key (16) | u64 sequence | u32 hits
//
// Commit protocol (WriteBatch): header + payload written, fdatasync of every touched file,
// and only then one synced RocksDB batch with the index entries. A crash before the index
// write leaves a record nobody points at (its slot is free again after restart); a crash
// after it leaves a durable block. A record slot freed by Remove is deleted from the index
// (WAL-ordered before any later index write), and a stale entry that survived anyway
// fails its header/checksum check: never wrong data.
//
// Reads (ReadBatch) always verify the payload's XXH3 against the index. After a warm
// restart the first read of each block also reads and checks its on-disk header
// (verify_on_restart). A failed check is a miss (Corrupt), the entry is dropped and
// checksum_failures counts it.
//
// Thread-safety: all methods may be called from any thread; the index map has a lock,
// I/O runs outside it. The caller must not Remove a block while reading it (the
// TierManager pins blocks that are being read).
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "formats/keys.h"
#include "formats/status.h"
#include "tiers/nvme/device.h"
#include "tiers/slot_allocator.h"
#include "tiers/types.h"

namespace rocksdb {
class DB;
}

namespace kvtier::tiers {

struct NvmeStoreOptions {
  std::string dir;              // folder for data files and index; created. Default: "" (refused)
  uint64_t capacity_bytes = 0;  // data bytes, rounded down to whole records. Default: 0 (refused)
  uint64_t slot_bytes = 0;      // largest payload, kIoAlign multiple. Default: 0 (refused)
  uint32_t queue_depth = 64;    // io_uring depth. Default: 64
  uint64_t file_bytes = uint64_t{1} << 30;  // target size of one data file. Default: 1 GiB
  bool verify_on_restart = true;  // check the on-disk header on a block's first read after
                                  // a warm restart (payloads are always checked). Default: true
  std::vector<iovec> fixed;     // memory to register as io_uring fixed buffers. Default: none

  Status Validate() const;
};

struct NvmeEntry {
  BlockId id;
  Key128 parent;
  uint32_t record = 0;
  uint64_t payload_len = 0, payload_xxh3 = 0, header_xxh3 = 0, sequence = 0;
  uint32_t hits = 0;
  bool verified = false;  // header checked since open (or written by this process)
};

struct NvmeWrite {
  BlockId id;
  Key128 parent;
  const uint8_t* payload = nullptr;  // 4 KiB aligned, readable for round_up(len, 4096) bytes
  uint64_t len = 0;                  // payload bytes, 1..slot_bytes
  Status result;                     // Ok also when the block was already stored
};

struct NvmeRead {
  BlockId id;
  uint8_t* dst = nullptr;    // 4 KiB aligned, writable for round_up(len, 4096) bytes
  uint64_t dst_capacity = 0;
  uint64_t len = 0;          // out: payload bytes
  Status result;             // NotFound, Corrupt (dropped and counted), IoError, Ok
};

struct NvmeStoreStats {
  uint64_t records_total = 0, records_used = 0, record_bytes = 0;
  uint64_t blocks_written = 0, blocks_read = 0, bytes_written = 0, bytes_read = 0;
  uint64_t checksum_failures = 0, index_entries_dropped = 0, loaded_at_open = 0;
};

class NvmeStore {
 public:
  // `wrap` (optional) wraps the real device, e.g. with fault injection in tests.
  using DeviceWrapper = std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)>;
  static StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeStoreOptions& opts,
                                                   DeviceWrapper wrap = nullptr);
  // The wrapper Open applies when its caller passes none, made per store from its record
  // size: process-wide, installed at start by test builds only (fault injection from the
  // environment, tiers/test_point_env.cc). Default: none.
  using DefaultWrapperFactory = std::function<DeviceWrapper(uint64_t record_bytes)>;
  static void SetDefaultDeviceWrapper(DefaultWrapperFactory f);
  ~NvmeStore();

  Status WriteBatch(std::span<NvmeWrite> writes);
  // on_ready(i) (optional) runs on the calling thread as soon as reads[i] is finished and
  // verified (result set), while later reads are still in flight; the index bookkeeping
  // (hit counts, dropping corrupt entries) is done when the batch returns.
  Status ReadBatch(std::span<NvmeRead> reads, const std::function<void(size_t)>& on_ready = nullptr);
  // NotFound when absent.
  Status Remove(const BlockId& id);

  bool Contains(const BlockId& id) const;
  std::optional<NvmeEntry> Find(const BlockId& id) const;
  std::vector<NvmeEntry> Entries() const;
  NvmeStoreStats Stats() const;

  uint64_t slot_bytes() const { return opts_.slot_bytes; }
  uint64_t record_bytes() const { return record_bytes_; }
  uint32_t records_total() const { return records_total_; }
  uint32_t free_records() const;
  // Where record r lives (for tests and tools: inspect, corrupt, verify).
  std::string DataPath(uint32_t file) const;
  void RecordLocation(uint32_t record, uint32_t* file, uint64_t* offset) const;
  Device* device() { return dev_.get(); }

 private:
  NvmeStore() = default;
  Status LoadIndex();
  void DropEntryLocked(const BlockId& id);

  NvmeStoreOptions opts_;
  uint64_t record_bytes_ = 0;
  uint32_t records_total_ = 0, records_per_file_ = 0, num_files_ = 0;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<rocksdb::DB> db_;
  uint8_t* staging_ = nullptr;  // kStagingRecords * 4 KiB of header buffers (registered)
  std::mutex io_mu_;            // one batch at a time uses staging_

  mutable std::mutex mu_;  // guards map_, alloc_, next_seq_
  std::unordered_map<BlockId, NvmeEntry, BlockIdHash> map_;
  SlotAllocator alloc_;
  uint64_t next_seq_ = 1;

  std::atomic<uint64_t> blocks_written_{0}, blocks_read_{0}, bytes_written_{0}, bytes_read_{0};
  std::atomic<uint64_t> checksum_failures_{0}, index_dropped_{0}, loaded_{0};
};

inline uint64_t RoundUp4K(uint64_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

}  // namespace kvtier::tiers
