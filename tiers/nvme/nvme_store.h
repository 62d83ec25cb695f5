// NvmeStore: the NVMe tier. Records of a few sizes (record classes) in preallocated
// O_DIRECT files, one io_uring (UringDevice) with a deep queue, and a RocksDB index.
//
// Record classes. A record is
//   [ 4 KiB: formats/record.h header (96 bytes) + zero padding ][ payload, padded to 4 KiB ]
// so the payload starts 4 KiB aligned and is read by O_DIRECT straight into a host slot.
// There is one record class per host slot class (TierManager: tiers.slot_classes), of
// 4096 + the class's slot bytes; a block takes a record of the smallest class that holds
// it, so a 576 KiB block takes a 580 KiB record, not one of 4096 + slot_bytes (1444 KiB
// with the default classes: 40% of it used). One class (no host classes, or an NVMe
// tier smaller than a slab) is the store of equal records it replaces.
//
// Placement. The folder holds data/kvtier-NNNN.dat (equal-size files) and index/
// (RocksDB). The records are cut in slabs of slab_bytes (64 MiB with several classes;
// with one class a slab is one data file's worth of records) that a SlabAllocator
// (tiers/slab_allocator.h, as in the host and HBM tiers) gives to the classes by demand.
// A file is a whole number of slabs, so no record spans two files. A record id is the
// record's byte offset in the store / 4 KiB: a u32, so a store holds at most 16 TiB of
// slabs (Open refuses more). Record r lives in file r * 4096 / file bytes at
// r * 4096 % file bytes (RecordLocation). A slab of class c holds floor(slab / c) records
// back to back from its start; 64 MiB holds 112 records of 580 KiB (576 KiB of it left
// over, 0.88%) and 45 of 1444 KiB (556 KiB, 0.85%). The TierManager's slabs are
// tiers.nvme.slab_bytes, not the host's: a record is 4 KiB larger than its class, so the
// host's 2880 KiB slab would hold one 1444 KiB record. Eviction, and moving a slab to a
// starved class, are the caller's (TierManager's) job: BeginMove, then Remove of the
// slab's blocks.
//
// Index schema (RocksDB, one column family; formats in docs/formats.md, a golden copy in
// tests/data/nvme_index_v2.bin):
//   "meta"                               -> u32 version=2 | u64 slab_bytes | u32 slabs_per_file
//                                           | u32 num_slabs | u32 num_classes
//                                           | u64 record_bytes x num_classes (smallest first)
//                                           (a folder made with another geometry is
//                                           refused, naming both; one of index version 1,
//                                           one record size, is emptied at open: one
//                                           warning line, its entries counted as dropped)
//   'b' | contract_id (8, BE) | key (16) -> u8 version=2 | u32 record | u64 payload_len
//                                           | u64 payload_xxh3 | u64 header_xxh3
//                                           | parent key (16) | u64 sequence | u32 hits
// An entry's record class is the one its payload_len takes. At open the allocator is
// rebuilt from the entries (SlabAllocator::Restore); an entry whose record is not a
// record start of that class in a slab of it (or is taken twice) is dropped and counted,
// never reinterpreted.
//
// Commit protocol (WriteBatch): header + payload written, fdatasync of every touched file,
// and only then one synced RocksDB batch with the index entries. A crash before the index
// write leaves a record nobody points at (its record is free again after restart); a crash
// after it leaves a durable block. A record freed by Remove is deleted from the index
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
#include <string_view>
#include <unordered_map>
#include <vector>

#include "formats/keys.h"
#include "formats/status.h"
#include "tiers/nvme/device.h"
#include "tiers/slab_allocator.h"
#include "tiers/types.h"

namespace rocksdb {
class DB;
}

namespace kvtier::tiers {

struct NvmeStoreOptions {
  std::string dir;              // folder for data files and index; created. Default: "" (refused)
  uint64_t capacity_bytes = 0;  // data bytes, rounded down to whole slabs. Default: 0 (refused)
  uint64_t slot_bytes = 0;      // largest payload, kIoAlign multiple. Default: 0 (refused)
  // The payload bytes of the record classes (the host slot classes; kIoAlign multiples,
  // at most kMaxSlotClasses, the largest slot_bytes); a record of a class is 4096 + its
  // bytes. Default: empty (one class of slot_bytes)
  std::vector<uint64_t> classes;
  // Records sized by their blocks (TierManagerOptions::classes_at_registration): a payload
  // of n bytes (1..slot_bytes) takes a record of 4096 + n rounded up to 4 KiB, its class
  // made the first time a payload of that size comes (AddClassFor, or a write or the
  // index at open), at most kMaxArenaClasses; `classes` must be empty. The index's meta
  // lists no record size then, and an entry's class is the one its payload_len takes:
  // after a restart a slab's class comes from the records on disk, whatever order the
  // classes were made in before. Default: false
  bool records_by_size = false;
  // Bytes of a slab, a kIoAlign multiple that holds a record of the largest class; 0: with
  // one class, one data file's worth of records (file_bytes rounded down to records, at
  // most the capacity's), with several kDefaultSlabBytes, with records_by_size
  // AutoSlabBytes(capacity, slot_bytes + 4096) (tiers/slab_allocator.h). Default: 0
  uint64_t slab_bytes = 0;
  uint32_t queue_depth = 64;    // io_uring depth. Default: 64
  uint64_t file_bytes = uint64_t{1} << 30;  // target size of one data file, rounded down to
                                            // whole slabs (at least one). Default: 1 GiB
  bool verify_on_restart = true;  // check the on-disk header on a block's first read after
                                  // a warm restart (payloads are always checked). Default: true
  std::vector<iovec> fixed;     // memory to register as io_uring fixed buffers. Default: none

  Status Validate() const;
};

struct NvmeEntry {
  BlockId id;
  Key128 parent;
  uint32_t record = 0;  // the record's byte offset in the store / 4 KiB
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

// The store's layout, as the index's "meta" records it.
struct NvmeGeometry {
  uint64_t slab_bytes = 0;
  uint32_t slabs_per_file = 0, num_slabs = 0;
  std::vector<uint64_t> record_bytes;  // per class, smallest first
  bool operator==(const NvmeGeometry&) const = default;
  std::string ToString() const;  // "2 slabs of 64 MiB (1 a file), records of 580 KiB, 1444 KiB"
};

// The index format (docs/formats.md), for the store and the format tests.
namespace nvme_index {
inline constexpr uint32_t kVersion = 2;       // "meta" version; 1: one record size (dropped)
inline constexpr uint8_t kEntryVersion = 2;
std::string EncodeMeta(const NvmeGeometry& g);
// The version of a meta value (0 when it has none); `g` is filled for version 2.
uint32_t DecodeMeta(std::string_view v, NvmeGeometry* g);
std::string Key(const BlockId& id);
bool ParseKey(std::string_view k, BlockId* id);
std::string EncodeEntry(const NvmeEntry& e);
bool DecodeEntry(std::string_view v, NvmeEntry* e);
}  // namespace nvme_index

struct NvmeStoreStats {
  // records_total: records of the smallest class the store would hold in every slab
  // (record_bytes: that class's size); records_used: taken records of every class;
  // capacity_bytes / used_bytes: bytes of the slabs and of the taken records.
  uint64_t records_total = 0, records_used = 0, record_bytes = 0;
  uint64_t capacity_bytes = 0, used_bytes = 0;
  uint64_t blocks_written = 0, blocks_read = 0, bytes_written = 0, bytes_read = 0;
  uint64_t checksum_failures = 0, index_entries_dropped = 0, loaded_at_open = 0;
};

class NvmeStore {
 public:
  // `wrap` (optional) wraps the real device, e.g. with fault injection in tests.
  using DeviceWrapper = std::function<std::unique_ptr<Device>(std::unique_ptr<Device>)>;
  static StatusOr<std::unique_ptr<NvmeStore>> Open(const NvmeStoreOptions& opts,
                                                   DeviceWrapper wrap = nullptr);
  // The wrapper Open applies when its caller passes none, made per store: process-wide,
  // installed at start by test builds only (fault injection from the environment,
  // tiers/test_point_env.cc). Default: none.
  using DefaultWrapperFactory = std::function<DeviceWrapper()>;
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
  const NvmeGeometry& geometry() const { return geo_; }
  // Records of the smallest class in every slab (the tier's "slots", as HostPool::slots).
  uint32_t records_total() const;
  // Where record r lives (for tests and tools: inspect, corrupt, verify).
  std::string DataPath(uint32_t file) const;
  void RecordLocation(uint32_t record, uint32_t* file, uint64_t* offset) const;
  Device* device() { return dev_.get(); }

  // The record classes and slabs (SlabAllocator's names, as HostPool's, for TierState):
  // classes are indexed smallest first (records_by_size: in the order they were made);
  // class_bytes is a record's size (4096 + payload).
  int num_classes() const { return classes_.load(std::memory_order_acquire); }
  uint64_t class_bytes(int cls) const { return alloc_.class_bytes(cls); }
  // The class of the record a payload of `payload_len` bytes takes; -1 when none holds it
  // (records_by_size: none of that size was made yet).
  int ClassFor(uint64_t payload_len) const;
  // The class a payload of `payload_len` bytes takes, made now if it is new
  // (records_by_size); Invalid for a payload of 0 or more than slot_bytes, or past
  // kMaxArenaClasses. Without records_by_size: ClassFor, Invalid when -1.
  StatusOr<int> AddClassFor(uint64_t payload_len);
  uint64_t arena_bytes() const { return uint64_t{geo_.num_slabs} * geo_.slab_bytes; }
  uint32_t num_slabs() const { return geo_.num_slabs; }
  uint32_t slots_per_slab(int cls) const;
  uint32_t most(int cls) const { return num_slabs() * slots_per_slab(cls); }
  uint32_t SlabOf(uint32_t record) const;
  uint32_t used() const;
  uint32_t used(int cls) const;
  uint64_t used_bytes() const;
  uint32_t free_count(int cls) const;
  uint32_t capacity(int cls) const;
  uint32_t slabs(int cls) const;
  int SlabClass(uint32_t slab) const;
  bool Draining(uint32_t slab) const;
  std::vector<uint32_t> TakenSlots(uint32_t slab) const;  // record ids
  // Starts moving `slab` to class `cls` (SlabAllocator::BeginMove): no record is taken
  // from it any more, and the Remove of its last block hands it over. Returns its taken
  // records (their blocks are the caller's to remove).
  StatusOr<std::vector<uint32_t>> BeginMove(uint32_t slab, int cls);
  // The block whose index entry names record `record` (none for a free record or one a
  // write has taken but not committed yet).
  std::optional<BlockId> BlockAt(uint32_t record) const;

 private:
  NvmeStore() = default;
  Status LoadIndex();
  // Empties an index of version 1 (one record size; see the header comment).
  Status DropVersion1Index();
  StatusOr<int> AddClassForLocked(uint64_t payload_len);
  // Allocator ids (granule units) <-> record ids (4 KiB units).
  uint32_t RecordOf(uint32_t id) const { return id * ids_per_granule_; }
  std::optional<uint32_t> IdOf(uint32_t record) const;

  NvmeStoreOptions opts_;
  NvmeGeometry geo_;
  uint32_t num_files_ = 0, ids_per_granule_ = 1;
  std::unique_ptr<Device> dev_;
  std::unique_ptr<rocksdb::DB> db_;
  uint8_t* staging_ = nullptr;  // kStagingRecords * 4 KiB of header buffers (registered)
  std::mutex io_mu_;            // one batch at a time uses staging_

  mutable std::mutex mu_;  // guards map_, at_, alloc_, next_seq_
  std::unordered_map<BlockId, NvmeEntry, BlockIdHash> map_;
  std::unordered_map<uint32_t, BlockId> at_;  // record -> block, of map_'s entries
  SlabAllocator alloc_;
  // alloc_'s classes, published after each is made (readers of the geometry hold no lock;
  // alloc_ never moves a class).
  std::atomic<int> classes_{0};
  uint64_t next_seq_ = 1;

  std::atomic<uint64_t> blocks_written_{0}, blocks_read_{0}, bytes_written_{0}, bytes_read_{0};
  std::atomic<uint64_t> checksum_failures_{0}, index_dropped_{0}, loaded_{0};
};

inline uint64_t RoundUp4K(uint64_t n) { return (n + kIoAlign - 1) / kIoAlign * kIoAlign; }

}  // namespace kvtier::tiers
